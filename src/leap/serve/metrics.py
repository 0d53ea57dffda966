"""Prometheus collectors of the service, read at scrape time: the ranker's model and
fail-open figures, and the decision log's counters (the request counters and latency
histogram live with the app, :func:`leap.serve.app.create_app`)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from leap.rank.decisions import DecisionLog
from leap.rank.ranker import Ranker


class RankerCollector(Collector):
    """Model and fail-open figures read from the Ranker at scrape time."""

    def __init__(self, ranker: Ranker) -> None:
        self.ranker = ranker

    def collect(self) -> Iterable[Metric]:
        fail = CounterMetricFamily("leap_fail_open", "Answers that failed open (empty ranking "
                                   "or predictions with a reason), by reason code",
                                   labels=["reason"])
        for code, n in sorted(self.ranker.fail_open_counts.items()):
            fail.add_metric([code], n)
        yield fail
        version = self.ranker.model_version
        info = GaugeMetricFamily("leap_model_info", "The serving model version (value 1)",
                                 labels=["version"])
        if version is not None:
            info.add_metric([version], 1.0)
        yield info
        yield GaugeMetricFamily("leap_model_loaded", "1 when a model is loaded, else 0",
                                value=float(version is not None))
        w = self.ranker.watcher
        yield CounterMetricFamily("leap_model_reloads", "Models loaded (the first included)",
                                  value=w.reloads)
        yield CounterMetricFamily("leap_model_reload_failures", "Published versions that "
                                  "failed to load or verify and were refused (the previous "
                                  "model kept serving)", value=w.reload_failures)
        refused = GaugeMetricFamily("leap_model_refused_info", "The last refused model "
                                    "version (value 1; none after a good version loads)",
                                    labels=["version"])
        if w.refused_version is not None:
            refused.add_metric([w.refused_version], 1.0)
        yield refused


class DecisionCollector(Collector):
    """The decision log's counters, read at scrape time."""

    def __init__(self, decisions: DecisionLog) -> None:
        self.decisions = decisions

    def collect(self) -> Iterable[Metric]:
        d = self.decisions
        yield CounterMetricFamily("leap_decisions_recorded", "Rankings handed to the decision "
                                  "log", value=d.recorded)
        yield CounterMetricFamily("leap_decisions_written", "Rankings written to the decision "
                                  "log's DuckDB file", value=d.written)
        yield CounterMetricFamily("leap_decisions_dropped", "Rankings not recorded because the "
                                  "decision log's queue was full (the ranking was served)",
                                  value=d.dropped)
        yield GaugeMetricFamily("leap_decisions_queued", "Rankings waiting to be written",
                                value=d.queued)
        yield CounterMetricFamily("leap_decision_write_errors", "Decision log flushes that "
                                  "failed and were retried", value=d.write_errors)
