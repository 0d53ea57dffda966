"""Every HTTP request and response model of ``leap serve`` (pydantic), in one place.

The rank contract a scheduler codes against::

    POST /v1/rank  {"job": {...launch-time fields...}, "candidates": [...]}   (candidates optional)
    -> {"ranking": [{"hardware", "predicted_throughput", "cost_per_hour", "value",
                     "predicted_utilization", "speedup", "flags", ...}],
        "excluded": [{"hardware", "reason", "detail"}], "model_version", "reason",
        "objective", "latency_ms", "ignored_fields"}

New response fields always come with a default, so an older client keeps parsing (it ignores
what it does not know). ``leap rank --json`` prints the same response object.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from leap.data.schema import JOB_BOUNDS, MAX_BATCH_SIZE, MAX_COUNT, MAX_SIZE, PRECISIONS
from leap.rank.formats import SCHEDULER_FORMATS
from leap.rank.results import OBJECTIVES, RISKS

# The allowed values come from their one source (the job schema, the ranker's vocabulary,
# the scheduler formats); pydantic validates and documents them as these literals.
if TYPE_CHECKING:
    Precision: TypeAlias = str
    Objective: TypeAlias = str
    Risk: TypeAlias = str
    OutputFormat: TypeAlias = str
else:
    Precision = Literal[PRECISIONS]
    Objective = Literal[OBJECTIVES]
    Risk = Literal[RISKS]
    OutputFormat = Literal[("json", *SCHEDULER_FORMATS)]

HardwareName = Annotated[str, StringConstraints(min_length=1, max_length=128)]
_Name = Annotated[str, StringConstraints(min_length=1, max_length=512)]

#: Bounds keep requests physical (and every derived number finite); far above any real job.
#: They are the schema's (:data:`leap.data.schema.JOB_BOUNDS`), shared with every entry point.
_MAX_COUNT = MAX_COUNT
_MAX_SIZE = MAX_SIZE
_NUMERIC_FIELDS = tuple(JOB_BOUNDS)

_JOB_EXAMPLE: dict[str, Any] = {"family_id": "ads-ranker-daily", "model_type": "dlrm-large",
                "model_category": "recommendation", "trainer_count": 4, "batch_size": 4096,
                "devices_per_trainer": 8, "precision": "bf16", "num_params": 1.2e9,
                "flops_per_sample": 6.0e9}


def _size(description: str) -> Any:
    return Field(None, ge=0, le=_MAX_SIZE, allow_inf_nan=False, description=description)


def _count(description: str) -> Any:
    return Field(None, ge=1, le=_MAX_COUNT, description=description)


class Job(BaseModel):
    """A job as it is known at launch (the attempt record without its outcome).

    Unknown fields are accepted and ignored; their names come back in ``ignored_fields``
    (a misspelt optional field is visible, never silently used).
    """

    model_config = ConfigDict(extra="allow", populate_by_name=True,
                              json_schema_extra={"example": _JOB_EXAMPLE})

    family_id: _Name = Field(description="The recurring job this attempt belongs to "
                             "(history is keyed on it).")
    model_type: _Name = Field(description="Model architecture type.")
    trainer_count: int = Field(ge=1, le=_MAX_COUNT, description="Number of trainers (hosts).")
    batch_size: int = Field(ge=1, le=MAX_BATCH_SIZE,
                            description="Per-trainer batch size in samples.")
    model_category: _Name | None = Field(None, description="e.g. recommendation, vision, llm.")
    num_params: float | None = _size("Model parameters.")
    flops_per_sample: float | None = _size("Training FLOPs per sample (forward + backward); "
                                           "enables predicted MFU.")
    embedding_params: float | None = _size("Embedding-table parameters.")
    num_layers: float | None = _size("Layers.")
    hidden_dim: float | None = _size("Hidden width.")
    seq_len: float | None = _size("Sequence length.")
    num_dense_features: float | None = _size("Dense input features.")
    num_sparse_features: float | None = _size("Sparse input features.")
    precision: Precision | None = Field(
        None, description="Training precision (selects the peak FLOP/s).")
    devices_per_trainer: int | None = _count("Accelerators per trainer (default 1).")
    data_parallel: int | None = _count("Data-parallel degree.")
    tensor_parallel: int | None = _count("Tensor-parallel degree.")
    pipeline_parallel: int | None = _count("Pipeline-parallel degree.")
    # The wire name is "model_config" (pydantic reserves that attribute name for itself).
    definition: dict[str, Any] | None = Field(
        None, alias="model_config", description="The model's definition: a Hugging Face style "
        "config.json object (or leap's DLRM format). Its architecture summary fills the "
        "architecture fields left empty (never one you give); see `leap describe-model`.")

    @field_validator(*_NUMERIC_FIELDS, mode="before")
    @classmethod
    def _numbers_only(cls, v: Any) -> Any:
        # JSON true/false and "4" are not numbers, as in the Python API and every other entry
        # point (pydantic's lax mode would take them as 1 and 4).
        if isinstance(v, bool | str):
            kind = "boolean" if isinstance(v, bool) else "string"
            raise ValueError(f"must be a number, not a {kind}")
        return v

    def launch_fields(self) -> dict[str, Any]:
        """The set fields, extras included (what the ranker receives)."""
        return self.model_dump(exclude_none=True, by_alias=True)


class RankRequest(BaseModel):
    """Rank the candidate hardware types of one job."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "example": {"job": _JOB_EXAMPLE, "candidates": ["H100-SXM", "A100-SXM4-80GB", "L4"]}})

    job: Job
    candidates: list[HardwareName] | None = Field(
        None, min_length=1, max_length=1024,
        description="Eligible types (default: every type in the cost catalog). An unknown "
        "name is a 422 with a suggestion.")
    objective: Objective = Field(
        "value", description="value: samples per unit cost; throughput: fastest (within "
        "max_cost_per_hour when given).")
    max_cost_per_hour: float | None = Field(
        None, gt=0, le=1e12, allow_inf_nan=False,
        description="Budget: types whose cost per hour exceeds it are excluded.")
    risk: Risk = Field(
        "cautious", description="cautious (default): keep the cheapest type first unless a "
        "dearer one's predicted value gain is confident given the 80% intervals; neutral: "
        "order by the median prediction; averse: by the lower bound of each type's 80% "
        "interval.")
    free_devices: dict[HardwareName, Annotated[float, Field(ge=0, allow_inf_nan=False)]] | None = \
        Field(None, max_length=1024, description="Devices of each type free for this job now "
              "(optional, e.g. from the scheduler). A type with fewer than the job needs is "
              "kept, flagged no_free_devices, after every type with room.")
    format: OutputFormat = Field(
        "json", description="Also render the preference list in a scheduler's format "
        "(response field `formatted`): skypilot (resources.ordered), kubernetes (pod "
        "nodeAffinity preferences by weight), slurm (#SBATCH --gres/--constraint per choice).")


