"""The terminal tables of the report's studies: plain rows the CLI prints and the HTML page
embeds (:func:`leap.eval.report.report_tables` gathers them; the ``leap experiment`` studies'
tables are in :mod:`leap.eval.experiment_tables`). :func:`pct`, :func:`signed_pct`,
:func:`money` and :func:`leap.metrics.si` format their numbers the same way everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leap.features.encode import NOVELTY_GROUPS

if TYPE_CHECKING:
    from leap.eval.backtest import BacktestResult
    from leap.eval.impact_summary import ImpactFigures
    from leap.eval.real_data import RealDataResult
    from leap.eval.studies import LookupResult, RankingResult

METHOD_LABELS = {"leap": "LEAP (cautious, default)", "leap_risk_neutral": "LEAP, risk-neutral",
                  "leap_risk_averse": "LEAP, risk-averse",
                  "leap_no_premium_filter": "LEAP, no premium filter",
                  "cheapest": "cheapest type", "fastest_peak": "fastest peak FLOP/s",
                  "most_used": "family's most-used type", "random": "random (expected)"}
ARM_LABELS = {"baseline": "no advice", "leap": "LEAP advice",
               "leap_aware": "LEAP told free devices", "greedy_oracle": "greedy oracle",
               "optimum": "LP optimum"}


@dataclass(frozen=True)
class Table:
    """A titled table of strings (for the terminal and the HTML page); ``key`` names the study."""

    key: str
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    #: Leading columns of labels (left-aligned); the others hold figures.
    labels: int = 1


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


def signed_pct(x: Any) -> str:
    if x is None or not math.isfinite(float(x)):
        return "–"
    return f"{100 * float(x):+.1f}%"


def money(x: Any) -> str:
    if x is None or not math.isfinite(float(x)):
        return "–"
    return f"{float(x):,.0f}"


# Tables -----------------------------------------------------------------------------------------
def backtest_tables(bt: BacktestResult) -> list[Table]:
    """The backtest's summary, its nights, and the summary by novelty group."""
    tables: list[Table] = []
    s = bt.summary
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
        blk = s.figure(key)
        if blk:
            rows.append((label, pct(blk.median), pct(blk.min), pct(blk.max)))
    paper = s.paper
    rows.append(("paper: accuracy ±20% (attempts)", pct(paper.get("accuracy_median")),
                 pct(paper.get("accuracy_min")), pct(paper.get("accuracy_max"))))
    span = f"{bt.settings.get('first_day', '')}..{bt.settings.get('last_day', '')}"
    tables.append(Table("backtest", f"backtest: {s.nights} nights {span}",
                        ("figure", "median", "min", "max"), tuple(rows)))
    nights = tuple(
        (n.day, f"{int(n.held_out.n):,}", pct(n.held_out.accuracy),
         pct(n.held_out.accuracy_gpu_hours), pct(n.held_out.median_ape),
         pct(n.oracle_ceiling.accuracy if n.oracle_ceiling else None),
         pct(n.held_out.seen_families.accuracy),
         pct(n.held_out.unseen_families.accuracy))
        for n in bt.nights)
    tables.append(Table("nights", "nights", ("day", "attempts", "±20%", "±20% GPU-h", "MdAPE",
                                             "ceiling", "seen fam.", "unseen fam."), nights))
    groups = []
    for g in NOVELTY_GROUPS:
        cells = [s.figure(f"{kind}_{what}_{g}") for kind in ("novelty", "masked")
                 for what in ("accuracy", "interval_coverage")]
        if any(cells):
            acc, cover, m_acc, m_cover = cells
            groups.append((g.replace("_", " "),
                           *(f"{pct(c.median)} / {pct(c.pooled)}" if c else "—"
                             for c in (acc, cover)),
                           f"{cover.min:.0%}–{cover.max:.0%}" if cover else "—",
                           *(f"{pct(c.median)} / {pct(c.pooled)}" if c else "—"
                             for c in (m_acc, m_cover))))
    if groups:
        tables.append(Table(
            "backtest_novelty", "backtest by novelty group (median night / all nights' "
            "attempts pooled): as attempts came, and the same attempts with their own "
            "(family, type) history masked", ("group", "±20%", "80% interval covers",
                                              "covers, nights' range", "±20%, masked",
                                              "covers, masked"), tuple(groups)))
    return tables


