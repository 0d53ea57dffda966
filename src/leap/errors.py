"""Typed exceptions: the library raises these; the CLI and HTTP layer translate them once."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class LeapError(Exception):
    """Base of every error a user can cause and fix."""


class ConfigError(LeapError):
    """A bad setting, option or scenario file."""


class DataError(LeapError):
    """A file or value that cannot be read as attempts (the whole input is refused)."""


class CatalogError(LeapError):
    """A bad hardware catalog entry, or an unknown hardware name."""


class ArtifactError(LeapError):
    """A missing, corrupt or incompatible model artifact."""


class ModelError(LeapError):
    """Training or prediction cannot proceed (too little data, unfitted model ...)."""


class QualityGateError(ModelError):
    """A freshly trained model is too much worse than the published one to replace it."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """Return ``"; did you mean 'X'?"`` for the closest choice, or an empty string.

    Examples
    --------
    >>> did_you_mean("H10O", ["H100-SXM", "A100-SXM4-80GB"])
    "; did you mean 'H100-SXM'?"
    """
    def score(choice: str) -> float:
        a, b = name.lower(), choice.lower()
        ratio = difflib.SequenceMatcher(None, a, b).ratio()
        # Names that start alike are far likelier typos of each other ("H10O" -> "H100-SXM").
        common = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                      min(len(a), len(b)))
        return ratio + 0.15 * min(common, 3)

    ranked = sorted(choices, key=score, reverse=True)
    if not ranked or score(ranked[0]) < 0.55:
        return ""
    return f"; did you mean '{ranked[0]}'?"
