"""Transfer to types a family never ran on: the estimate, masking without leaks, novelty."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import SMALL_AS_OF
from leap.catalog import Catalog
from leap.config import Workspace
from leap.data.store import Store
from leap.features import transfer
from leap.features.columns import SMALL, Columns
from leap.features.encode import (
    FEATURE_NAMES,
    NOVELTY_GROUPS,
    FeatureSpec,
    encode,
    novelty,
)
from leap.features.history import HistoryBuilder, prepare_history
from leap.features.transfer import BLEND_FAMILIES, SHRINK_FAMILIES, SHRINK_GAIN, TransferIndex
from leap.model.window import load_attempts, masked_rows

CAT = Catalog.default()


@pytest.fixture(scope="module")
def attempts(sim_workspace: Workspace) -> pd.DataFrame:
    with Store(sim_workspace.store_path, read_only=True) as store:
        return load_attempts(store, SMALL_AS_OF - timedelta(days=12),
                             SMALL_AS_OF + timedelta(days=1))


def _index(levels: dict[tuple[str, str], float], pairs: list[tuple],
           phys: float = 2.0) -> TransferIndex:
    """Families' residuals on types (their physics estimate ``phys`` everywhere)."""
    fam_hw = pd.DataFrame([{"family_id": f, "hardware": h, "fam_hw_med_r": r,
                            "fam_hw_med_y": r + phys} for (f, h), r in levels.items()])
    rows = [p if len(p) == 8 else (*p, 0.0, 0.0) for p in pairs]
    transfer = pd.DataFrame(rows, columns=["level", "key", "hw_a", "hw_b", "d_med", "n", "sxy",
                                           "sxx"])
    return TransferIndex(fam_hw, transfer)


def _keys(family: str, n: int, mt: str = "m1", cat: str = "vision") -> dict[str, np.ndarray]:
    return {"family_id": np.array([family] * n, dtype=object),
            "model_type": np.array([mt] * n, dtype=object),
            "model_category": np.array([cat] * n, dtype=object),
            "precision": np.array(["bf16"] * n, dtype=object)}


def _features(idx: TransferIndex, keys: dict[str, np.ndarray], hw: list[str],
              phys: float = 3.0) -> dict[str, np.ndarray]:
    return idx.features(keys, np.array(hw, dtype=object), CAT, np.full(len(hw), phys))


def test_transfer_carries_the_family_level_by_the_shrunk_pair_difference() -> None:
    idx = _index({("f", "A100-SXM4-80GB"): 0.5},
                 [("mt", "m1", "A100-SXM4-80GB", "H100-SXM", 0.2, 10.0)])
    out = _features(idx, _keys("f", 2), ["H100-SXM", "A100-SXM4-80GB"])
    # The model-type difference (10 families) shrinks toward the broader levels (none: 0).
    want = 0.5 + 10 * 0.2 / (10 + SHRINK_FAMILIES)
    assert out["xfer_d_r"][0] == pytest.approx(want)
    # No gain evidence: the whole physics gain applies, the residual carries over as is.
    assert out["xfer_gamma"][0] == 1.0 and out["xfer_g_r"][0] == pytest.approx(0.5)
    lam = 10 / (10 + BLEND_FAMILIES)
    assert out["xfer_r"][0] == pytest.approx(lam * want + (1 - lam) * 0.5)
    assert out["xfer_n_types"][0] == 1 and out["xfer_pair_n"][0] == 10
    # The family's own level on a type is never the estimate for that type.
    assert np.isnan(out["xfer_r"][1]) and out["xfer_n_types"][1] == 0
    assert out["xfer_dist"][0] > 0


def test_transfer_without_pair_evidence_is_the_physics_ratio_and_new_types_work() -> None:
    idx = _index({("f", "A100-SXM4-80GB"): 0.5, ("f", "L4"): 0.7}, [])
    # B200 appears nowhere in the history: the estimate is the family's mean residual.
    out = _features(idx, _keys("f", 1), ["B200"])
    assert out["xfer_r"][0] == pytest.approx(0.6)
    assert out["xfer_n_types"][0] == 2
    unknown = _features(idx, _keys("nobody", 1), ["B200"])
    assert np.isnan(unknown["xfer_r"][0]) and unknown["xfer_n_types"][0] == 0


def test_gain_share_carries_a_job_that_does_not_speed_up_as_physics_says() -> None:
    # Fleet evidence: between types, residuals fall by exactly the physics gain (slope -1),
    # so jobs like this get none of it (an input-bound job): gamma -> 0.
    idx = _index({("f", "L4"): -1.0}, [("all", "bf16", "L4", "T4", 0.0, 50.0, -20.0, 20.0)],
                 phys=2.0)
    out = _features(idx, _keys("f", 1), ["T4"], phys=5.0)
    gamma = 20.0 * 0.0 / (20.0 + SHRINK_GAIN) + SHRINK_GAIN * 1.0 / (20.0 + SHRINK_GAIN)
    assert out["xfer_gamma"][0] == pytest.approx(gamma)
    # Family's log throughput on L4 is 1.0 (= -1 + 2); the target's physics is 5 (+3).
    assert out["xfer_g_r"][0] + 5.0 == pytest.approx(1.0 + gamma * 3.0)
    # A type nobody ran on in the window (H100 here) has no pairs of its own: the fleet's
    # slope is not extrapolated to it, the whole physics gain applies.
    new = _features(idx, _keys("f", 1), ["H100-SXM"], phys=5.0)
    assert new["xfer_gamma"][0] == 1.0
    assert new["xfer_g_r"][0] + 5.0 == pytest.approx(1.0 + 3.0)


