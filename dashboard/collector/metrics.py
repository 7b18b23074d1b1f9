"""`GET /metrics`: the runs' health in the Prometheus text format, for a cluster's Grafana.

Built per scrape from the same rows and status rules as the JSON views (so an alert and
the dashboard cannot disagree), every live run's processes and throughput totals read in
one query each (`dashboard.collector.fleet`), not two queries a run. Per run: its state
(one series per state, 1 for the current one), world size, processes reporting and
checkpoints saved; per process: its state (one series, the current state, value 1),
seconds since its last report and since its step last moved; per data-parallel rank: rows
(packed: blocks) and tokens per second and the share of time its loop waited for data over
the last 30 s, global step; per dataset of a mixture: its weight, rows supplied and passes
completed (its latest report); per node cache (host and folder): hits, misses, bytes from the
store and from the cache, evictions, files fetched again, files prefetched and the
prefetcher's lead in steps (omitted when the report has none) (its latest `cache` event).

At scale: a run whose last report was received longer ago than `METRICS_KEEP_S` (15 min; a finished,
stopped or long-dead run) leaves /metrics (its views stay in the API), so a collector
holding 1,000 runs exposes the live ones only. The text is written here rather than through
`prometheus_client`'s object model (which spent ~70 % of a 1,000-run scrape validating and
escaping), escaping label values as the exposition format requires: backslash, double
quote and line feed; any other Unicode as UTF-8.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dashboard.collector import caches
from dashboard.collector.fleet import live_processes, live_totals
from dashboard.collector.status import Health, by_rank, run_status
from dashboard.collector.store import Store
from dashboard.collector.throughput import STRAGGLER_WINDOW_S
from loader.wire import text_list

RUN_STATES = ("starting", "running", "stalled", "crashed", "restarted", "finished", "stopped")
METRICS_KEEP_S = 900.0  # a run leaves /metrics this long after its last report
PREFIX = "elastic_loader_"
RUN, RANK, DATASET = ("run_id",), ("run_id", "rank"), ("run_id", "dataset")
NODE = ("run_id", "host", "cache_dir")  # a node cache: its host and folder
PROCESS = (*RANK, "process")  # a process: its data-parallel rank and its global rank
# (key, type, name after PREFIX (counters: without `_total`), help, labels)
FAMILIES: tuple[tuple[str, str, str, str, tuple[str, ...]], ...] = (
    ("state", "gauge", "run_state", "1 for the run's state, 0 for the others", (*RUN, "state")),
    ("world", "gauge", "run_world_size", "Ranks of the run's current world", RUN),
    ("reporting", "gauge", "run_ranks_reporting",
     "Processes of the current world that reported", RUN),
    ("checkpoints", "counter", "run_checkpoints_saved",
     "Checkpoints saved (folded across ranks)", RUN),
    ("rank_state", "gauge", "rank_state",
     "The process's current state (value 1); `process` is its global rank", (*PROCESS, "state")),
    ("rows", "gauge", "rank_rows_per_second",
     "Rows (packed runs: blocks) per second over the last 30 s", RANK),
    ("tokens", "gauge", "rank_tokens_per_second",
     "Tokens per second over the last 30 s (packed runs only)", RANK),
    ("wait", "gauge", "rank_data_wait_ratio",
     "Share of the last 30 s the training loop waited for data", RANK),
    ("step", "gauge", "rank_global_step", "Batches handed out since the run began", RANK),
    ("age", "gauge", "rank_last_report_age_seconds",
     "Seconds since the process's last report", PROCESS),
    ("no_step", "gauge", "rank_seconds_since_step",
     "Seconds since the process's step last moved", PROCESS),
    ("mix_weight", "gauge", "mixture_weight",
     "A mixture dataset's share of every global step now", DATASET),
    ("mix_rows", "counter", "mixture_rows_supplied",
     "Rows (packed: blocks) a mixture dataset supplied since the run began", DATASET),
    ("mix_passes", "gauge", "mixture_passes_completed",
     "Passes over a mixture dataset completed", DATASET),
    *((f"cache_{key}", "counter", f"node_cache_{key}", text, NODE) for key, text in (
        ("hits", "Data-file reads a node's cache served (its latest report)"),
        ("misses", "Data files a node fetched from the store into its cache"),
        ("bytes_from_store", "Bytes of data files a node's cache fetched from the store (not manifests, headers)"),
        ("bytes_from_cache", "Bytes of data files a node read from its cache"),
        ("evictions", "Files a node's cache evicted to stay under cache_limit"),
        ("refetched", "Cached files found damaged or missing and fetched again"),
        ("prefetched", "Data files the plan-driven prefetcher fetched ahead of the readers"),
    )),
    ("cache_lead", "gauge", "node_cache_prefetch_lead_steps",
     "Steps the prefetcher is ahead of the readers (omitted without a prefetcher)", NODE),
)  # fmt: skip
_NAMES = {
    key: PREFIX + name + ("_total" if kind == "counter" else "")
    for key, kind, name, _, _ in FAMILIES
}
# 'elastic_loader_rank_state{run_id="{}",rank="{}",process="{}",state="{}"} {}': one
# `str.format` a sample (a scrape of 128,000 processes writes ~700,000 of them)
_LINES = {
    key: _NAMES[key].replace("{", "{{")
    + "{{"
    + ",".join(f'{label}="{{}}"' for label in labels)
    + "}} {}"
    for key, _, _, _, labels in FAMILIES
}


def escape(value: str) -> str:
    """A label value as the text exposition format writes it: `\\`, `"` and a line feed
    escaped; commas, spaces and any other Unicode as they are."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return repr(float(value)) if value == value else "NaN"


