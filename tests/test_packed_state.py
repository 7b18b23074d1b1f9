"""A packed state's own fields, checked where every state is checked (save, load, inspect,
not only a restore), and the tokens it counts as dropped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from loader import StreamingDataLoader, StreamingDataset
from loader.checkpoint import CheckpointError, encode, load, save
from loader.tools.inspect import format_inspect

EOS = -1


def _documents(lengths: list[int]) -> pa.Table:
    docs = [[i * 1000 + k + 1 for k in range(n)] for i, n in enumerate(lengths)]
    return pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))})


def _loader(lengths: list[int], num_splits: int, seq_len: int) -> StreamingDataLoader:
    ds = StreamingDataset(
        _documents(lengths), columns=["tokens"], num_splits=num_splits, rank=0, world_size=1,
        pack_sequences=seq_len, eos_id=EOS,
    )  # fmt: skip
    return StreamingDataLoader(ds, batch_size=2)


def _without(state: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k != key}


@pytest.mark.parametrize(
    ("bad", "field", "problem"),
    [
        (lambda s: _without(s, "token_offsets"), "token_offsets", "is missing; a packed state"),
        (lambda s: s | {"token_offsets": [0, 0, 0, -1]}, "token_offsets[3]", "is -1, expected"),
        (lambda s: s | {"token_offsets": [0] * 5}, "token_offsets", "has 5 offsets"),
        (lambda s: s | {"token_offsets": [0, 0, 0]}, "token_offsets", "has 3 offsets"),
        (lambda s: s | {"token_offsets": [0, 0, 0, 1.5]}, "token_offsets[3]", "is 1.5"),
        (lambda s: s | {"token_offsets": {"0": 0}}, "token_offsets", "is a dict"),
        (lambda s: s | {"tokens_dropped": -3}, "tokens_dropped", "is -3, expected"),
    ],
)
def test_bad_token_fields_are_refused_by_save_load_and_inspect(
    tmp_path: Path, bad: Any, field: str, problem: str
) -> None:
    """Issue 19.14: missing, negative or extra token_offsets passed save, load and inspect;
    only a restore refused them."""
    loader = _loader([13] * 40, num_splits=4, seq_len=8)
    next(iter(loader))
    state = bad(loader.state_dict())
    message = rf"payload\.{field}'.*{problem}".replace("[", r"\[")
    with pytest.raises(CheckpointError, match=message):
        save(state, tmp_path / "refused.json")
    assert not (tmp_path / "refused.json").exists()
    path = tmp_path / "written-by-hand.json"
    path.write_bytes(encode(state))  # a file with a valid checksum around the bad state
    with pytest.raises(CheckpointError, match=message):
        load(path)
    with pytest.raises(CheckpointError, match=message):
        format_inspect(path)


def test_a_state_that_is_not_packed_has_no_token_offsets(tmp_path: Path) -> None:
    loader = StreamingDataLoader(StreamingDataset(_documents([3] * 10), num_splits=2), batch_size=2)
    state = loader.state_dict() | {"token_offsets": [0, 0]}
    with pytest.raises(ValueError, match=r"token_offsets.*plan\.pack_sequences is null"):
        save(state, tmp_path / "refused.json")


def test_tokens_dropped_counts_the_surplus_documents() -> None:
    """Issue 19.14: the N - S*L documents the plan leaves out of every split were not in
    `tokens_dropped`. 5 documents of 3 tokens, S = 2, blocks of 4: each split's 2 documents
    and their eos fill 2 blocks exactly; the fifth document is in no split: 3 tokens + eos."""
    lengths = [3] * 5
    loader = _loader(lengths, num_splits=2, seq_len=4)
    assert loader.state_dict()["tokens_dropped"] == 4
    assert sum(len(b["input_ids"]) for b in loader) == 4
    assert 4 * 4 + loader.state_dict()["tokens_dropped"] == sum(n + 1 for n in lengths)
