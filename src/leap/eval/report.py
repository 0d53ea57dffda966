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

:func:`report_tables` gives the same headline tables as plain rows for a terminal.
Matplotlib (Agg backend) is imported only when plotting.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from leap import __version__
from leap.errors import ConfigError
from leap.features.encode import NOVELTY_GROUPS

PLOTS: dict[str, str] = {
    "backtest": "accuracy_per_night.png",
    "errors": "error_distribution.png",
    "lookup": "lookup_vs_leap.png",
    "ranking": "ranking_regret.png",
    "impact": "impact_cost.png",
}
_METHOD_LABELS = {"leap": "LEAP (cautious, default)", "leap_risk_neutral": "LEAP, risk-neutral",
                  "leap_risk_averse": "LEAP, risk-averse",
                  "leap_no_premium_filter": "LEAP, no premium filter",
                  "cheapest": "cheapest type", "fastest_peak": "fastest peak FLOP/s",
                  "most_used": "family's most-used type", "random": "random (expected)"}
_ARM_LABELS = {"baseline": "no advice", "leap": "LEAP advice",
               "leap_aware": "LEAP told free devices", "greedy_oracle": "greedy oracle",
               "optimum": "LP optimum"}


@dataclass(frozen=True)
class Table:
    """A titled table of strings (for the terminal and the HTML page); ``key`` names the study."""

    key: str
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


def si(x: float | None) -> str:
    """A number with three significant digits and an SI suffix; a dash for missing values.

    >>> si(874_123.0), si(12.5), si(None)
    ('874k', '12.5', '—')
    """
    if x is None or x != x:
        return "—"
    for div, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def pct(x: Any, digits: int = 1) -> str:
    """A share as a percentage string; a dash for missing values.

    Examples
    --------
    >>> pct(0.7703), pct(None), pct(float("nan"))
    ('77.0%', '–', '–')
    """
    if x is None:
        return "–"
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "–"
    return "–" if not math.isfinite(v) else f"{100 * v:.{digits}f}%"


def _signed_pct(x: Any) -> str:
    if x is None or not math.isfinite(float(x)):
        return "–"
    return f"{100 * float(x):+.1f}%"


def _money(x: Any) -> str:
    if x is None or not math.isfinite(float(x)):
        return "–"
    return f"{float(x):,.0f}"


