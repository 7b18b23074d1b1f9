"""`elastic-loader plan` and the dashboard's Planner: what a layout supports, before a GPU is booked.

One answer for both, `loader.layout.fit_reason` (what the loader accepts): with a global
batch G that is a multiple of S every W <= G fits (per-rank batches G // W or one more);
otherwise W must divide S and, when G is given, G too. Layout arithmetic only
(`loader.layout`, standard library), so the Streamlit
page uses it without importing torch or Numba. The work is bounded whatever the sizes:
world sizes come from divisors found up to sqrt(S), the table lists at most `LISTED`
of them, and the placement shows the first ranks of each.
"""

from __future__ import annotations

from dataclasses import dataclass

from loader import args
from loader.layout import (
    Piece,
    fit_reason,
    is_whole,
    rank_batch_sizes,
    rank_pieces,
    supported_world_sizes,
    uses_steps,
)

MAX_NUM_SPLITS = 2**40  # divisors up to sqrt(S) = 2**20: a fraction of a second
MAX_ROWS = 2**63 - 1  # row positions are int64
LISTED = 64  # world sizes in the table when none are asked for
PLACED = 8  # ranks whose splits the table shows


@dataclass(frozen=True)
class WorldFit:
    """How one world size fits the layout."""

    world_size: int
    supported: bool
    reason: str  # why it does not fit; "" when it does
    splits_per_rank: int | None  # most splits a rank reads from (whole or in part)
    batch_size: int | None  # per rank, for the global batch asked for (the larger one)
    batches_per_epoch: int | None
    placement: list[list[Piece]]  # what the first `PLACED` ranks read of each step
    smallest_batch: int | None = None  # per rank, where G % W != 0 (else = batch_size)
    shared_splits: bool = False  # some split is read by two ranks

    @property
    def unequal(self) -> bool:
        """Per-rank batches differ by one row: weight the loss (`loss_scale`)."""
        return self.smallest_batch is not None and self.smallest_batch != self.batch_size


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
    drop_last: bool
    fits: list[WorldFit]
    unlisted: int  # supported world sizes left out of `fits` (none asked for, over LISTED)


def check_layout(
    rows: int, num_splits: int, world_sizes: list[int] | None, global_batch: int | None
) -> None:
    """ValueError naming the argument, its value and the accepted range, for absurd input."""
    bounds = [
        ("rows", rows, 1, MAX_ROWS),
        ("num_splits", num_splits, 1, min(MAX_NUM_SPLITS, max(rows, 1))),
        *(("world size", w, 1, MAX_ROWS) for w in world_sizes or []),
    ]
    if global_batch is not None:
        bounds.append(("global_batch", global_batch, 1, MAX_ROWS))
    for name, value, low, high in bounds:
        if not args.is_integer(value) or not low <= value <= high:
            why = " (every split needs a row)" if name == "num_splits" and value > rows else ""
            raise ValueError(f"{name} must be an integer in [{low}, {high:,}]{why}, got {value!r}")


def plan_report(
    rows: int,
    num_splits: int,
    world_sizes: list[int] | None = None,
    global_batch: int | None = None,
    drop_last: bool = False,
) -> PlanReport:
    """Everything `elastic-loader plan` prints, as data (the dashboard's Planner draws it)."""
    check_layout(rows, num_splits, world_sizes, global_batch)
    per_split = rows // num_splits
    kept = num_splits * per_split
    batches = None
    if global_batch is not None:
        batches = kept // global_batch if drop_last else -(-kept // global_batch)
    supported = supported_world_sizes(num_splits)
    asked = supported[:LISTED] if world_sizes is None else world_sizes
    return PlanReport(
        rows=rows,
        num_splits=num_splits,
        rows_per_split=per_split,
        rows_dropped=rows - kept,
        supported_world_sizes=supported,
        global_batch=global_batch,
        identical_global_batches=None if global_batch is None else global_batch % num_splits == 0,
        batches_per_epoch=batches,
        drop_last=drop_last,
        fits=[_fit(w, num_splits, global_batch, kept, drop_last) for w in asked],
        unlisted=len(supported) - len(asked) if world_sizes is None else 0,
    )


