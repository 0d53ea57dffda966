"""A preference list in the scheduler's own format: SkyPilot, Kubernetes or Slurm.

Names come from the catalog (``skypilot_name``, ``k8s_label_key``, ``k8s_label_value``,
``slurm_gres``, ``slurm_constraint``; your catalog TOML overrides them per type). A ranked type
without a name for the format is left out, and a comment says which. Counts: a job has
``trainer_count`` nodes of ``devices_per_trainer`` devices (1 when absent).

``skypilot``
    A task fragment: ``num_nodes`` and ``resources: ordered:`` with one ``accelerators:
    NAME:COUNT`` per choice, best first (SkyPilot tries them in order). Types sharing a SkyPilot
    name (e.g. A100 PCIe and SXM4 40GB are both ``A100``) appear once, at the better rank.
    TPU names carry the slice size (``tpu-v5p-8``) and take a count of 1.
``kubernetes``
    A pod ``affinity`` with ``nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution``:
    one term per choice on the type's node label, with weights from 100 (first choice) down
    to at least 1. Default label keys by vendor: NVIDIA ``nvidia.com/gpu.product`` (GPU
    feature discovery; values such as ``NVIDIA-H100-80GB-HBM3``), AMD
    ``amd.com/gpu.product-name`` (the AMD GPU operator's node labeller; ``AMD_Instinct_MI300X``),
    Google ``cloud.google.com/gke-tpu-accelerator`` (GKE; ``tpu-v5p-slice``). Other vendors
    have no default key: set ``k8s_label_key`` (e.g. ``node.kubernetes.io/instance-type``).
    It is a preference, never a requirement: eligibility stays with the scheduler.
``slurm``
    Per choice, the ``#SBATCH`` lines ``--nodes``, ``--gres=gpu:TYPE:COUNT`` and
    ``--constraint=FEATURE``. GRES types and node features are site-specific: the defaults are
    the catalog name in lower case; set ``slurm_gres`` / ``slurm_constraint`` to your site's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from leap.catalog import Catalog, Hardware
from leap.errors import ConfigError, did_you_mean

SCHEDULER_FORMATS: tuple[str, ...] = ("skypilot", "kubernetes", "slurm")
K8S_DEFAULT_LABEL_KEYS: dict[str, str] = {
    "NVIDIA": "nvidia.com/gpu.product",
    "AMD": "amd.com/gpu.product-name",
    "Google": "cloud.google.com/gke-tpu-accelerator",
}


def check_format(fmt: str) -> str:
    if fmt not in SCHEDULER_FORMATS:
        raise ConfigError(f"unknown format '{fmt}'{did_you_mean(fmt, SCHEDULER_FORMATS)}; "
                          f"formats: {', '.join(SCHEDULER_FORMATS)}")
    return fmt


def skypilot_name(hw: Hardware) -> str:
    return hw.skypilot_name


def k8s_label(hw: Hardware) -> tuple[str, str] | None:
    key = hw.k8s_label_key or K8S_DEFAULT_LABEL_KEYS.get(hw.vendor, "")
    return (key, hw.k8s_label_value) if key and hw.k8s_label_value else None


def slurm_names(hw: Hardware) -> tuple[str, str]:
    return (hw.slurm_gres or hw.name.lower(), hw.slurm_constraint or hw.name.lower())


def _shape(job: Mapping[str, Any]) -> tuple[int, int]:
    nodes = int(job.get("trainer_count") or 1)
    per_node = int(job.get("devices_per_trainer") or 1)
    return nodes, per_node


def _header(result: Mapping[str, Any], job: Mapping[str, Any], fmt: str) -> list[str]:
    return [f"# leap preference list ({fmt}) for family {job.get('family_id', '?')}, "
            f"model {result.get('model_version') or '-'}, by {result.get('objective', 'value')}",
            "# a preference, not an instruction: eligibility and placement stay with the "
            "scheduler"]


def _no_advice(result: Mapping[str, Any]) -> list[str]:
    return [f"# no advice: {result.get('reason') or 'empty ranking'}; keep your own resources"]


def _dump(doc: Any) -> str:
    import yaml

    return str(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))


def render(fmt: str, result: Mapping[str, Any], job: Mapping[str, Any], catalog: Catalog
           ) -> str:
    """The ranking ``result`` (a :meth:`RankResult.to_dict`) of ``job`` in ``fmt``.

    Parameters
    ----------
    fmt : {"skypilot", "kubernetes", "slurm"}
    result : mapping
        The rank answer (``ranking`` entries with ``hardware``, best first).
    job : mapping
        The job's launch-time fields (``trainer_count``, ``devices_per_trainer``).
    catalog : Catalog
        Where the scheduler names come from (the user's catalog).

    Returns
    -------
    str
        YAML (skypilot, kubernetes) or ``#SBATCH`` lines (slurm), with ``#`` comments.

    Examples
    --------
    >>> from leap.catalog import Catalog
    >>> r = {"ranking": [{"hardware": "H100-SXM"}, {"hardware": "L4"}]}
    >>> print(render("skypilot", r, {"trainer_count": 2, "devices_per_trainer": 8},
    ...              Catalog.default()).splitlines()[-3:])
    ['  ordered:', '  - accelerators: H100:8', '  - accelerators: L4:8']
    """
    check_format(fmt)
    names = [str(e["hardware"]) for e in result.get("ranking") or []]
    lines = _header(result, job, fmt)
    if not names:
        return "\n".join(lines + _no_advice(result)) + "\n"
    known = [n for n in names if n in catalog]
    missing = [n for n in names if n not in catalog]
    nodes, per_node = _shape(job)
    if fmt == "skypilot":
        ordered: list[dict[str, str]] = []
        seen: set[str] = set()
        unnamed = list(missing)
        for n in known:
            sky = skypilot_name(catalog[n])
            if not sky:
                unnamed.append(n)
                continue
            if sky in seen:
                continue
            seen.add(sky)
            count = 1 if sky.startswith("tpu-") else per_node
            ordered.append({"accelerators": f"{sky}:{count}"})
        if unnamed:
            lines.append(f"# left out (no skypilot_name in the catalog): {', '.join(unnamed)}")
        if not ordered:
            return "\n".join(lines + _no_advice({"reason": "no ranked type has a SkyPilot "
                                                           "name"})) + "\n"
        return "\n".join(lines) + "\n" + _dump({"num_nodes": nodes,
                                                "resources": {"ordered": ordered}})
    if fmt == "kubernetes":
        labelled = [(n, k8s_label(catalog[n])) for n in known]
        terms = [(n, lab) for n, lab in labelled if lab is not None]
        unnamed = missing + [n for n, lab in labelled if lab is None]
        if unnamed:
            lines.append(f"# left out (no Kubernetes node label in the catalog): "
                         f"{', '.join(unnamed)}")
        if not terms:
            return "\n".join(lines + _no_advice({"reason": "no ranked type has a node "
                                                           "label"})) + "\n"
        step = 99 // max(len(terms) - 1, 1)
        prefs = [{"weight": max(1, 100 - i * step),
                  "preference": {"matchExpressions": [
                      {"key": key, "operator": "In", "values": [value]}]}}
                 for i, (_, (key, value)) in enumerate(terms)]
        lines.append("# weights by rank: " + ", ".join(
            f"{n}={p['weight']}" for (n, _), p in zip(terms, prefs, strict=True)))
        return "\n".join(lines) + "\n" + _dump({"affinity": {"nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": prefs}}})
    # slurm
    if missing:
        lines.append(f"# left out (not in the catalog): {', '.join(missing)}")
    for i, n in enumerate(known, start=1):
        gres, feature = slurm_names(catalog[n])
        lines += [f"# choice {i}: {n}", f"#SBATCH --nodes={nodes}",
                  f"#SBATCH --gres=gpu:{gres}:{per_node}", f"#SBATCH --constraint={feature}"]
    return "\n".join(lines) + "\n"
