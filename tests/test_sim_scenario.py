"""Tests for the simulator scenario: defaults, user overrides, errors that say how to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from leap.errors import ConfigError
from leap.sim.scenario import CATEGORIES, Scenario


def test_defaults_match_the_paper_fleet() -> None:
    sc = Scenario.load()
    assert sc.attempts_per_day == 25000
    assert sc.n_model_types == 660
    assert sc.initial_families >= 1000
    assert sc.family_log_eff_sd == pytest.approx(0.5)
    assert sc.family_vendor_affinity_sd == pytest.approx(0.2)
    assert sc.attempt_noise_log_sd == pytest.approx(0.10)
    assert sc.new_hardware == "B200" and sc.new_hardware_day > 0
    assert set(sc.category_share) == set(CATEGORIES)
    # A realistic pool: many A100/H100, few B200.
    assert sc.capacity_share["H100-SXM"] > 3 * sc.capacity_share["B200"]


def test_user_file_overrides_only_its_keys_and_merges_tables(tmp_path: Path) -> None:
    f = tmp_path / "sc.toml"
    f.write_text('attempts_per_day = 500\nnew_hardware = ""\n[capacity_share]\n"T4" = 50.0\n')
    sc = Scenario.load(f)
    base = Scenario.load()
    assert sc.attempts_per_day == 500
    assert sc.new_hardware == ""
    assert sc.capacity_share["T4"] == 50.0
    assert sc.capacity_share["H100-SXM"] == base.capacity_share["H100-SXM"]
    assert sc.n_model_types == base.n_model_types


def test_toml_round_trip_is_exact() -> None:
    sc = Scenario.load().override(attempts_per_day=123, drift_sd_per_day=0.02)
    again = Scenario.from_toml(sc.to_toml())
    assert again == sc
    assert again.fingerprint() == sc.fingerprint()
    assert again.fingerprint() != Scenario.load().fingerprint()


def test_unknown_key_suggests_the_right_one(tmp_path: Path) -> None:
    f = tmp_path / "typo.toml"
    f.write_text("atempts_per_day = 10\n")
    with pytest.raises(ConfigError, match=r"unknown scenario key 'atempts_per_day'; did you "
                                          r"mean 'attempts_per_day'\?"):
        Scenario.load(f)


def test_wrong_type_names_the_key(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text('initial_families = "many"\n')
    with pytest.raises(ConfigError, match=r"'initial_families' must be a number, got 'many'"):
        Scenario.load(f)
    f.write_text("initial_families = 10.5\n")
    with pytest.raises(ConfigError, match=r"'initial_families' must be a whole number"):
        Scenario.load(f)


@pytest.mark.parametrize(("key", "value", "rule"), [
    ("failure_prob", 1.5, r"within \[0, 1\]"),
    ("attempts_per_day", 0, ">= 1"),
    ("duration_median_hours", -1.0, "> 0"),
    ("home_types_min", 5, ">= 1 and <= home_types_max"),
])
def test_out_of_range_values_are_refused(key: str, value: float, rule: str) -> None:
    with pytest.raises(ConfigError, match=f"'{key}' = .* must be {rule}"):
        Scenario.load().override(**{key: value})


def test_unknown_category_and_bad_table(tmp_path: Path) -> None:
    f = tmp_path / "cat.toml"
    f.write_text("[category_share]\nvisoin = 1.0\n")
    with pytest.raises(ConfigError, match=r"unknown category 'visoin'.*did you mean 'vision'"):
        Scenario.load(f)
    f.write_text('[capacity_share]\n"T4" = -1\n')
    with pytest.raises(ConfigError, match=r"\[capacity_share\] 'T4' must be a number >= 0"):
        Scenario.load(f)


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read scenario file .*nope\.toml"):
        Scenario.load(tmp_path / "nope.toml")
    f = tmp_path / "broken.toml"
    f.write_text("attempts_per_day = = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Scenario.load(f)


def test_shipped_scenario_by_name_even_beside_a_folder_of_that_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--scenario novel`` names the shipped scenario, also where the working directory
    has a folder called ``novel`` (it was read as a file and refused)."""
    (tmp_path / "novel").mkdir()
    monkeypatch.chdir(tmp_path)
    novel = Scenario.load(Path("novel"))
    assert novel.config_spread > 1
    assert novel.base_config_share < Scenario.default().base_config_share
