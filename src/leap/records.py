"""The JSON round-trip every typed study result shares: :class:`Record`.

A study returns a frozen dataclass that mixes in :class:`Record`; :meth:`Record.to_dict` is
the JSON the study writes (fields in declaration order, so the keys keep the order a reader
of the files knows) and :meth:`Record.from_dict` reads a saved file back, nested records
included, from the field annotations.

Examples
--------
>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Point(Record):
...     OMIT_NONE = frozenset({"note"})
...     n: int
...     note: str | None = None
>>> Point(3).to_dict()
{'n': 3}
>>> Point.from_dict({"n": 3, "note": "x"})
Point(n=3, note='x')
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Self


class Record:
    """Mixin for a frozen dataclass of study figures, with its JSON round-trip.

    Fields named in :attr:`OMIT_NONE` are left out of :meth:`to_dict` when None: the keys a
    study writes only when it has them. A key that :meth:`from_dict` does not find takes the
    field's default.
    """

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset()

    def to_dict(self) -> dict[str, Any]:
        """The JSON of the record: every field in order, nested records as dicts."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(typing.cast(Any, self)):
            v = getattr(self, f.name)
            if v is None and f.name in self.OMIT_NONE:
                continue
            out[f.name] = to_json(v)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Read :meth:`to_dict` back (e.g. a saved study's JSON).

        Raises
        ------
        TypeError
            ``data`` lacks a field without a default.
        """
        hints = _hints(cls)
        return cls(**{f.name: from_json(hints[f.name], data[f.name])
                      for f in dataclasses.fields(typing.cast(Any, cls)) if f.name in data})


def to_json(value: Any) -> Any:
    """``value`` as JSON-ready data: records as dicts, containers copied, the rest as is."""
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def from_json(kind: Any, value: Any) -> Any:
    """``value`` (read from JSON) as ``kind``: records (also inside lists, dicts and
    ``X | None``) are rebuilt, every other value is kept as it was read."""
    if value is None:
        return None
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        return from_json(args[0], value) if len(args) == 1 else value
    if isinstance(kind, type) and issubclass(kind, Record):
        return kind.from_dict(value)
    if origin is list:
        (item,) = typing.get_args(kind)
        return [from_json(item, v) for v in value]
    if origin is dict:
        _, item = typing.get_args(kind)
        return {k: from_json(item, v) for k, v in value.items()}
    return value


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]
