"""The processes of tests/test_trainers.py, one torchrun job per world size: Hugging Face's
Trainer and Lightning Fabric (the 3-process resume runs both: imports are the slow part).

Phase "hf", 2 processes: the plain `Trainer(train_dataset=StreamingDataset)` under both
Accelerate dispatch settings and `accelerator.prepare(DataLoader(dataset))` (each must be
refused on every process), then `StreamingTrainer` checkpointing every HF_SAVE_EVERY Trainer
steps, SIGKILLed at HF_KILL_AT (the steps after the last checkpoint are trained and lost).
Phase "fabric", 2 processes: Fabric saving at FABRIC_SAVE_AT, SIGKILLed at FABRIC_KILL_AT.
Phase "resume", 3 processes: both resume from their latest checkpoint and finish EPOCHS
epochs. Every process appends each batch it trains on to its own JSON-lines file as it goes
(a killed process keeps what it wrote).

    torchrun --nproc-per-node W tests/trainers_job.py JOB_JSON PHASE
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import orjson
import torch

from loader import StreamingDataLoader, StreamingDataset

NUM_ROWS, NUM_SPLITS, GLOBAL_BATCH, EPOCHS = 480, 6, 24, 2  # 20 loader steps an epoch
ACCUMULATION = 2  # HF: 10 Trainer steps an epoch
HF_SAVE_EVERY, HF_KILL_AT = 4, 14  # the latest checkpoint is Trainer step 12: epoch 1, batch 4
FABRIC_SAVE_AT, FABRIC_KILL_AT = 26, 30  # loader steps (epoch 1, batch 6 saved)


def dataset(job: dict[str, Any]) -> StreamingDataset:
    return StreamingDataset(job["uri"], columns=["id"], num_splits=NUM_SPLITS, shuffle_seed=3)


class Recorder:
    """This process's trained batches as JSON lines, written as they happen."""

    def __init__(self, job: dict[str, Any], name: str) -> None:
        rank, world = os.environ["RANK"], os.environ["WORLD_SIZE"]
        self.file = open(Path(job["out"], f"{name}-w{world}-rank{rank}.jsonl"), "ab")  # noqa: SIM115

    def write(self, **record: Any) -> None:
        self.file.write(orjson.dumps(record) + b"\n")
        self.file.flush()


# -- Hugging Face ---------------------------------------------------------------------


def hf(job: dict[str, Any], resume: bool) -> None:
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    from transformers import Trainer, TrainerCallback
    from transformers import TrainingArguments as Args

    from loader.trainers.hf import StreamingTrainer
    from tests.tiny_hf import tiny_model

    recorder = Recorder(job, "hf")

    class Recording(StreamingTrainer):
        def training_step(self, model: Any, inputs: Any, *more: Any, **kw: Any) -> Any:
            recorder.write(step=self.state.global_step, ids=inputs["id"].tolist())
            return super().training_step(model, inputs, *more, **kw)

    class KillAt(TrainerCallback):  # the crash: steps past the latest checkpoint are lost
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            if state.global_step == HF_KILL_AT and state.is_world_process_zero:
                os.kill(os.getpid(), signal.SIGKILL)  # torchrun then ends the other

    common = {"report_to": "none", "use_cpu": True, "disable_tqdm": True, "logging_steps": 1000}
    model = tiny_model(width=1)
    if not resume:  # the silent loss of issue 34, under both dispatch settings
        for dispatch in (None, False):
            args = Args(
                output_dir=str(Path(job["out"], "plain")), max_steps=2,
                per_device_train_batch_size=GLOBAL_BATCH // 2, save_strategy="no",
                accelerator_config={"dispatch_batches": dispatch}, **common,
            )  # fmt: skip
            try:
                Trainer(model=model, args=args, train_dataset=dataset(job)).train()
                recorder.write(plain=dispatch, refused=None)
            except ValueError as err:
                recorder.write(plain=dispatch, refused=str(err))
        try:  # and Accelerate's own prepare around a plain DataLoader
            next(iter(Accelerator(cpu=True).prepare(DataLoader(dataset(job), batch_size=4))))
            recorder.write(plain="prepare", refused=None)
        except ValueError as err:
            recorder.write(plain="prepare", refused=str(err))
    args = Args(
        output_dir=job["hf"], num_train_epochs=EPOCHS, learning_rate=1e-3,
        per_device_train_batch_size=GLOBAL_BATCH // 2,  # a resume keeps G, not this
        gradient_accumulation_steps=ACCUMULATION, save_strategy="steps",
        save_steps=HF_SAVE_EVERY, **common,
    )  # fmt: skip
    trainer = Recording(
        model=model, args=args, train_dataset=dataset(job), callbacks=[] if resume else [KillAt()]
    )
    trainer.train(resume_from_checkpoint=resume or None)
    recorder.write(end_step=trainer.state.global_step, end_epoch=trainer.state.epoch)


# -- Lightning Fabric -----------------------------------------------------------------


def fabric(job: dict[str, Any], resume: bool) -> None:
    import lightning as L

    world = int(os.environ["WORLD_SIZE"])
    fab = L.Fabric(accelerator="cpu", devices=world, strategy="ddp")
    fab.launch()
    model = torch.nn.Linear(1, 1)
    model, optimizer = fab.setup(model, torch.optim.SGD(model.parameters(), lr=1e-3))
    loader = StreamingDataLoader(dataset(job), global_batch_size=GLOBAL_BATCH)
    dl = fab.setup_dataloaders(loader)  # the defaults: use_distributed_sampler=True
    state = {"model": model, "optimizer": optimizer, "loader": dl}
    if resume:
        fab.load(job["fabric"], state)
    recorder = Recorder(job, "fabric")
    recorder.write(len=len(dl), resumed_at=loader.global_step)
    for _ in range(loader.state_dict()["epoch"], EPOCHS):
        for batch in dl:
            recorder.write(step=loader.global_step - 1, ids=batch["id"].tolist())
            loss = model(batch["id"].to(torch.float32)[:, None] / NUM_ROWS).pow(2).mean()
            fab.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if loader.global_step == FABRIC_SAVE_AT and not resume:
                fab.save(job["fabric"], state)
            if loader.global_step == FABRIC_KILL_AT and not resume and fab.global_rank == 0:
                os.kill(os.getpid(), signal.SIGKILL)  # torchrun then ends the others


if __name__ == "__main__":
    job, phase = orjson.loads(Path(sys.argv[1]).read_bytes()), sys.argv[2]
    if phase in ("hf", "resume"):
        hf(job, resume=phase == "resume")
    if phase in ("fabric", "resume"):
        fabric(job, resume=phase == "resume")