class RankedTypeOut(BaseModel):
    """One entry of the preference list."""

    hardware: str
    predicted_throughput: float = Field(description="samples/s of the whole job (median)")
    throughput_p10: float | None = Field(None, description="lower end of the 80% interval")
    throughput_p90: float | None = Field(None, description="upper end of the 80% interval")
    cost_per_hour: float = Field(description="devices x cost_per_device_hour")
    value: float = Field(description="samples per unit cost (predicted_throughput x 3600 / "
                         "cost_per_hour)")
    value_p10: float | None = Field(None, description="value at throughput_p10 (the key of "
                                    "the averse order)")
    value_p90: float | None = Field(None, description="value at throughput_p90")
    novelty: str | None = Field(None, description="what history the family had on the type: "
                                "seen_config, seen_pair_new_shape, unobserved_pair_1/2/3plus "
                                "(by types it ran on), new_family")
    predicted_utilization: float | None = Field(
        None, description="predicted model-FLOP utilization; null without flops_per_sample")
    speedup: float | None = Field(None, description="throughput over the fastest non-premium "
                                  "type the job fits on")
    devices: int = 1
    cost_per_device_hour: float = 0.0
    premium: bool = False
    flags: list[str] = Field(default_factory=list)


class ExcludedOut(BaseModel):
    """A candidate left out, with why."""

    hardware: str
    reason: str = Field(description="unknown_hardware, invalid_cost, does_not_fit_host, "
                        "does_not_fit_memory, premium_below_threshold or over_budget")
    detail: str = ""


