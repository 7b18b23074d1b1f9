"""Telemetry client: a rank reports where it is to the dashboard's collector.

The training loop only ever touches `on_batch` (three additions to running totals, no lock)
and `event` (a non-blocking put on a bounded queue). A daemon thread wakes about once a
second (and at once after an `event`, so checkpoints and resumes show without delay), folds
the counters into one `progress` event, drains the queue and POSTs the batch
with orjson over stdlib `urllib`. The trade-off is deliberate: telemetry is lossy. When the
collector is down, slow or refusing, events are dropped with one `TelemetryWarning`, the
sender backs off, and the job never waits: that is worth more than a complete record.

Wire format (names in `loader/wire.py`, validated by `dashboard/collector/models.py`):
`POST {url}/api/events` with `{"events": [event, ...]}`, where every event carries the run
id, the rank's static facts
(host, rank, local_rank, world_size, num_workers, num_splits, rows_per_split, batch_size,
global_batch_size), `kind`, `ts`, `epoch`, `step`, `splits` ([lo, hi) the rank reads from,
shared splits at its edges included: `loader.layout.owned_splits`), `cursors` (of those splits),
`tokens` and `blocks_per_split` (packed data only: tokens this rank handed out this epoch, and
the epoch's blocks per split, which the cursors and `rows` then count; the static `seq_len`
says tokens per block), the interval's `rows`, `batches`, `wait_s`, `interval_s`, `rows_per_s`, and `data` (the
kind-specific fields of `event(kind, **fields)`), and `incarnation` (this client's random id)
with `seq` (the event's number in its stream, assigned as it first goes out): the collector
ignores a number it has stored, so a retried batch that did arrive changes nothing. The
client's last batch ends with a `closed` event at the position the loader ended at, even once
it is collected, and time-stamped when it closed, not when that was sent (so a loader rebuilt
in the same process, as an anneal does, reports after it) (`data.reason`: `close` for `close()` or a
collected loader, `exit` at the process's end, `error` with `data.error`, the exception's
type, when it ends on an uncaught one; see `telemetry_exit.py`), so the dashboard can tell a
finished rank from a crashed one. That batch is retried within the exit budget.

The token goes only to the URL given: redirects are never followed (the collector never
sends one), so a redirect cannot carry the token to another origin. What an event carries
is `events.py`; how a batch is POSTed, and the back-off, is `transport.py`.
"""

from __future__ import annotations

import contextlib
import http.client
import inspect
import logging
import os
import queue
import socket
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from loader.telemetry.events import (
    POSITION_KEYS,
    STATIC_KEYS,
    event_value,
    position_fields,
    progress_fields,
)
from loader.telemetry.exit import _LIVE, EXIT_BUDGET_S, install_exit_hooks
from loader.telemetry.settings import (
    ENV_RUN_ID,
    ENV_TOKEN,
    ENV_URL,
    check_env,
    check_run_id,
    check_url,
    job_identity,
    job_length,
)
from loader.telemetry.transport import TelemetryWarning, Transport
from loader.wire import (
    CLOSE_REASON_CLOSE,
    CLOSE_REASON_ERROR,
    CLOSED,
    INGEST_PATH,
    PROGRESS,
)

__all__ = [
    "ENV_RUN_ID",
    "ENV_TOKEN",
    "ENV_URL",
    "POSITION_KEYS",
    "STATIC_KEYS",
    "TelemetryClient",
    "TelemetryWarning",
    "check_url",
    "event_value",
    "job_length",
    "position_fields",
]

Snapshot = Callable[[], Mapping[str, Any]]
logger = logging.getLogger(__name__)

HTTP_TIMEOUT_S = 1.0  # a POST's default timeout; `close()` waits at most twice this


