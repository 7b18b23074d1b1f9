"""The ledger for every run (issue 27, point 5): `rows_at_step` and `elastic-loader rows`
answer mixtures (each row's dataset, position, rank and id), packed runs (each block's rank
and the documents and token ranges it was cut from), steps `skip_steps` jumped over, and
resizes. Every answer is compared with what real loaders over small LanceDB tables handed
out, never with the same formula worked out again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lancedb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader import MixedDataset, StreamingDataLoader, StreamingDataset, checkpoint, rows_at_step
from loader.tools import cli
from loader.tools.rows import MixRun, RunPosition
from tests.batches import step_through_epochs, step_together
from tests.ledger_tables import EOS, token_docs

SIZES = {"web": 300, "code": 120, "math": 60}  # rows; ids of dataset k start at k * 10_000
SPLITS = {"web": 4, "code": 2, "math": 3}
WEIGHTS = [6, 3, 1]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Any:
    conn = lancedb.connect(str(tmp_path_factory.mktemp("ledger")))
    for k, (name, rows) in enumerate(SIZES.items()):
        conn.create_table(name, pa.table({"id": np.arange(rows, dtype=np.int64) + k * 10_000}))
    return conn


def _mixture_loaders(
    db: Any,
    world: int,
    g: int,
    weights: list[int] = WEIGHTS,
    ramp: list[tuple[int, int]] | None = None,
    **mix: Any,
) -> list[StreamingDataLoader]:
    out = []
    for r in range(world):
        parts = {
            name: StreamingDataset(
                db.open_table(name), ["id"], num_splits=SPLITS[name], rank=r, world_size=world
            )
            for name in SIZES
        }
        mixture = MixedDataset(parts, weights, **mix)
        out.append(StreamingDataLoader(mixture, global_batch_size=g, batch_schedule=ramp))
    return out


def _step_rows(batches: list[list[Any]], t: int) -> tuple[list[int], list[int], list[int]]:
    """(ids, ranks, dataset indices) of global step t, rank 0's rows first."""
    ids, ranks, sources = [], [], []
    for r, mine in enumerate(batches):
        ids += mine[t]["id"].tolist()
        sources += mine[t]["source"].tolist()
        ranks += [r] * len(mine[t]["id"])
    return ids, ranks, sources


def _assert_answers(run: Any, batches: list[list[Any]], steps: range, offset: int = 0) -> None:
    for t in steps:
        found = rows_at_step(run, offset + t, id_column="id")
        ids, ranks, sources = _step_rows(batches, t)
        assert found.ids == ids, t
        assert found.ranks.tolist() == ranks, t
        assert found.datasets is not None and found.datasets.tolist() == sources, t
        assert found.names == tuple(SIZES)
        for k, pos, i in zip(found.datasets.tolist(), found.positions.tolist(), ids, strict=True):
            assert i == pos + k * 10_000  # each dataset's own table position


@pytest.mark.parametrize(("world", "seed"), [(2, None), (3, 7)])
def test_a_mixtures_steps_equal_what_its_loaders_handed_out(
    db: Any, world: int, seed: int | None
) -> None:
    """Two mixture epochs and more (every dataset rolls into new passes), from a state
    saved mid-run: the steps before it, after it, and into the next epochs."""
    loaders = _mixture_loaders(db, world, 30, seed=seed)
    first = step_together(loaders, 4)
    state = loaders[0].state_dict()
    assert isinstance(RunPosition.from_state(state), MixRun)  # one entry for every state
    rest = step_through_epochs(_resumed(db, world, 30, state, seed=seed), 40)
    batches = [a + b for a, b in zip(first, rest, strict=True)]
    run = RunPosition.from_state(state)
    _assert_answers(run, batches, range(44))
    assert rows_at_step(run, 41).epoch >= 2  # past two epochs of the mixture
    only = rows_at_step(run, 5, rank=world - 1, id_column="id")
    assert only.ids == batches[world - 1][5]["id"].tolist()