class RankResponse(BaseModel):
    """The preference list. An empty ``ranking`` with a ``reason`` means: no advice (fail-open)."""

    model_config = ConfigDict(extra="ignore")

    ranking: list[RankedTypeOut] = Field(default_factory=list)
    excluded: list[ExcludedOut] = Field(default_factory=list)
    model_version: str | None = None
    reason: str | None = Field(None, description="null when ranked; else '<code>: <detail>' "
                               "(no_model, invalid_request, prediction_failed, client_*)")
    objective: str = "value"
    risk: str = "cautious"
    latency_ms: float = 0.0
    ignored_fields: list[str] = Field(default_factory=list)
    format: str = Field(default="json", description="the format asked for")
    formatted: str | None = Field(
        default=None, description="the preference list in `format` (YAML for skypilot and "
        "kubernetes, #SBATCH lines for slurm); null for json")

    @classmethod
    def failed(cls, reason: str, objective: str = "value") -> RankResponse:
        """An empty answer with ``reason`` (what a fail-open client returns)."""
        return cls(reason=reason, objective=objective)


class PredictJob(Job):
    """A job row for batch prediction: scored on ``hardware`` when set, else on every
    candidate."""

    hardware: HardwareName | None = None


class PredictRequest(BaseModel):
    """Predict samples/s for many (job, hardware) rows."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "example": {"jobs": [_JOB_EXAMPLE, {**_JOB_EXAMPLE, "hardware": "L4"}],
                    "candidates": ["H100-SXM", "L4"]}})

    jobs: list[PredictJob] = Field(min_length=1, max_length=10_000)
    candidates: list[HardwareName] | None = Field(
        None, min_length=1, max_length=1024,
        description="Types for rows without hardware (default: the model's whole catalog).")


class PredictionRow(BaseModel):
    job: int = Field(description="index of the job in the request")
    family_id: str
    model_type: str
    trainer_count: int
    batch_size: int
    hardware: str
    predicted_throughput: float
    throughput_p10: float | None = None
    throughput_p90: float | None = None
    novelty: str | None = None


class PredictResponse(BaseModel):
    model_config = ConfigDict(extra="ignore")

    predictions: list[PredictionRow] = Field(default_factory=list)
    model_version: str | None = None
    reason: str | None = None
    latency_ms: float = 0.0


class Health(BaseModel):
    status: Literal["ok", "degraded"] = Field(description="degraded: no model loaded (rank "
                                              "answers fail open)")
    model_version: str | None = None
    reason: str | None = None
    refused_version: str | None = Field(default=None, description="The last published version that "
                                        "failed to load or verify and was refused (the "
                                        "serving model kept serving); null once a good one "
                                        "loads")
    refused_reason: str | None = Field(default=None, description="Why refused_version was refused.")


class ModelInfo(BaseModel):
    """The serving model: version, training window, held-out metrics."""

    model_config = ConfigDict(extra="allow")

    version: str | None = None
    reason: str | None = None
    as_of: str | None = None
    window_start: str | None = None
    window_end: str | None = None
    window_days: int | None = None
    model_kind: str | None = None
    created_at: str | None = None
    loaded_at: str | None = None
    scoring: str | None = Field(default=None, description="How the boosters are scored: 'compiled' "
                                "(native code, checked equal to LightGBM) or 'lightgbm: <why>'.")
    pair_rows: str | None = Field(default=None, description="How a request's pair-model rows "
                                  "are computed: 'compiled' (leap.features._native, checked "
                                  "equal to NumPy) or 'numpy'.")
    transfer_features: str | None = Field(
        default=None, description="How a request's transfer features and shape-table lookups "
        "are computed: 'compiled' (leap.features._native, checked equal to NumPy) or 'numpy'.")
    metrics: dict[str, Any] = Field(default_factory=dict)
    catalog_fingerprint: str | None = None
    hardware: list[str] = Field(default_factory=list)
    reloads: int = 0
    reload_failures: int = 0
    reload_error: str | None = None
    refused_version: str | None = None
    refused_reason: str | None = None


class FieldError(BaseModel):
    field: str = Field(description="dotted path of the offending field, e.g. job.trainer_count")
    message: str
    type: str = "value_error"


class ErrorResponse(BaseModel):
    """A 4xx answer: ``detail`` names the field and the fix."""

    detail: str
    errors: list[FieldError] = Field(default_factory=list)
