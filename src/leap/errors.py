"""Typed exceptions: the library raises these; the CLI and HTTP layer translate them once.

A :class:`ParamError` names the library's parameters (``{nights}``); an edge that spells them
otherwise (the CLI's flags) renders it with its own spelling, so no library message needs to
know about flags.
"""

from __future__ import annotations

import difflib
import string
from collections.abc import Iterable, Mapping


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


class ParamError(ConfigError):
    """A bad value (or combination of values) of named parameters.

    Parameters
    ----------
    template : str
        The message; ``{name}`` stands for the parameter ``name`` (``{{`` for a brace).

    Attributes
    ----------
    params : tuple of str
        The parameters the message names, in order; ``param`` is the first.

    Examples
    --------
    >>> err = ParamError("{nights} must be >= 1, got 0")
    >>> str(err), err.param
    ('nights must be >= 1, got 0', 'nights')
    >>> err.render({"nights": "--nights"})
    '--nights must be >= 1, got 0'
    """

    def __init__(self, template: str) -> None:
        self.template = template
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f]
        self.params: tuple[str, ...] = tuple(dict.fromkeys(fields))
        self.param = self.params[0] if self.params else ""
        super().__init__(self.render({}))

    def render(self, spelling: Mapping[str, str]) -> str:
        """The message with each parameter spelled as ``spelling`` says (else its name)."""
        return self.template.format_map({p: spelling.get(p, p) for p in self.params})


class QualityGateError(ModelError, ParamError):
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