class _Lines:
    """The samples of every family, as text lines, in family order."""

    def __init__(self) -> None:
        self.lines: dict[str, list[str]] = {key: [] for key in _NAMES}

    def add(self, key: str, labels: tuple[str, ...], value: float) -> None:
        """`labels`: values already escaped, in the family's label order."""
        self.lines[key].append(_LINES[key].format(*labels, _number(value)))

    def processes(self, run_id: str, ranks: list[dict[str, Any]]) -> None:
        """Each process's state, report age and time since its step moved: the bulk of a
        large scrape (3 lines a process), so written with one f-string a line."""
        state, age, no_step = (_NAMES[k] for k in ("rank_state", "age", "no_step"))
        states, ages, stuck = (self.lines[k] for k in ("rank_state", "age", "no_step"))
        for r in ranks:
            labels = f'run_id="{run_id}",rank="{r["rank"]}",process="{r["process"]}"'
            states.append(f'{state}{{{labels},state="{r["state"]}"}} 1.0')
            ages.append(f"{age}{{{labels}}} {float(r['silent_s'])!r}")
            stuck.append(f"{no_step}{{{labels}}} {float(r['no_step_s'])!r}")

    def ranks(
        self,
        run_id: str,
        ranks: dict[int, dict[str, Any]],
        totals: dict[int, tuple[float, float | None, float, float]],
        packed: bool,
    ) -> None:
        """Each data-parallel rank's step, and its rows, wait share and tokens per second
        over the window (`totals`: rows, tokens, wait and covered seconds), one f-string a
        line like `processes`."""
        names = [_NAMES[k] for k in ("step", "rows", "wait", "tokens")]
        lines = [self.lines[k] for k in ("step", "rows", "wait", "tokens")]
        for rank, r in ranks.items():
            labels = f'{{run_id="{run_id}",rank="{rank}"}} '
            if r["global_step"] is not None:
                lines[0].append(f"{names[0]}{labels}{float(r['global_step'])!r}")
            total = totals.get(rank)
            if total is None:
                continue
            rows, tokens, wait_s, covered = total
            covered = covered or 1e-9
            lines[1].append(f"{names[1]}{labels}{_number(rows / covered)}")
            lines[2].append(f"{names[2]}{labels}{_number(min(1.0, wait_s / covered))}")
            if packed:
                lines[3].append(f"{names[3]}{labels}{_number((tokens or 0) / covered)}")

    def text(self) -> bytes:
        out = []
        for key, kind, _, text, _ in FAMILIES:
            help_text = text.replace("\\", "\\\\").replace("\n", "\\n")
            out += [f"# HELP {_NAMES[key]} {help_text}", f"# TYPE {_NAMES[key]} {kind}"]
            out += self.lines[key]
        return ("\n".join(out) + "\n").encode()


