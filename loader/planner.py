"""`elastic-loader plan`: what a (rows, num_splits) layout supports, before a GPU is booked.

The same arithmetic backs the loader's errors (`check_world_size`), so what the planner
says fits is exactly what the loader accepts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loader.layout import owned_splits, supported_world_sizes
from loader.plan import PlanSpec


@dataclass(frozen=True)
class WorldFit:
    """How one world size fits the layout."""

    world_size: int
    supported: bool
    splits_per_rank: int | None
    batch_size: int | None  # per rank, for the global batch asked for
    placement: list[range] = field(default_factory=list)


@dataclass(frozen=True)
class PlanReport:
    rows: int
    num_splits: int
    rows_per_split: int
    rows_dropped: int
    supported_world_sizes: list[int]
    global_batch: int | None
    identical_global_batches: bool | None
    batches_per_epoch: int | None
    fits: list[WorldFit]


def plan_report(
    rows: int,
    num_splits: int,
    world_sizes: list[int] | None = None,
    global_batch: int | None = None,
) -> PlanReport:
    """Everything `elastic-loader plan` prints, as data (the dashboard's planner uses it too)."""
    spec = PlanSpec(rows, num_splits, shuffle=False)
    supported = supported_world_sizes(num_splits)
    fits = []
    for world in world_sizes or supported:
        ok = world >= 1 and num_splits % world == 0
        batch = global_batch // world if ok and global_batch and global_batch % world == 0 else None
        placement = [owned_splits(r, world, num_splits) for r in range(world)] if ok else []
        fits.append(WorldFit(world, ok, num_splits // world if ok else None, batch, placement))
    identical = None if global_batch is None else global_batch % num_splits == 0
    kept = num_splits * spec.rows_per_split
    batches = None if global_batch is None else -(-kept // global_batch)
    return PlanReport(
        rows,
        num_splits,
        spec.rows_per_split,
        spec.rows_dropped,
        supported,
        global_batch,
        identical,
        batches,
        fits,
    )


def _ranges(placement: list[range], limit: int = 8) -> str:
    shown = [f"r{i}:[{p.start},{p.stop})" for i, p in enumerate(placement[:limit])]
    return " ".join(shown) + (
        f" … ({len(placement) - limit} more)" if len(placement) > limit else ""
    )


def format_report(report: PlanReport, num_workers: int = 0) -> str:
    lines = [
        f"rows N = {report.rows:,}, num_splits S = {report.num_splits}",
        f"rows per split L = N // S = {report.rows_per_split:,}; rows dropped per epoch: {report.rows_dropped} "
        f"(the last ones of each epoch's shuffled order)",
        f"world sizes S supports: {', '.join(map(str, report.supported_world_sizes))}",
        f"workers: num_workers={num_workers} per rank works with every supported world size "
        f"(workers change nothing in what a rank yields)",
    ]
    if report.global_batch is not None:
        verdict = (
            "yes"
            if report.identical_global_batches
            else f"no: make G a multiple of S={report.num_splits}"
        )
        lines.append(
            f"global batch G = {report.global_batch}: identical global batches on every world size: {verdict}; "
            f"{report.batches_per_epoch} global batches per epoch"
        )
    lines.append("")
    lines.append(
        f"{'W':>5}  {'fits':<4}  {'splits/rank':>11}  {'batch/rank':>10}  W*w procs  placement"
    )
    for fit in report.fits:
        batch = "-" if fit.batch_size is None else str(fit.batch_size)
        per = "-" if fit.splits_per_rank is None else str(fit.splits_per_rank)
        procs = fit.world_size * max(1, num_workers)
        where = (
            _ranges(fit.placement)
            if fit.supported
            else f"S % W = {report.num_splits % fit.world_size}"
        )
        lines.append(
            f"{fit.world_size:>5}  {'yes' if fit.supported else 'no':<4}  {per:>11}  {batch:>10}  {procs:>9}  {where}"
        )
    return "\n".join(lines)


def print_plan(
    rows: int,
    num_splits: int,
    world_sizes: list[int] | None = None,
    num_workers: int = 0,
    global_batch: int | None = None,
) -> int:
    """Print the report; exit status 1 when an asked-for world size does not fit."""
    report = plan_report(rows, num_splits, world_sizes, global_batch)
    print(format_report(report, num_workers))
    return 0 if all(f.supported for f in report.fits) else 1
