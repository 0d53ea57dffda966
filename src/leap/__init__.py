"""leap: learned throughput prediction and value ranking of accelerator types, before launch.

``import leap`` is cheap: the web stack, Dask and LightGBM load only when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leap.rank.ranker import Ranker
    from leap.rank.results import RankResult

__version__ = "0.1.0"

__all__ = ["RankResult", "Ranker", "__version__"]

# Public names whose modules are heavy (pandas, LightGBM): imported on first attribute access.
# (`leap.rank` is the ranking subpackage, so the entry point is `leap.Ranker(...).rank(job)`.)
_LAZY = {"Ranker": "leap.rank.ranker", "RankResult": "leap.rank.results"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'leap' has no attribute {name!r}")