def lookup_tables(lookup: LookupResult) -> list[Table]:
    """The lookup table beside LEAP, and the spec-ratio rule on the pairs without history."""
    lk = lookup.figures
    tables = [Table(
        "lookup", f"lookup table vs LEAP on {lookup.day or 'the held-out day'} "
        f"({lk.n:,} attempts)", ("", "lookup table", "LEAP"),
        (("coverage", pct(lk.table_coverage), pct(lk.leap_coverage)),
         ("accuracy ±20% on the table's covered subset", pct(lk.table_accuracy_covered),
          pct(lk.leap_accuracy_covered)),
         ("same, GPU-hour weighted", pct(lk.table_accuracy_covered_gpu_hours),
          pct(lk.leap_accuracy_covered_gpu_hours)),
         ("accuracy ±20% on all attempts (no estimate = miss)",
          pct(lk.table_accuracy_all), pct(lk.leap_accuracy_all)),
         ("paper (13.3% coverage; 53.2% vs 85.1% covered)", "13.3% / 53.2%",
          "100% / 85.1%")))]
    xf = lk.spec_ratio_transfer
    if xf is not None:
        groups = (("unobserved_pair_1", xf.unobserved_pair_1),
                  ("unobserved_pair_2", xf.unobserved_pair_2),
                  ("unobserved_pair_3plus", xf.unobserved_pair_3plus), ("all", xf.all))
        tables.append(Table(
            "spec_ratio_transfer", "types a family never ran on: LEAP beside the spec-ratio "
            "rule, on the rows the rule answers", ("group", "attempts", "rule covers",
                                                  "rule ±20%", "LEAP ±20%", "rule MdAPE",
                                                  "LEAP MdAPE"),
            tuple((g.replace("_", " "), f"{b.n:,}", pct(b.rule_coverage),
                   pct(b.rule_accuracy), pct(b.leap_accuracy),
                   pct(b.rule_median_ape), pct(b.leap_median_ape)) for g, b in groups)))
    return tables


def ranking_tables(ranking: RankingResult) -> list[Table]:
    """Each method against the oracle (both truths), LEAP's predictions by novelty group and
    the over-prediction of each list's first type."""
    rk = ranking.figures
    tables: list[Table] = []
    for key, what, methods in (("ranking", "the best type the premium rule allows", rk.methods),
                               ("ranking_all_types", "the best of all eligible types",
                                rk.methods_all_types)):
        ranked = tuple((METHOD_LABELS.get(m, m), pct(r.get("top1_agreement")),
                        pct(r.get("mean_regret")), pct(r.get("median_regret")),
                        pct(r.get("mean_regret_gpu_hours")),
                        f"{r.get('mean_ndcg', math.nan):.3f}")
                       for m, r in methods.items())
        tables.append(Table(key, f"ranking vs the oracle ({what}): {rk.n_sampled:,} jobs of "
                            f"{ranking.day or 'the held-out day'}, LEAP ranked "
                            f"{pct(rk.leap_coverage)}",
                            ("method", "top-1 agreement", "mean regret", "median regret",
                             "mean regret (GPU-h)", "NDCG"), ranked))
    pvt = rk.prediction_vs_truth
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
    picks = rk.pick_overprediction
    if picks:
        tables.append(Table(
            "ranking_picks", "predicted / true value of each list's first type",
            ("method", "median", "90th percentile", "share above 1.5x"),
            tuple((METHOD_LABELS.get(m, m), f"{p['median']:.2f}", f"{p['p90']:.2f}",
                   pct(p["share_above_1_5"])) for m, p in picks.items())))
    return tables


def impact_tables(im: ImpactFigures) -> list[Table]:
    """The impact study as tables: headline beside the paper, arms with their parts, bands."""
    hl, cov = im.headline, im.coverage
    paper = hl.paper
    head = [("paper (LEAP)", pct(paper["coverage"]), pct(paper["first_choice_attempts"]),
             pct(paper["first_choice_gpu_hours"]), f"~{pct(paper['cost_saving'], 0)}", "")]
    for arm in ("leap", "leap_aware", "greedy_oracle"):
        h = hl.arm(arm)
        if h is not None:
            head.append((ARM_LABELS.get(arm, arm),
                         pct(cov.attempts) if arm.startswith("leap") else "",
                         pct(h.first_choice_attempts), pct(h.first_choice_gpu_hours),
                         signed_pct(h.saving), pct(h.share_of_optimum)))
    head.append(("LP optimum", "", "", "", signed_pct(hl.optimum_saving), "100.0%"))
    head.append(("LP optimum, nobody waits", "", "", "",
                 signed_pct(hl.optimum_within_budget_saving), ""))
    tables = [Table(
        "impact", f"impact: {', '.join(im.days)}, {im.n_attempts:,} attempts, no-advice "
        f"cost {money(im.baseline_cost)}; advice depth {im.advice_depth}, delay cost "
        f"weight {im.delay_cost_weight:g}",
        ("arm", "coverage", "first choice (attempts)", "first choice (GPU-h)", "cost saving",
         "share of the optimum's saving"), tuple(head))]
    kinds = ("on_advice", "displaced", "home", "waiting", "moved")
    rows = []
    for arm, a in im.arms.items():
        sp = a.spread
        rows.append((ARM_LABELS.get(arm, arm), signed_pct(a.cost_change),
                     signed_pct(a.fleet_cost_change),
                     *(signed_pct(a.parts[k]) if k in a.parts else "" for k in kinds),
                     signed_pct(a.trimmed.cost_change),
                     f"{signed_pct(sp.get('min'))}..{signed_pct(sp.get('max'))}"))
    tables.append(Table(
        "impact_parts", "cost change against no advice; its parts by placement kind sum to it "
        "(advice: first advised type; moved: the optimum off home; no delay: fleet cost only; "
        "trimmed: top 1% of attempts by cost left out)",
        ("arm", "change", "no delay", "advice", "displaced", "home", "waiting", "moved",
         "trimmed", "day range"),
        tuple(rows)))
    bands = list(dict.fromkeys(b for a in im.arms.values() for b in a.bands))
    tables.append(Table(
        "impact_bands", "cost change by job size (devices)", ("arm", *bands),
        tuple((ARM_LABELS.get(arm, arm), *(signed_pct(a.bands[b].cost_change)
                                           if b in a.bands else "" for b in bands))
              for arm, a in im.arms.items())))
    return tables


