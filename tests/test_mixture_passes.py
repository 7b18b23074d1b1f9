"""Each dataset of a mixture tracks its passes: `epoch` and `len()` follow the mixture's
reading, also after `load_state_dict` (issue 27, point 6; LitData's
`test_combined_dataset_with_dataloader_2_epochs`, ported to this loader's meaning: a
dataset's `epoch` is the pass its next row comes from, counted from 0, and `len()` the
rows of that pass not yet supplied)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lancedb
import numpy as np
import pyarrow as pa
import pytest

from loader import CombinedStreamingDataset, MixedDataset, StreamingDataLoader, StreamingDataset


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Tables `one` (ids 0-9), `two` (ids 5-14, as LitData's test) and `small` (4 rows)."""
    conn = lancedb.connect(str(tmp_path_factory.mktemp("passes")))
    for name, ids in {"one": range(10), "two": range(5, 15), "small": range(100, 104)}.items():
        conn.create_table(name, pa.table({"id": np.asarray(ids, dtype=np.int64)}))
    return conn


def _combined(db: Any, names: tuple[str, str]) -> tuple[Any, list[StreamingDataset]]:
    parts = [StreamingDataset(db.open_table(n), ["id"], num_splits=2) for n in names]
    mix = CombinedStreamingDataset(parts, weights=[0.5, 0.5], iterate_over_all=False, seed=12345)
    return mix, parts


def _loader(mix: Any) -> StreamingDataLoader:
    return StreamingDataLoader(mix, num_workers=2, batch_size=2)


def test_two_epochs_then_a_resume_mid_epoch(db: Any, tmp_path: Path) -> None:
    mix, (one, two) = _combined(db, ("one", "two"))
    dl = _loader(mix)
    assert (one.epoch, two.epoch, len(one), len(two)) == (0, 0, 10, 10)
    first = [b["id"].tolist() for b in dl]
    assert len(first) == 10  # each pass of 10 rows ends with the epoch's 10th step
    assert (one.epoch, two.epoch, len(one), len(two)) == (1, 1, 10, 10)
    states, second = [], []
    for batch in dl:
        second.append(batch["id"].tolist())
        states.append(dl.state_dict())
    assert (one.epoch, two.epoch) == (2, 2)
    assert second != first  # each pass its own shuffle
    assert sorted(i for batch in second for i in batch) == [
        *range(5),
        *sorted(2 * [*range(5, 10)]),
        *range(10, 15),
    ]

    mix, (one, two) = _combined(db, ("one", "two"))  # a new job, resumed mid epoch 1
    dl = _loader(mix)
    dl.load_state_dict(states[3])  # after 4 steps of the second epoch: 4 rows of each
    assert (one.epoch, two.epoch, len(one), len(two)) == (1, 1, 6, 6)
    rest = [b["id"].tolist() for b in dl]
    assert rest == second[4:]
    assert (one.epoch, two.epoch, len(one), len(two)) == (2, 2, 10, 10)


def _one_and_small(db: Any) -> tuple[MixedDataset, StreamingDataset, StreamingDataset]:
    one, small = (
        StreamingDataset(db.open_table(n), ["id"], num_splits=2) for n in ("one", "small")
    )
    return MixedDataset({"one": one, "small": small}, [1, 1], epoch_source="one"), one, small


def test_a_small_dataset_counts_its_own_passes(db: Any) -> None:
    """4 rows at half of every step of 2: a pass every 4 steps, inside one's epoch of 10."""
    mix, one, small = _one_and_small(db)
    dl = StreamingDataLoader(mix, batch_size=2)
    seen = [(small.epoch, len(small)) for _ in dl]
    assert seen[3] == (1, 4) and seen[7] == (2, 4) and seen[9] == (2, 2)
    assert (one.epoch, len(one), small.epoch, len(small)) == (1, 10, 2, 2)
    again, _, small_again = _one_and_small(db)
    again.load_state_dict(dl.state_dict())
    assert (small_again.epoch, len(small_again)) == (2, 2)
