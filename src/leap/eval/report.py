"""The evaluation report: PNG plots, a self-contained HTML page and a JSON with every number.

:func:`write_report` takes the results of the backtest, the lookup comparison, the ranking
study, the impact study and (optionally) the real-data evaluation, each a JSON-ready dict or
None, and writes into one folder:

``index.html``
    the page (inline CSS, images referenced by relative path in the same folder);
``report.json``
    every number the page shows, and more;
``accuracy_per_night.png``, ``error_distribution.png``, ``lookup_vs_leap.png``,
``ranking_regret.png``, ``impact_cost.png``
    one plot per study present.

The headline tables come from :mod:`leap.eval.tables` (the same rows the terminal shows) and
the plots from :mod:`leap.eval.plots`; this module lays out the page.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from leap import __version__
from leap.errors import ConfigError
from leap.eval.experiment_tables import (
    alternatives_table,
    new_families_table,
    new_hardware_tables,
    trials_table,
)
from leap.eval.plots import (
    PLOTS,
    plot_accuracy,
    plot_errors,
    plot_impact,
    plot_lookup,
    plot_ranking,
)
from leap.eval.tables import (
    ARM_LABELS,
    Table,
    backtest_tables,
    impact_tables,
    lookup_tables,
    money,
    pct,
    ranking_tables,
    real_data_fold_tables,
    real_data_reference_lines,
    real_data_tables,
    signed_pct,
)

if TYPE_CHECKING:
    from leap.eval.alternatives import AlternativesResult
    from leap.eval.backtest import BacktestResult
    from leap.eval.new_families import NewFamiliesResult
    from leap.eval.new_hardware import NewHardwareResult
    from leap.eval.real_data import RealDataResult
    from leap.eval.studies import ImpactResult, LookupResult, RankingResult
    from leap.eval.trials_check import TrialsResult

__all__ = ["PLOTS", "Table", "impact_tables", "new_families_table", "pct", "plot_accuracy",
           "plot_errors", "plot_impact", "plot_lookup", "plot_ranking", "real_data_section",
           "report_tables", "write_report"]


def report_tables(*, backtest: BacktestResult | None = None, lookup: LookupResult | None = None,
                  ranking: RankingResult | None = None, impact: ImpactResult | None = None,
                  new_families: NewFamiliesResult | None = None,
                  new_hardware: NewHardwareResult | None = None,
                  trials: TrialsResult | None = None,
                  alternatives: AlternativesResult | None = None) -> list[Table]:
    """The headline tables of the results given (see :func:`write_report`), as strings.

    Examples
    --------
    >>> [t.title for t in report_tables()]
    []
    """
    tables: list[Table] = []
    if backtest is not None:
        tables.extend(backtest_tables(backtest))
    if lookup is not None:
        tables.extend(lookup_tables(lookup))
    if ranking is not None:
        tables.extend(ranking_tables(ranking))
    if impact is not None:
        tables.extend(impact_tables(impact.figures))
    if new_families is not None:
        tables.append(new_families_table(new_families))
    if new_hardware is not None:
        tables.extend(new_hardware_tables(new_hardware))
    if trials is not None:
        tables.append(trials_table(trials))
    if alternatives is not None:
        tables.append(alternatives_table(alternatives))
    return tables


def _html_table(t: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>"
                   for row in t.rows)
    return (f"<table><caption>{html.escape(t.title)}</caption><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>")


# The page ---------------------------------------------------------------------------------------
_CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;
color:#222}table{border-collapse:collapse;margin:1em 0;font-size:.9em}caption{text-align:left;
font-weight:600;padding:.3em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}
td:first-child,th:first-child{text-align:left}img{max-width:100%;border:1px solid #eee}
.note{color:#555;font-size:.9em}"""


@dataclass(frozen=True)
class _Parts:
    """The results a page shows (None: not run)."""

    backtest: BacktestResult | None
    lookup: LookupResult | None
    ranking: RankingResult | None
    impact: ImpactResult | None
    real_data: RealDataResult | None
    new_families: NewFamiliesResult | None
    new_hardware: NewHardwareResult | None
    trials: TrialsResult | None
    alternatives: AlternativesResult | None


