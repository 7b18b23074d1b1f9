"""Shared pieces of the benchmarks: paths, the table's shape, timing and peak memory.

Every reader in ``readers.py`` runs in a fresh process (``run.py`` starts one per
measurement), so a process's peak RSS (``resource.getrusage``) is the peak of that one
loader; its DataLoader workers' peaks are read from /proc (VmHWM) while they run.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
OUT = HERE / "out"
LANCEDB_URI = DATA / "lancedb"
TABLE = "rows"
LITDATA_DIR = DATA / "litdata"
MDS_DIR = DATA / "mds"
DIM = 128  # x is float32[DIM]: with id and label, 528 bytes a row
COLUMNS = ("id", "x", "label")


@dataclasses.dataclass(frozen=True)
class Case:
    """One measurement: which loader reads how, on which rank of how many.

    Attributes:
        loader: name in ``readers.READERS``.
        clump: shuffle clump size C (1 = every row on its own).
        batch_size: rows per batch on one rank.
        num_workers: DataLoader worker processes (0 = in the main process).
        rank: this process's rank.
        world_size: ranks reading at once (2 = two processes joined by Gloo).
        num_splits: S of our plan (peers have their own partitioning).
        max_rows: stop after this many rows on this rank (the epoch may be longer).
        max_seconds: or after this long, whichever comes first.
        resume_at: for the resume readers, where in the epoch the checkpoint is taken.
        reads_in_flight: ours' knob (None: its default); raw S3 readers use the same count.
        delay_ms: S3 readers: delay the proxy adds to every request.
    """

    loader: str
    clump: int = 1024
    batch_size: int = 1024
    num_workers: int = 0
    rank: int = 0
    world_size: int = 1
    num_splits: int = 48  # ours only; issue #2's S (supports W = 1, 2, 3, 4, 6, 8, ...)
    max_rows: int = 1 << 20
    max_seconds: float = 4.0
    resume_at: float = 0.9
    reads_in_flight: int | None = None  # ours: None is the loader's default
    delay_ms: float = 0.0  # object-store readers: injected delay per request


@dataclasses.dataclass
class Result:
    """What one process measured; ``run.py`` merges ranks and repetitions."""

    rows: int
    seconds: float  # steady state: from the first batch of the last worker to start
    first_batch_s: float  # from building the loader to the first batch
    peak_rss_mib: float  # this process
    worker_peak_rss_mib: float  # largest DataLoader worker (any descendant), 0 if none
    first_batch_at: float  # time.time() at the first batch: run.py's process-start latency
    extra: dict = dataclasses.field(default_factory=dict)  # reader-specific figures

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def num_rows() -> int:
    """Rows of the benchmark table (read from the LanceDB table on disk)."""
    import lance

    return lance.dataset(str(LANCEDB_URI / f"{TABLE}.lance")).count_rows()


def lance_path() -> str:
    """The Lance dataset under the LanceDB table, for raw reads and lance.torch."""
    return str(LANCEDB_URI / f"{TABLE}.lance")


def clump_positions(n: int, clump: int, seed: int) -> np.ndarray:
    """A clump-shuffled order of ``range(n)``: clumps of ``clump`` rows, permuted.

    Only for readers that have no plan of their own (raw reads before ours is
    importable); once ``loader.plan`` exists, ``readers.positions`` uses ours instead.
    """
    starts = np.arange(0, n, clump, dtype=np.int64)
    starts = np.random.default_rng(seed).permutation(starts)
    lengths = np.minimum(clump, n - starts)
    offsets = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.repeat(starts, lengths) + offsets


def rank_slice(positions: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s contiguous share of an epoch order (the same rows ours gives it)."""
    per = len(positions) // world_size
    return positions[rank * per : (rank + 1) * per]


def _peak_mib(who: int) -> float:
    return resource.getrusage(who).ru_maxrss / 1024.0  # Linux reports KiB


def _descendant_peak_mib() -> float:
    """Largest VmHWM (peak RSS) among live descendants: DataLoader workers, forkserver's too.

    Read while the workers are alive: forkserver/spawn workers are not our children, so
    ``RUSAGE_CHILDREN`` would miss them.
    """
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    family, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - family
        family |= frontier
    peak = 0.0
    for pid in family:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]) / 1024.0)
        except OSError:
            continue
    return peak


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def drain(make: Callable[[], Iterable], count: Callable[[Any], int], case: Case) -> Result:
    """Build a loader and pull batches until ``case.max_rows`` or ``case.max_seconds``.

    Args:
        make: builds the loader (imports already done); timed up to the first batch.
        count: a batch's row count.
        case: the limits.

    Returns:
        Rows and seconds of the steady state (after the first batch), the time from
        ``make()`` to the first batch, and peak RSS of this process and of its workers.
    """
    _barrier()  # ranks of a 2-rank case start their clocks together
    started = time.perf_counter()
    it = iter(make())
    count(next(it))
    first = time.perf_counter()
    first_at = time.time()
    for _ in range(case.num_workers - 1):  # the steady state starts once every worker is up
        count(next(it))
    steady = now = time.perf_counter()
    deadline = steady + case.max_seconds
    rows = 0
    for batch in it:
        rows += count(batch)
        now = time.perf_counter()
        if rows >= case.max_rows or now >= deadline:
            break
    workers = _descendant_peak_mib()
    del it
    return Result(
        rows=rows,
        seconds=now - steady,
        first_batch_s=first - started,
        peak_rss_mib=_peak_mib(resource.RUSAGE_SELF),
        worker_peak_rss_mib=max(workers, _peak_mib(resource.RUSAGE_CHILDREN)),
        first_batch_at=first_at,
    )


def median(values: Iterable[float]) -> float:
    vals = list(values)
    return float(np.median(vals)) if vals else float("nan")


def env_threads() -> dict[str, str]:
    """Environment for measured processes: Numba's workqueue layer (fork-safe)."""
    env = dict(os.environ)
    env.setdefault("NUMBA_THREADING_LAYER", "workqueue")
    # the repository root first: this checkout's `loader` (and tests' S3 helpers) win
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), str(HERE / "stubs"), str(HERE)])
    return env
