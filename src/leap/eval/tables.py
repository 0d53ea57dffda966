"""The terminal tables of every study: plain rows the CLI prints and the HTML page embeds.

:func:`report_tables` gives the headline tables of a report's typed results;
:func:`impact_tables`, :func:`new_families_table` and :func:`real_data_tables` those of one
study; :func:`si`, :func:`pct`, :func:`signed_pct` and :func:`money` format their numbers the
same way everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leap.eval.baselines import CHEAPEST
from leap.features.encode import NOVELTY_GROUPS

if TYPE_CHECKING:
    from leap.eval.alternatives import AlternativesResult
    from leap.eval.backtest import BacktestResult
    from leap.eval.impact_summary import ImpactFigures
    from leap.eval.new_families import FamilyComparison, NewFamiliesResult
    from leap.eval.new_hardware import NewHardwareResult
    from leap.eval.real_data import RealDataResult
    from leap.eval.studies import ImpactResult, LookupResult, RankingResult
    from leap.eval.trials import PlanSummary
    from leap.eval.trials_check import TrialArms, TrialsResult

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


def signed_pct(x: Any) -> str:
    if x is None or not math.isfinite(float(x)):
        return "–"
    return f"{100 * float(x):+.1f}%"


def money(x: Any) -> str:
    if x is None or not math.isfinite(float(x)):
        return "–"
    return f"{float(x):,.0f}"


# Tables -----------------------------------------------------------------------------------------
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
        blk = s.get(key)
        if blk:
            rows.append((label, pct(blk["median"]), pct(blk["min"]), pct(blk["max"])))
    paper = s.get("paper", {})
    rows.append(("paper: accuracy ±20% (attempts)", pct(paper.get("accuracy_median")),
                 pct(paper.get("accuracy_min")), pct(paper.get("accuracy_max"))))
    span = f"{bt.settings.get('first_day', '')}..{bt.settings.get('last_day', '')}"
    tables.append(Table("backtest", f"backtest: {s['nights']} nights {span}",
                        ("figure", "median", "min", "max"), tuple(rows)))
    nights = tuple(
        (n.day, f"{int(n.held_out['n']):,}", pct(n.held_out["accuracy"]),
         pct(n.held_out.get("accuracy_gpu_hours")), pct(n.held_out["median_ape"]),
         pct((n.oracle_ceiling or {}).get("accuracy")),
         pct(n.held_out["seen_families"]["accuracy"]),
         pct(n.held_out["unseen_families"]["accuracy"]))
        for n in bt.nights)
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


def _get(block: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        if not isinstance(block, Mapping) or k not in block:
            return math.nan
        block = block[k]
    return block


def _num(x: Any, fmt: str = ".3f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def new_hardware_tables(nh: NewHardwareResult) -> list[Table]:
    """The new-hardware study (:func:`leap.eval.new_hardware.new_hardware_study`) as tables.

    Examples
    --------
    >>> from leap.eval.new_hardware import HeldOutType, NewHardwareResult
    >>> b200 = HeldOutType(n=5, training_attempts_left_out=0, seen={"accuracy": 0.9},
    ...                    held_out={"accuracy": 0.4}, drop_points=50.0)
    >>> t = new_hardware_tables(NewHardwareResult("2026-01-31", 30, 0, 500, False, {},
    ...                                           {"B200": b200}))
    >>> t[0].rows[0][:4]
    ('B200', '5', '90.0%', '40.0%')
    """
    rows = []
    for name, b in nh.types.items():
        rk = b.ranking
        seen_rk = rk.model("seen") if rk is not None else {}
        held_rk = rk.model("held_out") if rk is not None else {}
        cheap_rk = rk.model(CHEAPEST) if rk is not None else {}
        type_is_best = rk.type_is_best if rk is not None else None
        rows.append((name, f"{int(b.n):,}", pct(_get(b.seen or {}, "accuracy")),
                     pct(_get(b.held_out or {}, "accuracy")), _num(b.drop_points, ".1f"),
                     f"{int(rk.n_sampled if rk is not None else 0):,}",
                     _num(_get(seen_rk, "mean_regret")), _num(_get(held_rk, "mean_regret")),
                     _num(_get(cheap_rk, "mean_regret")), pct(_get(held_rk, "top1_agreement")),
                     pct(_get(cheap_rk, "top1_agreement")),
                     pct(_get(seen_rk, "picks_type")), pct(_get(held_rk, "picks_type")),
                     pct(math.nan if type_is_best is None else type_is_best)))
    tables = [Table("new_hardware", f"types held out of training, scored on "
                    f"{nh.day} beside the same type seen",
                    ("type", "attempts", "±20% seen", "±20% held out", "drop (points)",
                     "jobs ranked", "regret seen", "regret held out", "regret cheapest",
                     "top-1 held out", "top-1 cheapest", "picked (seen)",
                     "picked (held out)", "truly best"), tuple(rows))]
    curve = nh.curve
    if curve is not None and curve.nights:
        tables.append(Table(
            "new_hardware_curve", f"newest type {curve.hardware} (first day "
            f"{curve.first_day}) night by night, beside the fleet",
            ("night", "days of history", "attempts", "±20% on the type", "±20% fleet",
             "gap (points)"),
            tuple((n.day, str(n.days_of_history), f"{int(n.n):,}",
                   pct(math.nan if n.accuracy is None else n.accuracy), pct(n.fleet_accuracy),
                   _num(math.nan if n.gap_points is None else n.gap_points, ".1f"))
                  for n in curve.nights)))
    return tables


def trials_table(tr: TrialsResult) -> Table:
    """The trials check (:func:`leap.eval.trials.trials_study`): planned vs random trials.

    One row per number of trials and choice (:func:`_trials_rows`).
    """
    kind = "new" if tr.new_type else "little-used"
    return Table("trials", f"trials on the {kind} type {tr.hardware}: planned against "
                 f"random trials of the same number and cost, scored on {tr.day}",
                 ("trials", "choice", "cost ($)", "succeeded", "model types", "±20% on the type",
                  "median |log ratio|", "mean regret", "top-1"),
                 _trials_rows(tr.arms) + _cheapest_row(tr.cheapest), labels=2)


def _cheapest_row(block: Mapping[str, float] | None) -> tuple[tuple[str, ...], ...]:
    """The cheapest-type rule's ranking figures as a row of :func:`trials_table` (none for
    results saved without them)."""
    if not block:
        return ()
    return (("any", "rule: cheapest type", "", "", "", "", "",
             _num(_get(block, "mean_regret")), pct(_get(block, "top1_agreement"))),)


def _trials_rows(arms: Mapping[str, TrialArms]) -> tuple[tuple[str, ...], ...]:
    """The rows of :func:`trials_table`: one per number of trials and choice.

    Examples
    --------
    >>> from leap.eval.trials_check import TrialArm, TrialArms
    >>> arm = TrialArm(trials=5, cost=10.0, succeeded=5, model_types=4,
    ...                accuracy={"accuracy": 0.5}, ranking={"mean_regret": 0.1})
    >>> _trials_rows({"5": TrialArms(arm)})[0][:3]
    ('5', 'planned', '10')
    """
    rows = []
    for n, both in arms.items():
        for kind, a in (("planned", both.planned), ("random", both.random)):
            if a is None:
                continue
            rows.append((str(n), kind, money(a.cost),
                         f"{int(a.succeeded or 0)}/{int(a.trials)}",
                         str(a.model_types or 0), pct(_get(a.accuracy, "accuracy")),
                         _num(_get(a.accuracy, "median_abs_log_ratio")),
                         _num(_get(a.ranking, "mean_regret")),
                         pct(_get(a.ranking, "top1_agreement"))))
    return tuple(rows)


def trials_plan_table(plan: PlanSummary) -> Table:
    """A plan of :func:`leap.eval.trials.plan_trials` (:meth:`TrialPlan.summary`) as a table."""
    rows = tuple((str(t.rank), str(t.family_id), str(t.model_type),
                  f"{t.trainer_count}x{t.devices_per_trainer or 1}, batch "
                  f"{t.batch_size}", money(t.estimated_cost),
                  f"{t.estimated_hours:g} h", _num(t.value_ratio, ".2f"),
                  _num(t.interval_ratio, ".1f"), _num(t.score, ".3g"))
                 for t in plan.trials)
    return Table("trials_plan", f"trials on {plan.hardware}, best first",
                 ("#", "family", "model type", "shape", "cost ($)", "duration",
                  "value vs best other", "interval (x)", "score"),
                 rows, labels=4)


def new_families_table(nf: NewFamiliesResult) -> Table:
    """The new-families study (:func:`leap.eval.new_families.new_families_study`) as a table.

    One row per group of left-out families with attempts (:func:`_new_families_rows`).
    """
    rows = _new_families_rows((
        ("families of left-out model types (together)", nf.model_type_groups),
        ("one large family, alone (as the paper)", nf.single_family),
        ("families new on the day (no history in either model)", nf.new_on_the_day)))
    return Table("new_families", f"new families on {nf.day}: "
                 "the same attempts scored by a model that saw their families and by one "
                 "trained without them, with and without the architecture columns",
                 ("attempts of", "n", "families", "±20% seen", "±20% held out",
                  "±20% held out, no architecture", "drop (points)"), rows)


def _new_families_rows(blocks: Iterable[tuple[str, FamilyComparison]]
                       ) -> tuple[tuple[str, ...], ...]:
    """The rows of :func:`new_families_table`: the ``(label, comparison)`` pairs with attempts.

    Examples
    --------
    >>> from leap.eval.new_families import FamilyComparison
    >>> blk = FamilyComparison(n=10, families=2, seen={"accuracy": 0.8},
    ...                        held_out_with_prior={"accuracy": 0.3},
    ...                        held_out_without_prior={"accuracy": 0.2}, drop_points=50.0)
    >>> _new_families_rows([("groups", blk)])[0][3]
    '80.0%'
    """
    rows = []
    for label, b in blocks:
        if not b.n:
            continue
        rows.append((label, f"{int(b.n):,}", f"{int(b.families or 0):,}",
                     pct((b.seen or {})["accuracy"]),
                     pct((b.held_out_with_prior or {})["accuracy"]),
                     pct((b.held_out_without_prior or {})["accuracy"]),
                     f"{math.nan if b.drop_points is None else b.drop_points:.1f}"))
    return tuple(rows)


def alternatives_table(alt: AlternativesResult) -> Table:
    """The alternatives study (:func:`leap.eval.alternatives.alternatives_study`) as a table.

    Examples
    --------
    >>> from leap.eval.alternatives import AlternativesResult, MethodResult
    >>> nan = float("nan")
    >>> m = MethodResult("lookup", "rule", 0.5, nan, 0.1, 0.6, 0.8, nan, nan, nan, 1.0, 2.0, 0.3)
    >>> alternatives_table(AlternativesResult("2026-01-31", 0, 0, 0, 0, 0, [m])).rows[0][:5]
    ('lookup', 'rule', '50.0%', '60.0%', '80.0%')
    """
    rows = tuple((m.name, m.kind, pct(m.accuracy), pct(m.coverage),
                  pct(m.accuracy_covered), pct(m.unobserved_pairs_accuracy),
                  pct(m.masked_pairs_accuracy), pct(m.median_ape), f"{m.fit_s:.1f}",
                  f"{m.predict_us_per_row:.1f}", f"{m.job_ms_p50:.2f}")
                 for m in alt.methods)
    return Table("alternatives", f"alternatives on {alt.day} "
                 f"({int(alt.eval_rows):,} attempts; "
                 f"{int(alt.unobserved_eval_rows):,} on a type new to the family; "
                 f"{int(alt.masked_eval_rows):,} with their pair history masked)",
                 ("method", "kind", "±20%", "cover", "±20% answered", "±20% new pair",
                  "±20% masked", "MdAPE", "fit s", "µs/row", "ms/job"),
                 rows)


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
    source, then the ranking on public prices when it ran."""
    tables = []
    for src, by_protocol in result.results.items():
        rows = tuple((protocol, method, f"{r.n:,}", whole_pct(r.coverage),
                      whole_pct(r.accuracy_within_20pct), whole_pct(r.median_ape))
                     for protocol, by_method in by_protocol.items()
                     for method, r in by_method.items())
        source = result.data.sources.get(src)
        title = src if source is None else f"{src}  ({source.rows:,} rows)"
        tables.append(Table(f"real_data_{src}", title,
                            ("protocol", "method", "n", "cov.", "±20%", "MdAPE"), rows,
                            labels=2))
    ranking = result.ranking_check
    if ranking is not None:
        tables.append(Table(
            "real_data_ranking", f"ranking on public prices: {ranking.configurations} "
            "Lambda configurations, each type held out",
            ("method", "ranked", "top-1 agreement", "mean value regret"),
            tuple((method, str(r.ranked), whole_pct(r.top1_agreement),
                   whole_pct(r.mean_regret)) for method, r in ranking.methods.items())))
    return tables


def real_data_reference_lines(result: RealDataResult) -> list[str]:
    """The reference spec-ratio check beside its expected figures, one line per variant."""
    ref = result.reference_check
    if ref is None:
        return []
    return [f"{name}: {whole_pct(ref.methods[name].accuracy_within_20pct)} within ±20% "
            f"(expected ~{expected:.0%}), MdAPE {whole_pct(ref.methods[name].median_ape)}, "
            f"n={ref.methods[name].n_covered}" for name, expected in ref.expected.items()]
