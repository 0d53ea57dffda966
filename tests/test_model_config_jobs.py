"""A job's "model_config": one expansion (leap.data.jobs) for rank, predict, CLI and HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from leap.arch import describe_model
from leap.config import Workspace
from leap.data.jobs import check_job, check_jobs_frame, expand_model_config
from leap.errors import DataError
from leap.rank.ranker import Ranker
from leap.serve.app import create_app
from leap.serve.payloads import RankRequest

CONFIGS = Path(__file__).parent / "data" / "model_configs"
GPT2 = json.loads((CONFIGS / "gpt2.json").read_text("utf-8"))
BASE = {"family_id": "f-new", "model_type": "gpt2", "trainer_count": 1, "batch_size": 8}

from test_rank import jobs, ranker  # noqa: E402,F401
from test_serve import serving  # noqa: E402


def test_model_config_fills_only_the_empty_architecture_fields() -> None:
    values, ignored = check_job({**BASE, "num_layers": 6, "seq_len": 256, "model_config": GPT2})
    summary = describe_model(GPT2, seq_len=256)
    assert values["num_layers"] == 6  # given: never overridden
    assert values["seq_len"] == 256
    assert values["num_params"] == summary.num_params
    assert values["flops_per_sample"] == summary.flops_per_sample  # at the job's seq_len
    assert values["hidden_dim"] == 768
    assert ignored == []  # model_config is a known field, not an ignored one


def test_a_job_without_model_config_is_unchanged() -> None:
    assert expand_model_config(BASE) is BASE
    assert check_job({**BASE, "model_config": None})[0] == check_job(BASE)[0]


def test_frame_rows_fill_from_their_own_config_or_the_shared_one() -> None:
    vit = json.loads((CONFIGS / "vit-base-patch16-224.json").read_text("utf-8"))
    frame = pd.DataFrame({**{k: [v, v, v] for k, v in BASE.items()},
                          "num_params": [np.nan, 5.0, np.nan],
                          "model_config": [GPT2, GPT2, None]})
    out = check_jobs_frame(frame)
    assert "model_config" not in out.columns and "model_config" in frame.columns
    assert out["num_params"].tolist()[:2] == [describe_model(GPT2).num_params, 5.0]
    assert np.isnan(out["num_params"].iloc[2])
    from leap.data.jobs import fill_from_model_configs

    shared = fill_from_model_configs(frame, vit)
    assert shared["num_params"].iloc[2] == describe_model(vit).num_params
    assert shared["num_params"].iloc[1] == 5.0


def test_bad_model_config_is_a_one_line_error_naming_the_field() -> None:
    with pytest.raises(DataError, match="job field 'model_config': field 'n_embd'"):
        check_job({**BASE, "model_config": {"model_type": "gpt2", "n_embd": "big"}})
    frame = pd.DataFrame({**{k: [v, v] for k, v in BASE.items()},
                          "model_config": [GPT2, {"model_type": "bart"}]})
    with pytest.raises(DataError, match="jobs row 1: job field 'model_config': model_type "
                       "'bart' is not supported"):
        check_jobs_frame(frame)
    with pytest.raises(DataError, match="'seq_len' must be a whole number"):
        check_job({**BASE, "seq_len": 10.5, "model_config": GPT2})


def test_rank_and_predict_see_the_same_numbers_as_explicit_fields(
        ranker: Ranker, jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    base = {k: v for k, v in jobs[0].items() if k not in describe_model(GPT2).columns()}
    explicit = {**base, **describe_model(GPT2).columns()}
    by_config = {**base, "model_config": GPT2}
    a = ranker.rank(explicit, ["H100-SXM", "L4"], strict=True)
    b = ranker.rank(by_config, ["H100-SXM", "L4"], strict=True)
    assert [(r.hardware, r.predicted_throughput) for r in a.ranking] == \
        [(r.hardware, r.predicted_throughput) for r in b.ranking]
    assert b.ignored_fields == []
    pa_ = ranker.predict([explicit], ["L4"], strict=True).frame
    pb = ranker.predict([by_config], ["L4"], strict=True).frame
    assert pa_["predicted_throughput"].tolist() == pb["predicted_throughput"].tolist()
    pc = ranker.predict(pd.DataFrame([by_config]), ["L4"], strict=True).frame
    assert pc["predicted_throughput"].tolist() == pb["predicted_throughput"].tolist()


def test_http_job_accepts_model_config(ranker: Ranker,  # noqa: F811
                                       jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    job = {**{k: v for k, v in jobs[0].items() if k not in ("num_params", "flops_per_sample")},
           "model_config": GPT2}
    assert RankRequest.model_validate({"job": job}).job.launch_fields()["model_config"] == GPT2
    with serving(create_app(ranker)) as url, httpx.Client(base_url=url, timeout=20) as client:
        _http_checks(client, job)


def _http_checks(client: httpx.Client, job: dict[str, Any]) -> None:
    ok = client.post("/v1/rank", json={"job": job, "candidates": ["L4", "H100-SXM"]})
    assert ok.status_code == 200 and ok.json()["ranking"] and ok.json()["ignored_fields"] == []
    pred = client.post("/v1/predict", json={"jobs": [job], "candidates": ["L4"]})
    assert pred.status_code == 200 and len(pred.json()["predictions"]) == 1
    bad = client.post("/v1/rank", json={"job": {**job, "model_config": {"model_type": "x"}}})
    assert bad.status_code == 422 and "model_type 'x' is not supported" in bad.json()["detail"]
    assert "model_config" in client.get("/openapi.json").text


def _cli(ws: Workspace, *args: str) -> Any:
    from leap.cli import _register, app

    _register()
    return CliRunner().invoke(app, ["--home", str(ws.home), *args])


def test_cli_describe_model_prints_schema_columns(trained_workspace: Workspace) -> None:
    res = _cli(trained_workspace, "describe-model", str(CONFIGS / "llama-2-7b.json"),
               "--seq-len", "2048", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["num_params"] == 6_738_415_616 and out["seq_len"] == 2048
    assert {"num_params", "embedding_params", "flops_per_sample", "num_layers", "hidden_dim",
            "seq_len"} <= set(out)
    table = _cli(trained_workspace, "describe-model", str(CONFIGS / "gpt2.json"))
    assert table.exit_code == 0 and "124,439,808" in table.output


def test_cli_bad_config_is_one_line_naming_the_file(trained_workspace: Workspace,
                                                    tmp_path: Path) -> None:
    bad = tmp_path / "cfg.json"
    bad.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096}))
    res = _cli(trained_workspace, "describe-model", str(bad))
    assert res.exit_code == 1
    assert f"{bad}: field 'num_hidden_layers' is required" in res.output
    assert "Traceback" not in res.output
    bad.write_text("{not json")
    res = _cli(trained_workspace, "describe-model", str(bad))
    assert res.exit_code == 1 and "not valid JSON" in res.output


def test_cli_rank_and_predict_take_a_model_config(
        trained_workspace: Workspace, tmp_path: Path, ranker: Ranker,  # noqa: F811
        jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    job = {k: v for k, v in jobs[0].items() if k not in ("num_params", "flops_per_sample")}
    (tmp_path / "job.json").write_text(json.dumps(job))
    res = _cli(trained_workspace, "rank", "--job", str(tmp_path / "job.json"), "--candidates",
               "L4,H100-SXM", "--model-config", str(CONFIGS / "gpt2.json"), "--json")
    assert res.exit_code == 0, res.output
    ranked = {r["hardware"]: r["predicted_throughput"] for r in json.loads(res.output)["ranking"]}
    # The same numbers the expansion works out, stated by hand (FLOPs at the job's seq_len).
    seq = int(job["seq_len"]) if job.get("seq_len") else None
    explicit = {**describe_model(GPT2, seq_len=seq).columns(), **job}
    want = {r.hardware: r.predicted_throughput
            for r in ranker.rank(explicit, ["L4", "H100-SXM"], strict=True).ranking}
    assert ranked == pytest.approx(want)
    # predict: a CSV of jobs plus --model-config; JSON Lines rows with their own configs.
    pd.DataFrame([job]).to_csv(tmp_path / "jobs.csv", index=False)
    out = tmp_path / "pred.csv"
    res = _cli(trained_workspace, "predict", str(tmp_path / "jobs.csv"), "--candidates", "L4",
               "--model-config", str(CONFIGS / "gpt2.json"), "--out", str(out))
    assert res.exit_code == 0, res.output
    (tmp_path / "jobs.jsonl").write_text(json.dumps({**job, "model_config": GPT2}) + "\n")
    out2 = tmp_path / "pred2.csv"
    res = _cli(trained_workspace, "predict", str(tmp_path / "jobs.jsonl"), "--candidates", "L4",
               "--out", str(out2))
    assert res.exit_code == 0, res.output
    a = pd.read_csv(out)["predicted_throughput"].tolist()
    b = pd.read_csv(out2)["predicted_throughput"].tolist()
    assert a == pytest.approx(b) and a[0] == pytest.approx(want["L4"])
    res = _cli(trained_workspace, "rank", "--job", str(tmp_path / "job.json"),
               "--model-config", str(tmp_path / "missing.json"))
    assert res.exit_code == 1 and "cannot read model config" in res.output
