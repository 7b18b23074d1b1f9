"""Resuming from a checkpoint file reads exactly the saved rows, or refuses naming file and field.

End to end through the real loader on real LanceDB/Lance tables and Parquet files in
tmp_path: writers append and delete after the save, cleanup removes versions, the dataset
is rebuilt with other parameters, and the file is damaged. `checkpoint.restore` is the
path a user takes (load the file, then `load_state_dict`), so each refusal names the file.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lance
import lancedb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from loader import StreamingDataLoader, StreamingDataset, checkpoint
from loader.checkpoint import CheckpointError, restore
from loader.sources import PinnedVersionGoneError
from loader.sources.arrow import legacy_table_fingerprint
from loader.tools.inspect import print_inspect
from tests.batches import flat_ids

NUM_ROWS, NUM_SPLITS, BATCH, BATCHES_BEFORE = 1200, 8, 32, 9


def _rows(lo: int, hi: int) -> pa.Table:
    ids = np.arange(lo, hi, dtype=np.int64)
    return pa.table({"id": ids, "label": ids % 5})


def _loader(source: Any, **kwargs: Any) -> StreamingDataLoader:
    options: dict[str, Any] = {
        "num_splits": NUM_SPLITS, "shuffle_seed": 3, "shuffle_clump_size": 4,
        "rank": 0, "world_size": 1, **kwargs,
    }  # fmt: skip
    return StreamingDataLoader(StreamingDataset(source, **options), batch_size=BATCH)


def _read_then_save(dl: StreamingDataLoader, path: Path) -> list[int]:
    it = iter(dl)
    ids = flat_ids(next(it) for _ in range(BATCHES_BEFORE))
    checkpoint.save(dl.state_dict(), path)
    return ids


@pytest.fixture
def db(tmp_path: Path) -> str:
    uri = str(tmp_path / "db")
    lancedb.connect(uri).create_table("items", _rows(0, NUM_ROWS))
    return uri


def _table(db: str, name: str = "items") -> Any:
    return lancedb.connect(db).open_table(name)


# ---------------------------------------------------------------- pinning


@pytest.mark.parametrize("filter", [None, "label != 3"])
def test_lancedb_resume_reads_pinned_rows_after_append_and_delete(
    db: str, tmp_path: Path, filter: str | None
) -> None:
    path = tmp_path / "ckpt.json"
    before = _read_then_save(_loader(_table(db), filter=filter), path)
    saved = checkpoint.load(path)
    pinned = saved["source"]["version"]
    assert saved["source"]["kind"] == "lancedb" and saved["source"]["table"] == "items"
    assert saved["source"]["uri"].endswith("items.lance") and isinstance(pinned, int)
    assert saved["plan"]["filter"] == filter
    assert saved["plan"]["num_rows"] == len(
        [i for i in range(NUM_ROWS) if filter is None or i % 5 != 3]
    )

    table = _table(db)
    table.add(_rows(NUM_ROWS, NUM_ROWS + 1000))
    table.delete("id < 500")
    assert table.count_rows() == NUM_ROWS + 1000 - 500

    dl = _loader(_table(db), filter=filter)  # opens the latest version...
    restore(dl, path)  # ...and the checkpoint moves it back to the pinned one
    assert dl.streaming_dataset.source.spec.version == pinned
    expected = [i for i in range(NUM_ROWS) if filter is None or i % 5 != 3]
    assert sorted(before + flat_ids(dl)) == expected  # each pinned row once, nothing appended


def test_lance_dataset_resume_reads_pinned_rows(tmp_path: Path) -> None:
    uri, path = str(tmp_path / "items.lance"), tmp_path / "ckpt.json"
    lance.write_dataset(_rows(0, NUM_ROWS), uri)
    before = _read_then_save(_loader(lance.dataset(uri)), path)
    lance.write_dataset(_rows(NUM_ROWS, NUM_ROWS + 1000), uri, mode="append")
    lance.dataset(uri).delete("id < 500")

    dl = _loader(lance.dataset(uri))
    restore(dl, path)
    assert sorted(before + flat_ids(dl)) == list(range(NUM_ROWS))


def test_resume_matches_an_uninterrupted_run_and_torch_save_works(db: str, tmp_path: Path) -> None:
    whole = flat_ids(_loader(_table(db)))
    dl = _loader(_table(db))
    it = iter(dl)
    head = flat_ids(next(it) for _ in range(BATCHES_BEFORE))
    torch.save(dl.state_dict(), tmp_path / "state.pt")  # the plain dict, no file format

    resumed = _loader(_table(db))
    resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert head + flat_ids(resumed) == whole


@pytest.mark.filterwarnings("ignore:optimize.cleanup_older_than=0.:UserWarning")
def test_cleaned_up_version_is_refused_naming_file_and_version(db: str, tmp_path: Path) -> None:
    path = tmp_path / "ckpt.json"
    _read_then_save(_loader(_table(db)), path)
    table = _table(db)
    table.add(_rows(NUM_ROWS, NUM_ROWS + 100))
    table.optimize(cleanup_older_than=dt.timedelta(0), delete_unverified=True)

    dl = _loader(_table(db))
    with pytest.raises(CheckpointError) as info:
        restore(dl, path)
    message = str(info.value)
    assert str(path) in message
    assert "cannot open version 1" in message and "tags.create" in message
    assert dl.state_dict()["cursors"] == [0] * NUM_SPLITS  # nothing resumed


@pytest.mark.filterwarnings("ignore:optimize.cleanup_older_than=0.:UserWarning")
def test_tagged_version_survives_cleanup(db: str, tmp_path: Path) -> None:
    """The recipe in checkpoints/README.md: tag the pinned version, cleanup keeps it."""
    path = tmp_path / "ckpt.json"
    before = _read_then_save(_loader(_table(db)), path)
    table = _table(db)
    table.tags.create("resume-run-1", checkpoint.load(path)["source"]["version"])
    table.add(_rows(NUM_ROWS, NUM_ROWS + 100))
    table.delete("id < 500")
    with pytest.raises(Exception, match="tagged version"):  # LanceDB's optimize refuses...
        table.optimize(cleanup_older_than=dt.timedelta(0), delete_unverified=True)
    stats = table.to_lance().cleanup_old_versions(  # ...Lance can skip tagged versions
        older_than=dt.timedelta(0), delete_unverified=True, error_if_tagged_old_versions=False
    )
    assert stats.old_versions > 0

    dl = _loader(_table(db))
    restore(dl, path)
    assert sorted(before + flat_ids(dl)) == list(range(NUM_ROWS))


# ---------------------------------------------------------------- fingerprints


def _parquet(folder: Path, sizes: list[int]) -> None:
    folder.mkdir(exist_ok=True)
    start = 0
    for i, size in enumerate(sizes):
        pq.write_table(_rows(start, start + size), folder / f"part-{i}.parquet")
        start += size


def test_parquet_change_is_refused_unless_allowed(tmp_path: Path) -> None:
    folder, path = tmp_path / "pq", tmp_path / "ckpt.json"
    _parquet(folder, [600, 600])
    _read_then_save(_loader(str(folder)), path)
    _parquet(folder, [500, 700])  # same rows in total, other files: the fingerprint differs

    with pytest.raises(CheckpointError) as info:
        restore(_loader(str(folder)), path)
    assert str(path) in str(info.value)
    assert "source.fingerprint" in str(info.value)
    assert "allow_source_change=True" in str(info.value)

    dl = _loader(str(folder), allow_source_change=True)
    restore(dl, path)
    assert dl.state_dict()["cursors"] == checkpoint.load(path)["cursors"]


def test_parquet_rows_appended_names_the_source_and_the_override(tmp_path: Path) -> None:
    """Appended files change N too; the refusal still names the source and the override."""
    folder, path = tmp_path / "pq", tmp_path / "ckpt.json"
    _parquet(folder, [600, 600])
    _read_then_save(_loader(str(folder)), path)
    _parquet(folder, [600, 600, 100])
    with pytest.raises(CheckpointError, match="allow_source_change=True"):
        restore(_loader(str(folder)), path)
    restore(_loader(str(folder), allow_source_change=True), path)


# ---------------------------------------------------------------- plan mismatches

MISMATCHES: list[tuple[dict[str, Any], str]] = [
    ({"num_splits": 16}, "plan.num_splits=8"),
    ({"shuffle_seed": 4}, "plan.shuffle_seed=3"),
    ({"shuffle_clump_size": 8}, "plan.shuffle_clump_size=4"),
    ({"filter": "label != 4"}, "plan.filter"),
    ({"shuffle": False}, "plan.shuffle=True"),
    ({"columns": ["id"]}, "source.columns"),
]


@pytest.mark.parametrize(("changes", "field"), MISMATCHES, ids=[f for _, f in MISMATCHES])
def test_other_plan_is_refused_naming_file_and_field(
    db: str, tmp_path: Path, changes: dict[str, Any], field: str
) -> None:
    path = tmp_path / "ckpt.json"
    _read_then_save(_loader(_table(db), filter="label != 3"), path)
    dl = _loader(_table(db), **{"filter": "label != 3", **changes})
    with pytest.raises(CheckpointError) as info:
        restore(dl, path)
    assert str(path) in str(info.value) and field in str(info.value)
    assert dl.state_dict()["cursors"] == [0] * dl.streaming_dataset.num_splits


def test_other_table_is_refused(db: str, tmp_path: Path) -> None:
    path = tmp_path / "ckpt.json"
    _read_then_save(_loader(_table(db)), path)
    lancedb.connect(db).create_table("other", _rows(0, NUM_ROWS))
    with pytest.raises(CheckpointError, match=r"source\.uri=.*items\.lance.*other\.lance"):
        restore(_loader(_table(db, "other")), path)


def test_refused_state_leaves_the_loader_as_it_was(db: str, tmp_path: Path) -> None:
    """A refusal must not half-apply: the loader keeps the version it was built on."""
    path = tmp_path / "ckpt.json"
    _read_then_save(_loader(_table(db)), path)
    _table(db).add(_rows(NUM_ROWS, NUM_ROWS + 100))
    dl = _loader(_table(db), shuffle_seed=4)
    version = dl.streaming_dataset.source.spec.version
    with pytest.raises(CheckpointError, match="shuffle_seed"):
        restore(dl, path)
    assert dl.streaming_dataset.source.spec.version == version
    assert dl.streaming_dataset.num_rows == NUM_ROWS + 100


def test_world_size_must_divide_num_splits_unless_g_is_a_multiple_of_it(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ckpt.json"
    _read_then_save(_loader(_table(db)), path)
    three = StreamingDataset(_table(db), num_splits=NUM_SPLITS, rank=0, world_size=3)
    with pytest.raises(ValueError, match=r"world_size=3.*multiple of num_splits.*\[1, 2, 4, 8\]"):
        StreamingDataLoader(three, batch_size=5)  # G = 15
    assert StreamingDataLoader(three, global_batch_size=2 * NUM_SPLITS).batch_size == 5  # 5, 5, 6
    assert print_inspect(path) == 0
    out = capsys.readouterr().out
    assert "any W <= G with a global batch G that is a multiple of S=8" in out
    assert "world sizes 1, 2, 4, 8" in out
    assert "items, version 1 (pinned)" in out


# ---------------------------------------------------------------- damaged files

DAMAGE: dict[str, Callable[[bytes], bytes]] = {
    "truncated": lambda data: data[: len(data) // 2],
    "bit-flip": lambda data: data[:-40] + bytes([data[-40] ^ 0x04]) + data[-39:],
    "edited": lambda data: data.replace(b'"cursors":[', b'"cursors":[1', 1),
    "foreign": lambda data: b'{"run": "exp-7", "step": 100}',
    "future": lambda data: data.replace(b'"format_version":1,', b'"format_version":9,', 1),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_file_never_resumes(db: str, tmp_path: Path, damage: str) -> None:
    path = tmp_path / "ckpt.json"
    _read_then_save(_loader(_table(db)), path)
    path.write_bytes(DAMAGE[damage](path.read_bytes()))
    dl = _loader(_table(db))
    with pytest.raises(CheckpointError, match=str(path)):
        restore(dl, path)
    assert sorted(flat_ids(dl)) == list(range(NUM_ROWS))  # a fresh epoch, not a guessed position


# ---------------------------------------------------------------- identity (issue 10: 1, 2, 4, 17)


def test_table_dropped_and_recreated_is_refused_naming_version_id(db: str, tmp_path: Path) -> None:
    """Same name, schema, rows and version number: only the version's files tell them apart."""
    path = tmp_path / "ckpt.json"
    _read_then_save(_loader(_table(db)), path)
    saved = checkpoint.load(path)["source"]
    connection = lancedb.connect(db)
    connection.drop_table("items")
    recreated = connection.create_table("items", _rows(0, NUM_ROWS))
    assert recreated.version == saved["version"]

    dl = _loader(_table(db))
    with pytest.raises(CheckpointError) as info:
        restore(dl, path)
    assert "source.version_id" in str(info.value) and str(path) in str(info.value)
    assert dl.state_dict()["cursors"] == [0] * NUM_SPLITS