def _run(store: Store, run: dict[str, Any], live: _Live, now: float, out: _Lines) -> None:
    run_id = escape(str(run["run_id"]))
    processes = live.processes.get(run["run_id"], [])
    status = run_status(store, run, processes, health=live.health, now=now)
    for state in RUN_STATES:
        out.add("state", (run_id, state), float(status["state"] == state))
    out.add("world", (run_id,), run["world_size"])
    out.add("reporting", (run_id,), len(status["ranks"]))
    out.add("checkpoints", (run_id,), store.checkpoints_saved(run["run_id"]))
    out.processes(run_id, status["ranks"])
    totals = live.totals.get(run["run_id"], {})
    out.ranks(run_id, by_rank(status), totals, run.get("seq_len") is not None)
    _mixture(store, run["run_id"], run_id, out)
    _cache(store, run["run_id"], run_id, out)


def _cache(store: Store, run_id: str, label: str, out: _Lines) -> None:
    """Per node cache (host, folder), its latest totals (any rank of the node sends them)."""
    for data in store.latest_caches(run_id):
        node = (label, escape(str(data.get("host", ""))), escape(str(data.get("cache_dir", ""))))
        for key in caches.COUNTERS:
            value = data.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                out.add(f"cache_{key}", node, value)
        ahead = caches.lead(data)
        if ahead is not None:
            out.add("cache_lead", node, ahead)


def _mixture(store: Store, run_id: str, label: str, out: _Lines) -> None:
    """Per dataset of a mixture run, from its latest facts (the Progress page's table)."""
    last = store.latest_mixture(run_id)
    if last is None:
        return
    data = last["data"]
    names = [escape(n) for n in text_list(data, "names")]
    weights = [float(Fraction(w)) for w in text_list(data, "weights") if w]
    for key, values in (
        ("mix_weight", weights),
        ("mix_rows", data.get("supplied") or []),
        ("mix_passes", data.get("passes") or []),
    ):
        for name, value in zip(names, values, strict=False):
            out.add(key, (label, name), value)


def _received(run: dict[str, Any]) -> float:
    """When the collector received the run's last report (its sender's clock may be off)."""
    return float(run["last_recv"] if run.get("last_recv") is not None else run["last_ts"])


@dataclass(frozen=True)
class _Live:
    """What one scrape reads for every live run at once (`dashboard.collector.fleet`)."""

    health: Health
    processes: dict[str, list[dict[str, Any]]]
    totals: dict[str, dict[int, tuple[float, float | None, float, float]]]


def scrape(
    store: Store, health: Health, now: float | None = None, keep_s: float = METRICS_KEEP_S
) -> bytes:
    """The text a Prometheus scrape gets (the text exposition format, version 0.0.4): every
    run that reported within `keep_s`."""
    now = time.time() if now is None else now
    since = now - keep_s
    collecting = gc.isenabled()
    gc.disable()  # ~10 objects a process, none in a cycle: collections cost 10-15 % of it
    try:
        runs = [run for run in store.runs() if _received(run) >= since]
        live = _Live(
            health, live_processes(store, since), live_totals(store, since, STRAGGLER_WINDOW_S)
        )
        out = _Lines()
        for run in runs:
            _run(store, run, live, now, out)
        return out.text()
    finally:
        if collecting:
            gc.enable()