# Tables -----------------------------------------------------------------------------------------
def report_tables(report: Mapping[str, Any]) -> list[Table]:
    """The headline tables of a report dict (see :func:`write_report`), as strings.

    Examples
    --------
    >>> [t.title for t in report_tables({})]
    []
    """
    tables: list[Table] = []
    bt = report.get("backtest")
    if bt:
        s = bt["summary"]
        rows: list[tuple[str, ...]] = []
        for label, key in (("accuracy ±20% (attempts)", "accuracy"),
                           ("accuracy ±20% (GPU-hours)", "accuracy_gpu_hours"),
                           ("median abs. % error", "median_ape"),
                           ("coverage", "coverage"),
                           ("accuracy, seen families", "accuracy_seen_families"),
                           ("accuracy, unseen families", "accuracy_unseen_families"),
                           ("unseen-family share of attempts", "unseen_share"),
                           ("oracle ceiling (truth within ±20%)", "oracle_ceiling"),
                           ("lookup table coverage", "lookup_coverage")):
            blk = s.get(key)
            if blk:
                rows.append((label, pct(blk["median"]), pct(blk["min"]), pct(blk["max"])))
        paper = s.get("paper", {})
        rows.append(("paper: accuracy ±20% (attempts)", pct(paper.get("accuracy_median")),
                     pct(paper.get("accuracy_min")), pct(paper.get("accuracy_max"))))
        span = f"{bt['settings'].get('first_day', '')}..{bt['settings'].get('last_day', '')}"
        tables.append(Table("backtest", f"backtest: {s['nights']} nights {span}",
                            ("figure", "median", "min", "max"), tuple(rows)))
        nights = tuple(
            (n["day"], f"{int(n['held_out']['n']):,}", pct(n["held_out"]["accuracy"]),
             pct(n["held_out"].get("accuracy_gpu_hours")), pct(n["held_out"]["median_ape"]),
             pct((n.get("oracle_ceiling") or {}).get("accuracy")),
             pct(n["held_out"]["seen_families"]["accuracy"]),
             pct(n["held_out"]["unseen_families"]["accuracy"]))
            for n in bt["nights"])
        tables.append(Table("nights", "nights", ("day", "attempts", "±20%", "±20% GPU-h", "MdAPE",
                                       "ceiling", "seen fam.", "unseen fam."), nights))
        groups = []
        for g in NOVELTY_GROUPS:
            cells = [s.get(f"{kind}_{what}_{g}") for kind in ("novelty", "masked")
                     for what in ("accuracy", "interval_coverage")]
            if any(cells):
                groups.append((g.replace("_", " "), *(pct(c["median"]) if c else "—"
                                                      for c in cells)))
        if groups:
            tables.append(Table(
                "backtest_novelty", "backtest by novelty group (median over nights): as "
                "attempts came, and the same attempts with their own (family, type) history "
                "masked", ("group", "±20%", "80% interval covers", "±20%, masked",
                           "covers, masked"), tuple(groups)))
    lk = report.get("lookup")
    if lk:
        tables.append(Table(
            "lookup", f"lookup table vs LEAP on {lk.get('day', 'the held-out day')} "
            f"({lk['n']:,} attempts)", ("", "lookup table", "LEAP"),
            (("coverage", pct(lk["table_coverage"]), pct(lk["leap_coverage"])),
             ("accuracy ±20% on the table's covered subset", pct(lk["table_accuracy_covered"]),
              pct(lk["leap_accuracy_covered"])),
             ("same, GPU-hour weighted", pct(lk["table_accuracy_covered_gpu_hours"]),
              pct(lk["leap_accuracy_covered_gpu_hours"])),
             ("accuracy ±20% on all attempts (no estimate = miss)",
              pct(lk["table_accuracy_all"]), pct(lk["leap_accuracy_all"])),
             ("paper (13.3% coverage; 53.2% vs 85.1% covered)", "13.3% / 53.2%",
              "100% / 85.1%"))))
    xf = (lk or {}).get("spec_ratio_transfer")
    if xf:
        tables.append(Table(
            "spec_ratio_transfer", "types a family never ran on: LEAP beside the spec-ratio "
            "rule, on the rows the rule answers", ("group", "attempts", "rule covers",
                                                  "rule ±20%", "LEAP ±20%", "rule MdAPE",
                                                  "LEAP MdAPE"),
            tuple((g.replace("_", " "), f"{xf[g]['n']:,}", pct(xf[g]["rule_coverage"]),
                   pct(xf[g]["rule_accuracy"]), pct(xf[g]["leap_accuracy"]),
                   pct(xf[g]["rule_median_ape"]), pct(xf[g]["leap_median_ape"]))
                  for g in ("unobserved_pair_1", "unobserved_pair_2", "unobserved_pair_3plus",
                            "all") if g in xf)))
    rk = report.get("ranking")
    if rk:
        for key, what in (("methods", "the best type the premium rule allows"),
                          ("methods_all_types", "the best of all eligible types")):
            if key not in rk:
                continue
            ranked = tuple((_METHOD_LABELS.get(m, m), pct(r.get("top1_agreement")),
                            pct(r.get("mean_regret")), pct(r.get("median_regret")),
                            pct(r.get("mean_regret_gpu_hours")),
                            f"{r.get('mean_ndcg', math.nan):.3f}")
                           for m, r in rk[key].items())
            tables.append(Table("ranking" if key == "methods" else "ranking_all_types",
                                f"ranking vs the oracle ({what}): {rk['n_sampled']:,} jobs of "
                                f"{rk.get('day', 'the held-out day')}, LEAP ranked "
                                f"{pct(rk['leap_coverage'])}",
                                ("method", "top-1 agreement", "mean regret", "median regret",
                                 "mean regret (GPU-h)", "NDCG"), ranked))
        pvt = rk.get("prediction_vs_truth", {})
        order = ["with_hardware_history", *NOVELTY_GROUPS[:2], "without_hardware_history",
                 *NOVELTY_GROUPS[2:]]
        by_group = tuple((k.replace("_", " "), f"{int(pvt[k]['n']):,}",
                          pct(pvt[k]["accuracy"]), pct(pvt[k]["median_ape"]),
                          pct(pvt[k].get("interval_coverage"))) for k in order if k in pvt)
        if by_group:
            tables.append(Table("ranking_novelty", "LEAP's predicted samples/s of the ranked "
                                "(job, type) entries against the true median, by novelty",
                                ("entries", "n", "±20%", "MdAPE", "80% interval covers"),
                                by_group))
        picks = rk.get("pick_overprediction", {})
        if picks:
            tables.append(Table(
                "ranking_picks", "predicted / true value of each list's first type",
                ("method", "median", "90th percentile", "share above 1.5x"),
                tuple((_METHOD_LABELS.get(m, m), f"{p['median']:.2f}", f"{p['p90']:.2f}",
                       pct(p["share_above_1_5"])) for m, p in picks.items())))
    im = report.get("impact")
    if im:
        tables.extend(impact_tables(im))
    nf = report.get("new_families")
    if nf:
        tables.append(new_families_table(nf))
    return tables


