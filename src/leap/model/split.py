"""The model split by novelty (:class:`NoveltySplitModel`), and what works on every model
kind: the :data:`Model` union, its boosters, its compiled scorers and its files."""

from __future__ import annotations

import json

import lightgbm as lgb
import numpy as np

from leap.errors import ArtifactError
from leap.metrics import accuracy
from leap.model.cascade import CascadeModel, Fitted, Fitter, GlobalModel, Scorer

#: Shares of the novel model's correction (over the base margin) tried on the rows of types a
#: family never ran on; :meth:`NoveltySplitModel.fit` keeps the one most accurate on the
#: validation day's such rows as they came (0: the history-adjusted estimate alone, 1: the
#: model as fitted).
SHRINK_GRID: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
#: Validation rows needed before the share is chosen (else 1).
SHRINK_MIN_ROWS = 100


class NoveltySplitModel(Fitted):
    """Two models routed by whether a row's family has history on the row's type.

    Rows with (family, type) history (``pair_feature`` present) go to ``seen``, trained on
    the fleet's rows as they were; the others (types the family never ran on, new families)
    go to ``novel``, trained on such rows plus rows whose own pair history was masked
    (:func:`leap.model.window.masked_rows`). Training one model on both mixes costs the rows
    with history accuracy; the split keeps each model on the mix it serves.

    Masked rows are families on types they did choose; the types a family never chose are
    another mix, on which the novel model's correction can move the history-adjusted
    estimate the wrong way. So on rows whose family ran on other types, its correction is
    scaled by ``shrink_``: the share of :data:`SHRINK_GRID` most accurate on the validation
    day's such rows as they came, never on masked rows. A new family keeps the whole
    correction: its validation rows are a few families, and a share chosen on them lost
    accuracy on later days (see the README).
    """

    kind = "split"
    PARTS = ("seen", "novel")

    def __init__(self, *, seen: GlobalModel | CascadeModel, novel: GlobalModel | CascadeModel,
                 pair_feature: str = "fam_hw_n") -> None:
        self.seen = seen
        self.novel = novel
        self.pair_feature = pair_feature
        self.shrink_ = 1.0

    def fit(self, X: np.ndarray, y: np.ndarray, *, base: np.ndarray, feature_names: list[str],
            categorical: list[str], masked: np.ndarray,
            val: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None,
            train: np.ndarray | None = None, fitter: Fitter | None = None
            ) -> NoveltySplitModel:
        """Fit ``seen`` on unmasked rows, ``novel`` on rows without pair history.

        ``masked`` marks the rows encoded with their own pair history removed; ``val`` is
        ``(X, y, base, masked)`` of the early-stopping rows; ``train`` (default: all) marks
        the rows of ``X`` to fit on, so the caller need not copy them out first.
        """
        self._set_columns(feature_names)
        train = np.ones(len(y), dtype=bool) if train is None else train
        novel = ~np.isfinite(np.asarray(X[:, self._col]))
        for part, rows, val_rows in (
                (self.seen, train & ~masked, None if val is None else ~val[3]),
                (self.novel, train & novel,
                 None if val is None else ~np.isfinite(val[0][:, self._col]))):
            v = None if val is None or val_rows is None else (
                val[0][val_rows], val[1][val_rows], val[2][val_rows])
            part.fit(X, y, base=base, feature_names=feature_names, categorical=categorical,
                     val=v, train=rows, fitter=fitter)
        self.fitted_ = True
        if val is not None:
            self.shrink_ = self._choose_shrink(val[0][~val[3]], val[1][~val[3]],
                                               val[2][~val[3]])
        return self

    def _set_columns(self, feature_names: list[str]) -> None:
        """The feature names, and the positions of the pair and family history counts (the
        latter -1 without a family-history column)."""
        self.feature_names_ = list(feature_names)
        self._col = self.feature_names_.index(self.pair_feature)
        self._fam_col = self.feature_names_.index("fam_n") if "fam_n" in feature_names else -1

    def _elsewhere(self, X: np.ndarray, novel: np.ndarray | None = None) -> np.ndarray:
        """Rows of ``X`` on a type their family never ran on, where it ran on others (none
        without a family-history column); ``novel``: the rows without pair history, when
        already known."""
        if self._fam_col < 0:
            return np.zeros(len(X), dtype=bool)
        novel = ~np.isfinite(X[:, self._col]) if novel is None else novel
        return novel & np.isfinite(X[:, self._fam_col])

    def _choose_shrink(self, X: np.ndarray, y: np.ndarray, base: np.ndarray) -> float:
        """The share of the novel model's correction most accurate on these rows (the
        validation day as it came) whose family ran elsewhere; ties go to the larger."""
        m = self._elsewhere(X)
        if m.sum() < SHRINK_MIN_ROWS:
            return 1.0
        b = base[m]
        full = self.novel.predict(X[m], base=b)
        actual = np.exp(y[m])
        scores = [accuracy(np.exp(b + s * (full - b)), actual) for s in SHRINK_GRID]
        return SHRINK_GRID[max(range(len(SHRINK_GRID)), key=lambda i: (scores[i], i))]

    def predict(self, X: np.ndarray, *, base: np.ndarray) -> np.ndarray:
        """Predicted log throughput per row, each from the model of its kind of row (the
        novel model's correction scaled by ``shrink_`` where the family ran elsewhere)."""
        self._check_fitted()
        out = np.empty(len(X), dtype=np.float64)
        novel = ~np.isfinite(X[:, self._col])
        for part, m in ((self.seen, ~novel), (self.novel, novel)):
            if m.any():
                out[m] = part.predict(X[m], base=base[m])
        if self.shrink_ != 1.0 and novel.any():
            m = self._elsewhere(X, novel)
            out[m] = base[m] + self.shrink_ * (out[m] - base[m])
        return out

    def to_files(self) -> dict[str, str]:
        self._check_fitted()
        files = {"model.json": json.dumps({"kind": self.kind, "pair_feature": self.pair_feature,
                                           "feature_names": self.feature_names_,
                                           "shrink": self.shrink_}, indent=2)}
        for name in self.PARTS:
            for fname, text in getattr(self, name).to_files().items():
                files[f"{name}.{fname}"] = text
        return files

    @classmethod
    def from_files(cls, files: dict[str, str]) -> NoveltySplitModel:
        meta = json.loads(files["model.json"])
        parts = {}
        for name in cls.PARTS:
            sub = {k[len(name) + 1:]: v for k, v in files.items() if k.startswith(f"{name}.")}
            part = model_from_files(sub)
            if isinstance(part, NoveltySplitModel):
                raise ArtifactError("a split model cannot nest another split model")
            parts[name] = part
        m = cls(seen=parts["seen"], novel=parts["novel"], pair_feature=meta["pair_feature"])
        m._set_columns(meta["feature_names"])
        m.shrink_ = float(meta.get("shrink", 1.0))
        m.fitted_ = True
        return m


