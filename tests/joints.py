"""Generated jobs for tests/test_joints.py: one seeded sample of the product of the loader's
features (rows or packed blocks, one dataset or a mixture with fixed weights, a schedule or
a set_weights call, a fixed G or a batch ramp, skip_steps, W and W', workers, telemetry),
the loaders of one job on W ranks in one process, and ranks driven step by step."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest

from loader import MixedDataset, StreamingDataLoader, StreamingDataset

BASE = 1000  # row i of dataset k has id k * BASE + i (its table position plus k * BASE)
TOKEN = 1_000_000  # token j of document d of dataset k is k * TOKEN + d * 1000 + j + 1
EOS = 0


@dataclass(frozen=True)
class Job:
    """One combination: the sources (rows or documents, S each), weights and their phases,
    G (and a ramp), a range to skip, W before and W' after a resume at step `crash`."""

    kind: str  # "rows" or "packed"
    sources: tuple[tuple[int, int], ...]  # (rows or documents, num_splits) per dataset
    g: int
    world: int
    world2: int
    crash: int
    workers: int = 0
    workers2: int = 0  # after the resume
    clump: int = 1  # shuffle_clump_size of every dataset
    seq_len: int = 4
    weights: tuple[int, ...] | None = None  # None: one dataset, no mixture
    schedule: tuple[tuple[int, tuple[int, ...]], ...] = ()
    call: tuple[int, tuple[int, ...], int] | None = None  # set_weights at step, weights, at_step
    ramp: tuple[tuple[int, int], ...] = ()  # batch_schedule
    skip: tuple[int, int] | None = None
    redeclare: bool = False  # the resumed mixture declares its weights again (else None)
    again: bool = False  # the resumed run registers the skipped range again (a no-op)
    telemetry: bool = False
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def mixture(self) -> bool:
        return self.weights is not None

    @property
    def call_refused(self) -> bool:
        """Whether the skipped range jumps past the call's at_step (refused: behind). The
        global_step seen before each batch is 0, 1, ..., start, then stop + 1, ...: the
        batch after `start` is step `stop`."""
        if not (self.call and self.skip):
            return False
        start, stop = self.skip
        made = self.call[0] if self.call[0] <= start else max(self.call[0], stop + 1)
        return self.call[2] < made

    def name(self) -> str:
        mix = "single" if not self.mixture else f"mix{len(self.sources)}"
        mix += "-schedule" if self.schedule else ""
        mix += "-set_weights" if self.call else ""
        parts = [self.kind, mix, f"G{self.g}" + ("-ramp" if self.ramp else "")]
        parts += [f"skip{self.skip[0]}-{self.skip[1]}" if self.skip else "noskip"]
        parts += [f"W{self.world}to{self.world2}at{self.crash}", f"w{self.workers}{self.workers2}"]
        parts += [f"C{self.clump}"] + (["again"] if self.again else [])
        return "-".join(parts + (["telemetry"] if self.telemetry else []))


def _weights(rng: random.Random, count: int) -> tuple[int, ...]:
    out = [rng.randint(0, 4) for _ in range(count)]
    out[rng.randrange(count)] = rng.randint(1, 4)  # never all zero
    return tuple(out)


def sample_jobs(seed: int, count: int, *, workers: int = 0, telemetry: bool = False) -> list[Job]:
    """`count` jobs drawn from the product {rows, packed} x {one dataset, a mixture of 2 or 3
    with fixed weights, a schedule or a set_weights call} x {fixed G, a ramp (one dataset)}
    x {skip or not} x W, W' in 1..4 (G not always a multiple of W), the crash anywhere:
    every one of the 20 cells of the product's first four factors in turn, the rest drawn."""
    rng = random.Random(seed)
    cells = [
        (kind, data, ramp, skip)
        for kind, data, ramp, skip in itertools.product(
            ["rows", "packed"], ["single", "mix", "mix-schedule", "mix-set_weights"],
            [False, True], [False, True],
        )
        if not (ramp and data != "single")  # a mixture's ramp: tests/test_batch_schedule.py
    ]  # fmt: skip
    rng.shuffle(cells)
    out = []
    for i in range(count):
        kind, data, ramp, skip = cells[i % len(cells)]
        out.append(_job(rng, kind, data, ramp, skip, workers, telemetry))
    return out


