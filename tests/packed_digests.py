"""Digests of every packed batch and state of a few generated runs, to compare a change of
the packed read path with what main handed out (tests/fixtures/packed-main-digests.json).

Record them with main's loader first on the path:

    git archive main loader | tar -x -C /tmp/packed-base
    PYTHONPATH=/tmp/packed-base .venv/bin/python tests/packed_digests.py > tests/fixtures/packed-main-digests.json

Each run is a seeded table of documents of 0-300 tokens; a digest hashes each batch's
fields in order (name, dtype, shape, bytes) and the state after the run (less the table's
path and version id, which name a temporary directory).
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import lancedb
import numpy as np
import pyarrow as pa
import torch

from loader import MixedDataset, StreamingDataLoader, StreamingDataset

EOS, PAD = -1, -2


def table(seed: int, docs: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 300, docs)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
    return pa.table({"tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))})


def digest(batches: Iterable[dict[str, Any]], state: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for batch in batches:
        for name, value in batch.items():
            h.update(name.encode())
            if isinstance(value, torch.Tensor):
                h.update(f"{value.dtype}{tuple(value.shape)}".encode())
                h.update(value.contiguous().numpy().tobytes())
            else:
                h.update(repr(value).encode())
    h.update(json.dumps(_scrub(state), sort_keys=True, default=str).encode())
    return h.hexdigest()


def _scrub(value: Any) -> Any:
    """The state without where a LanceDB table lies (a temporary directory each run)."""
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items() if k not in ("uri", "version_id")}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value


def loader(source: Any, rank: int, world: int, **kw: Any) -> StreamingDataLoader:
    fixed = {
        "global_batch_size": kw.pop("global_batch_size", 6),
        "num_workers": kw.pop("num_workers", 0),
    }
    ds = StreamingDataset(
        source, columns=["tokens"], rank=rank, world_size=world, eos_id=EOS, **kw
    )  # fmt: skip
    return StreamingDataLoader(ds, **fixed)


def run(loaders: list[StreamingDataLoader], steps: int | None = None) -> str:
    """Each rank's first `steps` batches (all if None) and its state, one digest."""
    out = []
    for each in loaders:
        batches = []
        for step, batch in enumerate(each):
            batches.append(batch)
            if steps is not None and step + 1 == steps:
                break
        out.append(digest(batches, each.state_dict()))
    return digest([], {"ranks": out})


def resumed(source: Any, kw: dict[str, Any], world: int, new_world: int, steps: int) -> str:
    """W ranks read `steps` batches and save; W' ranks resume and read the rest."""
    first = [loader(source, r, world, **kw) for r in range(world)]
    before = run(first, steps)
    second = [loader(source, r, new_world, **kw) for r in range(new_world)]
    for each in second:
        each.load_state_dict(first[0].state_dict())
    return digest([], {"before": before, "after": run(second)})


def mixture(narrow: bool) -> str:
    kw: dict[str, Any] = {"pack_fields": ["input_ids", "cu_seqlens"], "pack_dtype": "int32"}
    parts = [
        StreamingDataset(
            table(seed, docs), columns=["tokens"], num_splits=2, rank=0, world_size=1,
            eos_id=EOS, pack_sequences=37, shuffle_seed=seed, **(kw if narrow else {}),
        )
        for seed, docs in ((5, 90), (6, 60))
    ]  # fmt: skip
    return run([StreamingDataLoader(MixedDataset(parts, [1, 2]), global_batch_size=6)])


def cases(workers: bool) -> dict[str, Callable[[], str]]:
    """The runs by name; `workers`: also the one with DataLoader workers (processes)."""
    plain = table(1, 200)
    base: dict[str, Any] = {"num_splits": 3, "pack_sequences": 64, "shuffle_seed": 3}
    out: dict[str, Callable[[], str]] = {
        "w2_epoch1": lambda: run([loader(plain, r, 2, epoch=1, **base) for r in range(2)]),
        "clump1_seq7_batch3": lambda: run(
            [
                loader(
                    plain,
                    0,
                    1,
                    **{**base, "pack_sequences": 7, "global_batch_size": 3},
                    shuffle_clump_size=1,
                )
            ]
        ),
        "no_shuffle_long_seq": lambda: run(
            [loader(plain, 0, 1, **{**base, "pack_sequences": 1000}, shuffle=False)]
        ),
        "padded": lambda: run(
            [loader(plain, r, 2, **base, pad_id=PAD, blocks_per_epoch=600) for r in range(2)]
        ),
        "narrow": lambda: run(
            [
                loader(
                    plain, 0, 1, **base, pack_fields=["input_ids", "cu_seqlens"], pack_dtype="int32"
                )
            ]
        ),
        "resume_w2_to_w3": lambda: resumed(plain, base, 2, 3, 11),
        "resume_w3_to_w1_padded": lambda: resumed(
            plain, {**base, "pad_id": PAD, "blocks_per_epoch": 600}, 3, 1, 40
        ),
        "mixture": lambda: mixture(False),
        "mixture_narrow": lambda: mixture(True),
    }
    if workers:
        out["workers_lance"] = lambda: with_workers(plain, base)
    return out


def with_workers(source: pa.Table, kw: dict[str, Any]) -> str:
    """A LanceDB table read by 2 DataLoader workers, W = 2, resumed on W = 1."""
    with tempfile.TemporaryDirectory() as tmp:
        lance = lancedb.connect(str(Path(tmp) / "db")).create_table("docs", source)
        return resumed(lance, {**kw, "num_workers": 2}, 2, 1, 7)


if __name__ == "__main__":
    import loader as package

    print(f"recording with {package.__file__}", file=sys.stderr)
    json.dump({name: make() for name, make in cases(True).items()}, sys.stdout, indent=1)
    print()