def test_state_without_version_id_still_loads(db: str, tmp_path: Path) -> None:
    """States written before `version_id` existed skip that one check (documented)."""
    dl = _loader(_table(db))
    it = iter(dl)
    head = flat_ids(next(it) for _ in range(BATCHES_BEFORE))
    state = dl.state_dict()
    del state["source"]["version_id"]
    resumed = _loader(_table(db))
    resumed.load_state_dict(state)
    assert sorted(head + flat_ids(resumed)) == list(range(NUM_ROWS))


def test_uri_is_absolute_and_another_working_directory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second, path = tmp_path / "a", tmp_path / "b", tmp_path / "ckpt.json"
    for root, start in ((first, 0), (second, 5000)):
        lance.write_dataset(_rows(start, start + NUM_ROWS), str(root / "data" / "items.lance"))
    monkeypatch.chdir(first)
    _read_then_save(_loader("data/items.lance"), path)
    assert checkpoint.load(path)["source"]["uri"] == str(first / "data" / "items.lance")

    monkeypatch.chdir(second)
    with pytest.raises(CheckpointError, match=r"source\.uri=.*/a/data/items\.lance"):
        restore(_loader("data/items.lance"), path)
    monkeypatch.chdir(first)  # the same table by another spelling resumes
    restore(_loader(f"file://{first}/data/../data/items.lance"), path)


