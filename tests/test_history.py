"""History snapshots: the statistics SQL gives over the same rows, the same to the last bit
whatever order the rows come in, and history prepared in chunks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import duckdb
import numpy as np
import pandas as pd
import pytest

import leap.features.history as history_module
from leap.catalog import Catalog
from leap.features.columns import groups
from leap.features.history import LEVELS, TRANSFER, HistoryBuilder, prepare_history


def _history(n: int, seed: int = 0) -> pd.DataFrame:
    """``n`` prepared history rows (the columns of :func:`prepare_history`), over 10 days."""
    rng = np.random.default_rng(seed)
    fam = rng.integers(0, 400, n)
    hw = rng.choice(["A100", "H100", "L4", "MI300X"], n)
    tc = rng.choice([1, 2, 4], n)
    y = rng.normal(6.0, 1.5, n) + 1e-7 * rng.normal(size=n)  # digits a float sum rounds away
    start = datetime(2026, 1, 1, tzinfo=UTC)
    return pd.DataFrame({
        "family_id": [f"f{i}" for i in fam], "model_type": [f"mt{i % 37}" for i in fam],
        "model_category": np.where(fam % 2 == 0, "llm", "vision"), "precision": "bf16",
        "hardware": hw, "vendor": np.where(hw == "MI300X", "amd", "nvidia"),
        "trainer_count": tc, "shape": [f"{t}/1/32" for t in tc],
        "submitted_at": pd.to_datetime(start) + pd.to_timedelta(rng.uniform(0, 10, n), "D"),
        "y": y, "r": y - rng.normal(5.0, 1.0, n)})


def test_snapshots_do_not_depend_on_the_order_rows_come_in() -> None:
    hist = _history(300_000)
    as_of = datetime(2026, 1, 10, tzinfo=UTC)
    exclude = pd.DataFrame({"family_id": ["f1", "f2"], "hardware": ["A100", "L4"]})
    snaps = []
    for rows in (hist, hist.sample(frac=1.0, random_state=3)):
        builder = HistoryBuilder(rows, lookback_days=30)
        snaps.append((builder.snapshot(as_of), builder.snapshot(as_of, exclude=exclude)))
        builder.close()
    for one, two in zip(*snaps, strict=True):
        assert one.tables.keys() == two.tables.keys()
        for name, table in one.tables.items():
            pd.testing.assert_frame_equal(table, two.tables[name], check_exact=True, obj=name)
    # The spreads are real: they agree with pandas' standard deviation.
    sd = snaps[0][0].tables["fam_hw"]["fam_hw_sd_y"].to_numpy()
    window = (hist["submitted_at"] >= as_of - timedelta(days=30)) & (hist["submitted_at"] < as_of)
    expected = hist[window].groupby(
        ["family_id", "hardware"])["y"].std().fillna(0.0).sort_index().to_numpy()
    np.testing.assert_allclose(sd, expected, atol=1e-8)


def _sql_level(con: duckdb.DuckDBPyConnection, level: object, as_of: datetime) -> pd.DataFrame:
    """The reference: one level's statistics as SQL computes them over the same rows."""
    name, keys = level.name, ", ".join(level.keys)  # type: ignore[attr-defined]
    aggs = [f"count(*)::DOUBLE AS {name}_n",
            f"date_diff('second', max(submitted_at), $as_of) / 86400.0 AS {name}_days_since"]
    for v in level.values:  # type: ignore[attr-defined]
        aggs += [f"median({v}) AS {name}_med_{v}",
                 f"median({v}) FILTER (WHERE submitted_at >= $recent) AS {name}_last_{v}"]
    v0 = level.values[0]  # type: ignore[attr-defined]
    aggs.append(f"coalesce(stddev_samp({v0}), 0.0) AS {name}_sd_{v0}")
    return con.execute(
        f"SELECT {keys}, {', '.join(aggs)} FROM h WHERE submitted_at >= $start AND "
        f"submitted_at < $as_of GROUP BY {keys} ORDER BY {keys}",
        {"as_of": as_of, "start": as_of - timedelta(days=30),
         "recent": as_of - timedelta(days=2)}).df()