def write_report(out_dir: Path, *, backtest: BacktestResult | None = None,
                 lookup: LookupResult | None = None,
                 ranking: RankingResult | None = None,
                 impact: ImpactResult | None = None,
                 real_data: RealDataResult | None = None,
                 notes: Sequence[str] = (), meta: Mapping[str, Any] | None = None,
                 new_families: NewFamiliesResult | None = None,
                 new_hardware: NewHardwareResult | None = None,
                 trials: TrialsResult | None = None,
                 alternatives: AlternativesResult | None = None) -> Path:
    """Write ``index.html``, ``report.json`` and the plots into ``out_dir``; return the page.

    Parameters
    ----------
    out_dir : Path
        Created if missing; files of the same names are replaced.
    backtest : BacktestResult, optional
        :func:`leap.eval.backtest.run_backtest`.
    lookup : LookupResult, optional
        :func:`leap.eval.studies.lookup_day` (or the backtest's last night).
    ranking : RankingResult, optional
        :func:`leap.eval.studies.ranking_day`.
    impact : ImpactResult, optional
        :func:`leap.eval.studies.impact_day`.
    real_data : RealDataResult, optional
        :func:`leap.eval.real_data.run_real_data`.
    new_families : NewFamiliesResult, optional
        :func:`leap.eval.new_families.new_families_study`.
    new_hardware : NewHardwareResult, optional
        :func:`leap.eval.new_hardware.new_hardware_study`.
    trials : TrialsResult, optional
        :func:`leap.eval.trials_check.trials_study`.
    alternatives : AlternativesResult, optional
        :func:`leap.eval.alternatives.alternatives_study`.
    notes : sequence of str
        Lines shown under the title (e.g. which model the studies used).
    meta : dict, optional
        Extra settings stored in the JSON.

    Raises
    ------
    ConfigError
        Nothing to report (every part is None).
    """
    parts = _Parts(backtest=backtest, lookup=lookup, ranking=ranking, impact=impact,
                   real_data=real_data, new_families=new_families, new_hardware=new_hardware,
                   trials=trials, alternatives=alternatives)
    as_json = {name: None if part is None else part.to_dict()
               for name, part in vars(parts).items()}
    if all(v is None for v in as_json.values()):
        raise ConfigError("nothing to report: pass at least one result (backtest, lookup, "
                          "ranking, impact or real data)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"generated_at": datetime.now(UTC).isoformat(),
                              "leap_version": __version__, "meta": dict(meta or {}),
                              "notes": list(notes), **as_json}
    images: dict[str, str] = {}
    if backtest is not None and backtest.nights:
        plot_accuracy(backtest, out_dir / PLOTS["backtest"])
        plot_errors(backtest, out_dir / PLOTS["errors"])
        images["backtest"] = PLOTS["backtest"]
        images["errors"] = PLOTS["errors"]
    if lookup is not None:
        plot_lookup(lookup, out_dir / PLOTS["lookup"])
        images["lookup"] = PLOTS["lookup"]
    if ranking is not None and ranking.figures.n_sampled:
        plot_ranking(ranking, out_dir / PLOTS["ranking"])
        images["ranking"] = PLOTS["ranking"]
    if impact is not None:
        plot_impact(impact.figures, out_dir / PLOTS["impact"])
        images["impact"] = PLOTS["impact"]
    report["images"] = images
    (out_dir / "report.json").write_text(json.dumps(report, indent=1, default=_default)
                                         + "\n", encoding="utf-8")
    page = out_dir / "index.html"
    page.write_text(_page(parts, report["generated_at"], notes, images), encoding="utf-8")
    return page


def _default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Path | datetime):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _img(images: Mapping[str, str], key: str, alt: str) -> str:
    if key not in images:
        return ""
    return f'<p><img src="{html.escape(images[key])}" alt="{html.escape(alt)}"></p>'