def new_families_table(nf: Mapping[str, Any]) -> Table:
    """The new-families study (:func:`leap.eval.new_families.new_families_study`) as a table.

    Examples
    --------
    >>> blk = {"n": 10, "families": 2, "seen": {"accuracy": 0.8},
    ...        "held_out_with_prior": {"accuracy": 0.3},
    ...        "held_out_without_prior": {"accuracy": 0.2}, "drop_points": 50.0}
    >>> new_families_table({"day": "2026-01-31", "model_type_groups": blk}).rows[0][3]
    '80.0%'
    """
    labels = (("model_type_groups", "families of left-out model types (together)"),
              ("single_family", "one large family, alone (as the paper)"),
              ("new_on_the_day", "families new on the day (no history in either model)"))
    rows = []
    for key, label in labels:
        b = nf.get(key) or {}
        if not b.get("n"):
            continue
        rows.append((label, f"{int(b['n']):,}", f"{int(b.get('families', 0)):,}",
                     pct(b["seen"]["accuracy"]), pct(b["held_out_with_prior"]["accuracy"]),
                     pct(b["held_out_without_prior"]["accuracy"]),
                     f"{b.get('drop_points', math.nan):.1f}"))
    return Table("new_families", f"new families on {nf.get('day', 'the held-out day')}: "
                 "the same attempts scored by a model that saw their families and by one "
                 "trained without them, with and without the architecture columns",
                 ("attempts of", "n", "families", "±20% seen", "±20% held out",
                  "±20% held out, no architecture", "drop (points)"), tuple(rows))


def _html_table(t: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>"
                   for row in t.rows)
    return (f"<table><caption>{html.escape(t.title)}</caption><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>")


