"""Resume a Lightning run mid-epoch from the exact next batch, on a pinned table version.

Lightning (2.1+) saves the state of a train loader that has `state_dict` and
`load_state_dict` inside its own `.ckpt`, and restores it on `trainer.fit(ckpt_path=...)`.
This example also writes the same state as a crash-safe elastic-loader file beside each
Lightning checkpoint (`LoaderFile`), which `elastic-loader inspect` reads and a job on any
world size the layout allows (any W <= G with a G that is a multiple of num_splits) can resume from.

It runs a job that stops after `--stop-at` steps, appends rows to the table as a writer
would, resumes from the last checkpoint and checks that the two runs together trained on
every row of the pinned version exactly once::

    python examples/lightning_resume.py --work-dir /tmp/lightning-demo

Lightning is not a dependency of elastic-loader: install it next to the CPU torch with
`pip install -c <(echo torch==2.13.0) lightning` (see checkpoints/README.md).
Use `Trainer(use_distributed_sampler=False)`: the loader already gives each rank its rows.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lancedb
import lightning as L
import numpy as np
import pyarrow as pa
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from loader import StreamingDataLoader, StreamingDataset, checkpoint

ROWS, NUM_SPLITS, BATCH = 4096, 8, 64


class Regressor(L.LightningModule):
    """y = x @ w: small enough to train in seconds; records which rows it trained on."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)
        self.seen: list[int] = []

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.seen.extend(batch["id"].tolist())
        x = torch.stack([batch[f"x{i}"] for i in range(4)], dim=1).float()
        pred = self.linear(x).squeeze(-1)
        return torch.nn.functional.mse_loss(pred, batch["y"].float())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class LoaderFile(Callback):
    """Mirrors the loader state of each Lightning checkpoint into a crash-safe JSON file."""

    def __init__(self, loader: StreamingDataLoader, folder: Path) -> None:
        self.loader, self.folder = loader, folder

    def on_save_checkpoint(self, trainer: L.Trainer, module: Any, ckpt: dict[str, Any]) -> None:
        # Lightning does not prefetch from a loader that has a length, so this state is
        # exactly "every batch so far was trained on".
        path = self.folder / f"loader-step{trainer.global_step:06d}.json"
        checkpoint.save(self.loader.state_dict(), path)


def make_table(folder: Path) -> Any:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 4)).astype(np.float32)
    y = x @ np.array([1.0, -2.0, 0.5, 3.0], dtype=np.float32)
    columns = {"id": np.arange(ROWS), **{f"x{i}": x[:, i] for i in range(4)}, "y": y}
    db = lancedb.connect(folder / "db")
    return db.create_table("points", pa.table(columns), mode="overwrite")


def append_rows(table: Any, count: int) -> None:
    zeros = np.zeros(count, dtype=np.float32)
    ids = np.arange(ROWS, ROWS + count)
    table.add(pa.table({"id": ids, **{f"x{i}": zeros for i in range(4)}, "y": zeros}))


def make_loader(folder: Path) -> StreamingDataLoader:
    table = lancedb.connect(folder / "db").open_table("points")
    ds = StreamingDataset(table, num_splits=NUM_SPLITS, shuffle_seed=7, shuffle_clump_size=16)
    # len() counts the whole epoch and state["step"] the batches into it, across a resume,
    # which is how Lightning counts an epoch when it restores its own progress.
    return StreamingDataLoader(ds, batch_size=BATCH)


def run(work_dir: Path, stop_at: int, every: int) -> bool:
    """First run stops at `stop_at`; second resumes from the last checkpoint. True if exact."""
    work_dir.mkdir(parents=True, exist_ok=True)
    table = make_table(work_dir)
    pinned = table.version
    trainer_kw: dict[str, Any] = {
        "accelerator": "cpu", "devices": 1, "max_epochs": 1, "logger": False,
        "enable_progress_bar": False, "enable_model_summary": False,
        "use_distributed_sampler": False,  # the loader already splits the data per rank
    }  # fmt: skip

    first_loader, first = make_loader(work_dir), Regressor()
    saver = {"dirpath": work_dir / "ckpt", "every_n_train_steps": every, "save_top_k": -1}
    callbacks = [ModelCheckpoint(**saver), LoaderFile(first_loader, work_dir / "loader")]
    L.Trainer(max_steps=stop_at, callbacks=callbacks, **trainer_kw).fit(first, first_loader)
    last = max((work_dir / "ckpt").glob("*.ckpt"), key=lambda p: p.stat().st_mtime_ns)
    loops = torch.load(last, weights_only=False)["loops"]["fit_loop"]["state_dict"]
    trained_before = first.seen[: loops["combined_loader"][0]["step"] * BATCH]

    append_rows(table, 100)  # a writer lands; the resumed run must not see these rows
    second_loader, second = make_loader(work_dir), Regressor()
    callbacks = [ModelCheckpoint(**saver), LoaderFile(second_loader, work_dir / "loader")]
    L.Trainer(callbacks=callbacks, **trainer_kw).fit(second, second_loader, ckpt_path=last)

    exact = sorted(trained_before + second.seen) == list(range(ROWS))
    summary = {
        "pinned_version": pinned,
        "resumed_version": second_loader.streaming_dataset.source.spec.version,
        "checkpoint": str(last),
        "rows_before": len(trained_before),
        "rows_after": len(second.seen),
        "every_row_once": exact,
    }
    print(json.dumps(summary, indent=2))
    return exact


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=Path("checkpoints/lightning-demo"))
    parser.add_argument("--stop-at", type=int, default=37, help="steps of the first run")
    parser.add_argument("--every", type=int, default=10, help="checkpoint every k steps")
    args = parser.parse_args(argv)
    return 0 if run(args.work_dir, args.stop_at, args.every) else 1


if __name__ == "__main__":
    raise SystemExit(main())
