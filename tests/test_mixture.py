"""Mixtures through the loader on real tables: a LanceDB table mixed with Parquet files,
resumes through checkpoint files on another W with new weights, refusals, packed tokens."""

from __future__ import annotations

import itertools
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from loader import StreamingDataLoader, StreamingDataset, checkpoint, derive_packed_fields
from loader.mixture.dataset import CombinedStreamingDataset, MixedDataset
from loader.tools.inspect import format_inspect
from tests.tables import lancedb_table, make_rows

G = 12
PARQUET_BASE = 10_000  # the Parquet rows' ids start here, so an id says its table


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    lance = lancedb_table(tmp_path_factory.mktemp("mixdb"), rows=120)
    folder = tmp_path_factory.mktemp("mixpq")
    pq.write_table(make_rows(PARQUET_BASE, PARQUET_BASE + 45), folder / "part-0.parquet")
    return lance, folder


def mixture(
    tables: tuple[Any, Path], rank: int, world: int, weights: Any = (3, 1), **kw: Any
) -> MixedDataset:
    lance, folder = tables
    web = StreamingDataset(
        lance, columns=["id", "label"], num_splits=4, shuffle_seed=5, rank=rank, world_size=world
    )
    code = StreamingDataset(
        str(folder),
        columns=["id", "label"],
        num_splits=3,
        shuffle_seed=6,
        rank=rank,
        world_size=world,
    )
    return MixedDataset({"web": web, "code": code}, list(weights), **kw)


def loaders(
    tables: tuple[Any, Path], world: int, g: int = G, **kw: Any
) -> list[StreamingDataLoader]:
    return [
        StreamingDataLoader(mixture(tables, r, world, **kw), global_batch_size=g)
        for r in range(world)
    ]


def steps(loaders_: list[StreamingDataLoader], count: int) -> list[list[tuple[int, int]]]:
    """`count` global steps (across epochs): the sorted (source, id) of every rank's batch t."""
    out = []
    for batches in _global(loaders_, count):
        rows = []
        for batch in batches:
            assert set(batch) == {"id", "label", "source"}
            assert batch["source"].dtype == torch.int64 and len(batch["source"]) == len(batch["id"])
            for source, row in zip(batch["source"].tolist(), batch["id"].tolist(), strict=True):
                assert (row >= PARQUET_BASE) == (source == 1), "the source field names the table"
                rows.append((source, row))
        out.append(sorted(rows))
    return out


def _global(loaders_: list[StreamingDataLoader], count: int) -> list[list[dict[str, Any]]]:
    """Every rank's batches of `count` steps, a new `for` at each epoch's end (as a loop does)."""
    out: list[list[dict[str, Any]]] = []
    while len(out) < count:
        for batches in zip(*loaders_, strict=True):
            out.append(list(batches))
            if len(out) == count:
                break
    return out


def test_lance_and_parquet_mixed_the_same_on_every_world_size(tables: tuple[Any, Path]) -> None:
    one = steps(loaders(tables, 1), 20)
    for world in (2, 3, 5):
        assert steps(loaders(tables, world), 20) == one
    for step in one:  # 3:1 of 12 rows: exactly 9 and 3 every step
        assert Counter(s for s, _ in step) == {0: 9, 1: 3}
    code = [row for step in one for s, row in step if s == 1]
    assert sorted(code[:45]) == list(range(PARQUET_BASE, PARQUET_BASE + 45))  # a whole pass
    assert sorted(code[45:]) == sorted(set(code[45:]))  # the next pass begins, once each row


def test_resume_from_a_file_on_another_world_size_equals_the_uninterrupted_run(
    tables: tuple[Any, Path], tmp_path: Path
) -> None:
    whole = steps(loaders(tables, 2), 20)
    first = loaders(tables, 2)
    assert steps(first, 7) == whole[:7]
    path = checkpoint.save(first[1].state_dict(), tmp_path / "mix.json")
    assert first[0].state_dict() == first[1].state_dict()  # the same on every rank
    resumed = loaders(tables, 3, g=G)
    for dl in resumed:
        dl.load_state_dict(checkpoint.load(path))
    assert steps(resumed, 13) == whole[7:]
    assert "web" in format_inspect(path) and "3/4" in format_inspect(path)


def test_new_weights_at_a_resume_take_effect_from_that_step(tables: tuple[Any, Path]) -> None:
    first = loaders(tables, 2)
    before = steps(first, 5)
    state = first[0].state_dict()
    resumed = loaders(tables, 3, g=8, weights=[1, 1])
    for dl in resumed:
        dl.load_state_dict(state)
    after = steps(resumed, 12)
    for step in after:
        assert Counter(s for s, _ in step) == {0: 4, 1: 4}
    # each table's pass goes on from its cursors: no row twice before a pass is done
    code = [row for step in before + after for s, row in step if s == 1]
    assert len(set(code[: 15 + 7 * 4])) == 15 + 7 * 4  # the pass ends inside resumed step 8
    assert set(code[: 15 + 8 * 4]) == set(range(PARQUET_BASE, PARQUET_BASE + 45))
    web = [row for step in before + after for s, row in step if s == 0]
    assert len(web) == len(set(web)) == 45 + 4 * 12