def whole_pct(v: float) -> str:
    """A share as a whole percentage; a dash when nothing was covered (NaN).

    >>> whole_pct(0.714), whole_pct(float("nan"))
    ('71%', '–')
    """
    return "–" if v != v else f"{v:.0%}"


def real_data_tables(result: RealDataResult) -> list[Table]:
    """The real-data evaluation (:class:`leap.eval.real_data.RealDataResult`): one table per
    source (``in 80%``: measured figures inside a method's 80% interval, for a method with
    intervals), then the ranking on public prices when it ran."""
    tables = []
    for src, by_protocol in result.results.items():
        rows = tuple((protocol, method, f"{r.n:,}", whole_pct(r.coverage),
                      whole_pct(r.accuracy_within_20pct), whole_pct(r.median_ape),
                      "" if r.interval_coverage is None else whole_pct(r.interval_coverage))
                     for protocol, by_method in by_protocol.items()
                     for method, r in by_method.items())
        source = result.data.sources.get(src)
        title = src if source is None else f"{src}  ({source.rows:,} rows)"
        tables.append(Table(f"real_data_{src}", title,
                            ("protocol", "method", "n", "cov.", "±20%", "MdAPE", "in 80%"),
                            rows, labels=2))
    ranking = result.ranking_check
    if ranking is not None:
        tables.append(Table(
            "real_data_ranking", f"ranking on public prices: {ranking.configurations} "
            "Lambda configurations, each type held out",
            ("method", "ranked", "top-1 agreement", "mean value regret"),
            tuple((method, str(r.ranked), whole_pct(r.top1_agreement),
                   whole_pct(r.mean_regret)) for method, r in ranking.methods.items())))
    return tables


def real_data_fold_tables(result: RealDataResult) -> list[Table]:
    """Per source, leap on each fold of the protocols whose folds are named (the type or
    model held out; not ``held_out_cells``, whose folds are random groups of cells) beside
    the best other method there, uncovered rows counted as misses."""
    tables = []
    for src, by_protocol in result.by_fold.items():
        rows = []
        for protocol, folds in by_protocol.items():
            if protocol == "held_out_cells":
                continue
            for fold, by_method in folds.items():
                ours = by_method.get("leap")
                others = {m: r.accuracy_within_20pct_all for m, r in by_method.items()
                          if not m.startswith("leap") and math.isfinite(
                              r.accuracy_within_20pct_all)}
                if ours is None or not others:
                    continue
                best = max(others, key=lambda m: others[m])
                rows.append((protocol, fold, f"{ours.n:,}",
                             whole_pct(ours.accuracy_within_20pct_all), best,
                             whole_pct(others[best]),
                             f"{100 * (ours.accuracy_within_20pct_all - others[best]):+.0f}"))
        if rows:
            tables.append(Table(f"real_data_folds_{src}", f"{src}: leap per fold",
                                ("protocol", "fold", "n", "leap ±20%", "best other",
                                 "its ±20%", "points"), tuple(rows), labels=2))
    return tables


def real_data_reference_lines(result: RealDataResult) -> list[str]:
    """The reference spec-ratio check beside its expected figures, one line per variant."""
    ref = result.reference_check
    if ref is None:
        return []
    return [f"{name}: {whole_pct(ref.methods[name].accuracy_within_20pct)} within ±20% "
            f"(expected ~{expected:.0%}), MdAPE {whole_pct(ref.methods[name].median_ape)}, "
            f"n={ref.methods[name].n_covered}" for name, expected in ref.expected.items()]
