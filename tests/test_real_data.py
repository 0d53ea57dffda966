"""Real-data protocols: leak-free splits, the baselines, the learned-predictor hook and the CLI."""

from __future__ import annotations

import json
import math
import pickle
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from typer.testing import CliRunner

import leap.cli
from leap.catalog import Catalog
from leap.data.schema import ATTEMPTS_SCHEMA
from leap.datasets import OUTCOME_COLUMNS, benchmark_catalog, load_throughput
from leap.errors import ConfigError, ModelError
from leap.eval.parallel import Parallel
from leap.eval.real_data import (
    CELL_KEY,
    EVAL_DAY,
    LEAP,
    LEAP_NO_ARCHITECTURE,
    PROTOCOLS,
    TARGET,
    AttemptsPredictor,
    BenchmarkLookup,
    FitPredict,
    LinearScaling,
    NearestNeighbors,
    RealDataResult,
    ReferenceCheck,
    RowPredictor,
    SpecRatio,
    baseline_predictors,
    default_predictors,
    flat_results,
    html_section,
    make_splits,
    reference_check,
    reference_rows,
    run_protocols,
    run_real_data,
    verdicts,
)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return benchmark_catalog()


@pytest.fixture(scope="module")
def clean() -> pd.DataFrame:
    return load_throughput(include_flagged=False)


def _keys(df: pd.DataFrame, cols: tuple[str, ...] | list[str]) -> set[tuple[object, ...]]:
    return set(df[list(cols)].astype(str).itertuples(index=False, name=None))


# Splits ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("source", ["gavel", "lambda_pytorch", "lambda_tensorflow", "sia"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_splits_leak_no_held_out_row(clean: pd.DataFrame, source: str, protocol: str) -> None:
    df = clean[clean["source"] == source].reset_index(drop=True)
    splits = make_splits(df, protocol, n_folds=5, seed=3)
    assert splits
    tested = np.zeros(len(df), dtype=int)
    for s in splits:
        assert len(np.intersect1d(s.train, s.test)) == 0
        train, test = df.iloc[s.train], df.iloc[s.test]
        tested[s.test] += 1
        if protocol == "held_out_cells":
            assert not _keys(train, CELL_KEY) & _keys(test, CELL_KEY)
        elif protocol == "unseen_hardware":
            assert set(test["hardware"]) == {s.fold}
            assert s.fold not in set(train["hardware"])
        elif protocol == "unseen_model":
            assert set(test["model"]) == {s.fold}
            assert s.fold not in set(train["model"])
        elif protocol == "newest_types":
            held = set(s.fold.removeprefix("newest: ").split(", "))
            assert set(test["hardware"]) == held and not held & set(train["hardware"])
            cat = benchmark_catalog()
            assert min(cat[h].year for h in held) >= max(cat[h].year for h in train["hardware"])
            assert train["hardware"].nunique() >= 2
        else:
            assert set(test["hardware"]) == {s.fold} and (test["num_devices"] > 1).all()
            on_type = train[train["hardware"] == s.fold]
            assert len(on_type) and (on_type["num_devices"] == 1).all()
    if protocol in ("scaling", "newest_types"):
        assert (tested <= 1).all()
    else:  # every row is predicted exactly once
        assert (tested == 1).all()


def test_held_out_cells_folds_depend_on_the_seed_only(clean: pd.DataFrame) -> None:
    df = clean[clean["source"] == "gavel"].reset_index(drop=True)
    a = [s.test.tolist() for s in make_splits(df, "held_out_cells", seed=1)]
    b = [s.test.tolist() for s in make_splits(df, "held_out_cells", seed=1)]
    c = [s.test.tolist() for s in make_splits(df, "held_out_cells", seed=2)]
    assert a == b and a != c


def test_make_splits_refuses_bad_input(clean: pd.DataFrame) -> None:
    with pytest.raises(ConfigError, match="unknown protocol 'unseen_hw'"):
        make_splits(clean[clean["source"] == "gavel"], "unseen_hw")
    with pytest.raises(ConfigError, match="one source at a time"):
        make_splits(clean, "unseen_model")