def _page(parts: _Parts, generated_at: str, notes: Sequence[str],
          images: Mapping[str, str]) -> str:
    tables = {t.key: t for t in report_tables(
        backtest=parts.backtest, lookup=parts.lookup, ranking=parts.ranking,
        impact=parts.impact, new_families=parts.new_families, new_hardware=parts.new_hardware,
        trials=parts.trials, alternatives=parts.alternatives)}
    body = [f"<h1>leap evaluation report</h1><p class=note>generated "
            f"{html.escape(generated_at[:19])} UTC by leap "
            f"{html.escape(__version__)}; every number is in "
            "<a href=report.json>report.json</a>.</p>"]
    body += [f"<p class=note>{html.escape(n)}</p>" for n in notes]
    if parts.backtest is not None:
        body.append("<h2>Backtest: nightly retraining, scored on the next day</h2>"
                    "<p>Accuracy = share of the held-out day's succeeded attempts whose predicted "
                    "throughput is within ±20% of the measured value (attempt-weighted, as in "
                    "the paper, and weighted by GPU-hours). It measures throughput estimates on "
                    "observed attempts, not whether jobs were placed on the best hardware. The "
                    "oracle ceiling is the share the simulator's true medians reach: measurement "
                    "noise caps every predictor there.</p>")
        body.append(_img(images, "backtest", "accuracy per night"))
        for key in ("backtest", "nights"):
            if key in tables:
                body.append(_html_table(tables[key]))
        body.append(_img(images, "errors", "error distribution"))
    if parts.lookup is not None:
        body.append("<h2>The lookup table (the previous system) vs LEAP</h2><p>The table "
                    "answers with the median throughput of past attempts of exactly the same "
                    "(family, hardware, trainer count, batch size) in the training window; "
                    "LEAP's accuracy is shown on the same covered subset.</p>")
        body.append(_img(images, "lookup", "lookup vs LEAP"))
        if "lookup" in tables:
            body.append(_html_table(tables["lookup"]))
    if parts.ranking is not None:
        rk = parts.ranking.figures
        body.append("<h2>Ranking quality against the oracle</h2><p>"
                    + html.escape("; ".join(f"{k}: {v}" for k, v in rk.definitions.items()))
                    + "</p>")
        body.append(_img(images, "ranking", "ranking regret"))
        if "ranking" in tables:
            body.append(_html_table(tables["ranking"]))
    if parts.impact is not None:
        im = parts.impact.figures
        hl = im.headline
        shown = [(a, h) for a in ("leap", "leap_aware", "greedy_oracle")
                 if (h := hl.arm(a)) is not None]
        lead = (f"The LP optimum saves {pct(hl.optimum_saving)} of the no-advice cost"
                + "".join(f"; {ARM_LABELS[a]} saves {signed_pct(h.saving)} "
                          f"({pct(h.share_of_optimum)} of the optimum's saving)"
                          for a, h in shown)
                + ". The paper: ~3% saving, 19.9% of attempts and 30.0% of GPU-hours on the "
                "first choice, 95% coverage.")
        body.append("<h2>Impact: will advice save money?</h2><p>" + html.escape(lead)
                    + "</p><p class=note>"
                    + html.escape("; ".join(f"{k}: {v}" for k, v in im.definitions.items()))
                    + "</p>")
        body.append(_img(images, "impact", "impact cost"))
        for key in ("impact", "impact_parts", "impact_bands"):
            if key in tables:
                body.append(_html_table(tables[key]))
        for arm in ("leap", "leap_aware", "greedy_oracle"):
            top = im.arms[arm].top_contributors if arm in im.arms else []
            if top:
                body.append(_html_table(Table(
                    f"top_{arm}", f"{ARM_LABELS[arm]}: the attempts that move the total most",
                    ("attempt", "devices", "home", "placed", "kind", "cost change",
                     "of no-advice cost"),
                    tuple((t.attempt_id, str(t.devices), t.home, t.placed, t.kind,
                           money(t.cost_change), signed_pct(t.share_of_baseline))
                          for t in top[:5]))))
    if parts.new_families is not None and "new_families" in tables:
        body.append("<h2>New families: left out of training</h2><p>Every family of a drawn "
                    "share of model types leaves the training window together, and one large "
                    "family leaves alone; their attempts of the held-out day are scored by the "
                    "model that saw them and by the one that did not, the latter with and "
                    "without their architecture columns (the prior a job's model_config "
                    "gives).</p>")
        body.append(_html_table(tables["new_families"]))
    if parts.new_hardware is not None:
        body.append("<h2>New hardware: a type held out of training</h2><p>Every attempt on "
                    "the type leaves the training window; its attempts of the held-out day are "
                    "scored by the model that saw it and by the one that did not, and jobs that "
                    "could run on it are ranked against the oracle. The newest type's curve "
                    "scores it night by night after its first day.</p>")
        for key in ("new_hardware", "new_hardware_curve"):
            if key in tables:
                body.append(_html_table(tables[key]))
    if parts.trials is not None and "trials" in tables:
        body.append("<h2>Trial jobs on a new type</h2><p>The planned trials (window spend x "
                    "expected ranking loss removed per trial dollar, greedy, model types "
                    "covered) against random trials of the same number and cost, measured by "
                    "the simulator, added to the history and retrained.</p>")
        body.append(_html_table(tables["trials"]))
    if parts.alternatives is not None and "alternatives" in tables:
        body.append("<h2>Alternatives on the same held-out day</h2><p>One encoded training "
                    "set; other learners (fit on the same rows, learning the same residual "
                    "above the base margin), the simple rules and leap's ablations predict the "
                    "same attempts, as they came and with their own pair history masked.</p>")
        body.append(_html_table(tables["alternatives"]))
    if parts.real_data is not None:
        body.append(real_data_section(parts.real_data))
    return (f"<!doctype html><html><head><meta charset=utf-8><title>leap evaluation report"
            f"</title><style>{_CSS}</style></head><body>{''.join(body)}</body></html>\n")


