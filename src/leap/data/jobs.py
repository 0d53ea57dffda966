"""One validation of a job's launch-time fields, for every entry point alike.

The CLI (``leap rank``, ``leap predict``), the Python API (:meth:`Ranker.rank`,
:meth:`Ranker.predict`), the HTTP service and batch frames all check jobs here, against the
schema (:data:`~leap.data.schema.JOB_COLUMNS`, :data:`~leap.data.schema.JOB_BOUNDS`): the same
types (booleans are never numbers; NumPy scalars are numbers), the same ranges (counts >= 1,
sizes >= 0, nothing non-finite), and messages that name the field (and the row of a batch).

A job may describe its model by its definition instead of its numbers: ``"model_config":
{...}`` (a Hugging Face style config.json, see :mod:`leap.arch`). Its summary fills the
architecture fields the job left empty, here and only here (:func:`expand_model_config`), so
training, batch prediction, ranking and the HTTP service all see the same numbers.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from leap.arch import describe_model
from leap.data.schema import ALL_COLUMNS, JOB_BOUNDS, JOB_COLUMNS, PRECISIONS
from leap.errors import DataError, did_you_mean

#: The fields every job must have.
REQUIRED_JOB: tuple[str, ...] = ("family_id", "model_type", "trainer_count", "batch_size")
INT_FIELDS = frozenset(c for c in JOB_COLUMNS if ALL_COLUMNS[c] == pa.int64())
STR_FIELDS = frozenset(c for c in JOB_COLUMNS if ALL_COLUMNS[c] == pa.string())
#: Identity fields of an attempt that a caller may send along with the job; never features.
IDENTITY = frozenset({"attempt_id", "submitted_at", "hardware"})
#: The job field that carries a model definition (expanded by :func:`expand_model_config`).
MODEL_CONFIG = "model_config"


def _fmt(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def check_value(name: str, v: Any) -> Any:
    """``v`` as the typed value of job field ``name`` (``None`` stays ``None``).

    Raises
    ------
    DataError
        Wrong type (a boolean for a number, text for a count ...) or out of range.

    Examples
    --------
    >>> import numpy as np
    >>> check_value("trainer_count", np.int64(4))
    4
    >>> check_value("trainer_count", True)
    Traceback (most recent call last):
    ...
    leap.errors.DataError: job field 'trainer_count' must be a whole number, got True
    """
    if v is None:
        return None
    if name in STR_FIELDS:
        if not isinstance(v, str) or not v:
            raise DataError(f"job field '{name}' must be a non-empty string, got {_fmt(v)}")
        if name == "precision" and v not in PRECISIONS:
            raise DataError(f"job field 'precision' must be one of {', '.join(PRECISIONS)}, "
                            f"got {_fmt(v)}{did_you_mean(v, PRECISIONS)}")
        return v
    lo, hi = JOB_BOUNDS[name]
    whole = name in INT_FIELDS
    kind = "a whole number" if whole else "a finite number"
    # Plain int and float (what JSON gives) skip the abstract-class checks, which were a
    # quarter of checking a batch of jobs; bool is not ``int`` by type, so it takes them.
    plain = type(v)
    if plain is not int and plain is not float and (
            isinstance(v, bool | np.bool_) or not isinstance(v, numbers.Real)):
        raise DataError(f"job field '{name}' must be {kind}, got {_fmt(v)}")
    if plain is int or (plain is not float and isinstance(v, numbers.Integral)):
        iv = int(v)
        if not lo <= iv <= hi:
            got = _fmt(iv) if abs(iv) < 10**20 else f"a number of {len(str(abs(iv)))} digits"
            raise DataError(_range(name, iv < lo, lo, hi, got))
        return iv if whole else float(iv)
    fv = float(v)
    if not math.isfinite(fv) or (whole and fv != int(fv)):
        raise DataError(f"job field '{name}' must be {kind}, got {_fmt(v)}")
    if not lo <= fv <= hi:
        raise DataError(_range(name, fv < lo, lo, hi, _fmt(v)))
    return int(fv) if whole else fv


def _range(name: str, low: bool, lo: float, hi: float, got: str) -> str:
    bound = f">= {lo:g}" if low else f"<= {hi:g} (far above any real job)"
    return f"job field '{name}' must be {bound}, got {got}"


def _is_missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _summary_fields(config: Any, seq_len: Any, where: str) -> dict[str, float | None]:
    seq = check_value("seq_len", None if _is_missing(seq_len) else seq_len)
    if seq is not None and seq != int(seq):
        raise DataError(f"{where}job field 'seq_len' must be a whole number with "
                        f"'{MODEL_CONFIG}', got {_fmt(seq_len)}")
    return describe_model(config, seq_len=None if seq is None or seq < 1 else int(seq),
                          origin=f"{where}job field '{MODEL_CONFIG}'").columns()


def expand_model_config(job: Mapping[str, Any]) -> Mapping[str, Any]:
    """``job`` with the architecture fields it left empty filled from its ``model_config``.

    The summary (:func:`leap.arch.describe_model`, FLOPs at the job's ``seq_len`` when it
    states one) never overrides a value the job gives. A job without ``model_config`` is
    returned as it is; otherwise a new dict without the ``model_config`` key.

    Raises
    ------
    DataError
        The config cannot be read (the message names the field of the config).

    Examples
    --------
    >>> job = expand_model_config({"family_id": "f", "num_layers": 6, "model_config": {
    ...     "model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
    ...     "vocab_size": 50257, "n_positions": 1024}})
    >>> job["num_layers"], round(job["num_params"] / 1e6)
    (6, 124)
    """
    if MODEL_CONFIG not in job:
        return job
    out = {k: v for k, v in job.items() if k != MODEL_CONFIG}
    config = job[MODEL_CONFIG]
    if config is None:
        return out
    for name, value in _summary_fields(config, job.get("seq_len"), "").items():
        if _is_missing(out.get(name)):
            out[name] = value
    return out


def check_job(job: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Check a job's launch-time fields and return them typed, with the ignored field names.

    Every :data:`~leap.data.schema.JOB_COLUMNS` key is in the result (``None`` when absent).
    Outcome and unknown fields are ignored and returned in the second element, so a caller
    can see a misspelt optional field.

    Raises
    ------
    DataError
        A required field is missing or a field has the wrong type or range; the message
        names the field.

    Examples
    --------
    >>> values, ignored = check_job({"family_id": "f1", "model_type": "resnet50",
    ...                              "trainer_count": 2, "batch_size": 256, "status": "ok"})
    >>> values["trainer_count"], ignored
    (2, ['status'])
    """
    if not isinstance(job, Mapping):
        raise DataError(f"job must be an object of launch-time fields, got {type(job).__name__}")
    job = expand_model_config(job)
    out: dict[str, Any] = dict.fromkeys(JOB_COLUMNS)
    ignored = sorted(str(k) for k in job if k not in out and k not in IDENTITY)
    for name in REQUIRED_JOB:
        if job.get(name) is None:
            raise DataError(f"job field '{name}' is required (the launch-time fields are "
                            f"{', '.join(REQUIRED_JOB)} plus optional architecture fields)")
    for name in JOB_COLUMNS:
        out[name] = check_value(name, job.get(name))
    return out, ignored


