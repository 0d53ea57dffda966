"""The tables of the ``leap experiment`` studies (new hardware, trial runs, new families,
alternative learners), in the plain rows of :class:`leap.eval.tables.Table`."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from leap.eval.baselines import CHEAPEST
from leap.eval.tables import Table, money, pct

if TYPE_CHECKING:
    from leap.eval.alternatives import AlternativesResult
    from leap.eval.new_families import FamilyComparison, NewFamiliesResult
    from leap.eval.new_hardware import NewHardwareResult
    from leap.eval.trials import PlanSummary
    from leap.eval.trials_check import TrialArms, TrialsResult


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
                     pct(_get(b.held_out or {}, "accuracy")),
                     pct(_get(b.held_out or {}, "interval_coverage")),
                     _num(b.drop_points, ".1f"),
                     f"{int(rk.n_sampled if rk is not None else 0):,}",
                     _num(_get(seen_rk, "mean_regret")), _num(_get(held_rk, "mean_regret")),
                     _num(_get(cheap_rk, "mean_regret")), pct(_get(held_rk, "top1_agreement")),
                     pct(_get(cheap_rk, "top1_agreement")),
                     pct(_get(seen_rk, "picks_type")), pct(_get(held_rk, "picks_type")),
                     pct(math.nan if type_is_best is None else type_is_best)))
    tables = [Table("new_hardware", f"types held out of training, scored on "
                    f"{nh.day} beside the same type seen",
                    ("type", "attempts", "±20% seen", "±20% held out",
                     "in 80% interval held out", "drop (points)",
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