def test_predictors_never_see_the_outcome_or_a_held_out_cell(clean: pd.DataFrame,
                                                             catalog: Catalog) -> None:
    seen: list[int] = []

    def spy(train: pd.DataFrame, test: pd.DataFrame, cat: Catalog) -> np.ndarray:
        assert not set(OUTCOME_COLUMNS) & set(test.columns)
        assert TARGET in train.columns
        assert not _keys(train, CELL_KEY) & _keys(test, CELL_KEY)
        seen.append(len(test))
        return np.ones(len(test))

    df = clean[clean["source"].isin(["gavel", "lambda_tensorflow"])]
    out = run_protocols(df, {"spy": spy}, protocols=["held_out_cells"], catalog=catalog,
                        n_folds=4)
    assert sum(seen) == len(df) and len(seen) == 8
    assert out.results["gavel"]["held_out_cells"]["spy"].coverage == 1.0
    assert out.settings.protocols == ["held_out_cells"] and out.settings.n_folds == 4


def test_folds_on_worker_processes_match_the_serial_run(clean: pd.DataFrame,
                                                        catalog: Catalog) -> None:
    """Picklable predictors run on workers, a lambda stays here; the numbers are the same."""
    df = clean[clean["source"] == "gavel"]
    preds: dict[str, FitPredict] = {"knn": NearestNeighbors(),
                                    "ones": lambda tr, te, c: np.ones(len(te))}
    calls: list[tuple[int, int]] = []
    kwargs = {"protocols": ["unseen_model"], "catalog": catalog}
    serial = run_protocols(df, preds, **kwargs)
    parallel = run_protocols(df, preds, parallel=Parallel(workers=2),
                             progress=lambda done, total, label: calls.append((done, total)),
                             **kwargs)
    assert parallel.results == serial.results
    assert calls[-1][0] == calls[-1][1] == 2 * serial.results["gavel"]["unseen_model"][
        "knn"].folds


def test_a_predictor_of_the_wrong_length_is_refused(clean: pd.DataFrame,
                                                    catalog: Catalog) -> None:
    df = clean[clean["source"] == "gavel"]
    with pytest.raises(ModelError, match=r"predictor returned 1 values for \d+ test rows"):
        run_protocols(df, {"bad": lambda tr, te, c: np.ones(1)}, catalog=catalog,
                      protocols=["unseen_model"])
    with pytest.raises(ConfigError, match="source 'sai' has no rows here; did you mean 'sia'"):
        run_protocols(clean, {}, sources=["sai"], catalog=catalog)


# Baselines on tiny hand-made frames ----------------------------------------------------------
def _rows(*rows: tuple[str, int, int, float]) -> pd.DataFrame:
    """(hardware, num_devices, batch_size, throughput) rows of one configuration."""
    return pd.DataFrame({
        "source": "gavel", "table": "osdi20", "model": "m", "precision": "fp16",
        "num_nodes": 1, "hardware": [r[0] for r in rows],
        "num_devices": np.array([r[1] for r in rows], dtype=np.int64),
        "batch_size": pd.array([r[2] for r in rows], dtype="Int64"),
        TARGET: [r[3] for r in rows],
    })


def test_lookup_table_hits_only_the_exact_key(catalog: Catalog) -> None:
    train = _rows(("T4", 1, 32, 100.0), ("T4", 1, 32, 120.0), ("T4", 2, 32, 190.0))
    test = _rows(("T4", 1, 32, 0.0), ("T4", 1, 64, 0.0), ("A10", 1, 32, 0.0))
    pred = BenchmarkLookup()(train, test.drop(columns=[TARGET]), catalog)
    assert pred[0] == 110.0 and np.isnan(pred[1:]).all()
    # Two devices on one host and on two hosts are different configurations.
    two_hosts = _rows(("T4", 2, 32, 0.0)).assign(num_nodes=2)
    assert np.isnan(BenchmarkLookup()(train, two_hosts.drop(columns=[TARGET]), catalog)).all()


