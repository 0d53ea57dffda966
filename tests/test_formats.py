"""`leap rank --format`: SkyPilot, Kubernetes and Slurm output, golden files and schema checks.

With LEAP_UPDATE_GOLDEN=1 the golden files in tests/data/ are rewritten (then review the diff).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from leap.catalog import Catalog
from leap.cli import _register, app
from leap.config import Workspace
from leap.errors import ConfigError
from leap.rank.formats import SCHEDULER_FORMATS, render
from leap.rank.ranker import Ranker
from leap.serve.app import create_app
from test_rank import jobs, ranker  # noqa: F401

DATA = Path(__file__).parent / "data"
GOLDEN = {"skypilot": "format_skypilot.yaml", "kubernetes": "format_kubernetes.yaml",
          "slurm": "format_slurm.txt"}
JOB = {"family_id": "ads-ranker-daily", "model_type": "dlrm-large", "trainer_count": 2,
       "batch_size": 4096, "devices_per_trainer": 8}
# A fixed answer: NVIDIA, a shared SkyPilot name (two A100s), AMD, Intel (no names), a TPU.
RESULT = {"model_version": "20260112-01", "objective": "value", "reason": None,
          "ranking": [{"hardware": h} for h in
                      ("H100-SXM", "A100-SXM4-80GB", "A100-SXM4-40GB", "A100-PCIe-40GB",
                       "MI300X", "Gaudi2", "TPU-v5p", "L4")]}
runner = CliRunner()
_register()


def _body(text: str) -> Any:
    return yaml.safe_load(text)


@pytest.mark.parametrize("fmt", SCHEDULER_FORMATS)
def test_golden_files(fmt: str) -> None:
    got = render(fmt, RESULT, JOB, Catalog.default())
    path = DATA / GOLDEN[fmt]
    if os.environ.get("LEAP_UPDATE_GOLDEN") == "1":
        path.write_text(got)
    assert got == path.read_text(), f"{fmt} output changed; LEAP_UPDATE_GOLDEN=1 to accept"


def test_skypilot_passes_the_schema_and_keeps_the_order() -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="schema check needs jsonschema "
                                     "(pip install -e '.[dev]')")
    schema = json.loads((DATA / "skypilot_resources.schema.json").read_text())
    doc = _body(render("skypilot", RESULT, JOB, Catalog.default()))
    jsonschema.validate(doc, schema)
    assert doc["num_nodes"] == 2
    assert [c["accelerators"] for c in doc["resources"]["ordered"]] == \
        ["H100:8", "A100-80GB:8", "A100:8", "MI300X:8", "tpu-v5p-8:1", "L4:8"]
    # The schema bites: a misspelt key or a bad accelerator string fails.
    bad = {"num_nodes": 2, "resources": {"orderd": [{"accelerators": "H100:8"}]}}
    with pytest.raises(jsonschema.ValidationError, match="orderd"):
        jsonschema.validate(bad, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"resources": {"ordered": [{"accelerators": "H100 x8"}]}}, schema)


def test_skypilot_output_parses_with_skypilot_itself() -> None:
    """SkyPilot's own resources schema and Task parser, when the ``schedulers`` extra is
    installed (``pip install -e '.[schedulers]'``); the JSON schema above covers the rest."""
    pytest.importorskip("sky", reason="SkyPilot is not installed (the schedulers extra); its "
                        "own parser check is skipped")
    jsonschema = pytest.importorskip("jsonschema")
    import sky
    from sky.utils import schemas

    doc = _body(render("skypilot", RESULT, JOB, Catalog.default()))
    jsonschema.validate(doc["resources"], schemas.get_resources_schema())
    task = sky.Task.from_yaml_config(doc)
    assert task.num_nodes == 2
    got = [next(iter(r.accelerators)) for r in task.resources]
    assert got == ["H100", "A100-80GB", "A100", "MI300X", "tpu-v5p-8", "L4"]


class _Response:
    def __init__(self, data: Any) -> None:
        self.data = json.dumps(data)


def _deserialize(api: Any, data: Any, kind: str) -> Any:
    import inspect

    if "content_type" in inspect.signature(api.deserialize).parameters:
        # newer clients take the response text and its content type
        return api.deserialize(json.dumps(data), kind, "application/json")
    return api.deserialize(_Response(data), kind)


def test_kubernetes_passes_the_official_client_models() -> None:
    client = pytest.importorskip("kubernetes.client", reason="Kubernetes check skipped: "
                                 "install the official client (pip install -e '.[schedulers]')")
    doc = _body(render("kubernetes", RESULT, JOB, Catalog.default()))
    api = client.ApiClient()
    affinity = _deserialize(api, doc["affinity"], "V1Affinity")
    assert isinstance(affinity, client.V1Affinity)
    # Deserializing drops unknown keys silently: the round trip must give back every key.
    assert api.sanitize_for_serialization(affinity) == doc["affinity"]
    terms = affinity.node_affinity.preferred_during_scheduling_ignored_during_execution
    weights = [t.weight for t in terms]
    assert weights == sorted(weights, reverse=True) and len(set(weights)) == len(weights)
    assert all(1 <= w <= 100 for w in weights) and weights[0] == 100
    exprs = [t.preference.match_expressions[0] for t in terms]
    assert (exprs[0].key, exprs[0].values) == ("nvidia.com/gpu.product",
                                               ["NVIDIA-H100-80GB-HBM3"])
    assert ("amd.com/gpu.product-name", ["AMD_Instinct_MI300X"]) in \
        [(e.key, e.values) for e in exprs]
    assert all(e.operator == "In" for e in exprs)
    bad = json.loads(json.dumps(doc["affinity"]))
    bad["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["wieght"] = 5
    assert api.sanitize_for_serialization(_deserialize(api, bad, "V1Affinity")) != bad


def test_slurm_lines_per_choice() -> None:
    text = render("slurm", RESULT, JOB, Catalog.default())
    choices = re.findall(r"# choice (\d+): (\S+)\n#SBATCH --nodes=2\n#SBATCH --gres=gpu:(\S+):8"
                         r"\n#SBATCH --constraint=(\S+)", text)
    assert [c[1] for c in choices] == [r["hardware"] for r in RESULT["ranking"]]
    assert choices[0][2:] == ("h100-sxm", "h100-sxm")


def test_the_users_catalog_renames_and_empty_answers_say_so(tmp_path: Path) -> None:
    mine = tmp_path / "catalog.toml"
    mine.write_text('[[hardware]]\nname = "H100-SXM"\nskypilot_name = "H100-MEGA"\n'
                    'slurm_gres = "h100"\nslurm_constraint = "hopper"\n'
                    'k8s_label_value = "H100-custom"\n')
    cat = Catalog.load(mine)
    assert "H100-MEGA:8" in render("skypilot", RESULT, JOB, cat)
    assert "--gres=gpu:h100:8\n#SBATCH --constraint=hopper" in render("slurm", RESULT, JOB, cat)
    assert "- H100-custom" in render("kubernetes", RESULT, JOB, cat)
    assert cat.fingerprint() == Catalog.default().fingerprint()  # names are not figures
    empty = {"ranking": [], "reason": "no_model: nothing published"}
    for fmt in SCHEDULER_FORMATS:
        assert "# no advice: no_model: nothing published" in render(fmt, empty, JOB, cat)
    with pytest.raises(ConfigError, match="did you mean 'slurm'"):
        render("slurrm", RESULT, JOB, cat)


def test_cli_and_http_formats_on_a_real_model(trained_workspace: Workspace, tmp_path: Path,
                                              ranker: Ranker,  # noqa: F811
                                              jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(jobs[0]))
    res = runner.invoke(app, ["--home", str(trained_workspace.home), "rank", "--job",
                              str(job_file), "--candidates", "H100-SXM,L4,T4",
                              "--format", "skypilot"])
    assert res.exit_code == 0, res.output
    want = [r.hardware for r in ranker.rank(jobs[0], ["H100-SXM", "L4", "T4"]).ranking]
    sky = {"H100-SXM": "H100", "L4": "L4", "T4": "T4"}
    doc = _body(res.output)
    assert [c["accelerators"].split(":")[0] for c in doc["resources"]["ordered"]] == \
        [sky[h] for h in want]
    res = runner.invoke(app, ["--home", str(trained_workspace.home), "rank", "--job",
                              str(job_file), "--format", "yaml"])
    assert res.exit_code == 1 and "unknown format 'yaml'" in res.output
    with TestClient(create_app(ranker.with_options())) as client:
        r = client.post("/v1/rank", json={"job": jobs[0], "candidates": ["H100-SXM", "L4"],
                                          "format": "kubernetes"})
        assert r.status_code == 200
        body = r.json()
        assert body["format"] == "kubernetes" and body["ranking"]
        terms = _body(body["formatted"])["affinity"]["nodeAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"]
        assert len(terms) == len(body["ranking"])
        r = client.post("/v1/rank", json={"job": jobs[0], "format": "helm"})
        assert r.status_code == 422 and "format" in r.json()["detail"]
        assert client.post("/v1/rank", json={"job": jobs[0]}).json()["formatted"] is None