def _resumed(db: Any, world: int, g: int, state: dict[str, Any], **mix: Any) -> list[Any]:
    loaders = _mixture_loaders(db, world, g, **mix)
    for dl in loaders:
        dl.load_state_dict(state)
    return loaders


def test_a_mixture_resized_and_skipped(db: Any) -> None:
    """Saved on W=2, resumed on W=3 with steps 6 and 7 skipped: the later state answers
    the earlier steps (same rows; its own W's ranks), the skipped ones as skipped with no
    rows, and the later ones exactly as the three ranks read them."""
    two = _mixture_loaders(db, 2, 30)
    before = step_together(two, 4)
    three = _resumed(db, 3, 30, two[0].state_dict())
    for dl in three:
        dl.skip_steps(6, 8)
    after = step_together(three, 6)  # global steps 4, 5, then 8 ... 11
    run = RunPosition.from_state(three[0].state_dict())
    assert isinstance(run, MixRun) and run.world_size == 3
    for t in range(4):
        ids, _, _ = _step_rows(before, t)
        assert sorted(rows_at_step(run, t, id_column="id").ids or []) == sorted(ids)
    for t, global_step in enumerate([4, 5, 8, 9, 10, 11]):
        ids, ranks, _ = _step_rows(after, t)
        found = rows_at_step(run, global_step, id_column="id")
        assert (found.ids, found.ranks.tolist(), found.skipped) == (ids, ranks, False)
    for t in (6, 7):
        found = rows_at_step(run, t)
        assert found.skipped and len(found.positions) == len(found.ranks) == 0


def test_a_mixtures_batch_ramp_resized(db: Any) -> None:
    """A mixture ramping G 10 -> 20 -> 40, saved on W=2 after 3 steps, resumed on W=3: the
    later state answers every step with its own G, as the ranks read them."""
    ramp = [(2, 20), (5, 40)]
    two = _mixture_loaders(db, 2, 10, ramp=ramp)
    before = step_together(two, 3)
    three = _mixture_loaders(db, 3, 10, ramp=ramp)
    for dl in three:
        dl.load_state_dict(two[0].state_dict())
    after = step_through_epochs(three, 20)
    run = RunPosition.from_state(three[0].state_dict())
    for t in range(3):
        ids, _, _ = _step_rows(before, t)
        assert sorted(rows_at_step(run, t, id_column="id").ids or []) == sorted(ids)
    for t in range(20):
        ids, ranks, sources = _step_rows(after, t)
        found = rows_at_step(run, 3 + t, id_column="id")
        assert (found.ids, found.ranks.tolist()) == (ids, ranks), t
        assert found.datasets is not None and found.datasets.tolist() == sources
        assert found.global_batch_size == len(ids) == (10 if t + 3 < 2 else 20 if t + 3 < 5 else 40)


def test_new_weights_at_a_resume_are_a_phase_the_ledger_follows(db: Any) -> None:
    """Weights 6:3:1, then 2:5:3 from a resume at step 3: the state taken at the resume
    answers the new phase exactly, and a later one (it keeps every phase) answers the steps
    of both phases, before and after the resume."""
    first = _mixture_loaders(db, 2, 30)
    before = step_together(first, 3)
    later = _mixture_loaders(db, 2, 30, weights=[2, 5, 3])
    for dl in later:
        dl.load_state_dict(first[0].state_dict())
    at_resume = RunPosition.from_state(later[0].state_dict())
    got = step_together(later, 3)
    for t in range(3):
        assert rows_at_step(at_resume, 3 + t, id_column="id").ids == _step_rows(got, t)[0]
    run = RunPosition.from_state(later[0].state_dict())
    for t in range(3):
        assert rows_at_step(run, t, id_column="id").ids == _step_rows(before, t)[0]
        assert rows_at_step(run, 3 + t, id_column="id").ids == _step_rows(got, t)[0]