def test_spec_ratio_scales_by_the_published_ratio(catalog: Catalog) -> None:
    train = _rows(("A100-SXM4-40GB", 1, 64, 1000.0), ("A100-SXM4-40GB", 1, 32, 600.0))
    test = _rows(("H100-SXM", 1, 64, 0.0), ("H100-SXM", 1, 16, 0.0))
    flops, bw = 989.4 / 312.0, 3350.0 / 1560.0
    geo = SpecRatio("geomean")(train, test.drop(columns=[TARGET]), catalog)
    # Same batch preferred (1000); without one, every reference batch (median of 600, 1000).
    assert geo[0] == pytest.approx(1000.0 * math.sqrt(flops * bw))
    assert geo[1] == pytest.approx(800.0 * math.sqrt(flops * bw))
    assert SpecRatio("flops")(train, test, catalog)[0] == pytest.approx(1000.0 * flops)
    assert SpecRatio("bandwidth")(train, test, catalog)[0] == pytest.approx(1000.0 * bw)
    # A type without a published 16-bit peak is not covered unless estimates are allowed.
    laptop = _rows(("RTX-3070", 1, 64, 0.0))
    assert np.isnan(SpecRatio("geomean")(train, laptop, catalog)[0])
    assert np.isfinite(SpecRatio("geomean", specs="catalog")(train, laptop, catalog)[0])


def test_spec_ratio_nearest_copies_the_closest_type_only(catalog: Catalog) -> None:
    train = _rows(("A100-SXM4-40GB", 1, 64, 1000.0), ("T4", 1, 64, 50.0))
    test = _rows(("H100-SXM", 1, 64, 0.0))
    near = SpecRatio("geomean", nearest=True)(train, test.drop(columns=[TARGET]), catalog)
    both = SpecRatio("geomean")(train, test.drop(columns=[TARGET]), catalog)
    # The A100 is nearer the H100 than the T4 is: its figure alone, scaled.
    assert near[0] == pytest.approx(1000.0 * math.sqrt(989.4 / 312.0 * 3350.0 / 1560.0))
    assert near[0] != pytest.approx(both[0])


def test_spec_ratio_bound_picks_the_ratio_that_explains_training(catalog: Catalog) -> None:
    # A bandwidth-bound model: throughput exactly proportional to memory bandwidth.
    bw = {"V100-SXM2-32GB": 898.0, "A100-SXM4-40GB": 1560.0, "T4": 320.0, "H100-SXM": 3350.0}
    train = _rows(*[(h, 1, 8, 10.0 * b) for h, b in bw.items() if h != "H100-SXM"])
    test = _rows(("H100-SXM", 1, 8, 0.0))
    pred = SpecRatio("bound")(train, test, catalog)
    assert pred[0] == pytest.approx(10.0 * 3350.0)


def test_spec_ratio_refuses_unknown_settings() -> None:
    with pytest.raises(ConfigError, match="unknown spec ratio 'geomeen'; did you mean 'geomean'"):
        SpecRatio("geomeen")
    with pytest.raises(ConfigError, match="specs must be 'published' or 'catalog'"):
        SpecRatio(specs="guess")