def _fit(
    world: int, num_splits: int, global_batch: int | None, kept: int, drop_last: bool
) -> WorldFit:
    """Batches per epoch are S*L/G on every W, except a last short step with fewer rows
    than ranks, which is dropped (and counted)."""
    reason = fit_reason(num_splits, world, global_batch)
    if reason:
        return WorldFit(world, False, reason, None, None, None, [])
    placement = [rank_pieces(r, world, num_splits, global_batch) for r in range(min(world, PLACED))]
    touched = [sum(len(piece.splits) for piece in p) for p in placement]
    widest = max(touched) if uses_steps(num_splits, global_batch) else None
    if global_batch is None:
        return WorldFit(world, True, "", num_splits // world, None, None, placement)
    full, tail = divmod(kept, global_batch)
    batches = full + (tail > 0 and not drop_last and tail >= world)
    small, large = rank_batch_sizes(world, global_batch)
    shared = uses_steps(num_splits, global_batch) and any(
        not is_whole(piece, num_splits, global_batch) for pieces in placement for piece in pieces
    )
    splits = widest if widest is not None else num_splits // world
    return WorldFit(world, True, "", splits, large, batches, placement, small, shared)


def _pieces_text(pieces: list[Piece], num_splits: int, global_batch: int | None) -> str:
    """Whole splits as [a,b), a shared one as s[lo:hi of G/S]: its rows of each step."""
    per_split = 1
    if global_batch is not None and uses_steps(num_splits, global_batch):
        per_split = global_batch // num_splits
    return "+".join(
        f"[{p.split},{p.split_stop})"
        if is_whole(p, num_splits, global_batch)
        else f"{p.split}[{p.start}:{p.stop} of {per_split}]"
        for p in pieces
    )


def placement_text(fit: WorldFit, report: PlanReport) -> str:
    """What the first ranks read, e.g. `r0:[0,2)+2[0:20 of 30] r1:2[20:30 of 30]+...`; the
    reason for a world size that does not fit."""
    if not fit.supported:
        return fit.reason
    num_splits, global_batch = report.num_splits, report.global_batch
    shown = [
        f"r{i}:{_pieces_text(p, num_splits, global_batch)}" for i, p in enumerate(fit.placement)
    ]
    more = fit.world_size - len(fit.placement)
    return " ".join(shown) + (f" … ({more:,} more)" if more else "")


def batch_text(fit: WorldFit) -> str:
    """Rows per rank in a full step: `b`, or `a-b` where per-rank batches differ by one."""
    if fit.batch_size is None:
        return "-"
    return f"{fit.smallest_batch}-{fit.batch_size}" if fit.unequal else str(fit.batch_size)


LOSS_SCALE_NOTE = (
    "batch/rank a-b: per-rank batches differ by one row; for the exact gradient of "
    "the global batch multiply each rank's summed loss by dl.loss_scale (= W / rows "
    "of the global step) before backward"
)


def _shown(sizes: list[int], limit: int = LISTED) -> str:
    text = ", ".join(map(str, sizes[:limit]))
    return text + (f", … ({len(sizes) - limit:,} more)" if len(sizes) > limit else "")


def format_report(report: PlanReport, num_workers: int = 0) -> str:
    lines = [
        f"rows N = {report.rows:,}, num_splits S = {report.num_splits}",
        f"rows per split L = N // S = {report.rows_per_split:,}; rows dropped per epoch: "
        f"{report.rows_dropped} (the last ones of each epoch's shuffled order)",
        f"world sizes S supports: {_shown(report.supported_world_sizes)}",
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
            f"global batch G = {report.global_batch}: identical global batches on every world "
            f"size: {verdict}; {report.batches_per_epoch} global batches per epoch"
        )
    lines.append("")
    lines.append(
        f"{'W':>5}  {'fits':<4}  {'splits/rank':>11}  {'batch/rank':>10}  W*w procs  placement"
    )
    for fit in report.fits:
        batch = batch_text(fit)
        per = "-" if fit.splits_per_rank is None else str(fit.splits_per_rank)
        procs = fit.world_size * max(1, num_workers)
        where = placement_text(fit, report)
        verdict = "yes" if fit.supported else "no"
        lines.append(
            f"{fit.world_size:>5}  {verdict:<4}  {per:>11}  {batch:>10}  {procs:>9}  {where}"
        )
    if report.unlisted:
        lines.append(f"… and {report.unlisted:,} more world sizes (ask with --world-sizes)")
    if report.identical_global_batches:
        lines.append(
            f"with G = {report.global_batch} (a multiple of S) every W <= G fits: a rank reads "
            f"whole splits plus parts of the two at its edges (s[a:b of G/S]: rows a..b-1 of "
            f"that split's G/S in each step)"
        )
    if any(f.unequal for f in report.fits):
        lines.append(LOSS_SCALE_NOTE)
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
    return 1 if world_sizes and not all(f.supported for f in report.fits) else 0