def test_a_state_whose_datasets_differ_is_refused(tables: tuple[Any, Path], tmp_path: Path) -> None:
    dl = loaders(tables, 1)[0]
    steps([dl], 2)
    state = dl.state_dict()
    lance, _ = tables
    web = StreamingDataset(lance, columns=["id", "label"], num_splits=4, shuffle_seed=5)
    with pytest.raises(ValueError, match="names"):  # a dataset removed
        MixedDataset({"web": web}, [1]).load_state_dict(state)
    other = tmp_path / "other"
    other.mkdir()
    pq.write_table(make_rows(PARQUET_BASE, PARQUET_BASE + 46), other / "part-0.parquet")
    changed = StreamingDataset(str(other), columns=["id", "label"], num_splits=3, shuffle_seed=6)
    with pytest.raises(ValueError, match=r"sources\[1\].*'code'"):  # a table changed
        MixedDataset({"web": web, "code": changed}, [3, 1]).load_state_dict(state)
    with pytest.raises(ValueError, match="mixture's state"):
        web.load_state_dict(state)
    with pytest.raises(ValueError, match="single dataset's state"):
        MixedDataset({"web": web}, [1]).load_state_dict(web.state_dict())
    broken = {**state, "phase_counts": [0, 99]}
    with pytest.raises(ValueError, match="phase_counts"):
        checkpoint.save(broken, tmp_path / "bad.json")


def test_litdata_spelling(tables: tuple[Any, Path]) -> None:
    lance, folder = tables
    a = StreamingDataset(lance, columns=["id", "label"], num_splits=4)
    b = StreamingDataset(str(folder), columns=["id", "label"], num_splits=3)
    combined = CombinedStreamingDataset(datasets=[a, b], iterate_over_all=True)
    dl = StreamingDataLoader(combined, batch_size=11)
    ids = [i for batch in dl for i in batch["id"].tolist()]
    assert len(dl) == len(ids) // 11 == (120 + 45) // 11  # one pass of each, in proportion
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 165
    with pytest.raises(ValueError, match="iterate_over_all"):
        CombinedStreamingDataset(datasets=[a, b], weights=[0.5, 0.5], iterate_over_all=True)


def test_bad_mixtures_say_what_to_fix(tables: tuple[Any, Path]) -> None:
    lance, _ = tables
    a = StreamingDataset(lance, columns=["id"], num_splits=4)
    b = StreamingDataset(lance, columns=["id"], num_splits=4, rank=1, world_size=2)
    with pytest.raises(ValueError, match="one world"):
        MixedDataset([a, b], [1, 1])
    with pytest.raises(TypeError, match="StreamingDataset"):
        MixedDataset([a, "b"], [1, 1])
    with pytest.raises(ValueError, match="world_size=2 is more than the global batch"):
        StreamingDataLoader(MixedDataset([b], [1]), global_batch_size=1)


def token_table(docs: int, base: int) -> pa.Table:
    tokens = [[base + d * 100 + t + 1 for t in range(3 + d % 5)] for d in range(docs)]
    return pa.table({"tokens": pa.array(tokens, pa.list_(pa.int32()))})


def packed(world: int, weights: list[int]) -> list[StreamingDataLoader]:
    out = []
    for rank in range(world):
        kw = {
            "columns": ["tokens"],
            "rank": rank,
            "world_size": world,
            "eos_id": 0,
            "pack_sequences": 8,
        }
        a = StreamingDataset(token_table(40, 0), num_splits=2, **kw)
        b = StreamingDataset(token_table(25, 100_000), num_splits=3, **kw)
        out.append(StreamingDataLoader(MixedDataset([a, b], weights), global_batch_size=6))
    return out


def blocks(loaders_: list[StreamingDataLoader], count: int) -> list[list[tuple[int, ...]]]:
    out = []
    for batches in _global(loaders_, count):
        rows = []
        for batch in batches:
            b, seq = batch["input_ids"].shape
            cu = batch["cu_seqlens"]
            assert cu[-1] == b * seq and len(batch["source"]) == b
            assert bool((cu[1:] > cu[:-1]).all())
            assert set(range(0, b * seq, seq)) <= set(cu.tolist())  # every block starts a piece
            for source, block in zip(batch["source"].tolist(), batch["input_ids"], strict=True):
                assert (int(block.max()) >= 100_000) == (source == 1)  # interleaved blocks
            # the default fields follow their blocks: derived from input_ids and cu_seqlens
            derived = derive_packed_fields(batch["input_ids"], cu)
            for key, value in derived.items():
                assert torch.equal(batch[key], value), key
            rows.extend(
                (s, *row)
                for s, row in zip(
                    batch["source"].tolist(), batch["input_ids"].tolist(), strict=True
                )
            )
        out.append(sorted(rows))
    return out