def test_knn_prefers_the_same_model_and_scales_per_device(catalog: Catalog) -> None:
    train = pd.concat([_rows(("T4", 1, 32, 100.0), ("A10", 1, 32, 300.0)),
                       _rows(("T4", 1, 32, 9999.0)).assign(model="other")], ignore_index=True)
    test = _rows(("T4", 4, 32, 0.0)).drop(columns=[TARGET])
    pred = NearestNeighbors(k=1)(train, test, catalog)
    assert pred[0] == pytest.approx(400.0)  # 4 devices x the nearest same-model row
    unseen = test.assign(model="brand-new")
    assert np.isfinite(NearestNeighbors(k=2)(train, unseen, catalog)[0])
    with pytest.raises(ConfigError, match="k must be >= 1"):
        NearestNeighbors(k=0)
    # Neighbours at the same distance: the earlier training rows, whatever NumPy's version
    # (its partial sort took others here).
    hw = np.random.default_rng(0).choice(["A10", "T4", "L4"], 1000)
    many = _rows(*[(h, 1, 32, float(i + 1)) for i, h in enumerate(hw)])
    for k in (1, 3, 5):
        first = many[TARGET].to_numpy()[hw == "A10"][:k]
        pred = NearestNeighbors(k=k)(many, test.assign(hardware="A10"), catalog)[0]
        assert pred == pytest.approx(np.exp(np.log(first).mean()) * 4)


def test_linear_scaling_multiplies_the_single_device_rate(catalog: Catalog) -> None:
    train = _rows(("T4", 1, 32, 100.0), ("T4", 2, 32, 150.0))
    test = _rows(("T4", 8, 32, 0.0), ("T4", 8, 64, 0.0))
    pred = LinearScaling()(train, test, catalog)
    assert pred[0] == 800.0 and np.isnan(pred[1])


# The reference figures and the hook --------------------------------------------------------
def test_reference_check_reproduces_the_published_spec_ratio_figures(catalog: Catalog) -> None:
    ref = reference_check(load_throughput(), catalog)
    for name, expected in ref.expected.items():
        assert ref.methods[name].accuracy_within_20pct == pytest.approx(expected, abs=0.015)
    assert ref.methods["spec_ratio_geomean"].median_ape == pytest.approx(0.11, abs=0.01)
    # Predictions shared with the ranking check must not replace the reference variants,
    # even where a baseline has the same name (the baselines match batch sizes).
    df = load_throughput()
    shared = {name: (np.zeros(len(reference_rows(df))), 1)
              for name in ("spec_ratio_geomean", "spec_ratio_flops", "spec_ratio_bandwidth")}
    again = reference_check(df, catalog, predictions=shared)
    assert {n: again.methods[n] for n in ref.expected} == \
        {n: ref.methods[n] for n in ref.expected}


def test_attempts_predictor_hands_over_attempt_tables(clean: pd.DataFrame,
                                                      catalog: Catalog) -> None:
    calls: list[tuple[int, int]] = []

    def fit_predict(train: pa.Table, test: pa.Table, cat: Catalog) -> np.ndarray:
        assert train.schema == ATTEMPTS_SCHEMA and test.schema == ATTEMPTS_SCHEMA
        assert test.column("throughput").null_count == test.num_rows
        assert train.column("throughput").null_count == 0
        first = pc.min(train.column("submitted_at")).as_py()
        latest = pc.max(train.column("submitted_at")).as_py()
        assert EVAL_DAY - timedelta(days=28) <= first and latest < EVAL_DAY
        assert len({t.date() for t in train.column("submitted_at").to_pylist()}) > 10
        assert set(test.column("submitted_at").to_pylist()) == {EVAL_DAY}
        assert not set(train.column("hardware").to_pylist()) & set(
            test.column("hardware").to_pylist())
        calls.append((train.num_rows, test.num_rows))
        return np.full(test.num_rows, 1.0)

    df = clean[clean["source"] == "gavel"]
    out = run_protocols(df, {LEAP: AttemptsPredictor(fit_predict)}, catalog=catalog,
                        protocols=["unseen_hardware"])
    assert len(calls) == 3 and sum(n for _, n in calls) == len(df)
    assert out.results["gavel"]["unseen_hardware"][LEAP].n == len(df)