# Plots ------------------------------------------------------------------------------------------
def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy(backtest: Mapping[str, Any], path: Path) -> None:
    """Accuracy per night (both weightings, seen/unseen families) with the oracle ceiling.

    Examples
    --------
    >>> # plot_accuracy(backtest_result.to_json(), Path("accuracy_per_night.png"))
    """
    plt = _pyplot()
    nights = backtest["nights"]
    days = [datetime.fromisoformat(n["day"]) for n in nights]

    def series(*keys: str) -> np.ndarray:
        out = []
        for n in nights:
            cur: Any = n
            for k in keys:
                cur = cur.get(k) if isinstance(cur, Mapping) else None
            out.append(np.nan if cur is None else 100 * float(cur))
        return np.array(out)

    import matplotlib.dates as mdates

    fig, ax = plt.subplots(figsize=(9, 5.6), dpi=110)
    paper = backtest["summary"].get("paper", {})
    if paper:
        ax.axhspan(100 * paper["accuracy_min"], 100 * paper["accuracy_max"], color="0.88",
                   label="paper's 30 nights (73.5–80.6%)")
    ax.plot(days, series("oracle_ceiling", "accuracy"), "k--", lw=1.5,
            label="oracle ceiling (true median within ±20%)")
    ax.plot(days, series("held_out", "accuracy"), "o-", color="C0", lw=2,
            label="LEAP, attempt-weighted")
    ax.plot(days, series("held_out", "accuracy_gpu_hours"), "s-", color="C1", lw=1.5,
            label="LEAP, GPU-hour-weighted")
    ax.plot(days, series("held_out", "seen_families", "accuracy"), "^:", color="C2", ms=4,
            label="LEAP, families seen in the window")
    ax.plot(days, series("held_out", "unseen_families", "accuracy"), "v:", color="C3", ms=4,
            label="LEAP, unseen (new) families")
    med = backtest["summary"]["accuracy"]["median"] if backtest["summary"].get(
        "accuracy") else math.nan
    ax.set_title(f"Held-out accuracy per night ({len(nights)} nightly retrainings, "
                 f"median {pct(med)})")
    ax.set_xlabel("held-out day (UTC; model trained on the days before it)")
    ax.set_ylabel("held-out attempts within ±20% (%)")
    ax.set_ylim(0, 100)
    ax.xaxis.set_major_locator(mdates.DayLocator(interval=max(1, len(days) // 10)))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%Y-%m-%d"))
    if len(days) == 1:
        ax.set_xlim(days[0] - timedelta(days=1), days[0] + timedelta(days=1))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), fontsize=8, ncol=3)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_errors(backtest: Mapping[str, Any], path: Path) -> None:
    """Distribution of predicted / measured throughput over all nights, ±20% shaded.

    Examples
    --------
    >>> # plot_errors(backtest_result.to_json(), Path("error_distribution.png"))
    """
    plt = _pyplot()
    nights = backtest["nights"]
    edges = np.array(nights[0]["error_hist"]["log10_edges"])
    counts = np.sum([n["error_hist"]["counts"] for n in nights], axis=0).astype(float)
    total = counts.sum()
    share = 100 * counts / total if total else counts
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    ax.axvspan(math.log10(0.8), math.log10(1.2), color="C2", alpha=0.15,
               label="within ±20% (counted accurate)")
    ax.bar(edges[:-1], share, width=np.diff(edges), align="edge", color="C0",
           edgecolor="white", linewidth=0.3, label="LEAP, all nights")
    ticks = [0.1, 0.2, 0.5, 0.8, 1.0, 1.25, 2, 5, 10]
    ax.set_xticks([math.log10(t) for t in ticks], [f"{t:g}×" for t in ticks])
    ax.set_xlim(edges[0], edges[-1])
    ax.set_xlabel("predicted / measured throughput (log scale; ends include everything beyond)")
    ax.set_ylabel("held-out attempts (%) per bin")
    ax.set_title(f"Prediction error over {len(nights)} nights ({int(total):,} held-out attempts)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _bar_labels(ax: Any, bars: Any) -> None:
    for b in bars:
        h = b.get_height()
        if math.isfinite(h):
            ax.annotate(f"{h:.1f}%", (b.get_x() + b.get_width() / 2, h), ha="center",
                        va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")


def plot_lookup(lookup: Mapping[str, Any], path: Path) -> None:
    """Coverage and accuracy of the lookup table beside LEAP on one held-out day.

    Examples
    --------
    >>> # plot_lookup(lookup_comparison(past, held, pred), Path("lookup_vs_leap.png"))
    """
    plt = _pyplot()
    groups = ["coverage", "accuracy on the\ntable's covered subset",
              "accuracy on all attempts\n(no estimate = miss)"]
    table = [lookup["table_coverage"], lookup["table_accuracy_covered"],
             lookup["table_accuracy_all"]]
    leap = [lookup["leap_coverage"], lookup["leap_accuracy_covered"],
            lookup["leap_accuracy_all"]]
    x = np.arange(len(groups))
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    _bar_labels(ax, ax.bar(x - 0.2, 100 * np.array(table, float), 0.4, color="C7",
                           label="lookup table (family, hardware, trainers, batch)"))
    _bar_labels(ax, ax.bar(x + 0.2, 100 * np.array(leap, float), 0.4, color="C0",
                           label="LEAP"))
    ax.set_xticks(x, groups)
    ax.set_ylim(0, 110)
    ax.set_ylabel("share of held-out attempts (%)")
    ax.set_title(f"Lookup table vs LEAP on {lookup.get('day', 'the held-out day')} "
                 f"({lookup['n']:,} attempts, {lookup['n_covered']:,} covered by the table)")
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_ranking(ranking: Mapping[str, Any], path: Path) -> None:
    """Top-1 agreement per method, and the distribution of value regret (CDF).

    Examples
    --------
    >>> # plot_ranking(ranking_study(...), Path("ranking_regret.png"))
    """
    plt = _pyplot()
    methods = [m for m in ranking["methods"] if ranking["methods"][m].get("n")]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5.2), dpi=110)
    y = np.arange(len(methods))
    top1 = [100 * ranking["methods"][m]["top1_agreement"] for m in methods]
    regret = [100 * ranking["methods"][m]["mean_regret"] for m in methods]
    ax1.barh(y - 0.2, top1, 0.4, color="C0", label="top-1 agreement with the oracle")
    ax1.barh(y + 0.2, regret, 0.4, color="C3", label="mean value regret of the top choice")
    ax1.set_yticks(y, [_METHOD_LABELS.get(m, m) for m in methods])
    ax1.invert_yaxis()
    ax1.set_xlim(0, 100)
    ax1.set_xlabel("share of jobs / regret (%)")
    ax1.set_title("Top choice vs the oracle's best-value type")
    ax1.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    ax1.grid(alpha=0.3, axis="x")
    for i, m in enumerate(methods):
        vals = np.sort(np.array(ranking["regrets"].get(m, []), dtype=float))
        vals = vals[np.isfinite(vals)]
        if len(vals):
            ax2.step(100 * np.r_[0.0, vals], 100 * np.arange(len(vals) + 1) / len(vals),
                     where="post", color=f"C{i}", label=_METHOD_LABELS.get(m, m))
    ax2.set_xlabel("value regret of the top choice: 1 − true value / best true value (%)")
    ax2.set_ylabel("jobs with at most this regret (%)")
    ax2.set_xlim(0, 100)
    ax2.set_ylim(0, 101)
    ax2.set_title(f"Regret distribution ({ranking['n_sampled']:,} sampled jobs)")
    ax2.legend(fontsize=8, loc="lower right")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def impact_tables(im: Mapping[str, Any]) -> list[Table]:
    """The impact study as tables: headline beside the paper, arms with their parts, bands.

    Examples
    --------
    >>> # for t in impact_tables(impact_study(...)): print(t.title)
    """
    hl, cov = im["headline"], im["coverage"]
    paper = hl["paper"]
    head = [("paper (LEAP)", pct(paper["coverage"]), pct(paper["first_choice_attempts"]),
             pct(paper["first_choice_gpu_hours"]), f"~{pct(paper['cost_saving'], 0)}", "")]
    for arm in ("leap", "leap_aware", "greedy_oracle"):
        if arm in hl:
            h = hl[arm]
            head.append((_ARM_LABELS.get(arm, arm),
                         pct(cov["attempts"]) if arm.startswith("leap") else "",
                         pct(h["first_choice_attempts"]), pct(h["first_choice_gpu_hours"]),
                         _signed_pct(h["saving"]), pct(h["share_of_optimum"])))
    head.append(("LP optimum", "", "", "", _signed_pct(hl["optimum_saving"]), "100.0%"))
    if "optimum_within_budget_saving" in hl:
        head.append(("LP optimum, nobody waits", "", "", "",
                     _signed_pct(hl["optimum_within_budget_saving"]), ""))
    tables = [Table(
        "impact", f"impact: {', '.join(im['days'])}, {im['n_attempts']:,} attempts, no-advice "
        f"cost {_money(im['baseline_cost'])}; advice depth {im['advice_depth']}, delay cost "
        f"weight {im['delay_cost_weight']:g}",
        ("arm", "coverage", "first choice (attempts)", "first choice (GPU-h)", "cost saving",
         "share of the optimum's saving"), tuple(head))]
    kinds = ("on_advice", "displaced", "home", "waiting", "moved")
    rows = []
    for arm, a in im["arms"].items():
        sp = a.get("spread", {})
        rows.append((_ARM_LABELS.get(arm, arm), _signed_pct(a["cost_change"]),
                     _signed_pct(a["fleet_cost_change"]),
                     *(_signed_pct(a["parts"][k]) if k in a["parts"] else "" for k in kinds),
                     _signed_pct(a["trimmed"]["cost_change"]),
                     f"{_signed_pct(sp.get('min'))}..{_signed_pct(sp.get('max'))}"))
    tables.append(Table(
        "impact_parts", "cost change against no advice; its parts by placement kind sum to it "
        "(advice: first advised type; moved: the optimum off home; no delay: fleet cost only; "
        "trimmed: top 1% of attempts by cost left out)",
        ("arm", "change", "no delay", "advice", "displaced", "home", "waiting", "moved",
         "trimmed", "day range"),
        tuple(rows)))
    bands = list(dict.fromkeys(b for a in im["arms"].values() for b in a["bands"]))
    tables.append(Table(
        "impact_bands", "cost change by job size (devices)", ("arm", *bands),
        tuple((_ARM_LABELS.get(arm, arm), *(_signed_pct(a["bands"][b]["cost_change"])
                                           if b in a["bands"] else "" for b in bands))
              for arm, a in im["arms"].items())))
    return tables


def plot_impact(impact: Mapping[str, Any], path: Path) -> None:
    """Cost change per arm split by placement kind, and the first-choice shares.

    Examples
    --------
    >>> # plot_impact(impact_study(...), Path("impact_cost.png"))
    """
    plt = _pyplot()
    arms = list(impact["arms"])
    labels = [_ARM_LABELS.get(a, a) for a in arms]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5), dpi=110)
    x = np.arange(len(arms))
    pos = np.zeros(len(arms))
    neg = np.zeros(len(arms))
    for i, kind in enumerate(("on_advice", "displaced", "home", "waiting", "moved")):
        v = np.array([100 * impact["arms"][a]["parts"].get(kind, 0.0) for a in arms])
        if not np.any(v):
            continue
        bottom = np.where(v >= 0, pos, neg)
        ax1.bar(x, v, 0.6, bottom=bottom, color=f"C{i}", label=kind)
        pos += np.maximum(v, 0)
        neg += np.minimum(v, 0)
    totals = [impact["arms"][a]["cost_change"] for a in arms]
    ax1.scatter(x, [100 * c for c in totals], marker="D", color="k", zorder=3,
                label="total")
    for xi, c in zip(x, totals, strict=True):
        ax1.annotate(_signed_pct(c), (xi, max(pos[xi], 0)), ha="center", va="bottom",
                     fontsize=9, xytext=(0, 2), textcoords="offset points")
    t100 = [100 * c for c in totals if math.isfinite(c)]
    lo, hi = min([*neg, *t100, 0.0]), max([*pos, *t100, 0.0])
    ax1.set_ylim(lo - 0.05 * (hi - lo + 1), hi + 0.12 * (hi - lo + 1))
    ax1.axhline(0, color="k", lw=0.8)
    ax1.set_xticks(x, labels, rotation=15)
    ax1.set_ylabel("cost change against no advice (%)")
    ax1.set_title(f"Cost for the same work, by placement kind\n({', '.join(impact['days'])}, "
                  f"advice depth {impact.get('advice_depth', '?')})")
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3, axis="y")
    shown = [a for a in arms if a not in ("baseline", "optimum")]
    xs = np.arange(len(shown) + 1)
    paper = impact["headline"]["paper"]
    att = [100 * paper["first_choice_attempts"]] + [
        100 * impact["arms"][a]["first_choice_attempts"] for a in shown]
    gh = [100 * paper["first_choice_gpu_hours"]] + [
        100 * impact["arms"][a]["first_choice_gpu_hours"] for a in shown]
    _bar_labels(ax2, ax2.bar(xs - 0.2, att, 0.4, color="C0", label="share of attempts"))
    _bar_labels(ax2, ax2.bar(xs + 0.2, gh, 0.4, color="C1", label="share of GPU-hours"))
    ax2.set_xticks(xs, ["paper"] + [_ARM_LABELS.get(a, a) for a in shown], rotation=15)
    ax2.set_ylim(0, 105)
    ax2.set_ylabel("placed on the first advised type (%)")
    cov = impact["coverage"]
    ax2.set_title(f"Placed on the first choice\n(LEAP ranked {pct(cov['attempts'])} of "
                  f"attempts, {pct(cov['gpu_hours'])} of GPU-hours)")
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# The page ---------------------------------------------------------------------------------------
_CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;
color:#222}table{border-collapse:collapse;margin:1em 0;font-size:.9em}caption{text-align:left;
font-weight:600;padding:.3em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}
td:first-child,th:first-child{text-align:left}img{max-width:100%;border:1px solid #eee}
.note{color:#555;font-size:.9em}"""


def write_report(out_dir: Path, *, backtest: Mapping[str, Any] | None = None,
                 lookup: Mapping[str, Any] | None = None,
                 ranking: Mapping[str, Any] | None = None,
                 impact: Mapping[str, Any] | None = None,
                 real_data: Mapping[str, Any] | None = None,
                 notes: Sequence[str] = (), meta: Mapping[str, Any] | None = None,
                 new_families: Mapping[str, Any] | None = None) -> Path:
    """Write ``index.html``, ``report.json`` and the plots into ``out_dir``; return the page.

    Parameters
    ----------
    out_dir : Path
        Created if missing; files of the same names are replaced.
    backtest : dict, optional
        :meth:`leap.eval.backtest.BacktestResult.to_json`.
    lookup : dict, optional
        :func:`leap.eval.baselines.lookup_comparison` (plus ``day``).
    ranking : dict, optional
        :func:`leap.eval.ranking.ranking_study` (plus ``day``).
    impact : dict, optional
        :func:`leap.eval.impact.impact_study`.
    real_data : dict, optional
        :func:`leap.eval.real_data.run_real_data`; rendered by its ``html_section``.
    new_families : dict, optional
        :func:`leap.eval.new_families.new_families_study`.
    notes : sequence of str
        Lines shown under the title (e.g. which model the studies used).
    meta : dict, optional
        Extra settings stored in the JSON.

    Raises
    ------
    ConfigError
        Nothing to report (every part is None).

    Examples
    --------
    >>> # write_report(Path("reports/jan"), backtest=bt.to_json(), lookup=lk)
    """
    parts = {"backtest": backtest, "lookup": lookup, "ranking": ranking, "impact": impact,
             "real_data": real_data, "new_families": new_families}
    if all(v is None for v in parts.values()):
        raise ConfigError("nothing to report: pass at least one result (backtest, lookup, "
                          "ranking, impact or real data)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"generated_at": datetime.now(UTC).isoformat(),
                              "leap_version": __version__, "meta": dict(meta or {}),
                              "notes": list(notes), **parts}
    images: dict[str, str] = {}
    if backtest and backtest.get("nights"):
        plot_accuracy(backtest, out_dir / PLOTS["backtest"])
        plot_errors(backtest, out_dir / PLOTS["errors"])
        images["backtest"] = PLOTS["backtest"]
        images["errors"] = PLOTS["errors"]
    if lookup:
        plot_lookup(lookup, out_dir / PLOTS["lookup"])
        images["lookup"] = PLOTS["lookup"]
    if ranking and ranking.get("n_sampled"):
        plot_ranking(ranking, out_dir / PLOTS["ranking"])
        images["ranking"] = PLOTS["ranking"]
    if impact:
        plot_impact(impact, out_dir / PLOTS["impact"])
        images["impact"] = PLOTS["impact"]
    report["images"] = images
    (out_dir / "report.json").write_text(json.dumps(report, indent=1, default=_default)
                                         + "\n", encoding="utf-8")
    page = out_dir / "index.html"
    page.write_text(_page(report, images), encoding="utf-8")
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


def _page(report: Mapping[str, Any], images: Mapping[str, str]) -> str:
    tables = {t.key: t for t in report_tables(report)}
    body = [f"<h1>leap evaluation report</h1><p class=note>generated "
            f"{html.escape(report['generated_at'][:19])} UTC by leap "
            f"{html.escape(report['leap_version'])}; every number is in "
            "<a href=report.json>report.json</a>.</p>"]
    body += [f"<p class=note>{html.escape(n)}</p>" for n in report.get("notes", [])]
    bt = report.get("backtest")
    if bt:
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
    if report.get("lookup"):
        body.append("<h2>The lookup table (the previous system) vs LEAP</h2><p>The table "
                    "answers with the median throughput of past attempts of exactly the same "
                    "(family, hardware, trainer count, batch size) in the training window; "
                    "LEAP's accuracy is shown on the same covered subset.</p>")
        body.append(_img(images, "lookup", "lookup vs LEAP"))
        if "lookup" in tables:
            body.append(_html_table(tables["lookup"]))
    if report.get("ranking"):
        rk = report["ranking"]
        body.append("<h2>Ranking quality against the oracle</h2><p>"
                    + html.escape("; ".join(f"{k}: {v}" for k, v in rk["definitions"].items()))
                    + "</p>")
        body.append(_img(images, "ranking", "ranking regret"))
        if "ranking" in tables:
            body.append(_html_table(tables["ranking"]))
    if report.get("impact"):
        im = report["impact"]
        hl = im["headline"]
        lead = (f"The LP optimum saves {pct(hl['optimum_saving'])} of the no-advice cost"
                + "".join(f"; {_ARM_LABELS[a]} saves {_signed_pct(hl[a]['saving'])} "
                          f"({pct(hl[a]['share_of_optimum'])} of the optimum's saving)"
                          for a in ("leap", "leap_aware", "greedy_oracle") if a in hl)
                + ". The paper: ~3% saving, 19.9% of attempts and 30.0% of GPU-hours on the "
                "first choice, 95% coverage.")
        body.append("<h2>Impact: will advice save money?</h2><p>" + html.escape(lead)
                    + "</p><p class=note>"
                    + html.escape("; ".join(f"{k}: {v}" for k, v in im["definitions"].items()))
                    + "</p>")
        body.append(_img(images, "impact", "impact cost"))
        for key in ("impact", "impact_parts", "impact_bands"):
            if key in tables:
                body.append(_html_table(tables[key]))
        for arm in ("leap", "leap_aware", "greedy_oracle"):
            top = im["arms"].get(arm, {}).get("top_contributors", [])
            if top:
                body.append(_html_table(Table(
                    f"top_{arm}", f"{_ARM_LABELS[arm]}: the attempts that move the total most",
                    ("attempt", "devices", "home", "placed", "kind", "cost change",
                     "of no-advice cost"),
                    tuple((t["attempt_id"], str(t["devices"]), t["home"], t["placed"],
                           t["kind"], _money(t["cost_change"]),
                           _signed_pct(t["share_of_baseline"])) for t in top[:5]))))
    if report.get("new_families") and "new_families" in tables:
        body.append("<h2>New families: left out of training</h2><p>Every family of a drawn "
                    "share of model types leaves the training window together, and one large "
                    "family leaves alone; their attempts of the held-out day are scored by the "
                    "model that saw them and by the one that did not, the latter with and "
                    "without their architecture columns (the prior a job's model_config "
                    "gives).</p>")
        body.append(_html_table(tables["new_families"]))
    if report.get("real_data"):
        from leap.eval.real_data import html_section

        body.append(html_section(report["real_data"]))
    return (f"<!doctype html><html><head><meta charset=utf-8><title>leap evaluation report"
            f"</title><style>{_CSS}</style></head><body>{''.join(body)}</body></html>\n")
