"""A loader for torchtitan's trainer, which takes any DCP `Stateful` that iterates.

torchtitan's trainer builds one iterator over its dataloader and calls `next` on it for
every step, for as long as training runs; its checkpointer saves and loads the dataloader
with DCP under the key "dataloader". Its own loader keeps a state per data-parallel rank
and refuses another DP degree. This one keeps the loader's single state (per split, the
same on every process), so a job saved on one mesh resumes on another DP size; it is
endless (epoch after epoch), and it drops each epoch's short last step so every batch has
the same shape (compiled and pipelined models want that).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from loader.dataloader import StreamingDataLoader

STATE_KEY = "elastic_loader"  # the loader's state inside the dataloader's DCP entry


def titan_inputs(batch: Any) -> tuple[dict[str, Any], Any]:
    """A packed-tokens batch as torchtitan's trainer takes it: ({"input": input_ids}, labels),
    with the packing's other fields beside the input (position_ids, cu_seqlens, ...)."""
    if not isinstance(batch, dict) or "input_ids" not in batch or "labels" not in batch:
        raise ValueError(
            "titan_inputs expects a packed-tokens batch with input_ids and labels "
            "(StreamingDataset(pack_sequences=...)); pass to_inputs=<your function> otherwise"
        )
    extra = {k: v for k, v in batch.items() if k not in ("input_ids", "labels")}
    return {"input": batch["input_ids"], **extra}, batch["labels"]


class TitanDataLoader:
    """torchtitan's dataloader protocol over a StreamingDataset (or MixedDataset) on a mesh.

    Args:
        dataset: the dataset, built with `mesh=` (or rank/world_size) as usual.
        global_batch_size: G, rows of one step over all data-parallel ranks.
        to_inputs: turns a batch into what the trainer's step takes (default: the batch
            itself; `titan_inputs` for packed tokens: `({"input": ...}, labels)`).
        **loader_args: passed to StreamingDataLoader (num_workers, ...); drop_last is
            always True here.
    """

    def __init__(
        self,
        dataset: Any,
        global_batch_size: int,
        to_inputs: Callable[[Any], Any] | None = None,
        **loader_args: Any,
    ) -> None:
        if loader_args.pop("drop_last", True) is not True:
            raise ValueError(
                "TitanDataLoader always drops each epoch's short last step (drop_last=True): "
                "torchtitan's steps take batches of one shape"
            )
        self.loader = StreamingDataLoader(
            dataset, global_batch_size=global_batch_size, drop_last=True, **loader_args
        )
        self.to_inputs = to_inputs

    def __iter__(self) -> Iterator[Any]:
        """Batches for ever, epoch after epoch."""
        empty_passes = 0  # one may be the end of an epoch a state was saved at
        while empty_passes < 2:
            empty_passes += 1
            for batch in self.loader:
                empty_passes = 0
                yield batch if self.to_inputs is None else self.to_inputs(batch)
        raise ValueError(
            "an epoch of this dataset has no full step at "
            f"global_batch_size={self.loader.global_batch_size}: it cannot run for ever"
        )

    def state_dict(self) -> dict[str, Any]:
        """The loader's one state (the same on every process: DCP keeps one copy)."""
        return {STATE_KEY: self.loader.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if STATE_KEY not in state_dict:
            raise ValueError(
                f"this dataloader state has no {STATE_KEY!r} entry (keys "
                f"{sorted(state_dict)}): it was not saved by a TitanDataLoader"
            )
        self.loader.load_state_dict(state_dict[STATE_KEY])

    def close(self) -> None:
        self.loader.close()
