"""Simulator scenario: the frozen knobs of the reference fleet, loaded from TOML."""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from leap.errors import ConfigError, ParamError, did_you_mean

#: Model categories the simulator knows, in a fixed order (indices are used internally).
CATEGORIES: tuple[str, ...] = ("recommendation", "vision", "language", "llm", "speech",
                               "tabular", "graph")

_TABLES = ("capacity_share", "category_share")
_PROBABILITIES = ("straggler_share", "straggler_low", "straggler_high", "failure_prob",
                  "preemption_prob", "over_capacity_preemption_prob", "base_config_share",
                  "step_change_prob_per_day")


@dataclass(frozen=True)
class Scenario:
    """Every knob of the reference fleet. Build it with :meth:`load` (defaults + your file).

    Units are in the names; ``*_sd`` are standard deviations of natural logarithms.

    Examples
    --------
    >>> sc = Scenario.load()
    >>> sc.attempts_per_day
    25000
    >>> sc.override(attempts_per_day=1000).attempts_per_day
    1000
    """

    attempts_per_day: int
    n_model_types: int
    initial_families: int
    new_families_per_day: float
    family_mean_lifetime_days: float
    family_rate_pareto_alpha: float
    family_rate_cap: float
    family_log_eff_sd: float
    family_vendor_affinity_sd: float
    type_vendor_sd: float
    drift_sd_per_day: float
    step_change_prob_per_day: float
    step_change_log_sd: float
    attempt_noise_log_sd: float
    straggler_share: float
    straggler_low: float
    straggler_high: float
    failure_prob: float
    preemption_prob: float
    over_capacity_preemption_prob: float
    base_config_share: float
    config_spread: int
    duration_median_hours: float
    duration_log_sd: float
    duration_cap_hours: float
    home_types_min: int
    home_types_max: int
    capacity_factor: float
    new_hardware: str
    new_hardware_day: int
    default_capacity_share: float
    capacity_share: Mapping[str, float] = field(default_factory=dict)
    category_share: Mapping[str, float] = field(default_factory=dict)

    # Construction ---------------------------------------------------------------------------
    @classmethod
    def default(cls) -> Scenario:
        """The scenario shipped with leap (``resources/default_scenario.toml``)."""
        text = resources.files("leap.resources").joinpath("default_scenario.toml").read_text(
            "utf-8")
        return cls._from_mapping(_parse(text, "default scenario"), "default scenario", None)

    @classmethod
    def load(cls, path: Path | None = None) -> Scenario:
        """The default scenario overridden by the keys of the TOML file at ``path``.

        Parameters
        ----------
        path : Path, optional
            A scenario TOML file, or the name of a scenario shipped with leap (``novel``:
            ``resources/scenario_novel.toml``); ``None`` gives the defaults.

        Raises
        ------
        ConfigError
            The file cannot be read, is not TOML, has an unknown key (with a suggestion), a
            value of the wrong type or out of range.
        """
        base = cls.default()
        if path is None:
            return base
        shipped = resources.files("leap.resources").joinpath(f"scenario_{path}.toml")
        if not Path(path).is_file() and shipped.is_file():  # a folder of that name too
            return cls.from_toml(shipped.read_text("utf-8"), origin=f"scenario '{path}'",
                                 base=base)
        try:
            text = Path(path).read_text("utf-8")
        except OSError as exc:
            raise ParamError(f"cannot read scenario file {path}: {exc.strerror}; "
                             "pass an existing TOML file as {scenario}") from None
        return cls.from_toml(text, origin=str(path), base=base)

    @classmethod
    def from_toml(cls, text: str, origin: str = "scenario", base: Scenario | None = None
                  ) -> Scenario:
        """Parse scenario TOML ``text``; keys it omits come from ``base`` (default: defaults)."""
        base = cls.default() if base is None else base
        return cls._from_mapping(_parse(text, origin), origin, base)

    @classmethod
    def _from_mapping(cls, doc: Mapping[str, Any], origin: str, base: Scenario | None
                      ) -> Scenario:
        types = {f.name: f.type for f in fields(cls)}
        values: dict[str, Any] = asdict(base) if base is not None else {}
        for key, value in doc.items():
            if key not in types:
                raise ConfigError(f"{origin}: unknown scenario key '{key}'"
                                  f"{did_you_mean(key, types)}")
            if key in _TABLES:
                values[key] = {**values.get(key, {}), **_table(origin, key, value)}
            else:
                values[key] = _coerce(origin, key, str(types[key]), value)
        missing = [k for k in types if k not in values]
        if missing:
            raise ConfigError(f"{origin}: missing scenario key(s) {', '.join(missing)}")
        scenario = cls(**values)
        scenario.validate(origin)
        return scenario

    def override(self, **changes: Any) -> Scenario:
        """A copy with ``changes`` applied and validated (e.g. ``attempts_per_day`` from CLI)."""
        for key, value in changes.items():
            changes[key] = _coerce("override", key, str({f.name: f.type for f in fields(self)}
                                                        [key]), value)
        scenario = replace(self, **changes)
        scenario.validate("override")
        return scenario

    def validate(self, origin: str = "scenario") -> None:
        """Refuse values outside their meaningful range, naming the key and the fix."""
        def need(ok: bool, key: str, rule: str) -> None:
            if not ok:
                raise ConfigError(f"{origin}: '{key}' = {getattr(self, key)!r} must be {rule}")

        for key in ("attempts_per_day", "n_model_types", "initial_families"):
            need(getattr(self, key) >= 1, key, ">= 1")
        for key in ("new_families_per_day", "family_log_eff_sd", "family_vendor_affinity_sd",
                    "type_vendor_sd", "drift_sd_per_day", "step_change_log_sd",
                    "attempt_noise_log_sd", "duration_log_sd", "new_hardware_day",
                    "default_capacity_share"):
            need(getattr(self, key) >= 0, key, ">= 0")
        for key in ("family_mean_lifetime_days", "family_rate_pareto_alpha", "family_rate_cap",
                    "duration_median_hours", "duration_cap_hours", "capacity_factor"):
            need(getattr(self, key) > 0, key, "> 0")
        for key in _PROBABILITIES:
            need(0.0 <= getattr(self, key) <= 1.0, key, "within [0, 1]")
        need(self.straggler_low <= self.straggler_high, "straggler_low",
             f"<= straggler_high ({self.straggler_high})")
        need(self.failure_prob + self.over_capacity_preemption_prob < 1.0, "failure_prob",
             "such that failure_prob + over_capacity_preemption_prob < 1")
        need(1 <= self.home_types_min <= self.home_types_max, "home_types_min",
             f">= 1 and <= home_types_max ({self.home_types_max})")
        need(self.home_types_max <= 8, "home_types_max", "<= 8")
        need(1 <= self.config_spread <= 6, "config_spread", "within [1, 6]")
        unknown = [c for c in self.category_share if c not in CATEGORIES]
        if unknown:
            raise ConfigError(f"{origin}: unknown category '{unknown[0]}' in [category_share]"
                              f"{did_you_mean(unknown[0], CATEGORIES)}; known: "
                              f"{', '.join(CATEGORIES)}")
        if sum(self.category_share.values()) <= 0:
            raise ConfigError(f"{origin}: [category_share] must give at least one category a "
                              "positive share")

    # Serialisation --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values (tables as dicts)."""
        out = asdict(self)
        for key in _TABLES:
            out[key] = dict(out[key])
        return out

    def to_toml(self) -> str:
        """The whole scenario as TOML; ``from_toml(to_toml())`` gives an equal scenario."""
        lines: list[str] = []
        tables: dict[str, Mapping[str, float]] = {}
        for key, value in self.to_dict().items():
            if key in _TABLES:
                tables[key] = value
            else:
                lines.append(f"{key} = {json.dumps(value)}")
        for key, table in tables.items():
            lines.append("")
            lines.append(f"[{key}]")
            lines.extend(f"{json.dumps(name)} = {float(v)!r}" for name, v in table.items())
        return "\n".join(lines) + "\n"

    def fingerprint(self) -> str:
        """A stable digest of every knob (the store records which scenario it holds)."""
        import hashlib

        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _parse(text: str, origin: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{origin}: not valid TOML ({exc})") from None


def _table(origin: str, key: str, value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        raise ConfigError(f"{origin}: '{key}' must be a table ([{key}]) of name = number")
    out: dict[str, float] = {}
    for name, share in value.items():
        if isinstance(share, bool) or not isinstance(share, int | float) \
                or not math.isfinite(share) or share < 0:
            raise ConfigError(f"{origin}: [{key}] '{name}' must be a number >= 0, "
                              f"got {share!r}")
        out[str(name)] = float(share)
    return out


def _coerce(origin: str, key: str, want: str, value: Any) -> Any:
    # Field types are strings under `from __future__ import annotations`.
    if want == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{origin}: '{key}' must be a string, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{origin}: '{key}' must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"{origin}: '{key}' must be finite, got {value!r}")
    if want == "int":
        if float(value) != int(value):
            raise ConfigError(f"{origin}: '{key}' must be a whole number, got {value!r}")
        return int(value)
    return float(value)