def test_packed_mixture_is_token_exact_across_a_resize() -> None:
    whole = blocks(packed(1, [1, 2]), 12)
    for step in whole:
        assert Counter(r[0] for r in step) == {0: 2, 1: 4}
    assert blocks(packed(3, [1, 2]), 12) == whole
    first = packed(2, [1, 2])
    assert blocks(first, 5) == whole[:5]
    state = first[0].state_dict()
    resumed = packed(3, [1, 2])
    for dl in resumed:
        dl.load_state_dict(state)
    assert blocks(resumed, 7) == whole[5:]


def test_plan_command_for_a_mixture(capsys: pytest.CaptureFixture[str]) -> None:
    from loader.tools.cli import main

    specs = ["--mixture", "web=120/4@3", "--mixture", "code=45/3@1"]
    assert main(["plan", *specs, "--global-batch", "12"]) == 0
    out = capsys.readouterr().out
    assert "epoch: 15 steps (until code completes" in out  # 45 rows at 3 a step
    assert "web                3/4           9" in out
    assert main(["plan", *specs]) == 2
    assert "--global-batch" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["plan", "--mixture", "web=120"])


def test_the_loader_epoch_is_the_planned_one(tables: tuple[Any, Path]) -> None:
    dl = loaders(tables, 1)[0]
    assert len(dl) == 15 == sum(1 for _ in dl)  # a pass of code: 45 rows, 3 a step
    assert dl.progress.epoch == 0 and len(dl) == 15 == sum(1 for _ in dl)
    assert dl.progress.epoch == 1


def test_skip_steps_and_in_order(tables: tuple[Any, Path]) -> None:
    whole = steps(loaders(tables, 1), 10)
    dl = loaders(tables, 1)[0]
    dl.skip_steps(3, 5)  # Megatron's --skip-train-iteration-range on a mixture
    got = steps([dl], 8)
    assert got == whole[:3] + whole[5:10]
    assert dl.state_dict()["steps_skipped"] == [[3, 5]]
    with pytest.raises(ValueError, match="in order"):
        StreamingDataLoader(mixture(tables, 0, 1), global_batch_size=G, in_order=False)


def test_the_seed_changes_nothing_now_that_steps_interleave(tables: tuple[Any, Path]) -> None:
    plain = steps(loaders(tables, 3), 6)
    assert steps(loaders(tables, 3, seed=11), 6) == plain  # the same rows every step

    def layout(**kw: Any) -> list[list[int]]:
        return [b["source"].tolist() for bs in _global(loaders(tables, 3, **kw), 6) for b in bs]

    assert layout(seed=11) == layout()  # and the same rows on every rank


