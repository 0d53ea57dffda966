"""The terminal tables of every study: plain rows the CLI prints and the HTML page embeds.

:func:`report_tables` gives the headline tables of a report; :func:`impact_tables`,
:func:`new_families_table` and :func:`real_data_tables` those of one study; :func:`si`,
:func:`pct`, :func:`signed_pct` and :func:`money` format their numbers the same way
everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from leap.features.encode import NOVELTY_GROUPS

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
            ranked = tuple((METHOD_LABELS.get(m, m), pct(r.get("top1_agreement")),
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
                tuple((METHOD_LABELS.get(m, m), f"{p['median']:.2f}", f"{p['p90']:.2f}",
                       pct(p["share_above_1_5"])) for m, p in picks.items())))
    im = report.get("impact")
    if im:
        tables.extend(impact_tables(im))
    nf = report.get("new_families")
    if nf:
        tables.append(new_families_table(nf))
    nh = report.get("new_hardware")
    if nh:
        tables.extend(new_hardware_tables(nh))
    tr = report.get("trials")
    if tr:
        tables.append(trials_table(tr))
    alt = report.get("alternatives")
    if alt:
        tables.append(alternatives_table(alt))
    return tables


def _get(block: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        if not isinstance(block, Mapping) or k not in block:
            return math.nan
        block = block[k]
    return block


def _num(x: Any, fmt: str = ".3f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def new_hardware_tables(nh: Mapping[str, Any]) -> list[Table]:
    """The new-hardware study (:func:`leap.eval.new_hardware.new_hardware_study`) as tables.

    Examples
    --------
    >>> t = new_hardware_tables({"day": "2026-01-31", "types": {"B200": {
    ...     "n": 5, "seen": {"accuracy": 0.9}, "held_out": {"accuracy": 0.4},
    ...     "drop_points": 50.0}}})
    >>> t[0].rows[0][:4]
    ('B200', '5', '90.0%', '40.0%')
    """
    rows = []
    for name, b in nh.get("types", {}).items():
        rk = b.get("ranking") or {}
        rows.append((name, f"{int(b.get('n', 0)):,}", pct(_get(b, "seen", "accuracy")),
                     pct(_get(b, "held_out", "accuracy")), _num(b.get("drop_points"), ".1f"),
                     f"{int(rk.get('n_sampled', 0)):,}",
                     _num(_get(rk, "seen", "mean_regret")),
                     _num(_get(rk, "held_out", "mean_regret")),
                     pct(_get(rk, "seen", "picks_type")), pct(_get(rk, "held_out", "picks_type")),
                     pct(rk.get("type_is_best", math.nan))))
    tables = [Table("new_hardware", f"types held out of training, scored on "
                    f"{nh.get('day', 'the held-out day')} beside the same type seen",
                    ("type", "attempts", "±20% seen", "±20% held out", "drop (points)",
                     "jobs ranked", "regret seen", "regret held out", "picked (seen)",
                     "picked (held out)", "truly best"), tuple(rows))]
    curve = nh.get("curve") or {}
    if curve.get("nights"):
        tables.append(Table(
            "new_hardware_curve", f"newest type {curve.get('hardware')} (first day "
            f"{curve.get('first_day')}) night by night, beside the fleet",
            ("night", "days of history", "attempts", "±20% on the type", "±20% fleet",
             "gap (points)"),
            tuple((n["day"], str(n["days_of_history"]), f"{int(n['n']):,}",
                   pct(n.get("accuracy", math.nan)), pct(n.get("fleet_accuracy", math.nan)),
                   _num(n.get("gap_points", math.nan), ".1f")) for n in curve["nights"])))
    return tables


def trials_table(tr: Mapping[str, Any]) -> Table:
    """The trials check (:func:`leap.eval.trials.trials_study`): planned vs random trials.

    Examples
    --------
    >>> arm = {"trials": 5, "cost": 10.0, "succeeded": 5, "model_types": 4,
    ...        "accuracy": {"accuracy": 0.5}, "ranking": {"mean_regret": 0.1}}
    >>> trials_table({"hardware": "B200", "arms": {"5": {"planned": arm}}}).rows[0][:3]
    ('5', 'planned', '10')
    """
    rows = []
    for n, arms in tr.get("arms", {}).items():
        for kind in ("planned", "random"):
            a = arms.get(kind)
            if a is None:
                continue
            rows.append((str(n), kind, money(a.get("cost", 0.0)),
                         f"{int(a.get('succeeded', 0))}/{int(a.get('trials', 0))}",
                         str(a.get("model_types", 0)), pct(_get(a, "accuracy", "accuracy")),
                         _num(_get(a, "accuracy", "median_abs_log_ratio")),
                         _num(_get(a, "ranking", "mean_regret")),
                         pct(_get(a, "ranking", "top1_agreement"))))
    kind = "new" if tr.get("new_type", True) else "little-used"
    return Table("trials", f"trials on the {kind} type {tr.get('hardware')}: planned against "
                 f"random trials of the same number and cost, scored on {tr.get('day')}",
                 ("trials", "choice", "cost ($)", "succeeded", "model types", "±20% on the type",
                  "median |log ratio|", "mean regret", "top-1"), tuple(rows), labels=2)


def trials_plan_table(plan: Mapping[str, Any]) -> Table:
    """A plan of :func:`leap.eval.trials.plan_trials` (its ``to_dict``) as a table."""
    rows = tuple((str(t["rank"]), str(t["family_id"]), str(t["model_type"]),
                  f"{t['trainer_count']}x{t['devices_per_trainer'] or 1}, batch "
                  f"{t['batch_size']}", money(t["estimated_cost"]),
                  f"{t['estimated_hours']:g} h", _num(t["value_ratio"], ".2f"),
                  _num(t["interval_ratio"], ".1f"), _num(t["score"], ".3g"))
                 for t in plan.get("trials", []))
    return Table("trials_plan", f"trials on {plan.get('hardware')}, best first",
                 ("#", "family", "model type", "shape", "cost ($)", "duration",
                  "value vs best other", "interval (x)", "score"),
                 rows, labels=4)


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


def alternatives_table(alt: Mapping[str, Any]) -> Table:
    """The alternatives study (:func:`leap.eval.alternatives.alternatives_study`) as a table.

    Examples
    --------
    >>> m = {"name": "lookup", "kind": "rule", "accuracy": 0.5, "coverage": 0.6,
    ...      "accuracy_covered": 0.8, "masked_pairs_accuracy": float("nan"),
    ...      "median_ape": 0.1, "fit_s": 1.0, "predict_us_per_row": 2.0, "job_ms_p50": 0.3}
    >>> alternatives_table({"day": "2026-01-31", "methods": [m]}).rows[0][:5]
    ('lookup', 'rule', '50.0%', '60.0%', '80.0%')
    """
    rows = tuple((m["name"], m["kind"], pct(m["accuracy"]), pct(m["coverage"]),
                  pct(m["accuracy_covered"]), pct(m.get("unobserved_pairs_accuracy")),
                  pct(m["masked_pairs_accuracy"]), pct(m["median_ape"]), f"{m['fit_s']:.1f}",
                  f"{m['predict_us_per_row']:.1f}", f"{m['job_ms_p50']:.2f}")
                 for m in alt.get("methods", []))
    return Table("alternatives", f"alternatives on {alt.get('day', 'the held-out day')} "
                 f"({int(alt.get('eval_rows', 0)):,} attempts; "
                 f"{int(alt.get('unobserved_eval_rows', 0)):,} on a type new to the family; "
                 f"{int(alt.get('masked_eval_rows', 0)):,} with their pair history masked)",
                 ("method", "kind", "±20%", "cover", "±20% answered", "±20% new pair",
                  "±20% masked", "MdAPE", "fit s", "µs/row", "ms/job"),
                 rows)


def impact_tables(im: Mapping[str, Any]) -> list[Table]:
    """The impact study as tables: headline beside the paper, arms with their parts, bands."""
    hl, cov = im["headline"], im["coverage"]
    paper = hl["paper"]
    head = [("paper (LEAP)", pct(paper["coverage"]), pct(paper["first_choice_attempts"]),
             pct(paper["first_choice_gpu_hours"]), f"~{pct(paper['cost_saving'], 0)}", "")]
    for arm in ("leap", "leap_aware", "greedy_oracle"):
        if arm in hl:
            h = hl[arm]
            head.append((ARM_LABELS.get(arm, arm),
                         pct(cov["attempts"]) if arm.startswith("leap") else "",
                         pct(h["first_choice_attempts"]), pct(h["first_choice_gpu_hours"]),
                         signed_pct(h["saving"]), pct(h["share_of_optimum"])))
    head.append(("LP optimum", "", "", "", signed_pct(hl["optimum_saving"]), "100.0%"))
    if "optimum_within_budget_saving" in hl:
        head.append(("LP optimum, nobody waits", "", "", "",
                     signed_pct(hl["optimum_within_budget_saving"]), ""))
    tables = [Table(
        "impact", f"impact: {', '.join(im['days'])}, {im['n_attempts']:,} attempts, no-advice "
        f"cost {money(im['baseline_cost'])}; advice depth {im['advice_depth']}, delay cost "
        f"weight {im['delay_cost_weight']:g}",
        ("arm", "coverage", "first choice (attempts)", "first choice (GPU-h)", "cost saving",
         "share of the optimum's saving"), tuple(head))]
    kinds = ("on_advice", "displaced", "home", "waiting", "moved")
    rows = []
    for arm, a in im["arms"].items():
        sp = a.get("spread", {})
        rows.append((ARM_LABELS.get(arm, arm), signed_pct(a["cost_change"]),
                     signed_pct(a["fleet_cost_change"]),
                     *(signed_pct(a["parts"][k]) if k in a["parts"] else "" for k in kinds),
                     signed_pct(a["trimmed"]["cost_change"]),
                     f"{signed_pct(sp.get('min'))}..{signed_pct(sp.get('max'))}"))
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
        tuple((ARM_LABELS.get(arm, arm), *(signed_pct(a["bands"][b]["cost_change"])
                                           if b in a["bands"] else "" for b in bands))
              for arm, a in im["arms"].items())))
    return tables


def whole_pct(v: float) -> str:
    """A share as a whole percentage; a dash when nothing was covered (NaN).

    >>> whole_pct(0.714), whole_pct(float("nan"))
    ('71%', '–')
    """
    return "–" if v != v else f"{v:.0%}"


def real_data_tables(result: Mapping[str, Any]) -> list[Table]:
    """The real-data evaluation (:class:`leap.eval.real_data.RealDataResult` as JSON): one
    table per source, then the ranking on public prices when it ran."""
    tables = []
    for src, by_protocol in result["results"].items():
        rows = tuple((protocol, method, f"{r['n']:,}", whole_pct(r["coverage"]),
                      whole_pct(r["accuracy_within_20pct"]), whole_pct(r["median_ape"]))
                     for protocol, by_method in by_protocol.items()
                     for method, r in by_method.items())
        n_rows = result["data"]["sources"].get(src, {}).get("rows")
        title = src if n_rows is None else f"{src}  ({n_rows:,} rows)"
        tables.append(Table(f"real_data_{src}", title,
                            ("protocol", "method", "n", "cov.", "±20%", "MdAPE"), rows,
                            labels=2))
    ranking = result.get("ranking_check")
    if ranking:
        tables.append(Table(
            "real_data_ranking", f"ranking on public prices: {ranking['configurations']} "
            "Lambda configurations, each type held out",
            ("method", "ranked", "top-1 agreement", "mean value regret"),
            tuple((method, str(r["ranked"]), whole_pct(r["top1_agreement"]),
                   whole_pct(r["mean_regret"])) for method, r in ranking["methods"].items())))
    return tables


def real_data_reference_lines(result: Mapping[str, Any]) -> list[str]:
    """The reference spec-ratio check beside its expected figures, one line per variant."""
    ref = result.get("reference_check")
    if not ref:
        return []
    return [f"{name}: {whole_pct(ref[name]['accuracy_within_20pct'])} within ±20% "
            f"(expected ~{expected:.0%}), MdAPE {whole_pct(ref[name]['median_ape'])}, "
            f"n={ref[name]['n_covered']}" for name, expected in ref["expected"].items()]
