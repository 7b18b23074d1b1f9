"""Online reweighting: `set_weights(weights, at_step=t)` on a running mixture.

New weights begin a phase at global step t (`loader.mixture.weights`): from t on the new
phase's counts hold exactly, and every phase after t is replaced. Every rank must call it
with the same arguments: every process that builds the mixture's datasets (data-parallel
ranks and, on a mesh, their replicas: all hold the loader; on a pipeline only the stages in
`read_on`; an eval mixture built on one rank alone, nobody else) gathers a digest of
(weights, t) and of whether each could apply it, and all raise when they differ (within
the agreement timeout, never a silent divergence). A t that this rank has already read
ahead of (tasks handed to workers or to the read-ahead threads) is refused on every rank:
redoing a read-ahead would need the workers' queues drained, and a step read with the old
weights would make this rank's step t differ from a rank that had not read it yet.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from loader import args
from loader.mixture.weights import Phase, Weights, with_phase

OK, TOO_LATE = 0, 1


def digest(weights: Weights, at_step: int) -> int:
    """A signed 63-bit digest of (shares, at_step): what the ranks compare."""
    text = f"{at_step}:{weights.text()}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") >> 1


def set_weights(mixture: Any, weights: Sequence[Any], at_step: int) -> None:  # a MixedDataset
    """Give `mixture` `weights` from global step `at_step` on (see the module docstring)."""
    shares = Weights.of(weights, len(mixture.names))
    step = args.step("at_step", at_step, 0)
    plan = mixture.mix_plan
    phases = with_phase(plan.phases, Phase(step, shares), replace_later=True)
    progress = mixture.progress
    reached = progress.read_ahead_to()
    unchanged = phases == plan.phases  # called again (e.g. after a resume): nothing to do
    verdict = OK if unchanged or step >= reached else TOO_LATE
    peers = mixture.peers
    mine = [digest(shares, step), verdict]
    said = [mine] if peers is None else peers.gather(mine, "set_weights")
    if peers is not None and len({d for d, _ in said}) > 1:
        differ = [peers.describe(r) for r, (d, _) in enumerate(said) if d != said[0][0]]
        raise ValueError(
            f"set_weights: {', '.join(differ)} were given other weights or at_step than "
            f"{peers.describe(0)} (this process: {shares.text()} at step {step}); every "
            "process must call it with the same arguments"
        )
    late = [
        peers.describe(r) if peers is not None else "this process"
        for r, (_, v) in enumerate(said)
        if v == TOO_LATE
    ]
    if late and step < progress.global_step:  # handed out already (a skip may jump past it)
        raise ValueError(
            f"set_weights(at_step={step}) is behind the position (global_step="
            f"{progress.global_step}): a past phase never changes; give an at_step at or "
            f"after {progress.global_step}"
        )
    if late:
        raise ValueError(
            f"set_weights(at_step={step}): {', '.join(late)} already read global steps up to "
            f"{reached - 1} ahead (this rank's global step: {progress.global_step}); give an "
            f"at_step at or after the steps read ahead (at least {reached} here), or call "
            "set_weights before the loader reads that far (fewer workers, prefetch_factor or "
            "reads_in_flight read less far ahead)"
        )
    if not unchanged:
        mixture.mix_plan = replace(plan, phases=phases)
        progress.replan(mixture.mix_plan)