def test_every_rank_reads_a_mixed_batch_on_every_world_size() -> None:
    """Issue 27's example: W = 4, G = 40, weights 0.7 / 0.2 / 0.1 gave ranks 0 and 1 only
    the first dataset. Interleaved, every rank's slice holds each dataset within 2 rows of
    its share, on every W <= G, and the steps stay the same rows."""
    weights = [Fraction(7, 10), Fraction(1, 5), Fraction(1, 10)]

    def ranks(world: int, g: int) -> list[StreamingDataLoader]:
        out = []
        for rank in range(world):
            kw = {"rank": rank, "world_size": world}
            datasets = [
                StreamingDataset(
                    pa.table({"id": [k * 1000 + i for i in range(n)]}), num_splits=s, **kw
                )
                for k, (n, s) in enumerate([(400, 4), (90, 3), (37, 1)])
            ]
            out.append(StreamingDataLoader(MixedDataset(datasets, weights), global_batch_size=g))
        return out

    for g, worlds in ((40, (1, 3, 4, 7, 40)), (13, (1, 2, 5, 13))):
        whole = None
        for world in worlds:
            got = []
            for batches in _global(ranks(world, g), 12):
                for batch in batches:
                    sources = batch["source"].tolist()
                    assert sources == [i // 1000 for i in batch["id"].tolist()]
                    for k, w in enumerate(weights):
                        assert abs(sources.count(k) - len(sources) * w) < 2, (g, world, k)
                got.append(sorted(i for b in batches for i in b["id"].tolist()))
            whole = whole or got
            assert got == whole  # step t is the same rows on every W


def test_ragged_columns_and_row_transforms_join(tmp_path: Path) -> None:
    lists = pa.table({"v": pa.array([[i] * (i % 3 + 1) for i in range(30)], pa.list_(pa.int64()))})
    other = pa.table({"v": pa.array([[100 + i] for i in range(20)], pa.list_(pa.int64()))})
    a, b = StreamingDataset(lists, num_splits=2), StreamingDataset(other, num_splits=2)
    batch = next(iter(StreamingDataLoader(MixedDataset([a, b], [1, 1]), global_batch_size=10)))
    rows = [
        batch["v"].values[s:e].tolist() for s, e in itertools.pairwise(batch["v"].offsets.tolist())
    ]
    assert [r[0] >= 100 for r in rows] == [s == 1 for s in batch["source"].tolist()]
    assert all(len(set(r)) == 1 for r in rows)
    double = {"transform": lambda row: {"id": row["id"] * 2}}
    c = StreamingDataset(pa.table({"id": list(range(40))}), num_splits=2, **double)
    d = StreamingDataset(pa.table({"id": list(range(100, 120))}), num_splits=2, **double)
    batch = next(iter(StreamingDataLoader(MixedDataset([c, d], [1, 1]), global_batch_size=8)))
    assert sorted(batch["source"].tolist()) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert batch["source"].tolist() != sorted(batch["source"].tolist())  # interleaved
    assert all(i % 2 == 0 for i in batch["id"].tolist())
    assert [i >= 200 for i in batch["id"].tolist()] == [s == 1 for s in batch["source"].tolist()]


@pytest.mark.filterwarnings("ignore:pack_sequences=4 is longer")
def test_a_packed_mixture_goes_on_past_a_pass_without_a_whole_block() -> None:
    """Issue 24 item 8: a small packed dataset whose pass holds no whole block (seven short
    documents, S=2, seq 4) stopped a 3:1 mixture with `dataset 1 has no rows in pass 2`.
    Such a pass contributes nothing and is counted; the mixture goes on, exactly resumable."""

    def ranks(world: int) -> list[StreamingDataLoader]:
        out = []
        for rank in range(world):
            kw = {"columns": ["tokens"], "eos_id": 0, "pack_sequences": 4, "rank": rank}
            kw |= {"world_size": world, "shuffle_clump_size": 1}
            lengths = [0, 0, 0, 1, 1, 0, 0]
            docs = [[500_000 + d * 100 + t + 1 for t in range(n)] for d, n in enumerate(lengths)]
            small = pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))})
            parts = [
                StreamingDataset(token_table(300, 0), num_splits=2, shuffle_seed=2, **kw),
                StreamingDataset(small, num_splits=2, shuffle_seed=1, **kw),
            ]
            out.append(StreamingDataLoader(MixedDataset(parts, [3, 1]), global_batch_size=4))
        return out

    whole = blocks(ranks(1), 300)
    for step in whole:
        assert Counter(r[0] for r in step) == {0: 3, 1: 1}
    first = ranks(2)
    assert blocks(first, 130) == whole[:130]
    state = first[0].state_dict()
    assert state["empty_passes"][0] == 0 and state["empty_passes"][1] > 0
    resumed = ranks(1)
    for dl in resumed:
        dl.load_state_dict(state)
    assert blocks(resumed, 170) == whole[130:]


def test_a_tiny_dataset_repeating_inside_a_step_is_one_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 24 item 18: a 1-row dataset at weight 1/2 with a big G cost seconds a step (a
    segment, task, take and placement per pass). Its whole passes are now one segment, one
    group and one read: a step has a handful of groups, whatever G, and the rows are those
    the pass-by-pass path reads (each pass in its own epoch's shuffle)."""

    def batches(g: int) -> tuple[list[dict[str, Any]], StreamingDataLoader]:
        parts = [
            StreamingDataset(
                pa.table({"id": list(range(1000, 1500))}), num_splits=4, shuffle_seed=1
            ),
            StreamingDataset(pa.table({"id": [0]}), num_splits=1, shuffle_seed=2),
            StreamingDataset(pa.table({"id": [7, 8, 9]}), num_splits=1, shuffle_seed=3),
        ]
        dl = StreamingDataLoader(MixedDataset(parts, [2, 1, 1]), global_batch_size=g, read_size=g)
        return list(itertools.islice(dl, 6)), dl

    fast, dl = batches(4096)
    task = dl.streaming_dataset.progress.peek(dl._batching).task(0)
    assert len(task.groups) <= 9 and max(task.passes) >= 300  # 3 a dataset, not 1,024 + 341
    for batch in fast:
        ids = batch["id"].tolist()
        assert ids.count(0) == 1024 and sum(i in (7, 8, 9) for i in ids) == 1024
    monkeypatch.setattr("loader.mixture.dataset._fixed_rows", lambda ds: False)
    slow, _ = batches(4096)  # pass by pass, as before
    for one, other in zip(fast, slow, strict=True):
        assert torch.equal(one["id"], other["id"]) and torch.equal(one["source"], other["source"])