def test_learned_predictor_without_architecture_sees_blank_summaries(
        clean: pd.DataFrame, catalog: Catalog) -> None:
    seen: dict[bool, tuple[int, int]] = {}

    def fit_predict(train: pa.Table, test: pa.Table, cat: Catalog) -> np.ndarray:
        filled = train.num_rows - train.column("flops_per_sample").null_count
        seen[filled > 0] = (filled, train.num_rows - train.column("num_params").null_count)
        return np.full(test.num_rows, 1.0)

    df = clean[clean["source"] == "lambda_tensorflow"].reset_index(drop=True)
    split = make_splits(df, "unseen_hardware")[0]
    train, test = df.iloc[split.train], df.iloc[split.test]
    AttemptsPredictor(fit_predict)(train, test, catalog)
    AttemptsPredictor(fit_predict, architecture=False)(train, test, catalog)
    # Every Lambda TensorFlow model has published FLOPs; blanked, none is left.
    assert seen[True][0] > 0 and seen[False] == (0, 0)
    assert LEAP_NO_ARCHITECTURE in default_predictors(without_architecture=True)
    assert LEAP_NO_ARCHITECTURE not in default_predictors()


def test_the_learned_predictors_fits_run_on_the_threads_they_are_given(
        clean: pd.DataFrame, catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """Folds side by side in processes must not each fit on every core (two processes of two
    LightGBM threads each on two cores took 1.7-2.1x the CPU of one thread each)."""
    import leap.model.train

    class Fitted(Exception):
        pass

    seen: list[int] = []

    def train_window(frame: pd.DataFrame, cat: Catalog, as_of: object, cfg: Any) -> None:
        seen.append(cfg.threads)
        raise Fitted

    monkeypatch.setattr(leap.model.train, "train_window", train_window)
    df = clean[clean["source"] == "gavel"].reset_index(drop=True)
    split = make_splits(df, "unseen_hardware")[0]
    train, test = df.iloc[split.train], df.iloc[split.test]
    for threads in (1, 3):
        preds = default_predictors(without_architecture=True, threads=threads)
        for name in (LEAP, LEAP_NO_ARCHITECTURE):
            with pytest.raises(Fitted):
                preds[name](train, test, catalog)
    assert seen == [1, 1, 3, 3]
    # Picklable still, so the folds can travel to worker processes.
    assert pickle.loads(pickle.dumps(default_predictors(threads=1)[LEAP])) is not None


def _oracle(rows: pd.DataFrame) -> FitPredict:
    """A predictor that cheats on purpose (looks the answer up in ``rows``)."""
    keys = ["source", "table", "model", "precision", "hardware", "num_devices", "batch_size"]
    truth = rows.set_index(keys)[TARGET]

    def oracle(train: pd.DataFrame, test: pd.DataFrame, cat: Catalog) -> np.ndarray:
        idx = pd.MultiIndex.from_frame(test[keys])
        return truth.reindex(idx).to_numpy(dtype=float)

    return oracle


def test_results_json_report_and_verdicts(clean: pd.DataFrame) -> None:
    preds = {**baseline_predictors(), LEAP: _oracle(clean)}
    out = run_real_data(load_throughput("gavel"), predictors=preds,
                        protocols=["unseen_hardware"])
    saved = json.loads(json.dumps(out.to_dict()))  # serialisable as it is
    # Read back, it writes the same JSON (NaN included, so compare the text).
    assert json.dumps(RealDataResult.from_dict(saved).to_dict()) == json.dumps(saved)
    cell = out.results["gavel"]["unseen_hardware"]
    assert set(cell) == set(preds)
    # Point estimates have no interval to cover anything: the key is not written.
    assert cell["knn"].interval_coverage is None and "interval_coverage" not in saved[
        "results"]["gavel"]["unseen_hardware"]["knn"]
    assert cell[LEAP].accuracy_within_20pct == 1.0 and cell["lookup"].coverage == 0.0
    assert out.verdicts and "beats" in out.verdicts[0]
    assert verdicts(replace(out, results={"gavel": {"x": {"knn": cell["knn"]}}})) == []
    assert len(flat_results(out)) == len(preds)
    page = html_section(out)
    assert page.startswith('<section id="real-data">') and "spec_ratio_geomean" in page
    assert out.data.sources["gavel"].license.startswith("MIT")
    # Lambda-only checks
    assert out.reference_check is None and out.ranking_check is None
    assert "reference_check" not in saved and "ranking_check" not in saved


def test_reference_and_ranking_checks_score_the_learned_predictor(catalog: Catalog) -> None:
    df = load_throughput()
    oracle = _oracle(reference_rows(df))
    out = run_real_data(df, predictors={LEAP: oracle, LEAP_NO_ARCHITECTURE: oracle},
                        sources=["lambda_pytorch"], protocols=["unseen_model"])
    ref = out.reference_check
    assert ref is not None and out.ranking_check is not None
    assert ref.methods[LEAP].accuracy_within_20pct == 1.0
    # Leap without its architecture columns is scored on the reference rows too.
    assert ref.matched_geomean[LEAP_NO_ARCHITECTURE] == ref.matched_geomean[LEAP]
    assert ref.matched_geomean[LEAP].n == ref.methods["spec_ratio_geomean"].n_covered
    # In the JSON the learned predictor's matched score sits inside its own.
    saved = ref.to_dict()
    assert saved[LEAP]["matched_geomean"]["n"] == ref.matched_geomean[LEAP].n
    assert json.dumps(ReferenceCheck.from_dict(saved).to_dict()) == json.dumps(saved)
    rank = out.ranking_check
    assert rank.configurations > 40
    assert rank.methods[LEAP].top1_agreement == 1.0
    assert rank.methods[LEAP].mean_regret == 0.0
    cheap = rank.methods["cheapest_type"]
    assert 0.0 < cheap.top1_agreement < 1.0 and cheap.mean_regret > 0.0
    assert any(v.startswith("reference protocol") and "beats" in v for v in out.verdicts)
    # A result saved under the ranking check's older metric name reads as the current one.
    old = out.to_dict()
    old["ranking_check"] = {**rank.to_dict(), "methods": {
        m: {("mean_value_regret" if k == "mean_regret" else k): v for k, v in r.items()}
        for m, r in rank.to_dict()["methods"].items()}}
    renamed = RealDataResult.from_dict(old).ranking_check
    assert renamed is not None and json.dumps(renamed.to_dict()) == json.dumps(rank.to_dict())
    assert "Ranking on public prices" in html_section(out)


def test_cli_experiment_writes_json_and_html(tmp_path: Path) -> None:
    leap.cli._register()
    res = CliRunner().invoke(leap.cli.app, [
        "--home", str(tmp_path), "experiment", "real-data", "--source", "gavel",
        "--protocol", "unseen_hardware", "--protocol", "scaling", "--out", str(tmp_path / "o"),
        # In this process: the test files already run side by side (worker processes are
        # checked by test_folds_on_worker_processes_match_the_serial_run).
        "--workers", "1", "--json"])
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)
    saved = json.loads((tmp_path / "o" / "real_data.json").read_text("utf-8"))
    assert printed["results"] == saved["results"]
    assert set(saved["results"]["gavel"]) == {"unseen_hardware", "scaling"}
    page = (tmp_path / "o" / "real_data.html").read_text("utf-8")
    assert "<table>" in page
    # Per fold: each held-out type's rows, adding up to the protocol's, and shown on the page.
    folds = RealDataResult.from_dict(saved).by_fold["gavel"]["unseen_hardware"]
    assert set(folds) == {"K80", "P100", "V100-SXM2-16GB"}
    whole = saved["results"]["gavel"]["unseen_hardware"]
    for method, score in whole.items():
        per = [folds[f][method] for f in folds]
        assert sum(s.n for s in per) == score["n"]
        assert sum(s.n_covered for s in per) == score["n_covered"]
        hits = sum(s.accuracy_within_20pct_all * s.n for s in per)
        assert hits == pytest.approx(score["accuracy_within_20pct_all"] * score["n"])
    assert "gavel per fold" in page and "<td>V100-SXM2-16GB</td>" in page
    bad = CliRunner().invoke(leap.cli.app, ["--home", str(tmp_path), "experiment", "real-data",
                                            "--protocol", "nope"])
    assert bad.exit_code == 1 and "unknown protocol 'nope'" in bad.output


