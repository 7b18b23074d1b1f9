"""What a docs block takes as given (`<!-- docs-test: with NAME -->`), made small and real.

Each prelude returns the names the block uses: real tables on disk or in memory, and for
the model-shaped names the smallest thing that computes (a linear layer, not a stand-in
that ignores its input). A prelude that opens something closes it in `cleanup`.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tests.tables import lancedb_table, make_rows

VOCAB = 64


@dataclass
class Given:
    names: dict[str, Any]
    cleanup: list[Callable[[], None]] = field(default_factory=list)


def rows(root: Path) -> Given:
    """`table`: a LanceDB table of 600 rows (id, x float32[4], label, name)."""
    return Given({"table": lancedb_table(root)})


def ddp(root: Path) -> Given:
    """`table` and a real one-process Gloo group, so `dist.get_rank()` answers."""
    import torch.distributed as dist

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    given = rows(root)
    given.names["dist"] = dist
    given.cleanup.append(dist.destroy_process_group)
    return given


def images(root: Path) -> Given:
    """`table`: 96 PNG images (8x8 RGB) as bytes, with a label."""
    from PIL import Image

    pictures = []
    for i in range(96):
        buffer = io.BytesIO()
        Image.new("RGB", (8, 8), (i, 2 * i, 255 - i)).save(buffer, format="PNG")
        pictures.append(buffer.getvalue())
    table = pa.table({"image": pa.array(pictures, pa.binary()), "label": np.arange(96) % 10})
    return Given({"table": table})


def _token_table(documents: int, seed: int, longest: int = 40) -> pa.Table:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, longest, documents)
    docs = [rng.integers(0, VOCAB - 1, n).tolist() for n in lengths]
    return pa.table({"tokens": pa.array(docs, pa.list_(pa.int64()))})


def tokens(root: Path) -> Given:
    """`table` of token documents (~4 blocks of 2,048 a split at S = 48); `tokenizer`, `eos`,
    a tiny `model`, `torch` and `F`."""
    import torch
    import torch.nn.functional as F

    class TinyLM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, 8)
            self.position = torch.nn.Embedding(4096, 8)
            self.out = torch.nn.Linear(8, VOCAB)

        def forward(self, ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
            return self.out(self.embed(ids) + self.position(position_ids))

    class Tokenizer:
        eos_token_id = VOCAB - 1

    return Given(
        {
            "table": _token_table(2000, 0, longest=450),
            "tokenizer": Tokenizer(),
            "eos": Tokenizer.eos_token_id,
            "model": TinyLM(),
            "F": F,
            "torch": torch,
        }
    )


def mixture(root: Path) -> Given:
    """Three datasets (`web_ds`, `code_ds`, `math_ds`, and `datasets`: the three) and their
    tables, token documents."""
    from loader import StreamingDataset

    names: dict[str, Any] = {}
    for k, (name, splits) in enumerate([("web", 48), ("code", 16), ("math", 8)]):
        table = _token_table(200, k + 1)
        names[f"{name}_table"] = table
        names[f"{name}_ds"] = StreamingDataset(
            table, columns=["tokens"], num_splits=splits, shuffle_seed=k + 1
        )
    names["datasets"] = [names["web_ds"], names["code_ds"], names["math_ds"]]
    return Given(names)


def ramp(root: Path) -> Given:
    """`ds`: 4,096 rows in S = 32 splits (a batch ramp's every G a multiple of 32)."""
    from loader import StreamingDataset

    return Given({"ds": StreamingDataset(make_rows(0, 4096), num_splits=32, shuffle_seed=5)})


def row_table(root: Path) -> Given:
    """`table`: 64 in-memory rows of tests/tables.make_rows."""
    return Given({"table": make_rows(0, 64)})


def mesh(root: Path) -> Given:
    """A one-process Gloo job and its (dp=1, tp=1) `world_mesh`; `table` of token documents
    (`tokens`), `G` = 48 (a multiple of the blocks' 48 splits)."""
    from torch.distributed.device_mesh import init_device_mesh

    given = ddp(root)
    world_mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    given.names.update(tokens(root).names, world_mesh=world_mesh, mesh=world_mesh, G=48)
    return given


def accelerate(root: Path) -> Given:
    """An Accelerate `accelerator` on the CPU, a linear `model`, its `optimizer`, a loader
    `dl` over 600 rows and a `folder` for its state."""
    import torch
    from accelerate import Accelerator

    from loader import StreamingDataLoader, StreamingDataset

    model = torch.nn.Linear(4, 2)
    ds = StreamingDataset(lancedb_table(root), columns=["x", "label"], num_splits=4)
    return Given(
        {
            "accelerator": Accelerator(cpu=True),
            "model": model,
            "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
            "dl": StreamingDataLoader(ds, batch_size=8),
            "folder": str(root / "accelerate-state"),
        }
    )


def hf(root: Path) -> Given:
    """`table` (600 rows) and `model`: a tiny Hugging Face PreTrainedModel over x and label."""
    from tests.tiny_hf import tiny_model

    return Given({"table": lancedb_table(root), "model": tiny_model(width=5)})


PRELUDES: dict[str, Callable[[Path], Given]] = {
    "rows": rows,
    "ddp": ddp,
    "images": images,
    "tokens": tokens,
    "mixture": mixture,
    "row_table": row_table,
    "ramp": ramp,
    "mesh": mesh,
    "accelerate": accelerate,
    "hf": hf,
}
