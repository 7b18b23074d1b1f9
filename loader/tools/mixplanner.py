"""`elastic-loader plan --mixture`: what a mixture's global steps hold, before a GPU is booked.

From each dataset's rows, splits and weight and the global batch G: the exact shares, how
many rows of each a step holds (the row sequence of `loader.kernels.mix`, so a step holds
floor or ceil of G*w_k, never a random count), how many steps a pass of each takes, and
where the mixture's epoch ends. Every W <= G reads it (the step is one layout of G rows).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from loader.mixture.plan import (
    ALL_PASSES,
    FIRST_PASS,
    MixPlan,
    MixPosition,
    Phase,
    SourceAt,
    Weights,
    longest_pass,
    pass_of,
    rule_source,
)

SAMPLED_STEPS = 4096  # steps over which per-step counts are listed (min and max)


@dataclass(frozen=True)
class MixSpec:
    """One dataset of the mixture as the command line gives it: NAME=ROWS/SPLITS[@WEIGHT]."""

    name: str
    rows: int
    num_splits: int
    weight: str | None  # None: in proportion to the rows of its pass


def parse_spec(text: str) -> MixSpec:
    """'web=1000000/48@0.7' -> MixSpec; argparse turns the ValueError into a usage error."""
    try:
        name, rest = text.split("=", 1)
        sizes, weight = rest.split("@", 1) if "@" in rest else (rest, None)
        rows, splits = (int(v) for v in sizes.split("/", 1))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected NAME=ROWS/SPLITS[@WEIGHT], e.g. web=1000000/48@0.7"
        ) from None
    if rows < splits or splits < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: need ROWS >= SPLITS >= 1")
    return MixSpec(name, rows, splits, weight)


def _weight(text: str) -> float | int:
    return int(text) if text.isdigit() else float(text)


def format_mixture_plan(
    specs: Sequence[MixSpec], global_batch: int, iterate_over_all: bool = False
) -> str:
    """The report `elastic-loader plan --mixture ... --global-batch G` prints."""
    lengths = [s.rows // s.num_splits for s in specs]
    given = [
        s.num_splits * length if s.weight is None else _weight(s.weight)
        for s, length in zip(specs, lengths, strict=True)
    ]
    weights = Weights.of(given, len(specs), "--mixture weights")
    rows = [s.num_splits * length for s, length in zip(specs, lengths, strict=True)]
    rule = ALL_PASSES if iterate_over_all else pass_of(longest_pass(rows, weights))
    plan = MixPlan(
        (Phase(0, weights),),
        tuple(s.num_splits for s in specs),
        lambda k, e: lengths[k],
        None,
        rule,
    )
    start = MixPosition.start([SourceAt(0, (0,) * s.num_splits) for s in specs])
    sampled = min(SAMPLED_STEPS, weights.period // math.gcd(weights.period, global_batch))
    low, high = [global_batch] * len(specs), [0] * len(specs)
    counts = start.counts
    for _ in range(sampled):
        nxt = weights.counts_after(counts, global_batch)
        for k in range(len(specs)):
            low[k], high[k] = min(low[k], nxt[k] - counts[k]), max(high[k], nxt[k] - counts[k])
        counts = nxt
    epoch = plan.steps_left(start, global_batch)
    source = rule_source(rule)
    ending = "every dataset" if source is None else specs[source].name
    lines = [
        f"mixture of {len(specs)} datasets, global batch G={global_batch:,}: any world size "
        f"W <= {global_batch:,} reads the same global steps",
        f"epoch: {epoch:,} steps (until {ending} completes its pass; epoch_source=NAME or "
        f"steps_per_epoch=N set it instead)",
        f"{'dataset':<12}{'share':>10}{'rows/step':>12}{'steps/pass':>12}{'passes/epoch':>14}"
        f"{'dropped/pass':>14}",
    ]
    for k, (spec, share) in enumerate(zip(specs, weights.fractions(), strict=True)):
        per_pass = spec.num_splits * lengths[k]
        if share:
            alone = MixPlan((Phase(0, weights),), plan.num_splits, plan.units, None, FIRST_PASS)
            steps = alone.steps_to_supply(start, k, per_pass, global_batch)
            steps_text, passes = (
                f"{steps:,}",
                f"{float(epoch * global_batch * share / per_pass):.2f}",
            )
        else:
            steps_text, passes = "never", "0"
        step_rows = f"{low[k]}" if low[k] == high[k] else f"{low[k]}-{high[k]}"
        lines.append(
            f"{spec.name:<12}{share!s:>10}{step_rows:>12}{steps_text:>12}{passes:>14}"
            f"{spec.rows - per_pass:>14,}"
        )
    lines.append(
        f"state: {sum(s.num_splits for s in specs):,} cursors in all (O(total splits)); "
        f"rows/step over the first {sampled:,} steps"
    )
    return "\n".join(lines)


def print_mixture_plan(
    specs: Sequence[MixSpec],
    global_batch: int | None,
    iterate_over_all: bool = False,
    out: TextIO | None = None,
) -> int:
    if global_batch is None:
        raise ValueError("--mixture needs --global-batch G (the rows of one step on all ranks)")
    import sys

    print(format_mixture_plan(specs, global_batch, iterate_over_all), file=out or sys.stdout)
    return 0