class TelemetryClient:
    """Background, lossy reporter of one rank's progress (see the module docstring)."""

    def __init__(
        self,
        url: str,
        run_id: str,
        static: Mapping[str, Any],
        *,
        token: str | None = None,
        interval_s: float = 1.0,
        timeout_s: float | None = None,
        max_queue: int = 1024,
        attempt: str | None = None,
        hold: bool = False,
    ) -> None:
        self.run_id = check_run_id(run_id)
        self.attempt = attempt  # the launcher's job (and restart) this process belongs to
        # `hold`: the run id is a default that a resume may replace by its checkpoint's
        # lineage (`settle`): nothing is sent before the loader's first batch, resume or close
        self._settled = threading.Event()
        if not hold:
            self._settled.set()
        self.endpoint = check_url(url) + INGEST_PATH
        self.static = {k: static[k] for k in STATIC_KEYS if k in static}
        self.static.setdefault("host", socket.gethostname())
        self.static["heartbeat_s"] = interval_s  # the collector's thresholds start from it
        self.interval_s = interval_s
        self.timeout_s = HTTP_TIMEOUT_S if timeout_s is None else timeout_s
        self.sent = 0
        self.dropped = 0
        self._transport = Transport(self.endpoint, token, interval_s)
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=max_queue)
        # Running totals written only by the training thread; the sender reads them and
        # keeps the last read, so no lock is needed (a read torn between the three fields
        # is off by one batch for one tick and corrects itself on the next).
        self._rows = 0
        self._batches = 0
        self._wait_s = 0.0
        self._seen = (0, 0, 0.0)
        self._last_tick = time.monotonic()
        self._snapshot: Callable[[], Snapshot | None] | None = None
        self._where: Snapshot | None = None  # the position once the loader is gone
        self._closed_ts: float | None = None  # when the loader closed, not when that was sent
        self._close_reason = CLOSE_REASON_CLOSE
        self._close_error: str | None = None
        self._close_extra: dict[str, Any] = {}  # a signal's name, a planned restart
        self._final_by = 0.0  # monotonic deadline of the last send's retries
        self._position: dict[str, Any] = {}  # the last position read: the loader may be gone
        self._pid = os.getpid()
        # Idempotence: this client's random id and the next number of its events, assigned
        # on the sender thread as a batch first goes out (a retry re-sends the same numbers).
        self.incarnation = uuid.uuid4().hex
        self._seq = 0
        self._owner = threading.current_thread()  # its uncaught exception ends this client
        self._stop = threading.Event()
        self._wake = threading.Event()  # a discrete event goes out now, not at the next tick
        self._thread = threading.Thread(target=self._run, name="elastic-telemetry", daemon=True)
        self._thread.start()
        _LIVE.add(self)
        install_exit_hooks()

    @classmethod
    def from_settings(
        cls, url: str | None, run_id: str | None, static: Mapping[str, Any]
    ) -> TelemetryClient | None:
        """The loader's entry point: arguments win, then the environment; None means off.

        A bad argument is an error at construction; a bad environment variable (set for the
        whole job, perhaps by a launcher) is one warning and no telemetry: the job runs.
        """
        from_env = {ENV_URL: url is None, ENV_RUN_ID: run_id is None}
        url = url or os.environ.get(ENV_URL) or None
        if url is None:
            return None
        job, attempt = job_identity(static)
        chosen = run_id or os.environ.get(ENV_RUN_ID)
        run_id = chosen or job
        try:
            check_env(from_env, url, run_id)
        except ValueError as exc:
            warnings.warn(
                f"elastic-loader telemetry is off: {exc}; training continues",
                TelemetryWarning,
                stacklevel=3,
            )
            return None
        token = os.environ.get(ENV_TOKEN) or None
        return cls(url, run_id, static, token=token, attempt=attempt, hold=not chosen)

    def settle(self, run_id: str | None = None) -> None:
        """The run id is decided: `run_id` (a resumed checkpoint's lineage) if given, else
        the one it was made with; a held client starts sending. A no-op once settled."""
        if self._settled.is_set():
            return
        if run_id is not None:
            self.run_id = check_run_id(run_id)
        self._settled.set()

    @property
    def settled(self) -> bool:
        """Is the run id final (and the client sending)?"""
        return self._settled.is_set()

    def set_snapshot(self, fn: Snapshot, where: Snapshot | None = None) -> None:
        """`fn()` is called on the sender thread; it must be cheap and not raise.

        A bound method is held weakly: when its loader is garbage-collected the client
        flushes and stops at once, so a dropped loader leaves no thread behind. `where()`
        (held strongly, and dropped once the last batch is sent) gives the position after
        that, so the final `progress` and `closed` carry the step the loader ended at, not
        the last heartbeat's (a loader rebuilt mid-run, or one that read its last steps
        within a heartbeat).
        """
        self._where = where
        if inspect.ismethod(fn):
            self._snapshot = weakref.WeakMethod(fn, lambda _: self._finish())
        else:
            self._snapshot = lambda: fn

    def position(self) -> dict[str, Any] | None:
        """The loader's position now, as events carry it (its splits' cursors only); None
        when no loader is attached, it is gone, or the client is closing."""
        snapshot = self._snapshot() if self._snapshot is not None else None
        if snapshot is None or self._stop.is_set():
            return None
        return position_fields(snapshot(), self.static.get("num_splits"))

    def on_batch(self, rows: int, wait_s: float) -> None:
        """Count one batch handed to the training loop and how long the loop waited."""
        self._rows += rows
        self._batches += 1
        self._wait_s += wait_s

    def event(self, kind: str, **fields: Any) -> None:
        """Queue a discrete event (e.g. `checkpoint_loaded`); dropped if the queue is full."""
        ev = self._base(kind, time.time())
        position = {k: fields.pop(k) for k in POSITION_KEYS if k in fields}
        ev.update(position_fields(position, self.static.get("num_splits")))
        ev["data"] = {str(k): event_value(v) for k, v in fields.items()}
        self._offer(ev)
        self._wake.set()

    def close(self, timeout_s: float | None = None) -> None:
        """Flush what is pending, waiting at most `timeout_s` (default: 2 × the HTTP timeout)
        and retrying the last send within that time."""
        if self._stop.is_set():
            return
        wait_s = 2 * self.timeout_s if timeout_s is None else timeout_s
        self._finish(deadline=time.monotonic() + 0.8 * wait_s)  # the last try ends in time
        self._thread.join(wait_s)

    def _finish(
        self,
        reason: str = CLOSE_REASON_CLOSE,
        error: str | None = None,
        deadline: float | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Ask the sender for its final flush now (never blocks: it may run inside GC).

        The last send is retried until `deadline` (monotonic; default: the exit budget from
        now); a later call may move the deadline, and turn the reason into `error`."""
        if not self._stop.is_set() or reason == CLOSE_REASON_ERROR:
            self._close_reason, self._close_error = reason, error
            self._close_extra = dict(extra or {})
        if self._closed_ts is None:  # before a loader built next in this process reports
            self._closed_ts = time.time()
        self._final_by = time.monotonic() + EXIT_BUDGET_S if deadline is None else deadline
        self._stop.set()
        self._settled.set()  # a held client's last batch goes to the id it has
        self._wake.set()

    def __enter__(self) -> TelemetryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _base(self, kind: str, ts: float) -> dict[str, Any]:
        ev = {"run_id": self.run_id, "kind": kind, "ts": ts, "incarnation": self.incarnation}
        if self.attempt is not None:
            ev["attempt"] = self.attempt
        return {**ev, **self.static}

    def _number(self, events: list[dict[str, Any]]) -> None:
        """Give each event not yet numbered the next `seq` (the collector ignores a number
        it has stored already: a retried batch that did arrive changes nothing)."""
        for ev in events:
            if "seq" not in ev:
                ev["run_id"] = self.run_id  # queued while held: the settled id
                ev["seq"] = self._seq
                self._seq += 1

    def _offer(self, ev: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait(ev)
        except queue.Full:
            self.dropped += 1

    def _progress(self) -> dict[str, Any]:
        """Fold the counters since the last tick into one `progress` event."""
        now = time.monotonic()
        totals = (self._rows, self._batches, self._wait_s)
        rows, batches = totals[0] - self._seen[0], totals[1] - self._seen[1]
        wait_s = max(0.0, totals[2] - self._seen[2])
        self._seen = totals
        interval = max(now - self._last_tick, 1e-6)
        self._last_tick = now
        ts = time.time()
        if self._closed_ts is not None:  # the last report: at the close, not after it
            ts = min(ts, self._closed_ts)
        ev = self._base(PROGRESS, ts)
        ev.update(rows=rows, batches=batches, wait_s=wait_s, interval_s=interval)
        ev["rows_per_s"] = rows / interval
        snapshot = self._snapshot() if self._snapshot is not None else None
        if snapshot is None and self._snapshot is not None:
            self._stop.set()  # the loader is gone: this is the last send
            self._position = self._final_position()
        elif snapshot is not None:
            try:
                self._position = progress_fields(snapshot(), self.static.get("num_splits"))
            except Exception:  # a snapshot racing the loader must not kill the thread
                logger.debug("telemetry snapshot failed", exc_info=True)
        ev.update(self._position)  # a collected loader's last position, not none (and skips)
        return ev

    def _final_position(self) -> dict[str, Any]:
        """The position where the loader ended (`where`), else the last one read."""
        try:
            final = self._where() if self._where is not None else None
        except Exception:  # a dataset torn down with its loader: the last position read
            logger.debug("telemetry final position failed", exc_info=True)
            final = None
        if final is None:
            return self._position
        return progress_fields(final, self.static.get("num_splits"))

    def _drain(self) -> list[dict[str, Any]]:
        events = [self._progress()]
        with contextlib.suppress(queue.Empty):
            while True:
                events.append(self._queue.get_nowait())
        return events

    def _closing(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The last batch: `events` and a `closed` event at the final progress's position."""
        closed = self._base(CLOSED, self._closed_ts or time.time())
        where = ("epoch", "step", "global_step")
        closed.update({k: events[0][k] for k in where if k in events[0]})
        closed["data"] = {"reason": self._close_reason, **self._close_extra}
        if self._close_error is not None:
            closed["data"]["error"] = self._close_error
        return [*events, closed]

    def _run(self) -> None:
        try:
            self._settled.wait()
            while True:
                self._wake.wait(self.interval_s)
                self._wake.clear()
                if self._stop.is_set():
                    break
                self._send(self._drain())
            self._send_last(self._drain())
            self._where = None  # the dataset it holds may go
        except Exception:  # e.g. `-W error` turning the warning into an exception
            logger.exception("telemetry sender stopped; this rank's later events are dropped")

    def _send_last(self, events: list[dict[str, Any]]) -> None:
        """The final batch, ending with `closed`: retried (0.05 s doubling to 0.4 s apart)
        until it is through or `_final_by` passes. A lost `closed` turns a finished rank
        into a crashed one, so it is worth the exit budget; each try's timeout is cut to
        the time left."""
        pause = 0.05
        closed_seq = None
        while True:
            batch = self._closing(events)  # the reason may have changed since the last try
            if closed_seq is not None:
                batch[-1]["seq"] = closed_seq  # the same `closed`: a repeat if it arrived
            self._number(batch)
            closed_seq = batch[-1]["seq"]
            left = self._final_by - time.monotonic()
            if self._send(batch, final=True, timeout_s=max(0.05, min(self.timeout_s, left))):
                return
            if self._final_by - time.monotonic() <= pause or not self._transport.transient:
                self.dropped += len(batch)  # counted once, when the last try fails
                return
            time.sleep(pause)
            pause = min(2 * pause, 0.4)

    def _send(
        self, events: list[dict[str, Any]], final: bool = False, timeout_s: float | None = None
    ) -> bool:
        """POST `events` (numbered first); a regular send is skipped, its events dropped,
        while the transport backs off. A failed final send's events are counted by its caller."""
        if not final and self._transport.backing_off():
            self.dropped += len(events)
            return False
        self._number(events)
        if events and events[0]["kind"] == PROGRESS:
            events[0]["sent_ts"] = time.time()  # the collector reads this rank's clock from it
        try:
            self._transport.post(events, self.timeout_s if timeout_s is None else timeout_s)
        except (OSError, http.client.HTTPException, ValueError, TypeError) as exc:
            self.dropped += 0 if final else len(events)
            self._transport.failed(exc)
            return False
        self.sent += len(events)
        self._transport.succeeded()
        return True