def test_old_state_with_a_relative_uri_is_refused_unless_allowed(db: str) -> None:
    dl = _loader(_table(db))
    state = dl.state_dict()
    state["source"]["uri"] = "db/items.lance"
    with pytest.raises(ValueError, match=r"relative source\.uri='db/items\.lance'"):
        _loader(_table(db)).load_state_dict(state)
    _loader(_table(db), allow_source_change=True).load_state_dict(state)


def test_arrow_table_differing_only_in_the_middle_is_refused() -> None:
    table = _rows(0, NUM_ROWS)
    changed = table.set_column(0, "id", pa.array([*range(600), -1, *range(601, NUM_ROWS)]))
    dl = _loader(table)
    state = dl.state_dict()
    _loader(pa.concat_tables([table.slice(0, 100), table.slice(100)])).load_state_dict(state)
    with pytest.raises(ValueError, match=r"source\.fingerprint"):
        _loader(changed).load_state_dict(state)


def test_arrow_state_with_the_legacy_fingerprint_still_loads() -> None:
    """States written before the full fingerprint are compared with the one they carry."""
    table = _rows(0, NUM_ROWS)
    state = _loader(table).state_dict()
    state["source"]["fingerprint"] = legacy_table_fingerprint(table)
    _loader(table).load_state_dict(state)
    with pytest.raises(ValueError, match=r"source\.fingerprint='sha256:"):
        _loader(_rows(1, NUM_ROWS + 1)).load_state_dict(state)


@pytest.mark.filterwarnings("ignore:optimize.cleanup_older_than=0.:UserWarning")
def test_cleanup_during_the_epoch_says_the_pinned_version_was_removed(db: str) -> None:
    dataset = StreamingDataset(_table(db), num_splits=NUM_SPLITS, rank=0, world_size=1)
    dl = StreamingDataLoader(dataset, batch_size=BATCH, read_size=BATCH)  # a read per batch
    it = iter(dl)
    next(it)
    pinned = dl.streaming_dataset.source.spec.version
    table = _table(db)
    table.add(_rows(0, NUM_ROWS), mode="overwrite")
    table.optimize(cleanup_older_than=dt.timedelta(0), delete_unverified=True)
    with pytest.raises(PinnedVersionGoneError) as info:
        list(it)
    message = str(info.value)
    assert f"version {pinned}" in message and "were removed" in message
    assert "fresh state" in message and "tags.create" in message