def real_data_section(result: RealDataResult) -> str:
    """The real-data evaluation as an HTML ``<section>``: the tables the terminal shows, and
    under each source's its scores per fold, folded away."""
    tables = {t.key: t for t in [*real_data_tables(result), *real_data_fold_tables(result)]}
    parts = ['<section id="real-data"><h2>Real measured throughput (public benchmarks)</h2>',
             f"<p>{html.escape(str(result.data.rows))} rows; data checksum "
             f"{html.escape(str(result.data.checksum))}. Accuracy = share within ±20% of "
             "the measurement on covered rows; MdAPE = median absolute percentage error.</p>"]
    for source in result.results:
        meta = result.data.sources.get(source)
        repo, licence = ("", "") if meta is None else (meta.repo, meta.license)
        parts.append(f"<h3>{html.escape(source)}</h3><p>{html.escape(str(repo))}"
                     f" — licence: {html.escape(str(licence))}</p>")
        parts.append(_html_table(tables[f"real_data_{source}"]))
        if (folds := tables.get(f"real_data_folds_{source}")) is not None:
            parts.append(f"<details><summary>{html.escape(source)} per fold (the type or "
                         f"model held out)</summary>{_html_table(folds)}</details>")
    lines = real_data_reference_lines(result)
    if lines:
        parts.append("<h3>Reference check (Lambda PyTorch, 1 GPU, type held out)</h3><ul>"
                     + "".join(f"<li>{html.escape(line)}</li>" for line in lines) + "</ul>")
    if "real_data_ranking" in tables:
        parts.append("<h3>Ranking on public prices (Lambda PyTorch, 1 GPU, type held out)</h3>"
                     + _html_table(tables["real_data_ranking"]))
    if result.verdicts:
        parts.append("<ul>" + "".join(f"<li>{html.escape(v)}</li>" for v in result.verdicts)
                     + "</ul>")
    parts.append("</section>")
    return "\n".join(parts)