def _job(
    rng: random.Random, kind: str, data: str, ramp: bool, skip: bool, workers: int, tel: bool
) -> Job:
    count = 1 if data == "single" else rng.randint(2, 3)
    low, high = (30, 70) if kind == "rows" else (14, 30)
    sources = tuple((rng.randint(low, high), rng.randint(1, 3)) for _ in range(count))
    splits = sources[0][1]
    # one dataset: G a multiple of S (step t the same on every W); a mixture takes any G
    g = splits * rng.randint(1, 3) if data == "single" else rng.randint(2, 12)
    ramp_steps: tuple[tuple[int, int], ...] = ()
    if ramp:
        ramp_steps = ((rng.randint(1, 4), g + splits * rng.randint(1, 2)),)
    world, world2 = rng.randint(1, min(g, 4)), rng.randint(1, min(g, 4))
    schedule: tuple[tuple[int, tuple[int, ...]], ...] = ()
    call = None
    weights = _weights(rng, count) if data != "single" else None
    if data == "mix-schedule":
        schedule = ((rng.randint(1, 6), _weights(rng, count)),)
    if data == "mix-set_weights":
        at = rng.randint(1, 8)
        # workers read ahead: a call once reading began may name a step read already,
        # refused by design (docs/mixtures.md), so with workers it comes before reading
        call = (0 if workers else rng.randint(0, at - 1), _weights(rng, count), at)
    jumped = None
    if skip:
        start = rng.randint(1, 9)
        jumped = (start, start + rng.randint(1, 3))
    return Job(
        kind, sources, g, world, world2, rng.randint(1, 9), workers,
        seq_len=rng.choice([3, 4, 6]), weights=weights, schedule=schedule, call=call,
        ramp=ramp_steps, skip=jumped, redeclare=call is None and rng.random() < 0.5,
        telemetry=tel, workers2=rng.choice([0, workers]), clump=rng.choice([1, 1, 3]),
        again=jumped is not None and rng.random() < 0.5,
    )  # fmt: skip


def rows_table(k: int, rows: int) -> pa.Table:
    return pa.table({"id": [k * BASE + i for i in range(rows)]})


def docs_table(k: int, docs: int) -> pa.Table:
    """Documents of 1-9 tokens; every token says its dataset, document and place."""
    rng = random.Random(k * 7919 + docs)
    texts = [[k * TOKEN + d * 1000 + j + 1 for j in range(rng.randint(1, 9))] for d in range(docs)]
    return pa.table({"tokens": pa.array(texts, pa.list_(pa.int64()))})


def tables(job: Job) -> list[pa.Table]:
    make = rows_table if job.kind == "rows" else docs_table
    return [make(k, n) for k, (n, _) in enumerate(job.sources)]


def part(job: Job, table: pa.Table, k: int, rank: int = 0, world: int = 1) -> StreamingDataset:
    """Dataset k of `job` (the only one, or one of its mixture) on rank `rank` of `world`."""
    kw: dict[str, Any] = {"rank": rank, "world_size": world}
    if job.kind == "packed":
        kw |= {"columns": ["tokens"], "pack_sequences": job.seq_len, "eos_id": EOS}
    splits = job.sources[k][1]
    return StreamingDataset(
        table, num_splits=splits, shuffle_seed=k + 1, shuffle_clump_size=job.clump, **kw
    )


