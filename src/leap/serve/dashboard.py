"""The web page of `leap serve` at ``/``: server-rendered HTML and matplotlib PNGs, no JavaScript.

Sections: the model in use (version, training window, held-out accuracy, history snapshot
date), the nightly accuracy of every published version, the live figures of
:mod:`leap.serve.monitor` (with a plot), the fail-open and decision-log counts, and a form
(plain ``GET``) that ranks a job and shows its preference list.
"""

from __future__ import annotations

import html
import io
import json
import string
from collections.abc import Mapping
from importlib import resources
from typing import Any

from leap import __version__
from leap.errors import LeapError
from leap.metrics import si
from leap.rank.decisions import DecisionLog
from leap.rank.policy import FLAGS
from leap.rank.ranker import Ranker
from leap.rank.serving import ModelWatcher
from leap.serve.monitor import MonitorCollector

DASHBOARD_PATHS = ("/", "/dashboard/nightly.png", "/dashboard/live.png")
EXAMPLE_JOB = {"family_id": "ads-ranker-daily", "model_type": "dlrm-large", "trainer_count": 4,
               "batch_size": 4096, "devices_per_trainer": 8, "precision": "bf16"}


def _e(x: Any) -> str:
    return html.escape(str(x))


def _pct(x: Any) -> str:
    return "—" if x is None or x != x else f"{100 * float(x):.1f}%"


