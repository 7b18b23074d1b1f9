"""`GET /metrics`: the runs' health in the Prometheus text format, for a cluster's Grafana.

Built per scrape from the same store reads and status rules as the JSON views (so an
alert and the dashboard cannot disagree), written by `prometheus_client` itself. Per run:
its state (one series per state, 1 for the current one), world size, ranks reporting and
checkpoints saved; per rank of the current world: its state (one series, the current
state, value 1: all states for 1,024 ranks would be 6,144 series), rows (packed: blocks)
and tokens per second and the share of time its loop waited for data over the last 30 s,
global step, seconds since its last report and since its step last moved; per dataset of a
mixture: its weight, rows supplied and passes completed (its latest report).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from dashboard.collector.status import Health, by_rank, run_status
from dashboard.collector.store import Store
from dashboard.collector.throughput import STRAGGLER_WINDOW_S
from loader.wire import text_list

RUN_STATES = ("starting", "running", "stalled", "crashed", "restarted", "finished", "stopped")
PREFIX = "elastic_loader_"
RUN, RANK, DATASET = ("run_id",), ("run_id", "rank"), ("run_id", "dataset")
PROCESS = (*RANK, "process")  # a process: its data-parallel rank and its global rank
# (key, family, name after PREFIX, help, labels)
FAMILIES: tuple[tuple[str, Any, str, str, tuple[str, ...]], ...] = (
    ("state", GaugeMetricFamily, "run_state", "1 for the run's state, 0 for the others",
     (*RUN, "state")),
    ("world", GaugeMetricFamily, "run_world_size", "Ranks of the run's current world", RUN),
    ("reporting", GaugeMetricFamily, "run_ranks_reporting",
     "Ranks of the current world that reported", RUN),
    ("checkpoints", CounterMetricFamily, "run_checkpoints_saved",
     "Checkpoints saved (folded across ranks)", RUN),
    ("rank_state", GaugeMetricFamily, "rank_state",
     "The process's current state (value 1); `process` is its global rank", (*PROCESS, "state")),
    ("rows", GaugeMetricFamily, "rank_rows_per_second",
     "Rows (packed runs: blocks) per second over the last 30 s", RANK),
    ("tokens", GaugeMetricFamily, "rank_tokens_per_second",
     "Tokens per second over the last 30 s (packed runs only)", RANK),
    ("wait", GaugeMetricFamily, "rank_data_wait_ratio",
     "Share of the last 30 s the training loop waited for data", RANK),
    ("step", GaugeMetricFamily, "rank_global_step", "Batches handed out since the run began",
     RANK),
    ("age", GaugeMetricFamily, "rank_last_report_age_seconds",
     "Seconds since the process's last report", PROCESS),
    ("no_step", GaugeMetricFamily, "rank_seconds_since_step",
     "Seconds since the process's step last moved", PROCESS),
    ("mix_weight", GaugeMetricFamily, "mixture_weight",
     "A mixture dataset's share of every global step now", DATASET),
    ("mix_rows", CounterMetricFamily, "mixture_rows_supplied",
     "Rows (packed: blocks) a mixture dataset supplied since the run began", DATASET),
    ("mix_passes", GaugeMetricFamily, "mixture_passes_completed",
     "Passes over a mixture dataset completed", DATASET),
)  # fmt: skip


class RunMetrics:
    """A `prometheus_client` collector over the store: every run, read at scrape time."""

    def __init__(self, store: Store, health: Health, now: float | None = None) -> None:
        self.store, self.health, self.now = store, health, now

    def collect(self) -> Iterator[Metric]:
        now = time.time() if self.now is None else self.now
        family = {
            key: kind(PREFIX + name, text, labels=list(labels))
            for key, kind, name, text, labels in FAMILIES
        }
        for run in self.store.runs():
            self._run(run, now, family)
        yield from family.values()

    def _run(self, run: dict[str, Any], now: float, family: dict[str, Any]) -> None:
        run_id = str(run["run_id"])
        status = run_status(self.store, run, health=self.health, now=now)
        for state in RUN_STATES:
            family["state"].add_metric([run_id, state], float(status["state"] == state))
        family["world"].add_metric([run_id], run["world_size"])
        family["reporting"].add_metric([run_id], len(status["ranks"]))
        family["checkpoints"].add_metric([run_id], self.store.checkpoints_saved(run_id))
        since = run["last_ts"] - STRAGGLER_WINDOW_S
        totals = {r["rank"]: r for r in self.store.rank_totals(run_id, since, run["world_size"])}
        for r in status["ranks"]:
            process = [run_id, str(r["rank"]), str(r["process"])]
            family["rank_state"].add_metric([*process, r["state"]], 1.0)
            family["age"].add_metric(process, r["silent_s"])
            family["no_step"].add_metric(process, r["no_step_s"])
        for r in by_rank(status).values():
            labels = [run_id, str(r["rank"])]
            if r["global_step"] is not None:
                family["step"].add_metric(labels, r["global_step"])
            total = totals.get(r["rank"])
            if total is None:
                continue
            covered = total["iv"] or 1e-9
            family["rows"].add_metric(labels, total["rows"] / covered)
            family["wait"].add_metric(labels, min(1.0, total["wait_s"] / covered))
            if run.get("seq_len") is not None:
                family["tokens"].add_metric(labels, (total["tokens"] or 0) / covered)
        self._mixture(run_id, family)

    def _mixture(self, run_id: str, family: dict[str, Any]) -> None:
        """Per dataset of a mixture run, from its latest facts (the Progress page's table)."""
        last = self.store.latest_mixture(run_id)
        if last is None:
            return
        data = last["data"]
        names = text_list(data, "names")
        weights = [float(Fraction(w)) for w in text_list(data, "weights") if w]
        for key, values in (
            ("mix_weight", weights),
            ("mix_rows", data.get("supplied") or []),
            ("mix_passes", data.get("passes") or []),
        ):
            for name, value in zip(names, values, strict=False):
                family[key].add_metric([run_id, name], value)


def scrape(store: Store, health: Health, now: float | None = None) -> bytes:
    """The text a Prometheus scrape gets (the text exposition format)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunMetrics(store, health, now))
    return generate_latest(registry)
