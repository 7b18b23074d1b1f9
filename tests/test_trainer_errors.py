"""Issue 34, the errors of the trainers' glue, in one process: no error names an internal
class, and `StreamingTrainer` refuses what would resume from the wrong place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loader import StreamingDataLoader, StreamingDataset
from tests.tables import make_rows

TRAINER = {"report_to": "none", "use_cpu": True, "disable_tqdm": True, "save_strategy": "steps"}


def loader(global_batch: int) -> StreamingDataLoader:
    ds = StreamingDataset(make_rows(0, 96), columns=["id"], num_splits=4, shuffle_seed=1)
    return StreamingDataLoader(ds, global_batch_size=global_batch)


def test_a_loader_rebuilt_from_its_parts_is_told_what_to_do() -> None:
    """Lightning's use_distributed_sampler=True rebuilt the loader from `dl.dataset` and the
    error named `BatchReads`, a class the user never saw."""
    dl = loader(8)
    with pytest.raises(TypeError) as err:
        StreamingDataLoader(dl.dataset)
    assert "use_distributed_sampler=False" in str(err.value)
    with pytest.raises(TypeError) as length:
        len(dl.dataset)
    assert "len(loader)" in str(length.value)
    for message in (str(err.value), str(length.value)):
        assert "BatchReads" not in message and "BatchTask" not in message, message


def trainer(tmp_path: Path, dl: Any = None, **args: Any) -> Any:
    from transformers import TrainingArguments

    from loader.trainers.hf import StreamingTrainer
    from tests.tiny_hf import tiny_model

    settings = TrainingArguments(str(tmp_path), **{**TRAINER, **args})
    return StreamingTrainer(model=tiny_model(1), args=settings, train_dataloader=dl)


def test_streaming_trainer_refuses_a_resume_that_would_misplace_the_loader(tmp_path: Path) -> None:
    """Trainer counts epochs from its step and len(loader); in the second epoch another G
    would put Trainer's epoch 2 where the loader is in epoch 1, batch 6: refused."""
    trainer(tmp_path, loader(8), num_train_epochs=2, save_steps=6).train()  # 12 steps an epoch
    other_batch = trainer(tmp_path, loader(16), num_train_epochs=2, save_steps=6)
    with pytest.raises(ValueError, match="global batch size and gradient_accumulation_steps"):
        other_batch.train(resume_from_checkpoint=str(tmp_path / "checkpoint-18"))
    (tmp_path / "checkpoint-24" / "elastic_loader_state.json").unlink()  # as Trainer writes it
    with pytest.raises(FileNotFoundError, match=r"elastic_loader_state\.json"):
        trainer(tmp_path, loader(8), save_steps=6).train(resume_from_checkpoint=True)
    resumed = trainer(tmp_path, loader(8), num_train_epochs=2, save_steps=6)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-18"))
    assert (resumed.state.global_step, resumed.state.epoch) == (24, 2.0)


def test_streaming_trainer_arguments(tmp_path: Path) -> None:
    from transformers import TrainingArguments

    from loader.trainers.hf import StreamingTrainer
    from tests.tiny_hf import tiny_model

    args = TrainingArguments(str(tmp_path), **TRAINER)
    with pytest.raises(TypeError, match=r"train_dataloader=StreamingDataLoader"):
        StreamingTrainer(model=tiny_model(1), args=args, train_dataset=[{"id": 1}])
    with pytest.raises(ValueError, match="ignore_data_skip"):
        trainer(tmp_path, loader(8), ignore_data_skip=True)