@pytest.mark.slow
def test_full_experiment_runs_on_every_source(tmp_path: Path) -> None:
    leap.cli._register()
    res = CliRunner().invoke(leap.cli.app, ["--home", str(tmp_path), "experiment", "real-data"])
    assert res.exit_code == 0, res.output
    saved = json.loads((tmp_path / "work" / "reports" / "real_data.json").read_text("utf-8"))
    assert set(saved["results"]) == {"lambda_pytorch", "lambda_tensorflow", "gavel", "sia"}
    sia = saved["results"]["sia"]["held_out_cells"]
    assert sia["knn"]["accuracy_within_20pct"] > 0.7


def test_every_baseline_keeps_the_fit_predict_contract(clean: pd.DataFrame,
                                                       catalog: Catalog) -> None:
    # Called as the fold runner calls it, or fitted then asked: the same estimates.
    gavel = clean[clean["source"] == "gavel"]
    train = gavel.iloc[::2].reset_index(drop=True)
    test = gavel.iloc[1::2].reset_index(drop=True)
    blind = test.drop(columns=[c for c in OUTCOME_COLUMNS if c in test.columns])
    for name, p in baseline_predictors().items():
        assert isinstance(p, RowPredictor), name
        called = p(train, blind, catalog)
        fitted = p.fit(train, catalog)
        assert fitted is p
        np.testing.assert_array_equal(fitted.predict(blind), called)
    with pytest.raises(ModelError, match="not fitted yet; call fit"):
        NearestNeighbors().predict(blind)


