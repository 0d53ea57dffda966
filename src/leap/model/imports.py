"""Keeping scikit-learn out of processes that only score.

LightGBM imports scikit-learn whenever it is installed, for its estimator classes. leap uses
those only to train on Dask (:mod:`leap.model.distributed`) and in the alternatives study, yet
the import costs every process that loads a model: 1.3-1.7 s of a 2.5 s start on a 2-core
machine, and its memory, in each server worker, each worker restarted after a crash, and each
`leap rank` or `leap predict`. Those processes call :func:`without_sklearn` first.
"""

from __future__ import annotations

import sys


def without_sklearn() -> bool:
    """Make ``import sklearn`` fail in this process, so LightGBM loads without it; ``True``
    when it did. It changes nothing where LightGBM or scikit-learn is already imported (a
    test run, a notebook), so a later import there still works as before."""
    if "lightgbm" in sys.modules or "sklearn" in sys.modules:
        return False
    sys.modules["sklearn"] = None  # type: ignore[assignment]  # the import system's "absent"
    return True