def plain_values(values: Mapping[str, Sequence[Any]]) -> bool:
    """Whether each launch-time field's values (``values``: a list per field, as
    :func:`leap.features.encode.job_values` gives them) are each ``None`` or of the field's
    plain type: ``str`` for text, ``int`` for a count, ``int`` or a non-NaN ``float`` for a
    number.

    Such values typed as a frame (:func:`leap.features.encode.values_frame`) lose nothing, so
    :func:`check_jobs_frame` of that frame accepts exactly the jobs :func:`check_job` accepts,
    a whole column at a time. Any other value (a bool, a NumPy scalar, a float count, NaN) can
    be changed by the typing, so those jobs are checked one by one.

    >>> plain_values({"family_id": ["f"], "trainer_count": [2], "num_params": [1e9, None]})
    True
    >>> plain_values({"trainer_count": [2.0]}), plain_values({"num_params": [float("nan")]})
    (False, False)
    """
    none = type(None)
    for name, column in values.items():
        if name not in JOB_COLUMNS:
            continue
        kinds = set(map(type, column)) - {none}
        if name in STR_FIELDS:
            allowed: set[type] = {str}
        elif name in INT_FIELDS:
            allowed = {int}
        else:
            allowed = {int, float}
            if float in kinds and any(v != v for v in column):  # NaN is a value, not missing
                return False
        if not kinds <= allowed:
            return False
    return True


