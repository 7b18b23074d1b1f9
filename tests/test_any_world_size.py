"""Any world size W <= G (G a multiple of S): the loss weighting and workers.

The layout's properties (every row once, the same global batches on every W, equal step
counts) are hypothesis tests in tests/test_elastic_properties.py and, through real tables,
tests/test_loader_properties.py; real processes in tests/test_main_job.py and
tests/test_multinode.py. Here: `loss_scale` gives exactly the global batch's gradient when
per-rank batches differ by a row, and workers change nothing in the step layout.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from loader import StreamingDataLoader, StreamingDataset
from tests.tables import make_rows

ROWS, SPLITS, GLOBAL = 610, 8, 256  # 76 rows a split: 2 full steps of 32 each, a short one


def ranks(world: int, **kw: Any) -> list[StreamingDataLoader]:
    loaders = []
    for rank in range(world):
        ds = StreamingDataset(
            make_rows(0, ROWS), num_splits=SPLITS, shuffle_seed=4, rank=rank, world_size=world
        )
        loaders.append(StreamingDataLoader(ds, global_batch_size=GLOBAL, **kw))
    return loaders


def gradients(batches: list[list[dict[str, Any]]], scales: list[list[float]]) -> list[torch.Tensor]:
    """What DDP computes step by step: the mean over ranks of each rank's gradient of its
    summed loss times loss_scale (a linear model in float64)."""
    weight = torch.linspace(-1, 1, 4, dtype=torch.float64)
    out = []
    for step in range(len(batches[0])):
        per_rank = []
        for rank, rank_batches in enumerate(batches):
            w = weight.clone().requires_grad_(True)
            x = rank_batches[step]["x"].to(torch.float64)
            loss = ((x @ w - rank_batches[step]["label"].to(torch.float64)) ** 2).sum()
            (loss * scales[rank][step]).backward()
            assert w.grad is not None
            per_rank.append(w.grad)
        out.append(torch.stack(per_rank).mean(dim=0))
    return out


def run(world: int, **kw: Any) -> tuple[list[list[dict[str, Any]]], list[list[float]]]:
    batches, scales = [], []
    for dl in ranks(world, **kw):
        rank_batches, rank_scales = [], []
        for batch in dl:
            rank_batches.append(batch)
            rank_scales.append(dl.loss_scale)
        batches.append(rank_batches)
        scales.append(rank_scales)
    return batches, scales


def test_loss_scale_gives_the_global_batch_gradient_with_unequal_slices() -> None:
    one = gradients(*run(1))
    for world in (3, 5, 7):  # 256 % W != 0: slices of 85/86, 51/52, 36/37 rows
        batches, scales = run(world)
        sizes = {len(b["id"]) for b in batches_of_step(batches, 0)}
        assert max(sizes) - min(sizes) == 1
        assert scales[0][0] == world / GLOBAL and scales[0][-1] == world / (SPLITS * 12)
        got = gradients(batches, scales)
        assert len(got) == len(one) == 3
        for a, b in zip(got, one, strict=True):
            # a few ulps of float64 (the sums run in another order); a wrong scale is ~1 % off
            assert torch.allclose(a, b, rtol=1e-12, atol=0), (world, a, b)


def batches_of_step(batches: list[list[dict[str, Any]]], step: int) -> list[dict[str, Any]]:
    return [rank[step] for rank in batches]


@pytest.mark.slow
def test_workers_change_nothing_in_the_step_layout() -> None:
    plain = [[b["id"].tolist() for b in rank] for rank in run(3)[0]]
    workers = [[b["id"].tolist() for b in rank] for rank in run(3, num_workers=2, read_size=100)[0]]
    assert workers == plain
