"""Errors about a named parameter: the library says ``nights``, the CLI says ``--nights``.

A :class:`ParamError` message is a template whose ``{name}`` fields are parameter names. As a
string it names the Python parameters, as a library user passed them; an edge that spells
them otherwise (the CLI's flags) renders it with :meth:`ParamError.render` and its own
spelling of each name, so no library message needs to know about flags.
"""

from __future__ import annotations

import string
from collections.abc import Mapping

from leap.errors import ConfigError


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