@pytest.mark.parametrize("day", [2, 10])  # a short range (sorted directly) and a long one
def test_snapshots_give_what_sql_gives_over_the_same_rows(day: int) -> None:
    hist = _history(20_000, seed=day)
    as_of = datetime(2026, 1, 1 + day, tzinfo=UTC)
    exclude = pd.DataFrame({"family_id": ["f1", "f7", "f9"], "hardware": ["A100", "L4", "H100"]})
    builder = HistoryBuilder(hist, lookback_days=30)
    dropped = (hist["family_id"] + "/" + hist["hardware"]).isin(["f1/A100", "f7/L4", "f9/H100"])
    con = duckdb.connect()
    # Plain; without three (family, type) pairs; without every attempt on L4 (a type nobody
    # ran on, as the new-type interval is calibrated), here also without those pairs.
    no_l4 = hist["hardware"] == "L4"
    runs = pd.DataFrame({"family_id": ["f1", "f3", "f8", "nobody", "f4", "f3"],
                         "hardware": ["A100", "H100", "A100", "L4", "L4", "H100"],
                         "trainer_count": [2, 4, 1, 1, 8, 2]})
    pair = hist["family_id"] + "/" + hist["hardware"]
    tc = hist["trainer_count"]
    run_dropped = ((pair == "f1/A100") & (tc >= 2)) | ((pair == "f3/H100") & (tc >= 2)) \
        | (pair == "f8/A100")
    assert run_dropped.any()
    for snap, rows in ((builder.snapshot(as_of), hist),
                       (builder.snapshot(as_of, exclude=exclude), hist[~dropped]),
                       (builder.snapshot(as_of, exclude=exclude, exclude_hardware=["L4"]),
                        hist[~dropped & ~no_l4]),
                       # Without every attempt of two families (a model type hidden).
                       (builder.snapshot(as_of, exclude_families=["f2", "f5", "nobody"]),
                        hist[~hist["family_id"].isin(["f2", "f5"])]),
                       # Without some pairs' trainer counts from a count up (one unknown
                       # family, one count nobody ran), their smaller counts kept.
                       (builder.snapshot(as_of, exclude_trainer_counts_from=runs),
                        hist[~run_dropped])):
        con.register("h", rows)
        for level in LEVELS:
            got, want = snap.tables[level.name], _sql_level(con, level, as_of)
            sd = f"{level.name}_sd_{level.values[0]}"
            # Keys, counts, ages and medians to the last bit; the spread to rounding.
            pd.testing.assert_frame_equal(got.drop(columns=sd), want.drop(columns=sd),
                                          check_exact=True, check_dtype=False, obj=level.name)
            np.testing.assert_allclose(got[sd], want[sd], rtol=1e-12, atol=1e-12)
            # The builder's key index finds each row of its own table.
            keys = {k: got[k].astype(str).to_numpy(dtype=object) for k in level.keys}
            np.testing.assert_array_equal(snap.lookup(keys, level),
                                          got[list(level.stats)].to_numpy(dtype=np.float64))
            # Requests' rows (each job on several types): a key of the job alone is looked
            # up once a job, as each row alone would find it. One job, then three (two of
            # them the same key, one with no history), their rows out of order.
            if len(got):
                one = {k: np.repeat(v[:1], 4) for k, v in keys.items()}
                for k in set(level.keys) & {"hardware", "vendor"}:
                    one[k] = np.array(["A100", "nowhere", keys[k][0], keys[k][-1]], dtype=object)
                np.testing.assert_array_equal(
                    snap.lookup(one, level, (np.zeros(1, dtype=np.intp),
                                             np.zeros(4, dtype=np.intp))),
                    snap.lookup(one, level))
                job = np.array([2, 0, 0, 1, 2, 1, 0])
                three = {k: np.array([v[-1], v[0], "nobody"], dtype=object)[job]
                         for k, v in keys.items()}
                for k in set(level.keys) & {"hardware", "vendor"}:
                    three[k] = np.resize(np.array([keys[k][0], "nowhere", keys[k][-1]],
                                                  dtype=object), len(job))
                np.testing.assert_array_equal(snap.lookup(three, level, groups(job)),
                                              snap.lookup(three, level))
        # The transfer table's families: each (family, type)'s median residual and physics.
        fh = con.execute("SELECT family_id, hardware, median(r) AS r, median(y - r) AS phys "
                         "FROM h WHERE submitted_at < $as_of GROUP BY ALL", {"as_of": as_of}).df()
        pairs = fh.merge(fh, on="family_id", suffixes=("_a", "_b"))
        pairs = pairs[pairs["hardware_a"] != pairs["hardware_b"]]
        want_all = (pairs.assign(d=pairs["r_b"] - pairs["r_a"])
                    .groupby(["hardware_a", "hardware_b"])["d"].agg(["median", "size"]))
        table = snap.tables[TRANSFER]
        got_all = table[table["level"] == "all"].set_index(["hw_a", "hw_b"]).sort_index()
        np.testing.assert_array_equal(got_all["n"], want_all["size"])
        np.testing.assert_allclose(got_all["d_med"], want_all["median"], rtol=1e-12)
        con.unregister("h")
    builder.close()


