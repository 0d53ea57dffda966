"""The report's PNG plots, one per study (Matplotlib with the Agg backend, imported only
when plotting)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from leap.eval.tables import ARM_LABELS, METHOD_LABELS, pct, signed_pct

if TYPE_CHECKING:
    from leap.eval.backtest import BacktestResult
    from leap.eval.impact_summary import ImpactFigures
    from leap.eval.studies import LookupResult, RankingResult

PLOTS: dict[str, str] = {
    "backtest": "accuracy_per_night.png",
    "errors": "error_distribution.png",
    "lookup": "lookup_vs_leap.png",
    "ranking": "ranking_regret.png",
    "impact": "impact_cost.png",
}


# Plots ------------------------------------------------------------------------------------------
def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy(backtest: BacktestResult, path: Path) -> None:
    """Accuracy per night (both weightings, seen/unseen families) with the oracle ceiling."""
    plt = _pyplot()
    nights = backtest.nights
    days = [datetime.fromisoformat(n.day) for n in nights]

    def series(*keys: str) -> np.ndarray:
        out = []
        for n in nights:
            cur: Any = n.to_dict()
            for k in keys:
                cur = cur.get(k) if isinstance(cur, Mapping) else None
            out.append(np.nan if cur is None else 100 * float(cur))
        return np.array(out)

    import matplotlib.dates as mdates

    fig, ax = plt.subplots(figsize=(9, 5.6), dpi=110)
    paper = backtest.summary.paper
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
    acc = backtest.summary.figure("accuracy")
    med = acc.median if acc is not None else math.nan
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


def plot_errors(backtest: BacktestResult, path: Path) -> None:
    """Distribution of predicted / measured throughput over all nights, ±20% shaded."""
    plt = _pyplot()
    nights = backtest.nights
    edges = np.array(nights[0].error_hist.log10_edges)
    counts = np.sum([n.error_hist.counts for n in nights], axis=0).astype(float)
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


def plot_lookup(lookup: LookupResult, path: Path) -> None:
    """Coverage and accuracy of the lookup table beside LEAP on one held-out day."""
    plt = _pyplot()
    groups = ["coverage", "accuracy on the\ntable's covered subset",
              "accuracy on all attempts\n(no estimate = miss)"]
    lk = lookup.figures
    table = [lk.table_coverage, lk.table_accuracy_covered, lk.table_accuracy_all]
    leap = [lk.leap_coverage, lk.leap_accuracy_covered, lk.leap_accuracy_all]
    x = np.arange(len(groups))
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    _bar_labels(ax, ax.bar(x - 0.2, 100 * np.array(table, float), 0.4, color="C7",
                           label="lookup table (family, hardware, trainers, batch)"))
    _bar_labels(ax, ax.bar(x + 0.2, 100 * np.array(leap, float), 0.4, color="C0",
                           label="LEAP"))
    ax.set_xticks(x, groups)
    ax.set_ylim(0, 110)
    ax.set_ylabel("share of held-out attempts (%)")
    ax.set_title(f"Lookup table vs LEAP on {lookup.day or 'the held-out day'} "
                 f"({lk.n:,} attempts, {lk.n_covered:,} covered by the table)")
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_ranking(ranking: RankingResult, path: Path) -> None:
    """Top-1 agreement per method, and the distribution of value regret (CDF)."""
    plt = _pyplot()
    rk = ranking.figures
    methods = [m for m in rk.methods if rk.methods[m].get("n")]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5.2), dpi=110)
    y = np.arange(len(methods))
    top1 = [100 * rk.methods[m]["top1_agreement"] for m in methods]
    regret = [100 * rk.methods[m]["mean_regret"] for m in methods]
    ax1.barh(y - 0.2, top1, 0.4, color="C0", label="top-1 agreement with the oracle")
    ax1.barh(y + 0.2, regret, 0.4, color="C3", label="mean value regret of the top choice")
    ax1.set_yticks(y, [METHOD_LABELS.get(m, m) for m in methods])
    ax1.invert_yaxis()
    ax1.set_xlim(0, 100)
    ax1.set_xlabel("share of jobs / regret (%)")
    ax1.set_title("Top choice vs the oracle's best-value type")
    ax1.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    ax1.grid(alpha=0.3, axis="x")
    for i, m in enumerate(methods):
        vals = np.sort(np.array(rk.regrets.get(m, []), dtype=float))
        vals = vals[np.isfinite(vals)]
        if len(vals):
            ax2.step(100 * np.r_[0.0, vals], 100 * np.arange(len(vals) + 1) / len(vals),
                     where="post", color=f"C{i}", label=METHOD_LABELS.get(m, m))
    ax2.set_xlabel("value regret of the top choice: 1 − true value / best true value (%)")
    ax2.set_ylabel("jobs with at most this regret (%)")
    ax2.set_xlim(0, 100)
    ax2.set_ylim(0, 101)
    ax2.set_title(f"Regret distribution ({rk.n_sampled:,} sampled jobs)")
    ax2.legend(fontsize=8, loc="lower right")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_impact(impact: ImpactFigures, path: Path) -> None:
    """Cost change per arm split by placement kind, and the first-choice shares."""
    plt = _pyplot()
    arms = list(impact.arms)
    labels = [ARM_LABELS.get(a, a) for a in arms]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5), dpi=110)
    x = np.arange(len(arms))
    pos = np.zeros(len(arms))
    neg = np.zeros(len(arms))
    for i, kind in enumerate(("on_advice", "displaced", "home", "waiting", "moved")):
        v = np.array([100 * impact.arms[a].parts.get(kind, 0.0) for a in arms])
        if not np.any(v):
            continue
        bottom = np.where(v >= 0, pos, neg)
        ax1.bar(x, v, 0.6, bottom=bottom, color=f"C{i}", label=kind)
        pos += np.maximum(v, 0)
        neg += np.minimum(v, 0)
    totals = [impact.arms[a].cost_change for a in arms]
    ax1.scatter(x, [100 * c for c in totals], marker="D", color="k", zorder=3,
                label="total")
    for xi, c in zip(x, totals, strict=True):
        ax1.annotate(signed_pct(c), (xi, max(pos[xi], 0)), ha="center", va="bottom",
                     fontsize=9, xytext=(0, 2), textcoords="offset points")
    t100 = [100 * c for c in totals if math.isfinite(c)]
    lo, hi = min([*neg, *t100, 0.0]), max([*pos, *t100, 0.0])
    ax1.set_ylim(lo - 0.05 * (hi - lo + 1), hi + 0.12 * (hi - lo + 1))
    ax1.axhline(0, color="k", lw=0.8)
    ax1.set_xticks(x, labels, rotation=15)
    ax1.set_ylabel("cost change against no advice (%)")
    ax1.set_title(f"Cost for the same work, by placement kind\n({', '.join(impact.days)}, "
                  f"advice depth {impact.advice_depth})")
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3, axis="y")
    shown = [a for a in arms if a not in ("baseline", "optimum")]
    xs = np.arange(len(shown) + 1)
    paper = impact.headline.paper
    att = [100 * paper["first_choice_attempts"]] + [
        100 * impact.arms[a].first_choice_attempts for a in shown]
    gh = [100 * paper["first_choice_gpu_hours"]] + [
        100 * impact.arms[a].first_choice_gpu_hours for a in shown]
    _bar_labels(ax2, ax2.bar(xs - 0.2, att, 0.4, color="C0", label="share of attempts"))
    _bar_labels(ax2, ax2.bar(xs + 0.2, gh, 0.4, color="C1", label="share of GPU-hours"))
    ax2.set_xticks(xs, ["paper"] + [ARM_LABELS.get(a, a) for a in shown], rotation=15)
    ax2.set_ylim(0, 105)
    ax2.set_ylabel("placed on the first advised type (%)")
    cov = impact.coverage
    ax2.set_title(f"Placed on the first choice\n(LEAP ranked {pct(cov.attempts)} of "
                  f"attempts, {pct(cov.gpu_hours)} of GPU-hours)")
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
