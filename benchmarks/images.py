"""Issue #21's images-as-bytes figures: the same JPEG bytes read and decoded in DataLoader
workers by ours, lance.torch and LitData, decoded images/s.

    PYTHONPATH=.:benchmarks benchmarks/.venv/bin/python benchmarks/images.py [--images 4000]

- The images: `--images` JPEGs of 96x96 RGB (quality 90, a smooth random field plus noise,
  ~6 KB each), made with Pillow, seeded. One LanceDB table (`image` binary, `label` int64)
  that ours and lance.torch read, and the same bytes in LitData's `optimize` format.
- The decode, the same function for all: Pillow `Image.open(...).convert("RGB")` to a
  (3, 96, 96) uint8 tensor. Ours: `StreamingDataset(table, transform=decode_row)` (a per-row
  transform, run in the workers) + `StreamingDataLoader(batch_size=64, num_workers=w)`.
  lance.torch: `LanceDataset(batch_size=64, sampler=ShardedBatchSampler(randomize=True),
  to_tensor_fn=decode_batch)`, one shard a worker. LitData: `StreamingDataset(shuffle=True,
  transform=decode_item)` + its `StreamingDataLoader(batch_size=64, num_workers=w)`.
- Each measurement a fresh process; images/s over the whole second epoch of one loader
  (workers persistent, started in the first); ours reads 4 batches a task (`read_size=256`:
  the default 8192 rows would make an epoch of 8000 images one task for one worker).
  Repetitions go round every loader; ratios are taken within a repetition.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "images"
SIDE, BATCH, SEED = 96, 64, 7
READ_SIZE = 4 * BATCH  # ours: rows a task (the default, 8192, would be one task an epoch here)


def jpeg(i: int) -> bytes:
    """Image i: a smooth random field plus noise, as JPEG bytes (deterministic)."""
    from PIL import Image

    rng = np.random.default_rng([SEED, i])
    coarse = rng.integers(0, 256, (6, 6, 3)).astype(np.uint8)
    field = np.asarray(Image.fromarray(coarse).resize((SIDE, SIDE), Image.BILINEAR), np.int16)
    noisy = np.clip(field + rng.integers(-12, 13, field.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(noisy).save(out, format="JPEG", quality=90)
    return out.getvalue()


def _litdata_item(i: int) -> dict[str, Any]:
    return {"image": jpeg(i), "label": i % 10}


def build(images: int) -> None:
    import lancedb
    import pyarrow as pa

    stamp = DATA / "built.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("images") == images:
        return
    DATA.mkdir(parents=True, exist_ok=True)
    data = [jpeg(i) for i in range(images)]
    table = pa.table({"image": pa.array(data, pa.binary()), "label": np.arange(images) % 10})
    lancedb.connect(str(DATA / "lancedb")).create_table("images", table, mode="overwrite")
    from litdata import optimize

    optimize(
        fn=_litdata_item, inputs=list(range(images)), output_dir=str(DATA / "litdata"),
        chunk_bytes="16MB", num_workers=1, mode="overwrite",
    )  # fmt: skip
    mean = sum(map(len, data)) / images
    stamp.write_text(json.dumps({"images": images, "mean_bytes": mean}))


def decode(data: bytes) -> Any:
    from PIL import Image

    image = Image.open(io.BytesIO(data)).convert("RGB")
    return torch.from_numpy(np.array(image)).permute(2, 0, 1)


def decode_row(row: dict[str, Any]) -> dict[str, Any]:
    return {"image": decode(row["image"]), "label": row["label"]}


def decode_item(item: dict[str, Any]) -> dict[str, Any]:
    return {"image": decode(item["image"]), "label": item["label"]}


def decode_batch(batch: Any, **_: Any) -> dict[str, Any]:
    images = [decode(b) for b in batch.column("image").to_pylist()]
    return {"image": torch.stack(images), "label": torch.from_numpy(batch["label"].to_numpy())}


class LanceTorchShard(torch.utils.data.IterableDataset):
    """lance.torch for one worker: its own shard of the batches (as readers.py does)."""

    def __iter__(self) -> Any:
        from lance.sampler import ShardedBatchSampler
        from lance.torch.data import LanceDataset

        info = torch.utils.data.get_worker_info()
        workers = info.num_workers if info else 1
        sampler = ShardedBatchSampler(info.id if info else 0, workers, randomize=True, seed=SEED)
        path = str(DATA / "lancedb" / "images.lance")
        ds = LanceDataset(
            path, batch_size=BATCH, columns=["image", "label"], sampler=sampler,
            to_tensor_fn=decode_batch, auto_detect_rank=False,
        )  # fmt: skip
        yield from ds


def loader(name: str, workers: int) -> Any:
    persist = {"persistent_workers": workers > 0}
    if name == "ours":
        import lancedb

        from loader import StreamingDataLoader, StreamingDataset

        table = lancedb.connect(str(DATA / "lancedb")).open_table("images")
        ds = StreamingDataset(
            table, columns=["image", "label"], num_splits=4, shuffle_seed=SEED,
            shuffle_clump_size=64, rank=0, world_size=1, transform=decode_row,
        )  # fmt: skip
        return StreamingDataLoader(
            ds, batch_size=BATCH, num_workers=workers, read_size=READ_SIZE, **persist
        )
    if name == "lance_torch":
        shards = LanceTorchShard()
        return torch.utils.data.DataLoader(shards, batch_size=None, num_workers=workers, **persist)
    from litdata import StreamingDataLoader, StreamingDataset

    ds = StreamingDataset(str(DATA / "litdata"), shuffle=True, seed=SEED, transform=decode_item)
    return StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers, **persist)


def measure(name: str, workers: int) -> float:
    """Decoded images/s over a whole second epoch (workers persistent: started in the first,
    so neither start-up nor work done ahead of a clock start is in the figure)."""
    dl = loader(name, workers)
    first = next(iter(dl))
    assert first["image"].shape[1:] == (3, SIDE, SIDE), first["image"].shape
    for _ in dl:  # the rest of the first epoch
        pass
    done, start = 0, time.perf_counter()
    for batch in dl:
        done += len(batch["image"])
    return done / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--images", type=int, default=8000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--workers", default="0,2")
    p.add_argument("--one", nargs=2, metavar=("LOADER", "WORKERS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:  # by module name, so workers pickle `images.decode_row`, not `__main__.`
        import images

        print(json.dumps({"images_per_s": images.measure(args.one[0], int(args.one[1]))}))
        return
    build(args.images)
    names = ("ours", "lance_torch", "litdata")
    rates: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.reps):
        for workers in (int(w) for w in args.workers.split(",")):
            for name in names:
                cmd = [sys.executable, __file__, "--one", name, str(workers)]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                rate = json.loads(out.strip().splitlines()[-1])["images_per_s"]
                rates.setdefault((name, workers), []).append(rate)
                print(f"  {name:12s} w={workers} {rate:10,.0f} images/s", flush=True)
    mean = json.loads((DATA / "built.json").read_text())["mean_bytes"]
    print(
        f"\n{args.images} JPEGs of {SIDE}x{SIDE}, {mean:,.0f} B on average; medians of {args.reps}"
    )
    print("\n| w | ours images/s | ours ÷ lance.torch | ours ÷ LitData |\n|---|---|---|---|")
    for workers in sorted({w for _, w in rates}):
        ours = rates[("ours", workers)]
        ratio = {
            peer: statistics.median(
                a / b for a, b in zip(ours, rates[(peer, workers)], strict=True)
            )
            for peer in names[1:]
        }
        print(
            f"| {workers} | {statistics.median(ours):,.0f} | {ratio['lance_torch']:.2f} | "
            f"{ratio['litdata']:.2f} |"
        )
    print("\n| loader | w | images/s (median) |\n|---|---|---|")
    for (name, workers), values in sorted(rates.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"| {name} | {workers} | {statistics.median(values):,.0f} |")


if __name__ == "__main__":
    main()
