"""Hardware catalog: the shipped default plus a user's TOML overrides, with name lookup."""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, asdict, dataclass, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from leap.errors import CatalogError, did_you_mean


@dataclass(frozen=True)
class Hardware:
    """One accelerator type. Units are in the field names; figures are per device.

    ``peak_bf16_tflops`` is the dense 16-bit matmul peak (bf16 where supported, else fp16
    tensor cores). ``min_utilization`` only matters when ``premium`` is true: the ranker keeps
    a premium type only when the job's predicted utilization reaches it.
    """

    name: str
    vendor: str
    architecture: str
    year: int
    devices_per_host: int
    peak_bf16_tflops: float
    peak_fp32_tflops: float
    memory_gb: float
    mem_bw_gb_per_s: float
    intra_node_bw_gb_per_s: float
    inter_node_bw_gbit_per_s: float
    cost_per_device_hour: float
    premium: bool = False
    min_utilization: float = 0.0
    spec_source: str = ""
    cost_source: str = ""
    notes: str = ""
    # How schedulers name the type (``leap rank --format``); empty = the documented default
    # (see :mod:`leap.rank.formats`). Not figures: left out of :meth:`Catalog.fingerprint`.
    skypilot_name: str = ""
    k8s_label_key: str = ""
    k8s_label_value: str = ""
    slurm_gres: str = ""
    slurm_constraint: str = ""

    @property
    def bf16_native(self) -> float:
        """1.0 when the type runs bf16 natively, 0.0 for NVIDIA before Ampere (Pascal, Volta,
        Turing), whose 16-bit tensor cores are fp16 only: bf16 there runs at fp32 speed."""
        return 0.0 if self.vendor == "NVIDIA" and self.architecture.startswith(
            NO_BF16_ARCHITECTURES) else 1.0


#: Catalog fields that name a type in a scheduler's vocabulary (see leap.rank.formats).
SCHEDULER_NAME_FIELDS: tuple[str, ...] = ("skypilot_name", "k8s_label_key", "k8s_label_value",
                                          "slurm_gres", "slurm_constraint")

#: NVIDIA architectures without bf16 tensor cores (bf16 arrived with Ampere).
NO_BF16_ARCHITECTURES = ("Pascal", "Volta", "Turing")

_FIELD_TYPES: dict[str, type] = {
    f.name: {"str": str, "int": int, "float": float, "bool": bool}[str(f.type)]
    for f in fields(Hardware)
}
_REQUIRED = [f.name for f in fields(Hardware) if f.default is MISSING]
_POSITIVE = ("devices_per_host", "peak_bf16_tflops", "peak_fp32_tflops", "memory_gb",
             "mem_bw_gb_per_s", "intra_node_bw_gb_per_s", "inter_node_bw_gbit_per_s")

#: Numeric catalog columns that the feature encoder and simulator use, in a fixed order.
SPEC_COLUMNS: tuple[str, ...] = (
    "year", "devices_per_host", "peak_bf16_tflops", "peak_fp32_tflops", "memory_gb",
    "mem_bw_gb_per_s", "intra_node_bw_gb_per_s", "inter_node_bw_gbit_per_s",
    "cost_per_device_hour", "bf16_native",
)


