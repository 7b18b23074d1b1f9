"""Hugging Face's Trainer over the loader: its state in every checkpoint, resumed on any W.

Trainer builds a plain DataLoader over `train_dataset` and lets Accelerate shard it (which
would shard a StreamingDataset a second time: `loader.trainers.resharding` refuses that),
and on a resume it fast-forwards by replaying the epoch's first batches through a sampler
(`skip_first_batches`), which our loader has no use for and which would read the rows
again. `StreamingTrainer` trains on a StreamingDataLoader as it is, writes the loader's
state into each `checkpoint-N` folder before Trainer's own files (so a folder with
`trainer_state.json` has it), loads it on `train(resume_from_checkpoint=...)` on any world
size the layout allows, skips Trainer's replay (the loader continues where it was), and
checks that Trainer's step and epoch counters agree with the loader's position.

Trainer's step is an optimizer step: `gradient_accumulation_steps` batches of the loader.
Checkpoints are written after an optimizer step, when every batch handed out was trained
on, so the state is exact with gradient accumulation too.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

from transformers import Trainer
from transformers.trainer_callback import TrainerState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from loader import checkpoint
from loader import state as st
from loader.dataloader import StreamingDataLoader
from loader.dataset import StreamingDataset
from loader.mixture.dataset import MixedDataset

STATE_FILE = "elastic_loader_state.json"  # in each checkpoint-N folder
TRAINER_STATE = "trainer_state.json"  # Trainer's own (its TRAINER_STATE_NAME)


class StreamingTrainer(Trainer):
    """`transformers.Trainer` that trains on a StreamingDataLoader and resumes it exactly.

    Takes Trainer's arguments, plus:
        train_dataloader: a StreamingDataLoader (build it with `global_batch_size=G`: a
            resume on another world size keeps G, so Trainer's steps stay the same rows).
        train_dataset: instead, a StreamingDataset or MixedDataset: the loader is built with
            G = per_device_train_batch_size x W (a resume keeps the saved G) and
            `dataloader_num_workers` workers.

    The loader collates its batches itself: Trainer's `data_collator` applies to evaluation
    only (use the loader's `batch_transform` for training batches). Combine it with another
    Trainer subclass by inheriting from both: `class T(StreamingTrainer, SFTTrainer)`.
    """

    def __init__(
        self, *trainer_args: Any, train_dataloader: StreamingDataLoader | None = None, **kwargs: Any
    ) -> None:
        bound = inspect.signature(Trainer.__init__).bind(self, *trainer_args, **kwargs)
        dataset = bound.arguments.get("train_dataset")
        if train_dataloader is not None:
            if not isinstance(train_dataloader, StreamingDataLoader):
                raise TypeError(
                    f"train_dataloader must be a StreamingDataLoader, got "
                    f"{type(train_dataloader).__name__}"
                )
            if dataset is not None and dataset is not train_dataloader.streaming_dataset:
                raise ValueError("pass train_dataloader= or train_dataset=, not both")
            bound.arguments["train_dataset"] = train_dataloader.streaming_dataset
        elif not isinstance(dataset, StreamingDataset | MixedDataset):
            raise TypeError(
                "StreamingTrainer trains on train_dataloader=StreamingDataLoader(...) or "
                "train_dataset=StreamingDataset(...) (or a MixedDataset); got train_dataset="
                f"{type(dataset).__name__}"
            )
        super().__init__(*bound.args[1:], **bound.kwargs)
        if self.args.ignore_data_skip:
            raise ValueError(
                "ignore_data_skip=True: StreamingTrainer resumes the loader where the "
                "checkpoint was (it never replays batches); leave ignore_data_skip=False"
            )
        self._loader = train_dataloader
        self._resumed: tuple[dict[str, Any], int, Path] | None = None  # state, step, folder

    # -- the loader -------------------------------------------------------------------

    def get_train_dataloader(self) -> Any:
        """The StreamingDataLoader, as it is (Accelerate would shard it again)."""
        if self._loader is None:
            dataset = self.train_dataset
            assert isinstance(dataset, StreamingDataset | MixedDataset)
            global_batch = self.args.per_device_train_batch_size * dataset.world_size
            if self._resumed is not None:
                global_batch = int(self._resumed[0].get(st.KEY_GLOBAL_BATCH, global_batch))
            self._loader = StreamingDataLoader(
                dataset,
                global_batch_size=global_batch,
                num_workers=self.args.dataloader_num_workers,
            )
        if self._resumed is not None:
            state, trainer_step, folder = self._resumed
            self._resumed = None
            self._loader.load_state_dict(state)
            self._check_counters(trainer_step, folder)
        return self._loader

    def get_resumed_dataloader(self, dataloader: Any, num_batches: int) -> Any:
        """The loader itself: its loaded state already starts after those batches."""
        return dataloader

    def _check_counters(self, trainer_step: int, folder: Path) -> None:
        """Trainer counts epochs and batches from its step and the loader's length; they must
        be where the loader is, or Trainer would stop an epoch early or read past it."""
        assert self._loader is not None
        accumulation = self.args.gradient_accumulation_steps
        per_epoch = max(1, -(-len(self._loader) // accumulation))  # Trainer's update steps
        expected = (trainer_step // per_epoch, (trainer_step % per_epoch) * accumulation)
        epoch, _, batches = self._loader.progress.position()
        if (epoch, batches) != expected:
            raise ValueError(
                f"{folder}: Trainer's step {trainer_step} is epoch {expected[0]}, batch "
                f"{expected[1]} of {len(self._loader)}, but the loader's state is epoch "
                f"{epoch}, batch {batches}: resume with the global batch size and "
                f"gradient_accumulation_steps the checkpoint was written with"
            )

    # -- checkpoints ------------------------------------------------------------------

    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
    ) -> Any:
        """Trainer's `train`; a resume loads the loader's state from the checkpoint first."""
        folder = resume_from_checkpoint
        if folder is True:
            folder = get_last_checkpoint(self.args.output_dir)  # None: Trainer says so
        if isinstance(folder, str | os.PathLike):
            self._resumed = _read_resume(Path(folder))
            resume_from_checkpoint = str(folder)
        return super().train(resume_from_checkpoint, trial, ignore_keys_for_eval)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """The loader's state first (atomic, checksummed), then Trainer's files."""
        if self.args.should_save and self._loader is not None:
            name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            path = Path(self._get_output_dir(trial=trial), name, STATE_FILE)
            path.parent.mkdir(parents=True, exist_ok=True)
            checkpoint.save(self._loader.state_dict(), path)
        super()._save_checkpoint(model, trial)


def _read_resume(folder: Path) -> tuple[dict[str, Any], int, Path]:
    """(the loader's state, Trainer's step, the folder) of a checkpoint folder."""
    if not (folder / STATE_FILE).is_file():
        raise FileNotFoundError(
            f"{folder} has no {STATE_FILE}: it was not written by StreamingTrainer, so "
            f"where the loader was is unknown (resume from a checkpoint StreamingTrainer saved)"
        )
    trainer_step = TrainerState.load_from_json(str(folder / TRAINER_STATE)).global_step
    return checkpoint.load(folder / STATE_FILE), trainer_step, folder