def test_a_masked_snapshot_reusing_the_plain_one_is_the_one_computed_alone() -> None:
    hist = _history(100_000, seed=5)
    as_of = datetime(2026, 1, 9, tzinfo=UTC)
    exclude = pd.DataFrame({"family_id": [f"f{i}" for i in range(0, 400, 3)],
                            "hardware": ["A100", "H100", "L4", "MI300X"] * 33 + ["A100", "L4"]})
    alone = HistoryBuilder(hist, lookback_days=30)
    want = alone.snapshot(as_of, exclude=exclude)
    alone.close()
    builder = HistoryBuilder(hist, lookback_days=30)
    builder.snapshot(as_of - timedelta(days=1))  # another time's plain snapshot: not reused
    assert as_of not in builder._plain
    other = builder.snapshot(as_of, exclude=exclude)
    plain = builder.snapshot(as_of)
    got = builder.snapshot(as_of, exclude=exclude)  # the pair levels from the plain one
    builder.close()
    for snap in (other, got):
        assert snap.tables.keys() == want.tables.keys()
        for name, table in want.tables.items():
            pd.testing.assert_frame_equal(snap.tables[name], table, check_exact=True, obj=name)
    assert 0 < len(got.tables["fam_hw"]) < len(plain.tables["fam_hw"])


def test_history_is_reduced_in_chunks_with_the_same_result(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks are filtered one at a time (no filtered copy of the whole window); a chunk with
    no usable row adds nothing and changes no column's type."""
    n = 40
    at = pd.to_datetime(datetime(2026, 1, 1, tzinfo=UTC)) + pd.to_timedelta(np.arange(n), "h")
    attempts = pd.DataFrame({
        "attempt_id": [f"a{i}" for i in range(n)], "family_id": [f"f{i % 3}" for i in range(n)],
        "model_type": "mt", "model_category": "llm", "precision": "bf16",
        "hardware": np.where(np.arange(n) % 2 == 0, "H100-SXM", "A100-SXM4-80GB"),
        "trainer_count": 1 + np.arange(n) % 4, "devices_per_trainer": 8, "batch_size": 32,
        "num_params": 1e9, "flops_per_sample": 6e12, "submitted_at": at,
        # Rows 10-19 failed: with chunks of 10, one chunk has nothing usable.
        "status": np.where((np.arange(n) >= 10) & (np.arange(n) < 20), "failed", "succeeded"),
        "throughput": np.where((np.arange(n) >= 10) & (np.arange(n) < 20), np.nan,
                               100.0 + np.arange(n))})
    cat = Catalog.default()
    whole = prepare_history(attempts, cat)
    monkeypatch.setattr(history_module, "PREPARE_CHUNK_ROWS", 10)
    chunked = prepare_history(attempts, cat)
    pd.testing.assert_frame_equal(chunked, whole)
    assert len(whole) == 30
    none = prepare_history(attempts.assign(status="failed"), cat)
    assert none.empty and list(none.columns) == list(whole.columns)