def _coerce(where: str, key: str, value: Any) -> Any:
    want = _FIELD_TYPES[key]
    if want is bool:
        if not isinstance(value, bool):
            raise CatalogError(f"{where}: field '{key}' must be true or false, got {value!r}")
        return value
    if want is str:
        if not isinstance(value, str):
            raise CatalogError(f"{where}: field '{key}' must be a string, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CatalogError(f"{where}: field '{key}' must be a number, got {value!r}")
    if want is int:
        if float(value) != int(value):
            raise CatalogError(f"{where}: field '{key}' must be a whole number, got {value!r}")
        return int(value)
    return float(value)


def _check(where: str, hw: Hardware) -> None:
    for key in _POSITIVE:
        v = getattr(hw, key)
        if not math.isfinite(v) or v <= 0:
            raise CatalogError(f"{where}: field '{key}' must be a positive number, got {v!r}")
    if not math.isfinite(hw.cost_per_device_hour) or hw.cost_per_device_hour < 0:
        raise CatalogError(f"{where}: field 'cost_per_device_hour' must be >= 0, "
                           f"got {hw.cost_per_device_hour!r}")
    if not 0.0 <= hw.min_utilization <= 1.0:
        raise CatalogError(f"{where}: field 'min_utilization' must be within [0, 1], "
                           f"got {hw.min_utilization!r}")


class Catalog(Mapping[str, Hardware]):
    """An ordered, immutable mapping of accelerator name to :class:`Hardware`.

    Examples
    --------
    >>> cat = Catalog.default()
    >>> cat["H100-SXM"].vendor
    'NVIDIA'
    >>> len(cat) >= 20
    True
    """

    def __init__(self, entries: list[Hardware]) -> None:
        self._by_name = {h.name: h for h in entries}
        if len(self._by_name) != len(entries):
            raise CatalogError("catalog has duplicate hardware names")

    # Mapping protocol ---------------------------------------------------------------------
    def __getitem__(self, name: str) -> Hardware:
        try:
            return self._by_name[name]
        except KeyError:
            raise CatalogError(
                f"unknown hardware '{name}'{did_you_mean(name, self._by_name)}"
            ) from None

    def __contains__(self, name: object) -> bool:
        # Mapping's default goes through __getitem__, whose CatalogError is not a KeyError.
        return name in self._by_name

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    # Construction -------------------------------------------------------------------------
    @classmethod
    def default(cls) -> Catalog:
        """The catalog shipped with leap (public specs and on-demand prices)."""
        text = resources.files("leap.resources").joinpath("catalog.toml").read_text("utf-8")
        return cls._from_toml_text(text, "default catalog", base=None)

    @classmethod
    def load(cls, path: Path | None = None) -> Catalog:
        """The default catalog, overridden and extended by the user's TOML file at ``path``.

        In the user file, a ``[[hardware]]`` table whose name is already in the catalog
        overrides only the fields it sets (e.g. your internal ``cost_per_device_hour``); a new
        name must set every spec field. ``enabled = false`` removes a type.
        """
        base = cls.default()
        if path is None:
            return base
        try:
            text = Path(path).read_text("utf-8")
        except OSError as exc:
            raise CatalogError(f"cannot read catalog file {path}: {exc.strerror}") from None
        return cls._from_toml_text(text, str(path), base=base)

    @classmethod
    def _from_toml_text(cls, text: str, origin: str, base: Catalog | None) -> Catalog:
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise CatalogError(f"{origin}: not valid TOML ({exc})") from None
        unknown_top = set(doc) - {"hardware"}
        if unknown_top:
            raise CatalogError(f"{origin}: unknown top-level key(s) {sorted(unknown_top)}; "
                               "expected [[hardware]] tables")
        tables = doc.get("hardware", [])
        if not isinstance(tables, list):
            raise CatalogError(f"{origin}: 'hardware' must be an array of tables ([[hardware]])")
        entries = dict(base._by_name) if base is not None else {}
        for i, table in enumerate(tables, start=1):
            name = table.get("name")
            if not isinstance(name, str) or not name:
                raise CatalogError(f"{origin}: [[hardware]] entry #{i} has no 'name'")
            where = f"{origin}: hardware '{name}'"
            enabled = table.get("enabled", True)
            extra = set(table) - set(_FIELD_TYPES) - {"enabled"}
            if extra:
                bad = sorted(extra)[0]
                raise CatalogError(f"{where}: unknown field '{bad}'"
                                   f"{did_you_mean(bad, _FIELD_TYPES)}")
            values = {k: _coerce(where, k, v) for k, v in table.items() if k != "enabled"}
            if enabled is False:
                entries.pop(name, None)
                continue
            if name in entries:
                hw = replace(entries[name], **values)
            else:
                missing = [k for k in _REQUIRED if k not in values]
                if missing:
                    raise CatalogError(f"{where}: missing field(s) {', '.join(missing)} "
                                       "(a new hardware type must set every spec field)")
                hw = Hardware(**values)
            _check(where, hw)
            entries[name] = hw
        if not entries:
            raise CatalogError(f"{origin}: the catalog is empty")
        return cls(list(entries.values()))

    # Views --------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    def resolve(self, names: list[str] | None) -> list[str]:
        """Validate candidate names (``None`` means every type); raises with a suggestion."""
        if names is None:
            return self.names
        for n in names:
            self[n]
        return list(dict.fromkeys(names))

    def spec_matrix(self, names: list[str] | np.ndarray) -> np.ndarray:
        """Float matrix of :data:`SPEC_COLUMNS` for ``names`` (rows follow ``names``)."""
        # Entries never change after construction: build the per-name rows once (this runs
        # on every launch-time ranking).
        rows = self.__dict__.get("_spec_rows")
        if rows is None:
            rows = ({n: i for i, n in enumerate(self._by_name)},
                    np.array([[float(getattr(h, c)) for c in SPEC_COLUMNS]
                              for h in self.values()], dtype=np.float64).reshape(
                                  -1, len(SPEC_COLUMNS)))
            self._spec_rows = rows
        pos, matrix = rows
        return matrix[[pos[n] for n in names]]

    def to_records(self) -> list[dict[str, Any]]:
        return [asdict(h) for h in self.values()]

    def fingerprint(self) -> str:
        """A stable digest of every figure: artifacts record which catalog they saw."""
        import hashlib
        import json

        records = [{k: v for k, v in r.items() if k not in SCHEDULER_NAME_FIELDS}
                   for r in self.to_records()]
        blob = json.dumps(records, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_toml(self) -> str:
        """The whole catalog as TOML (artifacts carry this snapshot)."""
        lines: list[str] = []
        for h in self.values():
            lines.append("[[hardware]]")
            for key, value in asdict(h).items():
                if isinstance(value, bool):
                    lines.append(f"{key} = {'true' if value else 'false'}")
                elif isinstance(value, str):
                    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
                    lines.append(f'{key} = "{escaped}"')
                else:
                    lines.append(f"{key} = {value!r}")
            lines.append("")
        return "\n".join(lines)

    @classmethod
    def from_toml(cls, text: str, origin: str = "catalog snapshot") -> Catalog:
        return cls._from_toml_text(text, origin, base=None)