def test_transfer_features_are_the_same_for_one_row_and_many() -> None:
    idx = _index({("f", "A100-SXM4-80GB"): 0.5, ("g", "L4"): 0.1},
                 [("all", "bf16", "A100-SXM4-80GB", "L4", -0.3, 40.0, -3.0, 5.0),
                  ("cat", "vision/bf16", "A100-SXM4-80GB", "L4", -0.2, 8.0)])
    # More rows than the dict lookups of a few rows take (SMALL): both paths are compared.
    half = 3 * (SMALL // 6 + 10)
    hw = np.array(["L4", "T4", "H100-SXM"] * (2 * half // 3), dtype=object)
    keys = {k: np.concatenate([v, _keys("g", half)[k]]) for k, v in _keys("f", half).items()}
    big = idx.features(keys, hw, CAT, np.full(len(hw), 3.0))
    assert len(hw) == 2 * half > SMALL
    for i in (0, 1, 2, 95, half + 4):
        one = idx.features({k: v[i:i + 1] for k, v in keys.items()}, hw[i:i + 1], CAT,
                           np.full(1, 3.0))
        for name, arr in big.items():
            np.testing.assert_array_equal(arr[i:i + 1], one[name])


class _NoRatio:
    """A pair model that predicts no change beyond physics: ``xfer_p_r`` is then the median
    of the family's residuals on the types it is read from."""

    shape_boosters = ()

    def predict(self, jobs: Columns, hw_a: np.ndarray, hw_b: np.ndarray, catalog: Catalog,
                job: np.ndarray | None = None) -> np.ndarray:
        return np.zeros(len(hw_a))


def test_pair_estimate_reads_the_targets_vendor_first_and_takes_the_median() -> None:
    levels = {("f", "A100-SXM4-80GB"): 0.0, ("f", "H100-SXM"): 0.2, ("f", "L4"): 0.1,
              ("f", "TPU-v5e"): -1.0, ("t", "TPU-v5e"): -0.4, ("t", "Gaudi3"): 0.6}
    idx = _index(levels, [])
    idx.pairs = _NoRatio()  # type: ignore[assignment]
    hw = ["A10G", "TPU-v4", "A10G", "TPU-v5p"]
    keys = {k: np.concatenate([_keys("f", 2)[k], _keys("t", 2)[k]]) for k in _keys("f", 1)}
    jobs = Columns.from_frame(pd.DataFrame({"family_id": keys["family_id"], "hardware": hw,
                                            "batch_size": 8, "trainer_count": 1}))
    out = idx.features(keys, np.array(hw, dtype=object), CAT, np.full(4, 3.0), jobs)
    # f on an NVIDIA type: its three NVIDIA types (median 0.1), never its TPU level; on a
    # TPU: its TPU level alone. t ran on no NVIDIA type: every type it ran on (median 0.1).
    np.testing.assert_allclose(out["xfer_p_r"], [0.1, -1.0, 0.1, -0.4])
    np.testing.assert_allclose(out["xfer_p_sd"], [np.std([0.0, 0.2, 0.1]), 0.0,
                                                  np.std([-0.4, 0.6]), 0.0])
    # The other estimates still read every type the family ran on.
    assert out["xfer_n_types"].tolist() == [4, 4, 2, 2]


class _ShapeStep(_NoRatio):
    """Shape boosters that add 0.5 to any move between shapes, -0.5 on an L4."""

    shape_boosters = (None,)
    shape_reach = np.full(3, np.inf)
    neighbour_share = 0.0  # the boosters' carry alone

    def predict_shapes(self, jobs: Columns, a_shape: np.ndarray, catalog: Catalog,
                       job: np.ndarray | None = None) -> np.ndarray:
        on = jobs.take(np.arange(len(a_shape)) if job is None else job)
        return np.where(on.obj("hardware") == "L4", -0.5, 0.5)


def test_shape_estimate_reads_the_nearest_shapes_the_family_ran_on_the_type(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transfer, "SHAPE_NEAREST", 3)  # of the family's four H100 shapes
    shapes = pd.DataFrame(
        [("f", "H100-SXM", "1/8/16", 0.1), ("f", "H100-SXM", "1/8/32", 0.2),
         ("f", "H100-SXM", "1/8/64", 0.4), ("f", "H100-SXM", "8/8/64", 1.0),
         ("f", "L4", "1/8/128", 5.0)],
        columns=["family_id", "hardware", "shape", "fam_hw_shape_med_r"])
    fam_hw = pd.DataFrame({"family_id": "f", "hardware": ["H100-SXM", "L4"],
                           "fam_hw_med_r": 0.0, "fam_hw_med_y": 2.0})
    empty = pd.DataFrame(columns=["level", "key", "hw_a", "hw_b", "d_med", "n", "sxy", "sxx"])
    idx = TransferIndex(fam_hw, empty, _ShapeStep(), shapes)  # type: ignore[arg-type]
    hw = ["H100-SXM", "H100-SXM", "L4", "T4", "L4", "H100-SXM"]
    batch = [128, 16, 64, 64, 256, 256]
    keys = _keys("f", 6) | {"shape": np.array([f"1/8/{b}" for b in batch], dtype=object)}
    jobs = Columns.from_frame(pd.DataFrame({"family_id": "f", "hardware": hw,
                                            "trainer_count": 1, "devices_per_trainer": 8,
                                            "batch_size": batch}))
    out = idx.features(keys, np.array(hw, dtype=object), CAT, np.full(6, 3.0), jobs)
    # Batch 128 on H100: the three nearest shapes (64, 32, 16; not 8 trainers), median 0.2,
    # moved by 0.5. Batch 16 there is a shape it ran: the three nearest others (32, 64 and
    # 8 trainers of 64), never its own, median 0.4. On L4 its one shape, moved by -0.5; on
    # T4, where it never ran, none. The same job on L4 and on H100 is moved on each row's
    # own type.
    np.testing.assert_allclose(out["xfer_s_r"], [0.7, 0.9, 4.5, np.nan, 4.5, 0.7])
    for i in range(6):  # a row's estimate does not depend on the rows beside it
        one = idx.features({k: v[i:i + 1] for k, v in keys.items()},
                           np.array(hw[i:i + 1], dtype=object), CAT, np.full(1, 3.0),
                           jobs.take(np.array([i])))
        np.testing.assert_array_equal(one["xfer_s_r"], out["xfer_s_r"][i:i + 1])


def test_a_type_is_carried_from_the_jobs_own_shape_where_the_family_ran_it() -> None:
    # f ran two shapes on A100: batch 16 (residual 0.9) and 64 (-0.1; median over both 0.4).
    shapes = pd.DataFrame([("f", "A100-SXM4-80GB", "1/1/16", 0.9),
                           ("f", "A100-SXM4-80GB", "1/1/64", -0.1)],
                          columns=["family_id", "hardware", "shape", "fam_hw_shape_med_r"])
    fam_hw = pd.DataFrame({"family_id": ["f"], "hardware": ["A100-SXM4-80GB"],
                           "fam_hw_med_r": [0.4], "fam_hw_med_y": [2.4]})
    empty = pd.DataFrame(columns=["level", "key", "hw_a", "hw_b", "d_med", "n", "sxy", "sxx"])
    idx = TransferIndex(fam_hw, empty, None, shapes)
    batch = [16, 64, 32]
    keys = _keys("f", 3) | {"shape": np.array([f"1/1/{b}" for b in batch], dtype=object)}
    for pairs in (None, _NoRatio()):
        idx.pairs = pairs  # type: ignore[assignment]
        jobs = Columns.from_frame(pd.DataFrame({"family_id": "f", "hardware": "H100-SXM",
                                                "trainer_count": 1, "batch_size": batch}))
        out = idx.features(keys, np.array(["H100-SXM"] * 3, dtype=object), CAT,
                           np.full(3, 3.0), jobs)
        # Its own shape's residual where it ran that shape on A100, else the median there.
        np.testing.assert_allclose(out["xfer_d_r"], [0.9, -0.1, 0.4])
        if pairs is not None:
            np.testing.assert_allclose(out["xfer_p_r"], [0.9, -0.1, 0.4])


def test_the_pair_estimate_reads_a_type_at_the_jobs_shape_by_the_shape_boosters() -> None:
    # f ran batch 16 (residual 0.9) and 64 (-0.1) on A100 and batch 32 (0.2) on L4.
    shapes = pd.DataFrame([("f", "A100-SXM4-80GB", "1/1/16", 0.9),
                           ("f", "A100-SXM4-80GB", "1/1/64", -0.1), ("f", "L4", "1/1/32", 0.2)],
                          columns=["family_id", "hardware", "shape", "fam_hw_shape_med_r"])
    fam_hw = pd.DataFrame({"family_id": "f", "hardware": ["A100-SXM4-80GB", "L4"],
                           "fam_hw_med_r": [0.4, 0.2], "fam_hw_med_y": [2.4, 2.2]})
    empty = pd.DataFrame(columns=["level", "key", "hw_a", "hw_b", "d_med", "n", "sxy", "sxx"])
    idx = TransferIndex(fam_hw, empty, _ShapeStep(), shapes)  # type: ignore[arg-type]
    batch = [16, 32]
    keys = _keys("f", 2) | {"shape": np.array([f"1/1/{b}" for b in batch], dtype=object)}
    jobs = Columns.from_frame(pd.DataFrame({"family_id": "f", "hardware": "H100-SXM",
                                            "trainer_count": 1, "devices_per_trainer": 1,
                                            "batch_size": batch}))
    out = idx.features(keys, np.array(["H100-SXM"] * 2, dtype=object), CAT, np.full(2, 3.0),
                       jobs)
    # Batch 16: its own residual on A100 (0.9), and L4's batch 32 moved to 16 there (0.2 -
    # 0.5); their median. Batch 32: A100's two shapes moved to 32 (median 0.4 + 0.5) and
    # its own on L4 (0.2).
    np.testing.assert_allclose(out["xfer_p_r"], [np.median([0.9, -0.3]),
                                                 np.median([0.9, 0.2])])
    # The pair differences still read a type's median where the job's shape is not there.
    np.testing.assert_allclose(out["xfer_d_r"], [np.mean([0.9, 0.2]), np.mean([0.4, 0.2])])
    # Boosters that learned batch moves of at most 1.5x carry no shape here (each move is
    # 2x): a type's median where the family never ran the job's shape there.
    idx.pairs.shape_reach = np.array([np.inf, np.inf, np.log(1.5)])  # type: ignore[union-attr]
    out = idx.features(keys, np.array(["H100-SXM"] * 2, dtype=object), CAT, np.full(2, 3.0),
                       jobs)
    np.testing.assert_allclose(out["xfer_p_r"], [np.median([0.9, 0.2]),
                                                 np.median([0.4, 0.2])])


def test_a_type_is_carried_from_the_same_work_in_another_layout() -> None:
    # f ran 4 devices as 2 hosts x 2 (per-trainer batch 64, global 128) on A100 (residual
    # 0.9) and as 1 x 4 and 4 x 1 at global batch 256 (0.2 and 0.4); its median there is 0.
    rows = [("2/2/64", 0.9), ("1/4/256", 0.2), ("4/1/64", 0.4), ("1/1/8", -0.5), ("1/1/9", 0.0),
            ("1/1/10", 0.5)]
    shapes = pd.DataFrame([("f", "A100-SXM4-80GB", s, r) for s, r in rows],
                          columns=["family_id", "hardware", "shape", "fam_hw_shape_med_r"])
    fam_hw = pd.DataFrame({"family_id": ["f"], "hardware": ["A100-SXM4-80GB"],
                           "fam_hw_med_r": [0.0], "fam_hw_med_y": [2.0]})
    empty = pd.DataFrame(columns=["level", "key", "hw_a", "hw_b", "d_med", "n", "sxy", "sxx"])
    idx = TransferIndex(fam_hw, empty, None, shapes)
    # The target's hosts hold 4: the same work is 1 x 4 at 128, 1 x 4 at 256 (ran as is),
    # 2 x 2 at per-trainer 128 (global 256: two layouts, their mean), 1 x 2 (never).
    shape = [(1, 4, 128), (1, 4, 256), (2, 2, 128), (1, 2, 64)]
    tc, dpt, batch = (list(c) for c in zip(*shape, strict=True))
    keys = _keys("f", 4) | {"shape": np.array(["/".join(map(str, s)) for s in shape],
                                              dtype=object)}
    jobs = Columns.from_frame(pd.DataFrame({"family_id": "f", "hardware": "H100-SXM",
                                            "trainer_count": tc, "devices_per_trainer": dpt,
                                            "batch_size": batch}))
    out = idx.features(keys, np.array(["H100-SXM"] * 4, dtype=object), CAT, np.full(4, 3.0),
                       jobs)
    np.testing.assert_allclose(out["xfer_d_r"], [0.9, 0.2, 0.3, 0.0])
    # Without the job columns only the exact shape is read.
    out = idx.features(keys, np.array(["H100-SXM"] * 4, dtype=object), CAT, np.full(4, 3.0))
    np.testing.assert_allclose(out["xfer_d_r"], [0.0, 0.2, 0.0, 0.0])


def test_without_shape_boosters_a_shape_moves_as_the_family_moved_on_its_other_types(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TransferIndex, "carries_shape_moves", lambda self: True)
    # f ran 1 and 8 devices at batch 16 on A100 (residuals 0.2 and 0.5) and on H100 (0.0 and
    # 0.6), one device on L4 (1.0) and on T4 batch 16 and 32 (0.3, 0.1).
    rows = [("A100-SXM4-80GB", "1/1/16", 0.2), ("A100-SXM4-80GB", "1/8/16", 0.5),
            ("H100-SXM", "1/1/16", 0.0), ("H100-SXM", "1/8/16", 0.6), ("L4", "1/1/16", 1.0),
            ("T4", "1/1/16", 0.3), ("T4", "1/1/32", 0.1)]
    shapes = pd.DataFrame([("f", h, s, r) for h, s, r in rows],
                          columns=["family_id", "hardware", "shape", "fam_hw_shape_med_r"])
    fam_hw = pd.DataFrame({"family_id": "f", "hardware": ["A100-SXM4-80GB", "H100-SXM", "L4",
                                                          "T4"],
                           "fam_hw_med_r": 0.0, "fam_hw_med_y": 2.0})
    empty = pd.DataFrame(columns=["level", "key", "hw_a", "hw_b", "d_med", "n", "sxy", "sxx"])
    idx = TransferIndex(fam_hw, empty, None, shapes)
    hw = ["L4", "L4", "A100-SXM4-80GB", "T4", "V100-SXM2-32GB"]
    shape = [(1, 8, 16), (1, 1, 16), (1, 8, 16), (1, 8, 16), (1, 8, 16)]
    tc, dpt, batch = (list(c) for c in zip(*shape, strict=True))
    keys = _keys("f", 5) | {"shape": np.array(["/".join(map(str, s)) for s in shape],
                                              dtype=object)}
    jobs = Columns.from_frame(pd.DataFrame({"family_id": "f", "hardware": hw,
                                            "trainer_count": tc, "devices_per_trainer": dpt,
                                            "batch_size": batch}))
    out = idx.features(keys, np.array(hw, dtype=object), CAT, np.full(5, 3.0), jobs)
    # 8 devices on L4: its one device (1.0) moved as on A100 (+0.3) and on H100 (+0.6),
    # their median. One device on L4 is a shape it ran, but never read from itself: no
    # other shape there. On A100 its own 8 devices are never read: its one device (0.2)
    # moved as on H100 (+0.6) alone. On T4 its two shapes, each moved as on A100 and H100
    # where it ran both (batch 32 on neither). On a type it never ran on, nothing.
    np.testing.assert_allclose(out["xfer_s_r"], [1.0 + 0.45, np.nan, 0.8, 0.3 + 0.45, np.nan])
    for i in range(5):  # a row's estimate does not depend on the rows beside it
        one = idx.features({k: v[i:i + 1] for k, v in keys.items()},
                           np.array(hw[i:i + 1], dtype=object), CAT, np.full(1, 3.0),
                           jobs.take(np.array([i])))
        np.testing.assert_array_equal(one["xfer_s_r"], out["xfer_s_r"][i:i + 1])
    # Where the pair model has shape boosters, they carry shapes instead; where they reach
    # none of the family's shapes there (boosters that learned no device moves), the moves.
    idx.pairs = _ShapeStep()  # type: ignore[assignment]
    out = idx.features(keys, np.array(hw, dtype=object), CAT, np.full(5, 3.0), jobs)
    assert out["xfer_s_r"][0] == pytest.approx(0.5)  # L4's one device, moved by -0.5
    idx.pairs.shape_reach = np.array([np.inf, 0.0, np.inf])  # type: ignore[attr-defined]
    out = idx.features(keys, np.array(hw, dtype=object), CAT, np.full(5, 3.0), jobs)
    assert out["xfer_s_r"][0] == pytest.approx(1.45)


def _moves_window(transfers: bool, n_families: int = 10) -> TransferIndex:
    """Families on three types at four shapes: each family's move between shapes is the same
    on every type (``transfers``), or each cell is the family's level plus noise."""
    rng = np.random.default_rng(5)
    shapes = ["1/1/16", "1/8/16", "1/1/32", "1/8/32"]
    rows = []
    for f in range(n_families):
        move = rng.normal(0.0, 1.0, len(shapes))
        for h, level in (("A100-SXM4-80GB", 0.1), ("H100-SXM", -0.2), ("L4", 0.4)):
            for k, shape in enumerate(shapes):
                r = level + (move[k] if transfers else rng.normal(0.0, 0.3))
                rows.append((f"f{f}", h, shape, r))
    table = pd.DataFrame(rows, columns=["family_id", "hardware", "shape", "fam_hw_shape_med_r"])
    fam_hw = table.groupby(["family_id", "hardware"], as_index=False)["fam_hw_shape_med_r"] \
        .median().rename(columns={"fam_hw_shape_med_r": "fam_hw_med_r"})
    fam_hw["fam_hw_med_y"] = fam_hw["fam_hw_med_r"] + 2.0
    empty = pd.DataFrame(columns=["level", "key", "hw_a", "hw_b", "d_med", "n", "sxy", "sxx"])
    return TransferIndex(fam_hw, empty, None, table)


def test_shape_moves_carry_only_where_the_window_says_they_transfer() -> None:
    keys = _keys("f0", 1) | {"shape": np.array(["1/8/16"], dtype=object)}
    jobs = Columns.from_frame(pd.DataFrame({"family_id": ["f0"], "hardware": ["L4"],
                                            "trainer_count": [1], "devices_per_trainer": [8],
                                            "batch_size": [16]}))
    for transfers in (True, False):
        idx = _moves_window(transfers)
        assert idx.carries_shape_moves() is transfers
        out = idx.features(keys, np.array(["L4"], dtype=object), CAT, np.full(1, 3.0), jobs)
        assert bool(np.isfinite(out["xfer_s_r"][0])) is transfers
    # Too few cells to judge (two families: 24): no moves.
    assert _moves_window(True, n_families=2).carries_shape_moves() is False


def test_novelty_groups_follow_the_history_of_each_row() -> None:
    pos = {n: i for i, n in enumerate(FEATURE_NAMES)}
    X = np.full((4, len(FEATURE_NAMES)), np.nan)
    X[0, [pos["fam_hw_shape_n"], pos["fam_hw_n"], pos["fam_n"]]] = 1
    X[1, [pos["fam_hw_n"], pos["fam_n"]]] = 1
    X[2, pos["fam_n"]] = 1
    X[2, pos["xfer_n_types"]] = 7
    X[3, pos["xfer_n_types"]] = 0
    assert [NOVELTY_GROUPS[g] for g in novelty(X, FEATURE_NAMES)] == [
        "seen_config", "seen_pair_new_shape", "unobserved_pair_3plus", "new_family"]


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), share=st.sampled_from([0.3, 1.0]))
def test_masked_rows_cannot_see_their_own_pair(attempts: pd.DataFrame, seed: int,
                                               share: float) -> None:
    """A masked row's features equal those built from a history where its (family, type)
    never happened, and do not move when that pair's outcomes change."""
    as_of = SMALL_AS_OF - timedelta(days=1)
    past = attempts[attempts["submitted_at"] < as_of]
    day = attempts[(attempts["submitted_at"] >= as_of) & (attempts["submitted_at"] < SMALL_AS_OF)
                   & (attempts["status"] == "succeeded")].head(400).reset_index(drop=True)
    spec = FeatureSpec(names=FEATURE_NAMES, vocab=FeatureSpec.fit(day, CAT).vocab)
    builder = HistoryBuilder(prepare_history(past, CAT))
    X_day = encode(day, builder.snapshot(as_of), CAT, spec)
    Xm, rows = masked_rows(day, X_day, builder, as_of, CAT, spec, np.random.default_rng(seed),
                           share=share)
    assert len(rows) > 0
    pairs = day.iloc[rows][["family_id", "hardware"]].drop_duplicates()
    # Pair history is gone from every masked row.
    assert not np.isfinite(Xm[:, FEATURE_NAMES.index("fam_hw_n")]).any()
    # Poison every outcome of the masked pairs: the masked rows must not change.
    hit = past.merge(pairs.assign(_hit=True), on=["family_id", "hardware"], how="left")[
        "_hit"].fillna(False).to_numpy(dtype=bool)
    poisoned = past.copy()
    poisoned.loc[hit, "throughput"] *= 1000.0
    Xp, rows_p = masked_rows(day, X_day, HistoryBuilder(prepare_history(poisoned, CAT)), as_of,
                             CAT, spec, np.random.default_rng(seed), share=share)
    np.testing.assert_array_equal(rows, rows_p)
    np.testing.assert_array_equal(Xm, Xp)
    # ... and they equal the rows encoded from a history without those pairs at all.
    removed = HistoryBuilder(prepare_history(past[~hit], CAT)).snapshot(as_of)
    np.testing.assert_array_equal(Xm, encode(day.iloc[rows], removed, CAT, spec))


def test_snapshot_exclusion_of_nothing_changes_nothing(attempts: pd.DataFrame) -> None:
    as_of = datetime(2026, 1, 10, tzinfo=UTC)
    builder = HistoryBuilder(prepare_history(attempts[attempts["submitted_at"] < as_of], CAT))
    a = builder.snapshot(as_of)
    b = builder.snapshot(as_of, exclude=pd.DataFrame({"family_id": ["no-such"],
                                                      "hardware": ["L4"]}))
    for name in a.tables:
        pd.testing.assert_frame_equal(a.tables[name], b.tables[name])


@pytest.mark.parametrize("n", [3, 300])
def test_missing_key_text_is_none_on_both_paths(n: int) -> None:
    """A request (few rows) and a training frame (many rows) must key a missing category the
    same way as history does ("None"), whatever pandas does with NaN in ``astype(str)``."""
    from leap.features.columns import Columns

    frame = pd.DataFrame({"model_category": [np.nan] * n, "precision": [None] * n})
    cols = Columns.from_frame(frame)
    assert set(cols.text("model_category")) == {"None"} == set(cols.text("precision"))


def test_encoding_in_blocks_gives_the_same_rows(trained_workspace: Workspace,
                                                attempts: pd.DataFrame,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows are encoded a block at a time (bounded memory on a large day); any block size,
    blocks small enough for the request path's dict lookups included, and blocks computed
    at once on threads, gives the same matrix as the whole, whose lookups go through
    pandas."""
    import leap.features.encode as encode_module
    from leap.model.artifact import Registry

    art = Registry(trained_workspace.models_dir).load()
    assert art.snapshot.pairs is not None, "the pair and shape estimates are exercised"
    day = attempts.iloc[-(SMALL + 300):]  # the latest rows, more than the dict paths take
    whole = encode(day, art.snapshot, CAT, art.full_spec)
    monkeypatch.setattr(encode_module, "ENCODE_CHUNK_ROWS", 1000)  # blocks of 1,000 and less
    np.testing.assert_array_equal(encode(day, art.snapshot, CAT, art.full_spec), whole)
    # Blocks computed at once on threads (a batch prediction): the same rows, in order.
    monkeypatch.setattr(encode_module, "THREADED_MIN_ROWS", 500)
    for threads in (2, 3):
        np.testing.assert_array_equal(
            encode(day, art.snapshot, CAT, art.full_spec, threads=threads), whole)
    small = encode(day, art.snapshot, CAT, art.full_spec, dtype=np.float32)
    assert small.dtype == np.float32
    np.testing.assert_array_equal(small, whole.astype(np.float32))
    # Repeated configurations are encoded once; each row is what it is encoded alone.
    distinct = Columns.from_frame(day).codes(encode_module.DISTINCT_KEY)[1]
    assert len(distinct) < len(day)
    for i in range(0, len(day), 37):
        np.testing.assert_array_equal(encode(day.iloc[[i]], art.snapshot, CAT, art.full_spec),
                                      whole[[i]])


def _window(n_families: int = 6, truth: str = "bandwidth"
            ) -> tuple[TransferIndex, Columns, dict[str, np.ndarray]]:
    """Families that each ran one shape on three types, every move between two types exactly
    the memory-bandwidth ratio (a job the compute-bound physics estimate misjudges), or with
    ``truth="physics"`` exactly the physics estimate's ratio; and family f2's job on B200."""
    from leap.features.physics import estimates

    types = ["A100-SXM4-80GB", "L4", "MI300X"]
    job = {"trainer_count": 1, "batch_size": 32, "devices_per_trainer": 1,
           "flops_per_sample": 1e12, "num_params": 1e8, "precision": "bf16"}
    phys = estimates(pd.DataFrame([{**job, "hardware": h} for h in types]), CAT)["log_phys_sps"]
    rows = []
    for i in range(n_families):
        for h, p in zip(types, phys, strict=True):
            y = 0.1 * i + (np.log(CAT[h].mem_bw_gb_per_s) if truth == "bandwidth" else p)
            rows.append({"family_id": f"f{i}", "hardware": h, "shape": "1/1/32",
                         "fam_hw_shape_med_y": y, "fam_hw_shape_med_r": y - p})
    shapes = pd.DataFrame(rows)
    fam_hw = shapes.drop(columns="shape").rename(columns={"fam_hw_shape_med_y": "fam_hw_med_y",
                                                          "fam_hw_shape_med_r": "fam_hw_med_r"})
    empty = pd.DataFrame(columns=["level", "key", "hw_a", "hw_b", "d_med", "n", "sxy", "sxx"])
    idx = TransferIndex(fam_hw, empty, None, shapes)
    target = Columns.from_frame(pd.DataFrame([{**job, "family_id": "f2", "hardware": "B200"}]))
    return idx, target, _keys("f2", 1) | {"shape": np.array(["1/1/32"], dtype=object)}


def test_a_type_nobody_ran_on_is_carried_by_the_spec_rule_the_window_favours() -> None:
    from leap.features.physics import estimates

    idx, job, keys = _window()
    # Every move in the window is the bandwidth ratio: the rule's FLOP/s share is 0.
    assert idx.spec_rule(CAT) == 0.0
    phys_b = estimates(job, CAT)["log_phys_sps"]
    out = idx.features(keys, np.array(["B200"], dtype=object), CAT, phys_b, job)
    # B200 is in nobody's history: f2's level, carried by the bandwidth ratio alone.
    want = 0.2 + np.log(CAT["B200"].mem_bw_gb_per_s)
    assert out["xfer_r"][0] + phys_b[0] == pytest.approx(want)
    assert out["xfer_g_r"][0] + phys_b[0] == pytest.approx(want)
    # A type the window holds is not carried by the rule: the physics ratio, as before.
    on_l4 = job.with_hardware(np.array(["L4"], dtype=object))
    phys_l4 = estimates(on_l4, CAT)["log_phys_sps"]
    seen = idx.features(keys, np.array(["L4"], dtype=object), CAT, phys_l4, on_l4)
    level = [0.2 + np.log(CAT[h].mem_bw_gb_per_s) - p for h, p in zip(
        ["A100-SXM4-80GB", "MI300X"], estimates(job.with_hardware(np.array(
            ["A100-SXM4-80GB", "MI300X"], dtype=object)), CAT)["log_phys_sps"], strict=True)]
    assert seen["xfer_g_r"][0] == pytest.approx(np.mean(level))


def test_the_physics_ratio_stays_where_it_carries_the_window_as_well() -> None:
    from leap.features.physics import estimates

    idx, job, keys = _window(truth="physics")
    # Every move is the physics ratio: a tie with any other share keeps it.
    assert idx.spec_rule(CAT) is None
    phys_b = estimates(job, CAT)["log_phys_sps"]
    out = idx.features(keys, np.array(["B200"], dtype=object), CAT, phys_b, job)
    assert out["xfer_r"][0] == pytest.approx(0.2)  # the family's residual, carried as is
    # Too few moves to judge (2 families x 6 moves): the physics ratio.
    few, _, _ = _window(n_families=2)
    assert few.spec_rule(CAT) is None


def _twin_window(twin_gap: float = 0.0) -> tuple[TransferIndex, Catalog]:
    """20 families, one shape each on five types: two A100 40GB twins (spec distance 0.003)
    where every family's residual is alike (or ``twin_gap`` apart), and three unlike types
    where the physics estimate is off by a type's own amount. The catalog adds A100-NEW, a
    third twin nobody ran on."""
    from dataclasses import replace

    offset = {"A100-PCIe-40GB": 0.0, "A100-SXM4-40GB": twin_gap, "H100-SXM": 1.0,
              "A10G": 0.8, "L4": -1.0}
    rows = [{"family_id": f"f{i}", "hardware": h, "shape": "1/1/32",
             "fam_hw_shape_med_r": 0.1 * i + off, "fam_hw_shape_med_y": 0.1 * i + off + 2.0}
            for i in range(20) for h, off in offset.items()]
    # Family g ran on every type but the PCIe twin.
    rows += [{"family_id": "g", "hardware": h, "shape": "1/1/32", "fam_hw_shape_med_r": off,
              "fam_hw_shape_med_y": off + 2.0} for h, off in offset.items()
             if h != "A100-PCIe-40GB"]
    shapes = pd.DataFrame(rows)
    fam_hw = shapes.drop(columns="shape").rename(columns={"fam_hw_shape_med_y": "fam_hw_med_y",
                                                          "fam_hw_shape_med_r": "fam_hw_med_r"})
    empty = pd.DataFrame(columns=["level", "key", "hw_a", "hw_b", "d_med", "n", "sxy", "sxx"])
    idx = TransferIndex(fam_hw, empty, _NoRatio(), shapes)  # type: ignore[arg-type]
    cat = Catalog([*(CAT[h] for h in CAT), replace(CAT["A100-SXM4-40GB"], name="A100-NEW")])
    return idx, cat


def test_a_type_nobody_ran_on_is_read_from_its_twins_where_the_window_favours_them() -> None:
    idx, cat = _twin_window()
    # Read from its twin, every A100 cell of the window lands; from its four nearest types
    # (its twin, A10G, H100, L4: median 0.4 off) none does.
    assert idx.twin_distance(cat) == transfer.TWIN_DISTANCES[0]
    fams = ["f3", "g"]
    keys = {k: np.concatenate([_keys(f, 1)[k] for f in fams]) for k in _keys("f", 1)}
    keys["shape"] = np.array(["1/1/32"] * 2, dtype=object)
    for hw, want in ((["A100-NEW", "A100-NEW"], [0.3, 0.0]),
                     # A type the window knows: its pair evidence stands, the nearest four.
                     (["L4", "A100-PCIe-40GB"], [np.median([0.3, 0.3, 1.1, 1.3]),
                                                  np.median([0.0, 0.8, 1.0, -1.0])])):
        jobs = Columns.from_frame(pd.DataFrame({"family_id": fams, "hardware": hw,
                                                "batch_size": 32, "trainer_count": 1}))
        out = idx.features(keys, np.array(hw, dtype=object), cat, np.full(2, 3.0), jobs)
        np.testing.assert_allclose(out["xfer_p_r"], want)


def test_twins_that_disagree_are_read_like_any_other_types() -> None:
    # Twins half a log apart: each misses the other's level as badly as the nearest four.
    idx, cat = _twin_window(twin_gap=0.5)
    assert idx.twin_distance(cat) is None


def test_a_type_nobody_ran_on_is_read_from_the_nearest_of_many_types_a_family_ran_on() -> None:
    """A family that ran on LOCAL_MIN_TYPES of the target's vendor's types or more is read
    from its nearest type alone; one that ran on fewer, by the pair model from its nearest
    PAIR_NEAREST (here a pair model that predicts no change: their median)."""
    from dataclasses import replace

    many = ["V100-SXM2-32GB", "T4", "A10G", "L4", "L40S", "A100-SXM4-80GB", "H100-PCIe",
            "H100-SXM", "H200"]
    few = ["A10G", "L4", "H100-PCIe", "H100-SXM"]
    assert len(many) >= transfer.LOCAL_MIN_TYPES > len(few)
    off = {h: 0.1 * k for k, h in enumerate(many)}   # each type's residual its own
    rows = [{"family_id": fam, "hardware": h, "shape": "1/1/32", "fam_hw_shape_med_r": off[h],
             "fam_hw_shape_med_y": off[h] + 2.0}
            for fam, types in (("g", many), ("s", few)) for h in types]
    shapes = pd.DataFrame(rows)
    fam_hw = shapes.drop(columns="shape").rename(columns={"fam_hw_shape_med_y": "fam_hw_med_y",
                                                          "fam_hw_shape_med_r": "fam_hw_med_r"})
    empty = pd.DataFrame(columns=["level", "key", "hw_a", "hw_b", "d_med", "n", "sxy", "sxx"])
    idx = TransferIndex(fam_hw, empty, _NoRatio(), shapes)  # type: ignore[arg-type]
    idx.spec_rule = lambda catalog: None  # type: ignore[method-assign]  # moves: physics ratio
    h100 = CAT["H100-SXM"]
    # Half again H100's FLOP/s and bandwidth: nearest to H200 (0.45 in summed log ratios).
    new = replace(h100, name="H100-NEW", peak_bf16_tflops=1.5 * h100.peak_bf16_tflops,
                  mem_bw_gb_per_s=1.5 * h100.mem_bw_gb_per_s)
    cat = Catalog([*(CAT[h] for h in CAT), new])
    fams = ["g", "s"]
    keys = {k: np.concatenate([_keys(f, 1)[k] for f in fams]) for k in _keys("f", 1)}
    keys["shape"] = np.array(["1/1/32"] * 2, dtype=object)
    hw = np.array(["H100-NEW"] * 2, dtype=object)
    jobs = Columns.from_frame(pd.DataFrame({"family_id": fams, "hardware": hw,
                                            "batch_size": 32, "trainer_count": 1}))
    out = idx.features(keys, hw, cat, np.full(2, 3.0), jobs)
    np.testing.assert_allclose(out["xfer_p_r"], [off["H200"], np.median([off[h] for h in few])])
    # A type the window knows (H100-SXM, g's own level left out) is read by the pair model
    # however many types the family ran on: the median of its four nearest, not H200 alone.
    def spec(h: str) -> np.ndarray:
        return np.log([cat[h].peak_bf16_tflops, cat[h].mem_bw_gb_per_s])

    others = [h for h in many if h != "H100-SXM"]
    near = sorted(others, key=lambda h: np.abs(spec(h) - spec("H100-SXM")).sum())[:4]
    known = np.array(["H100-SXM"] * 2, dtype=object)
    out = idx.features(keys, known, cat, np.full(2, 3.0), jobs.with_hardware(known))
    assert out["xfer_p_r"][0] == pytest.approx(np.median([off[h] for h in near]))
    assert out["xfer_p_r"][0] != pytest.approx(off["H200"])


def test_without_flops_the_physics_estimate_is_the_spec_proxy_not_the_batch() -> None:
    """A job with a parameter count but no FLOPs: the weight-streaming bound is reported, but
    the estimate residuals are read over is the hardware proxy, which no batch size moves
    (public tables run each type at the largest batch that fits its memory)."""
    from leap.features.physics import estimates

    rows = [{"hardware": h, "trainer_count": 1, "devices_per_trainer": 1, "batch_size": b,
             "num_params": 1.5e8, "precision": "fp16"}
            for h in ("A100-SXM4-80GB", "H100-SXM") for b in (8, 64)]
    est = estimates(pd.DataFrame(rows), CAT)
    phys, stream = est["log_phys_sps"], est["log_weight_stream_sps"]
    assert phys[0] == pytest.approx(phys[1]) and phys[2] == pytest.approx(phys[3])
    assert stream[1] - stream[0] == pytest.approx(np.log(8.0))
    a, h = CAT["A100-SXM4-80GB"], CAT["H100-SXM"]
    assert phys[2] - phys[0] == pytest.approx(
        0.5 * np.log(h.peak_bf16_tflops / a.peak_bf16_tflops)
        + 0.5 * np.log(h.mem_bw_gb_per_s / a.mem_bw_gb_per_s))