def test_a_predictor_with_intervals_is_scored_on_its_median_and_ranked_by_the_default_rule(
        catalog: Catalog) -> None:
    from leap.eval.real_reference import ranking_check
    from leap.eval.real_splits import held_out_predictions

    df = load_throughput()
    rows = reference_rows(df)
    exact = _oracle(rows)

    def spread(width: float) -> FitPredict:
        def fn(train: pd.DataFrame, test: pd.DataFrame, cat: Catalog) -> np.ndarray:
            m = exact(train, test, cat)
            return np.column_stack([m, m / width, m * width])
        return fn

    # Three columns travel through the folds; the score reads the median.
    held = held_out_predictions(rows, {"wide": spread(1e6)}, "unseen_hardware", catalog)
    assert held["wide"][0].shape == (len(rows), 3)
    scores = run_protocols(rows, {"wide": spread(1e6)}, protocols=["unseen_hardware"],
                           catalog=catalog).results["lambda_pytorch"]["unseen_hardware"]
    assert scores["wide"].accuracy_within_20pct == 1.0
    assert scores["wide"].interval_coverage == 1.0  # the measured figure is inside each
    assert "interval_coverage" in scores["wide"].to_dict()
    # Exact medians with intervals too wide to trust: the default (cautious) rule keeps the
    # cheapest type first, as the price alone would; the median (neutral) and the low end
    # (averse, the same factor on every type) still pick the best type every time.
    rank = ranking_check(df, {"wide": spread(1e6), "narrow": spread(1.0)}, catalog)
    cheap, wide = rank.methods["cheapest_type"], rank.methods["wide"]
    assert (wide.top1_agreement, wide.mean_regret) == (cheap.top1_agreement, cheap.mean_regret)
    assert cheap.top1_agreement < 1.0
    for name in ("wide_neutral", "wide_averse", "narrow", "narrow_neutral"):
        assert rank.methods[name].top1_agreement == 1.0, name
        assert rank.methods[name].mean_regret == 0.0, name
