"""The ledger of packed runs (issue 27, point 5): each block's rank and the documents and
token ranges it was cut from, compared with the blocks real loaders handed out; and what the
CLI prints for them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lancedb
import pytest

from loader import StreamingDataLoader, StreamingDataset, checkpoint, rows_at_step
from loader.tools import cli
from loader.tools.rows import RunPosition
from tests.batches import step_through_epochs, step_together
from tests.ledger_tables import EOS, token_docs


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return token_docs(lancedb.connect(str(tmp_path_factory.mktemp("ledger-packed"))))


@pytest.mark.parametrize(("world", "other"), [(2, 3), (3, 1)])
def test_packed_blocks_are_the_documents_and_tokens_the_ledger_names(
    docs: Any, world: int, other: int, tmp_path: Path
) -> None:
    """Each block the ranks read is the concatenation of the token ranges of the documents
    the ledger names (eos after each document), into the next epoch. Saved on W after 2
    steps, resumed on W', asked from the W' state 2 steps later: the first two steps are the
    same blocks (named with W''s ranks), the later ones on the ranks that read them."""
    table = docs
    texts = table.to_arrow().column("tokens").to_pylist()
    loaders = _packed_resumed(table, world, None)
    first = step_together(loaders, 2)
    resumed = _packed_resumed(table, other, loaders[0].state_dict())
    steps = len(resumed[0]) + 3  # the rest of epoch 0 and into epoch 1
    rest = step_through_epochs(resumed, 2)
    checkpoint.save(resumed[0].state_dict(), tmp_path / "packed")
    more = step_through_epochs(resumed, steps - 4)
    rest = [a + b for a, b in zip(rest, more, strict=True)]
    run = RunPosition.from_state(checkpoint.load(tmp_path / "packed"))
    assert isinstance(run, RunPosition) and run.world_size == other
    for t in range(steps):
        found = rows_at_step(run, t)
        assert found.documents is not None
        mine = first if t < 2 else rest
        at = t if t < 2 else t - 2
        blocks = [row for part in mine for row in part[at]["input_ids"].tolist()]
        got = [
            [tok for p, a, z in pieces for tok in (texts[p] + [EOS])[a:z]]
            for pieces in found.documents
        ]
        if t < 2:
            assert sorted(got) == sorted(blocks), t
        else:
            assert got == blocks, t
            assert found.ranks.tolist() == [
                r for r, part in enumerate(rest) for _ in part[at]["input_ids"]
            ]
    assert rows_at_step(run, steps - 1).epoch == 1


def _packed_resumed(table: Any, world: int, state: dict[str, Any] | None) -> list[Any]:
    out = []
    for r in range(world):
        ds = StreamingDataset(
            table, ["tokens"], num_splits=3, rank=r, world_size=world,
            pack_sequences=16, eos_id=EOS,
        )  # fmt: skip
        dl = StreamingDataLoader(ds, global_batch_size=6)
        if state is not None:
            dl.load_state_dict(state)
        out.append(dl)
    return out


def test_the_cli_prints_a_packed_steps_documents(
    docs: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = docs
    dl = StreamingDataLoader(
        StreamingDataset(table, ["tokens"], num_splits=3, pack_sequences=16, eos_id=EOS),
        global_batch_size=6,
    )
    next(iter(dl))
    checkpoint.save(dl.state_dict(), tmp_path / "p")
    assert cli.main(["rows", str(tmp_path / "p"), "--step", "0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("; 6 blocks") and out[1] == "rank\tblock\tdocuments"
    assert all("[" in line.split("\t")[2] for line in out[2:])
    assert cli.main(["rows", str(tmp_path / "p"), "--step", "0", "--id-column", "x"]) == 2
    assert "packed run" in capsys.readouterr().err