Model = GlobalModel | CascadeModel | NoveltySplitModel


def boosters(model: Model) -> dict[str, lgb.Booster]:
    """Every booster of ``model`` by name (its file name in the artifact, without ``.txt``)."""
    if isinstance(model, NoveltySplitModel):
        return {f"{part}.{name}": b for part in model.PARTS
                for name, b in boosters(getattr(model, part)).items()}
    if isinstance(model, CascadeModel):
        return {"router": model.router_, **{f"specialist_{j:02d}": b
                                            for j, b in enumerate(model.specialists_)}}
    return {"global": model.booster_}


def set_scorers(model: Model, scorers: dict[str, Scorer]) -> None:
    """Score ``model``'s boosters with ``scorers`` (named as :func:`boosters`; ``{}``: LightGBM).

    Each part's table is replaced whole, so a prediction running meanwhile sees either the
    old table or the new one.
    """
    if isinstance(model, NoveltySplitModel):
        for part in model.PARTS:
            set_scorers(getattr(model, part), {k[len(part) + 1:]: f for k, f in scorers.items()
                                               if k.startswith(f"{part}.")})
        return
    model.scorers_ = dict(scorers)


def model_from_files(files: dict[str, str]) -> Model:
    """Rebuild a fitted model from the text files :meth:`to_files` wrote."""
    try:
        kind = json.loads(files["model.json"])["kind"]
        if kind == "cascade":
            return CascadeModel.from_files(files)
        if kind == "global":
            return GlobalModel.from_files(files)
        if kind == "split":
            return NoveltySplitModel.from_files(files)
    except (KeyError, ValueError, TypeError, lgb.basic.LightGBMError) as exc:
        raise ArtifactError(f"model files are unreadable: {exc}") from None
    raise ArtifactError(f"unknown model kind {kind!r} in model.json")