def check_jobs_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Check a batch of jobs (one per row) with the rules of :func:`check_job`.

    Missing values (``None``/``NaN``) are allowed in optional columns only; the message of a
    bad value names the field and its row (0-based, in frame order). A ``model_config`` column
    (a model definition per row, e.g. from JSON Lines) fills each row's empty architecture
    fields as :func:`expand_model_config` does; the frame returned has them and no
    ``model_config`` column (the frame passed in is not changed).

    Raises
    ------
    DataError
        The first bad value, e.g. ``jobs row 3: job field 'trainer_count' must be within
        [1, 1e+06], got -4``.

    Examples
    --------
    >>> import pandas as pd
    >>> ok = check_jobs_frame(pd.DataFrame({"family_id": ["f"], "model_type": ["m"],
    ...                                     "trainer_count": [2], "batch_size": [8]}))
    """
    missing = [c for c in REQUIRED_JOB if c not in frame.columns]
    if missing:
        raise DataError(f"jobs lack required field(s) {', '.join(missing)}")
    if MODEL_CONFIG in frame.columns:
        frame = fill_from_model_configs(frame)
    for name in [c for c in JOB_COLUMNS if c in frame.columns]:
        col = frame[name]
        null = col.isna().to_numpy()
        if name in REQUIRED_JOB and null.any():
            row = int(np.flatnonzero(null)[0])
            raise DataError(f"jobs row {row}: job field '{name}' is required")
        if name in STR_FIELDS or col.dtype == object or pd.api.types.is_bool_dtype(col):
            _check_each(name, col, null)
            continue
        if not pd.api.types.is_numeric_dtype(col):
            raise DataError(f"jobs: job field '{name}' must be numeric, got column type "
                            f"{col.dtype}")
        values = col.to_numpy(dtype=np.float64, na_value=np.nan)
        lo, hi = JOB_BOUNDS[name]
        present = ~null
        bad = present & ~(np.isfinite(values) & (values >= lo) & (values <= hi))
        if name in INT_FIELDS:
            bad |= present & np.isfinite(values) & (values != np.round(values))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            _check_each(name, col.iloc[row:row + 1], null[row:row + 1], offset=row)
            raise DataError(f"jobs row {row}: job field '{name}' must be within [{lo:g}, "
                            f"{hi:g}], got {_fmt(col.iloc[row])}")  # (check_value said so)
    return frame


def fill_from_model_configs(frame: pd.DataFrame, config: Any = None) -> pd.DataFrame:
    """A copy of ``frame`` whose empty architecture cells are filled from model definitions.

    Each row's definition is its ``model_config`` cell, else ``config`` (one definition for
    every row, e.g. ``leap predict --model-config FILE``); rows with neither are unchanged.
    FLOPs use each row's ``seq_len`` when it has one. The ``model_config`` column is dropped.

    Raises
    ------
    DataError
        A definition cannot be read; the message names the row and the config field.
    """
    out = frame.drop(columns=[MODEL_CONFIG]) if MODEL_CONFIG in frame.columns else frame.copy()
    per_row = frame[MODEL_CONFIG].tolist() if MODEL_CONFIG in frame.columns \
        else [None] * len(frame)
    seqs = frame["seq_len"].tolist() if "seq_len" in frame.columns else [None] * len(frame)
    filled: dict[str, list[Any]] = {}
    cache: dict[tuple[int, Any], dict[str, float | None]] = {}
    for i, (row_config, seq) in enumerate(zip(per_row, seqs, strict=True)):
        chosen = config if _is_missing(row_config) else row_config
        if chosen is None:
            continue
        key = (id(chosen), None if _is_missing(seq) else seq)
        if key not in cache:
            where = f"jobs row {i}: " if chosen is row_config else ""
            cache[key] = _summary_fields(chosen, seq, where)
        for name, value in cache[key].items():
            filled.setdefault(name, [None] * len(frame))[i] = value
    for name, values in filled.items():
        new = pd.Series(values, index=out.index, dtype="float64")
        out[name] = out[name].where(out[name].notna(), new) if name in out.columns else new
    return out


def _check_each(name: str, col: pd.Series, null: np.ndarray, offset: int = 0) -> None:
    if isinstance(col.dtype, pd.StringDtype):
        # Every value is text, so a value's verdict is the same in every row: each distinct
        # one is checked once (a batch of jobs x types repeats most of them), and a bad one
        # is named at its first row.
        codes, uniques = pd.factorize(col)
        for k, v in enumerate(uniques.tolist()):
            try:
                check_value(name, v)
            except DataError as exc:
                row = int(np.flatnonzero(codes == k)[0])
                raise DataError(f"jobs row {offset + row}: {exc}") from None
        return
    for i, (v, is_null) in enumerate(zip(col.tolist(), null.tolist(), strict=True)):
        if is_null:
            continue
        try:
            check_value(name, v)
        except DataError as exc:
            raise DataError(f"jobs row {offset + i}: {exc}") from None