def dataset(job: Job, tabs: list[pa.Table], rank: int, world: int, resumed: bool) -> Any:
    """Rank `rank`'s dataset of `job` on `world` ranks (a resumed mixture declares its
    weights again only when `job.redeclare`; else it adopts the state's phases)."""
    parts = [part(job, table, k, rank, world) for k, table in enumerate(tabs)]
    if not job.mixture:
        return parts[0]
    if resumed and not job.redeclare:
        return MixedDataset(parts, None)
    schedule = [(at, list(w)) for at, w in job.schedule]
    return MixedDataset(parts, list(job.weights or ()), schedule=schedule or None)


def loaders(
    job: Job, tabs: list[pa.Table], world: int, *, workers: int = 0, resumed: bool = False,
    telemetry: str | None = None, run_id: str | None = None, skip: bool = True,
) -> list[StreamingDataLoader]:  # fmt: skip
    """The W ranks' loaders of `job` (drop_last: an epoch's last short step is dropped on
    every W alike); `skip`: the job's range registered (not at a resume: the state keeps
    it)."""
    kw: dict[str, Any] = {"drop_last": True, "num_workers": workers}
    if job.ramp:
        kw["batch_schedule"] = [list(p) for p in job.ramp]
    if job.call:  # set_weights may not name a step already read ahead
        kw |= {"reads_in_flight": 0, "read_size": 1}  # one batch a read
    if telemetry:
        kw |= {"telemetry": telemetry, "run_id": run_id or job.name()[:100]}
    out = []
    for rank in range(world):
        dl = StreamingDataLoader(
            dataset(job, tabs, rank, world, resumed), global_batch_size=job.g, **kw
        )
        if skip and job.skip and not resumed:
            dl.skip_steps(*job.skip)
        out.append(dl)
    return out


Steps = dict[int, list[Any]]  # global step -> each rank's batch


def drive(
    job: Job, dls: list[StreamingDataLoader], until: int, called: list[bool],
    epochs: dict[int, int] | None = None,
) -> Steps:  # fmt: skip
    """Step the ranks together (a new `for` as an epoch ends) until their global_step
    reaches `until`; the set_weights call made by every rank once global_step reaches its
    step (`called` says whether a run made it already, across a resume). `epochs` gets
    each step's epoch."""
    running = [iter(dl) for dl in dls]
    out: Steps = {}
    while dls[0].global_step < until:
        if job.call and not called[0] and dls[0].global_step >= job.call[0]:
            if job.call[2] < dls[0].global_step:  # a skip jumped past at_step: refused
                with pytest.raises(ValueError, match=r"is behind the position"):
                    dls[0].set_weights(list(job.call[1]), at_step=job.call[2])
            else:
                for dl in dls:
                    dl.set_weights(list(job.call[1]), at_step=job.call[2])
            called[0] = True
        got = []
        for rank, dl in enumerate(dls):
            batch = next(running[rank], None)
            for _ in range(3):  # a skip may take a whole epoch's steps
                if batch is not None:
                    break
                running[rank] = iter(dl)
                batch = next(running[rank], None)
            assert batch is not None, f"rank {rank} yielded nothing at {dl.global_step}"
            got.append(batch)
        steps = {dl.global_step for dl in dls}
        assert len(steps) == 1, f"ranks at different global steps: {steps}"
        out[steps.pop() - 1] = got
        if epochs is not None:
            epochs[dls[0].global_step - 1] = dls[0].progress.epoch
    for it in running:
        it.close()  # type: ignore[attr-defined]  # generators: stops workers, threads
    return out


def units(batch: dict[str, Any]) -> list[Any]:
    """A batch's rows (ids) or blocks (tuples of tokens), in order."""
    if "input_ids" in batch:
        return [tuple(b) for b in batch["input_ids"].tolist()]
    return batch["id"].tolist()


def merged(steps: Steps) -> dict[int, list[Any]]:
    """Each global step's units, all ranks together, sorted: what is the same on every W."""
    return {t: sorted(u for b in got for u in units(b)) for t, got in steps.items()}