def _table(head: list[str], rows: list[list[str]], table_id: str = "") -> str:
    ident = f' id="{table_id}"' if table_id else ""
    out = [f"<table{ident}><thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head)
           + "</tr></thead><tbody>"]
    out += ["<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows]
    return "".join(out) + "</tbody></table>"


def _card(label: str, value: str, card_id: str = "") -> str:
    ident = f' id="{card_id}"' if card_id else ""
    return f'<div class="card"{ident}><b>{value}</b><span>{_e(label)}</span></div>'


def nightly_history(ranker: Ranker) -> list[dict[str, Any]]:
    """Held-out accuracy of every published version (oldest first), from their manifests."""
    watcher = ranker.watcher
    if not isinstance(watcher, ModelWatcher):
        return []
    root = watcher.registry.root
    out = []
    for version in watcher.registry.versions():
        try:
            m = json.loads((root / version / "manifest.json").read_text("utf-8"))
        except (OSError, ValueError):
            continue
        held = (m.get("metrics") or {}).get("held_out") or {}
        out.append({"version": version, "day": held.get("day") or str(m.get("as_of"))[:10],
                    "accuracy": held.get("accuracy"),
                    "accuracy_gpu_hours": held.get("accuracy_gpu_hours"),
                    "median_ape": held.get("median_ape")})
    return sorted(out, key=lambda r: (str(r["day"]), r["version"]))


class Dashboard:
    """Renders the page and its plots for one app (see :func:`leap.serve.app.create_app`)."""

    def __init__(self, ranker: Ranker, *, monitor: MonitorCollector | None = None,
                 decisions: DecisionLog | None = None) -> None:
        self.ranker = ranker
        self.monitor = monitor
        self.decisions = decisions
        text = resources.files("leap.resources").joinpath("dashboard.html").read_text("utf-8")
        self.template = string.Template(text)

    # Sections ----------------------------------------------------------------------------
    def _model(self) -> str:
        info = self.ranker.model_info()
        if info["version"] is None:
            return f'<p class="err" id="no-model">No model loaded: {_e(info["reason"])}</p>'
        held = (info.get("metrics") or {}).get("held_out") or {}
        fail = self.ranker.fail_open_counts
        cards = [_card("version", _e(info["version"]), "model-version"),
                 _card("training window", f'{_e(str(info["window_start"])[:10])} → '
                       f'{_e(str(info["window_end"])[:10])} ({_e(info["window_days"])} d)'),
                 _card("history snapshot as of", _e(str(info["as_of"])[:10])),
                 _card(f"held-out accuracy (±20%, {held.get('day', '?')})",
                       _pct(held.get("accuracy")), "heldout-accuracy"),
                 _card("held-out MdAPE", _pct(held.get("median_ape"))),
                 _card("fail-open answers since start", f"{sum(fail.values()):,}", "fail-open")]
        if self.decisions is not None:
            d = self.decisions
            cards.append(_card("decisions recorded / dropped",
                               f"{d.written:,} / {d.dropped:,}", "decisions"))
        return '<div class="cards">' + "".join(cards) + "</div>"

    def _nightly(self) -> str:
        hist = nightly_history(self.ranker)
        if not hist:
            return "<p>No published versions with held-out figures.</p>"
        rows = [[_e(h["day"]), _e(h["version"]), _pct(h["accuracy"]),
                 _pct(h["accuracy_gpu_hours"]), _pct(h["median_ape"])] for h in hist[-10:]]
        return ('<img id="nightly-plot" src="/dashboard/nightly.png" alt="held-out accuracy per '
                'nightly model">' + _table(["held-out day", "version", "within ±20%",
                                            "GPU-hour weighted", "MdAPE"], rows, "nightly"))

    def _live(self) -> str:
        report = self.monitor.current() if self.monitor else None
        if report is None or not report.days:
            why = f" ({_e(self.monitor.error)})" if self.monitor and self.monitor.error else ""
            return ('<p id="live-empty">No decisions joined to attempts yet: decisions are '
                    "recorded as leap serves rankings; ingest the attempts that ran and this "
                    f"section fills in (see <code>leap monitor</code>){why}.</p>")
        days = report.days[-14:]
        last = days[-1]
        cards = [_card(f"coverage ({last.date})", _pct(last.coverage_attempts),
                       "live-coverage"),
                 _card("coverage of GPU-hours", _pct(last.coverage_gpu_hours)),
                 _card("on first choice", _pct(last.first_choice_share)),
                 _card("in top 3", _pct(last.top3_share)),
                 _card("live within ±20%", _pct(last.within_20), "live-accuracy"),
                 _card("live MdAPE", _pct(last.mdape)),
                 _card("in 80% interval", _pct(last.interval_coverage))]
        rows = [[_e(d.date), f"{d.attempts:,}", _pct(d.coverage_attempts),
                 _pct(d.coverage_gpu_hours), _pct(d.first_choice_share),
                 _pct(d.top3_share), _pct(d.within_20), _pct(d.mdape),
                 _pct(d.interval_coverage), f"{d.fail_open:,}"] for d in days]
        return ('<div class="cards">' + "".join(cards) + "</div>"
                '<img id="live-plot" src="/dashboard/live.png" alt="live figures per day">'
                + _table(["day", "attempts", "coverage", "coverage GPU-h", "1st choice",
                          "top 3", "within ±20%", "MdAPE", "in interval", "fail-open"], rows,
                         "live"))

    def _rank(self, job_text: str, candidates_text: str) -> tuple[str, int]:
        from pydantic import ValidationError

        from leap.serve.payloads import RankRequest

        try:
            doc = json.loads(job_text)
        except ValueError as exc:
            return f'<p class="err" id="rank-error">job: not valid JSON ({_e(exc)})</p>', 422
        if not isinstance(doc, dict):
            return '<p class="err" id="rank-error">job: expected a JSON object</p>', 422
        request = doc if isinstance(doc.get("job"), dict) else {"job": doc}
        names = [c.strip() for c in candidates_text.split(",") if c.strip()]
        if names:
            request["candidates"] = names
        try:
            req = RankRequest.model_validate(request)
            result = self.ranker.rank(req.job.launch_fields(), req.candidates,
                                      objective=req.objective,
                                      max_cost_per_hour=req.max_cost_per_hour, risk=req.risk,
                                      strict=True, free_devices=req.free_devices)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return f'<p class="err" id="rank-error">{_e(where)}: {_e(first["msg"])}</p>', 422
        except LeapError as exc:
            return f'<p class="err" id="rank-error">{_e(exc)}</p>', 422
        out = []
        if result.reason:
            out.append(f'<p class="warn" id="rank-reason">No ranking: {_e(result.reason)}</p>')
        if result.ranking:
            rows = []
            for i, r in enumerate(result.ranking, start=1):
                span = "—" if r.throughput_p10 is None else \
                    f"{si(r.throughput_p10)}–{si(r.throughput_p90)}"
                rows.append([str(i), _e(r.hardware), si(r.predicted_throughput), span,
                             f"{r.cost_per_hour:.2f}", si(r.value), _e(r.novelty or "—"),
                             _e(", ".join(FLAGS.get(f, f) for f in r.flags))])
            out.append(_table(["#", "hardware", "samples/s", "80% interval", "cost/hour",
                               "samples per cost", "novelty", "flags"], rows, "ranking"))
        if result.excluded:
            out.append("<details><summary>left out "
                       f"({len(result.excluded)})</summary>" + _table(
                           ["hardware", "reason", "detail"],
                           [[_e(e.hardware), _e(e.reason), _e(e.detail)]
                            for e in result.excluded], "excluded") + "</details>")
        out.append(f"<p>model {_e(result.model_version or '—')}, "
                   f"{result.latency_ms:.1f} ms</p>")
        return "".join(out), 200

    # The page and its plots ---------------------------------------------------------------
    def page(self, query: Mapping[str, str]) -> tuple[str, int]:
        """The HTML page; with a ``job`` query parameter, also that job's ranking."""
        job_text = query.get("job")
        candidates_text = query.get("candidates", "")
        ranking, status = ("", 200) if job_text is None else self._rank(job_text,
                                                                        candidates_text)
        body = self.template.substitute(
            title="dashboard", model=self._model(), nightly=self._nightly(), live=self._live(),
            job_text=_e(job_text if job_text is not None else json.dumps(EXAMPLE_JOB, indent=2)),
            candidates_text=_e(candidates_text), ranking=ranking, leap_version=_e(__version__))
        return body, status

    def nightly_png(self) -> bytes:
        hist = [h for h in nightly_history(self.ranker) if h["accuracy"] is not None]
        return _plot([h["day"] for h in hist],
                     {"within ±20%": [h["accuracy"] for h in hist],
                      "GPU-hour weighted": [h["accuracy_gpu_hours"] for h in hist]},
                     "held-out accuracy per nightly model")

    def live_png(self) -> bytes:
        report = self.monitor.current() if self.monitor else None
        days = report.days[-30:] if report else []
        keys = {"coverage": "coverage_attempts", "on first choice": "first_choice_share",
                "in top 3": "top3_share", "live within ±20%": "within_20",
                "in 80% interval": "interval_coverage"}
        return _plot([d.date for d in days], {k: [d.figure(v) for d in days] for k, v in
                                              keys.items()}, "live figures per day")


def _plot(x: list[str], series: dict[str, list[Any]], title: str) -> bytes:
    # The object API, not pyplot: no global state, safe from the server's worker threads.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 3), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for label, ys in series.items():
        vals = [float("nan") if y is None else 100 * float(y) for y in ys]
        ax.plot(x, vals, marker="o", label=label)
    if not x:
        ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylim(0, 100)
    ax.set_ylabel("%")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if x:
        ax.legend(fontsize=8, loc="lower left")
        fig.autofmt_xdate()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