def test_the_cli_answers_a_mixture_checkpoint(
    db: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before issue 27 a mixture checkpoint failed with `error: 'plan'`."""
    loaders = _mixture_loaders(db, 2, 30)
    batches = step_together(loaders, 3)
    checkpoint.save(loaders[0].state_dict(), tmp_path / "mix")
    assert cli.main(["rows", str(tmp_path / "mix"), "--step", "1", "--id-column", "id"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# global step 1: epoch 0, step 1 of the epoch; W = 2, G = 30; 30 rows"
    assert out[1] == "rank\tdataset\tposition\tid"
    ids, ranks, sources = _step_rows(batches, 1)
    rows = [line.split("\t") for line in out[2:]]
    assert [int(r[3]) for r in rows] == ids and [int(r[0]) for r in rows] == ranks
    assert [r[1] for r in rows] == [list(SIZES)[k] for k in sources]
    assert cli.main(["rows", str(tmp_path / "mix"), "--step", "2", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["skipped"] is False and len(answer["rows"]) == 30
    assert {row["dataset"] for row in answer["rows"]} == set(SIZES)
    assert cli.main(["rows", str(tmp_path / "mix"), "--step", "2", "--rank", "5"]) == 2
    assert "rank must be in [0, 1]" in capsys.readouterr().err
    bad = ["rows", str(tmp_path / "mix"), "--step", "2", "--id-column", "id", "--source", "x"]
    assert cli.main(bad) == 2
    assert "NAME=URI" in capsys.readouterr().err


def _web_loaders(db: Any) -> list[StreamingDataLoader]:
    """Two ranks over the "web" table's ids, S = 4, G = 20."""
    return [
        StreamingDataLoader(
            StreamingDataset(db.open_table("web"), ["id"], num_splits=4, rank=r, world_size=2),
            global_batch_size=20,
        )
        for r in range(2)
    ]


def test_skipped_steps_of_a_dataset_say_so(db: Any) -> None:
    """A single dataset skipping steps 2 and 3 (W=2): those steps have no rows and no
    ranks; every other step is what the ranks read."""
    loaders = _web_loaders(db)
    for dl in loaders:
        dl.skip_steps(2, 4)
    got = step_together(loaders, 6)  # global steps 0, 1, 4 ... 7
    run = RunPosition.from_state(loaders[0].state_dict())
    for t, global_step in enumerate([0, 1, 4, 5, 6, 7]):
        ids = [i for mine in got for i in mine[t]["id"].tolist()]
        assert rows_at_step(run, global_step, id_column="id").ids == ids
    for global_step in (2, 3):
        found = rows_at_step(run, global_step, id_column="id")
        assert found.skipped and found.ids == [] and len(found.ranks) == 0


@pytest.fixture(scope="module")
def docs(db: Any) -> Any:
    return token_docs(db)


def test_a_batch_ramp_resized_mid_way(db: Any, tmp_path: Path, capsys: Any) -> None:
    """G 8 -> 16 -> 32 on S=4, saved after 4 steps on W=2, resumed on W=3: the later state
    answers every step of the ramp (the earlier ones as the same rows), into epoch 1, and
    the CLI's `plan` with --batch-schedule the run that never stopped."""
    ramp = [(3, 16), (6, 32)]

    def loaders(world: int) -> list[Any]:
        return [
            StreamingDataLoader(
                StreamingDataset(
                    db.open_table("web"), ["id"], num_splits=4, rank=r, world_size=world
                ),
                global_batch_size=8,
                batch_schedule=ramp,
            )
            for r in range(world)
        ]

    two = loaders(2)
    before = step_together(two, 4)
    three = loaders(3)
    for dl in three:
        dl.load_state_dict(two[0].state_dict())
    after = step_through_epochs(three, 8)  # steps 4 ... 11 (300 rows: 3x8 + 3x16 + 7x32 + 4)
    run = RunPosition.from_state(three[0].state_dict())
    for t in range(4):
        ids = sorted(i for mine in before for i in mine[t]["id"].tolist())
        found = rows_at_step(run, t, id_column="id")
        assert sorted(found.ids or []) == ids and found.global_batch_size == len(ids)
    for t in range(8):
        ids = [i for mine in after for i in mine[t]["id"].tolist()]
        assert rows_at_step(run, 4 + t, id_column="id").ids == ids, t
    assert [rows_at_step(run, t).global_batch_size for t in (2, 3, 6, 12, 13)] == [8, 16, 32, 32, 4]
    assert rows_at_step(run, 14).epoch == 1
    plan = ["rows", "plan", "--step", "5", "--rows", "300", "--num-splits", "4"]
    plan += ["--world-size", "2", "--global-batch", "8", "--batch-schedule", "3:16,6:32"]
    assert cli.main([*plan, "--seed", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "G = 16; 16 rows" in lines[0]
    step_5 = sorted(i for mine in after for i in mine[1]["id"].tolist())
    assert sorted(int(line.split("\t")[1]) for line in lines[2:]) == step_5  # web: id = position
    with pytest.raises(SystemExit):  # argparse: exit status 2 and the usage
        cli.main([*plan[:-1], "6:x"])
    assert "'x' is not a number" in capsys.readouterr().err


def test_a_packed_mixture_names_each_blocks_dataset_and_documents(
    db: Any, docs: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Two packed tables mixed 2:1 on W=2, into the small one's second pass: each
    block is the token ranges of the documents the ledger names, in the dataset it names."""
    tokens = [[-(i * 1000 + t + 1) for t in range(3 + i % 7)] for i in range(20)]  # < 0: its own
    small = db.create_table(
        "small_docs", pa.table({"tokens": pa.array(tokens, pa.list_(pa.int64()))})
    )
    texts = {"docs": docs.to_arrow().column("tokens").to_pylist(), "small_docs": tokens}

    def loaders() -> list[Any]:
        out = []
        for r in range(2):
            parts = {
                name: StreamingDataset(
                    table, ["tokens"], num_splits=2, rank=r, world_size=2,
                    pack_sequences=8, eos_id=EOS,
                )
                for name, table in (("docs", docs), ("small_docs", small))
            }  # fmt: skip
            out.append(StreamingDataLoader(MixedDataset(parts, [2, 1]), global_batch_size=6))
        return out

    first = loaders()
    got = step_through_epochs(first, 3)
    checkpoint.save(first[0].state_dict(), tmp_path / "pm")
    got = [a + b for a, b in zip(got, step_through_epochs(first, 9), strict=True)]
    run = RunPosition.from_state(checkpoint.load(tmp_path / "pm"))
    assert isinstance(run, MixRun) and run.at_step(12).sources[1].epoch == 1  # a second pass
    for t in range(12):
        found = rows_at_step(run, t)
        assert found.documents is not None and found.datasets is not None and found.names
        blocks = [row for mine in got for row in mine[t]["input_ids"].tolist()]
        sources = [k for mine in got for k in mine[t]["source"].tolist()]
        assert found.datasets.tolist() == sources and found.ranks.tolist() == [0] * 3 + [1] * 3
        for block, k, pieces in zip(blocks, sources, found.documents, strict=True):
            own = texts[found.names[k]]
            assert [tok for p, a, z in pieces for tok in (own[p] + [EOS])[a:z]] == block, t
    assert cli.main(["rows", str(tmp_path / "pm"), "--step", "7"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "rank\tdataset\tblock\tdocuments"


def test_no_traceback_reaches_the_cli_user(
    db: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever fails under `elastic-loader rows` is one line on stderr and exit status 2."""
    loaders = _mixture_loaders(db, 2, 30)
    checkpoint.save(loaders[0].state_dict(), tmp_path / "mix")

    def broken(*args: Any, **kwargs: Any) -> None:
        raise KeyError("plan")

    monkeypatch.setattr("loader.tools.rows_cli.rows_at_step", broken)
    assert cli.main(["rows", str(tmp_path / "mix"), "--step", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "elastic-loader rows: error: KeyError: 'plan'\n"


@st.composite
def _mixture_runs(draw: st.DrawFn) -> dict[str, Any]:
    g = draw(st.integers(2, 24))
    return {
        "rows": [draw(st.integers(8, 60)) for _ in range(draw(st.integers(1, 3)))],
        "splits": draw(st.integers(1, 4)),
        "weights": draw(st.lists(st.integers(1, 6), min_size=3, max_size=3)),
        "seed": draw(st.none() | st.integers(0, 9)),
        "g": g,
        "worlds": (draw(st.integers(1, min(g, 4))), draw(st.integers(1, min(g, 4)))),
        "resize_at": draw(st.integers(0, 6)),
        "skip": draw(st.none() | st.tuples(st.integers(0, 12), st.integers(1, 3))),
    }


@settings(max_examples=10, deadline=None)
@given(job=_mixture_runs())
def test_the_ledger_of_any_mixture_run(job: dict[str, Any]) -> None:
    """Any mixture (datasets, weights, seed, G), resized from W to W' at any step, with a
    range of steps skipped after the resize: asked from the final state, every step after
    the resize is what the W' ranks read (ids, ranks, datasets), every earlier one the same
    rows, a skipped one skipped."""
    tables = [
        pa.table({"id": np.arange(n, dtype=np.int64) + k * 10_000})
        for k, n in enumerate(job["rows"])
    ]

    def loaders(world: int) -> list[Any]:
        out = []
        for r in range(world):
            parts = {
                f"d{k}": StreamingDataset(
                    t, ["id"], num_splits=job["splits"], rank=r, world_size=world
                )
                for k, t in enumerate(tables)
            }
            weights = job["weights"][: len(tables)]
            mix = MixedDataset(parts, weights, seed=job["seed"], steps_per_epoch=7)
            out.append(StreamingDataLoader(mix, global_batch_size=job["g"]))
        return out

    world, other = job["worlds"]
    first = loaders(world)
    before = step_through_epochs(first, job["resize_at"]) if job["resize_at"] else [[]] * world
    later = loaders(other)
    for dl in later:
        dl.load_state_dict(first[0].state_dict())
    skipped: set[int] = set()
    if job["skip"] is not None:
        start = job["resize_at"] + job["skip"][0]
        skipped = set(range(start, start + job["skip"][1]))
        for dl in later:
            dl.skip_steps(start, start + job["skip"][1])
    after = step_through_epochs(later, 12)
    run = RunPosition.from_state(later[0].state_dict())
    for t in range(job["resize_at"]):
        found = rows_at_step(run, t)
        assert found.datasets is not None
        ids = (found.positions + found.datasets * 10_000).tolist()
        assert sorted(ids) == sorted(_step_rows(before, t)[0]), t
    step, t = job["resize_at"], 0
    while t < 12:
        found = rows_at_step(run, step)
        if step in skipped:
            assert found.skipped and len(found.positions) == 0
        else:
            assert found.datasets is not None
            ids, ranks, sources = _step_rows(after, t)
            assert (found.positions + found.datasets * 10_000).tolist() == ids, step
            assert found.ranks.tolist() == ranks and found.datasets.tolist() == sources
            t += 1
        step += 1


@pytest.mark.parametrize("mixture", [False, True])
def test_a_range_pending_in_the_state_is_answered_as_skipped(db: Any, mixture: bool) -> None:
    """Found by tests/test_joints.py (rows, one dataset or a mixture, skip_steps, a state
    saved before the range): the state holds the range (`skips_pending`) and the run resumed
    from it skips it, but the ledger answered its steps with rows no rank read. Now they are
    skipped, and every other step is what the resumed ranks read."""
    loaders = _mixture_loaders(db, 2, 30) if mixture else _web_loaders(db)
    for dl in loaders:
        dl.skip_steps(4, 6)
    running = [iter(dl) for dl in loaders]
    for _ in range(2):
        for it in running:
            next(it)
    state = loaders[0].state_dict()
    assert state["skips_pending"] == [[4, 6]]
    run = RunPosition.from_state(state)
    for t in (4, 5):
        found = rows_at_step(run, t, id_column="id")
        assert found.skipped and found.ids == [] and len(found.ranks) == 0, t
    for global_step in (2, 3, 6, 7):  # the next steps the ranks read
        ids = [i for it in running for i in next(it)["id"].tolist()]
        assert rows_at_step(run, global_step, id_column="id").ids == ids, global_step
