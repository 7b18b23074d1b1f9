"""The node cache driven by the plan: Belady eviction, the prefetcher, its lead in the node
stats, a full cache disk, and a resume on another W through a warm cache (issue #35)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader import StreamingDataLoader, StreamingDataset
from loader.cache_plan import NEVER, FileUses, belady_order
from loader.cache_stats import node_stats
from tests.net import wait_until

ROWS, PER_FILE, BATCH = 8000, 250, 64
REPO = Path(__file__).resolve().parents[1]


# -- Belady's choice, at the NumPy level -------------------------------------------------


def _true_next(sequence: list[int], now: int, fragment: int) -> int:
    """The brute force: the first time >= now the sequence uses `fragment`."""
    for t in range(now, len(sequence)):
        if sequence[t] == fragment:
            return t
    return int(NEVER)


@settings(max_examples=200, deadline=None)
@given(
    data=st.data(),
    fragments=st.integers(2, 12),
    length=st.integers(1, 300),
)
def test_the_eviction_choice_is_belady_on_generated_use_sequences(
    data: st.DataObject, fragments: int, length: int
) -> None:
    """One split, one row a fragment use: the table's next uses are the sequence's, and the
    first victim among any cached files is one whose next use is furthest (never: first)."""
    sequence = data.draw(st.lists(st.integers(0, fragments - 1), min_size=length, max_size=length))
    files = [[f"data/{i}.lance"] for i in range(fragments)]
    # positions are the fragments themselves: fragment i holds row i
    uses = FileUses.build(
        lambda split: np.asarray(sequence, dtype=np.int64),
        [0],
        np.arange(fragments + 1, dtype=np.int64),
        files,
        len(sequence),
    )
    now = data.draw(st.integers(0, length))
    cached = data.draw(st.lists(st.integers(0, fragments - 1), min_size=1, unique=True))
    ages = data.draw(st.lists(st.integers(0, 5), min_size=len(cached), max_size=len(cached)))
    got = uses.next_use([files[i][0] for i in cached], now)
    truth = [_true_next(sequence, now, i) for i in cached]
    assert got.tolist() == truth
    order = belady_order(got, np.asarray(ages))
    first = int(order[0])
    assert truth[first] == max(truth), "the furthest next use goes first"
    ties = [ages[i] for i in range(len(cached)) if truth[i] == truth[first]]
    assert ages[first] == min(ties), "ties: the least recently used"
    assert uses.next_use(["data/other.lance"], now).tolist() == [NEVER], "unknown: no use"


# -- the node stats' counter and gauge ---------------------------------------------------


def test_node_stats_sum_counters_and_take_the_smallest_live_lead(tmp_path: Path) -> None:
    """The lead is a gauge: never summed, the smallest among live processes that prefetch,
    and a dead process's last file does not hold it."""
    stats = tmp_path / "stats"
    stats.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        for pid, lead, prefetched in (
            (os.getpid(), 7, 2), (sleeper.pid, 4, 3), (dead.pid, 1, 5), (os.getpid() + 0, None, 1),
        ):  # fmt: skip
            body = {"hits": 1, "prefetched": prefetched, "prefetch_lead": lead}
            (stats / f"{pid}-{prefetched}.json").write_text(json.dumps(body))
        found = node_stats(str(tmp_path), since=0)
        assert found["prefetched"] == 11 and found["hits"] == 4
        assert found["prefetch_lead"] == 4
    finally:
        sleeper.kill()
        sleeper.wait()
    assert node_stats(str(tmp_path), since=0)["prefetch_lead"] == 7, "the sleeper died"
    (stats / f"{os.getpid()}-2.json").unlink()
    assert node_stats(str(tmp_path), since=0)["prefetch_lead"] is None, "none prefetches"


# -- the loader: prefetch and eviction on a local table ------------------------------------


def _blobs() -> pa.Array:
    rng = np.random.default_rng(0)  # incompressible: a file is ~50 KB on disk
    return pa.array([rng.bytes(200) for _ in range(ROWS)])


def _write(path: Path) -> str:
    ids = np.arange(ROWS, dtype=np.int64)
    blobs = _blobs()
    lance.write_dataset(pa.table({"id": ids, "b": blobs}), path, max_rows_per_file=PER_FILE)
    return str(path)


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _write(tmp_path_factory.mktemp("t") / "t.lance")


def _loader(uri: str, num_workers: int = 0, **kw: Any) -> StreamingDataLoader:
    prefetch = kw.pop("cache_prefetch_bytes", None)
    in_flight = kw.pop("reads_in_flight", None)
    clump = kw.pop("shuffle_clump_size", 64)
    ds = StreamingDataset(
        uri, num_splits=4, rank=0, world_size=1, shuffle_seed=3, shuffle_clump_size=clump,
        storage_options=kw.pop("storage_options", None), **kw,
    )  # fmt: skip
    return StreamingDataLoader(
        ds, batch_size=BATCH, read_size=BATCH, num_workers=num_workers,
        cache_prefetch_bytes=prefetch, reads_in_flight=in_flight,
    )  # fmt: skip


def _ids(loader: StreamingDataLoader) -> list[list[int]]:
    return [batch["id"].tolist() for batch in loader]


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "elastic-loader-prefetch"]


def test_prefetch_fetches_ahead_reports_its_lead_and_stops(table: str, tmp_path: Path) -> None:
    plain = _ids(_loader(table))
    cache = tmp_path / "c"
    loader = _loader(table, cache_dir=cache)
    leads, got = [], []
    for i, batch in enumerate(loader):
        got.append(batch["id"].tolist())
        if i % 10 == 0:
            loader.streaming_dataset.reader._rows().cache.write_stats(force=True)
            leads.append(node_stats(str(cache), since=0)["prefetch_lead"])
    assert got == plain, "prefetch never changes the batches"
    totals = node_stats(str(cache), since=0)
    assert totals["prefetched"] > 0, totals
    assert any(lead is not None and lead > 0 for lead in leads), leads
    assert totals["prefetch_lead"] is None, "the loop ended: nothing prefetches"
    wait_until(lambda: not _prefetch_threads(), 30, "the prefetcher to stop")

    dropped = iter(_loader(table, cache_dir=tmp_path / "d"))
    next(dropped)
    assert _prefetch_threads()
    del dropped  # the iterator dropped mid-epoch: the prefetcher stops
    wait_until(lambda: not _prefetch_threads(), 30, "the dropped loader's prefetcher to stop")


def test_a_failing_store_is_reported_by_the_read_not_the_prefetcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table's data files vanish from the store: the prefetcher's fetches fail quietly
    and the read that needs a file raises; no exception escapes a background thread."""
    uri = _write(tmp_path / "t.lance")
    escaped: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", escaped.append)
    loader = _loader(uri, cache_dir=tmp_path / "c")
    rows = iter(loader)
    next(rows)
    for path in Path(uri, "data").glob("*.lance"):
        path.unlink()
    with pytest.raises(OSError, match=r"removed|failed"):
        for _ in rows:
            pass
    wait_until(lambda: not _prefetch_threads(), 30, "the prefetcher to stop")
    assert not escaped, escaped


def test_reads_in_flight_under_a_tight_limit_keep_their_files(table: str, tmp_path: Path) -> None:
    """Four reads at once, a limit of a third of the table: a read pins its files before
    fetching them, so another read's eviction never removes them before it reads (they
    were once removed between the fetch and the read, twice, and the read failed)."""
    limit = sum(p.stat().st_size for p in Path(table, "data").glob("*.lance")) // 3
    plain = _ids(_loader(table, shuffle_clump_size=1))
    cached = _loader(
        table, cache_dir=tmp_path / "c", cache_limit=limit, reads_in_flight=4,
        cache_prefetch_bytes=0, shuffle_clump_size=1,
    )  # fmt: skip
    assert _ids(cached) == plain
    assert node_stats(str(tmp_path / "c"), since=0)["evictions"] > 0


def test_cache_prefetch_bytes_argument(table: str) -> None:
    ds = StreamingDataset(table, num_splits=4, rank=0, world_size=1, shuffle_seed=3)
    assert (
        StreamingDataLoader(ds, batch_size=8, cache_prefetch_bytes="1MiB").cache_prefetch_bytes
        == 2**20
    )
    assert StreamingDataLoader(ds, batch_size=8, cache_prefetch_bytes=0).cache_prefetch_bytes == 0
    for bad in ("lots", -1, True):
        with pytest.raises(ValueError, match="cache_prefetch_bytes"):
            StreamingDataLoader(ds, batch_size=8, cache_prefetch_bytes=bad)


def test_full_cache_disk_is_a_clear_error_and_leaves_no_partial_file(
    table: str, tmp_path: Path
) -> None:
    """A real 600 KB tmpfs (in a private mount namespace) below the table's 2 MB: the read
    fails naming the folder and cache_limit; every file left is whole or absent; with a
    cache_limit that fits the disk the same rows are read."""
    where = tmp_path / "small"
    where.mkdir()
    child = REPO / "tests" / "full_disk_job.py"
    mount = f"mount -t tmpfs -o size=600k tmpfs {where} && exec {sys.executable} {child} {table} {where}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = ["unshare", "-m", "sh", "-c", mount]
    if os.geteuid() != 0:
        command.insert(1, "-r")  # a user namespace of its own maps this user to root there
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["mounted"] < 1_000_000, "the cache really is the small filesystem"
    assert str(where) in report["error"] and "cache_limit" in report["error"], report
    assert "full" in report["error"], report
    assert report["partial"] == [] and report["tmp"] == [], report
    assert report["whole"] > 0, report
    assert report["limited"] == _ids(_loader(table)), "a limit that fits: the same rows"


# -- Belady against LRU on the store's bytes ----------------------------------------------


@pytest.mark.slow
def test_belady_and_prefetch_read_fewer_store_bytes_than_lru(
    s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A limit below the table: the proxy counts what the store serves for two epochs of
    each policy; the batches are identical to an uncached read. Two reads in flight: the
    files they hold stay well under the limit (docs/cache.md, sizing)."""
    from loader.read import reader as reader_module
    from tests.netproxy import FaultProxy

    bucket = s3_server.make_bucket()
    uri = f"s3://{bucket}/t.lance"
    ids = np.arange(ROWS, dtype=np.int64)
    lance.write_dataset(
        pa.table({"id": ids, "b": _blobs()}), uri,
        max_rows_per_file=PER_FILE, storage_options=s3_server.storage_options,
    )  # fmt: skip
    table_bytes = sum(
        p.stat().st_size for p in Path(_write(tmp_path / "same.lance"), "data").glob("*")
    )

    def two_epochs(options: dict[str, str], **kw: Any) -> list[list[list[int]]]:
        loader = _loader(uri, storage_options=options, reads_in_flight=2, **kw)
        out = []
        for epoch in range(2):
            loader.streaming_dataset.set_epoch(epoch)
            out.append(_ids(loader))
        return out

    plain = two_epochs(s3_server.storage_options)
    served = {}
    with FaultProxy((s3_server.host, s3_server.port)) as proxy:
        options = {**s3_server.storage_options, "endpoint": proxy.endpoint}
        for policy in ("lru", "belady", "belady+prefetch"):
            with monkeypatch.context() as patch:
                if policy == "lru":  # the reads know no clock: least recently used
                    patch.setattr(
                        reader_module.BatchReader, "_clock", lambda s, t: contextlib.nullcontext()
                    )
                before = proxy.counts.bytes_down
                got = two_epochs(
                    options, cache_dir=tmp_path / policy, cache_limit=table_bytes // 2,
                    cache_prefetch_bytes=None if policy == "belady+prefetch" else 0,
                )  # fmt: skip
                served[policy] = proxy.counts.bytes_down - before
            assert got == plain, f"{policy}: the batches differ from the uncached read"
    print(f"store bytes by policy (table {table_bytes}): {served}")  # the figure docs cite
    assert served["belady"] < served["lru"], served
    assert served["belady+prefetch"] < served["lru"], served


# -- resume on another W through the warm cache --------------------------------------------


@pytest.mark.slow
def test_resume_on_3_ranks_through_the_cache_2_ranks_warmed(tmp_path: Path) -> None:
    """2 ranks read 5 steps through a cache whose limit is below the table and save; 3 ranks
    resume with the same (warm) cache: the global batches of an uncached uninterrupted run,
    every row once."""
    import lancedb

    from tests.dist_job import GLOBAL_BATCH, NUM_SPLITS
    from tests.tables import make_rows
    from tests.test_distributed import global_batches, launch

    db = tmp_path / "db"
    table = lancedb.connect(str(db)).create_table("rows", make_rows(0, 100))
    for start in range(100, 600, 100):  # six fragments: a limit can hold some of them
        table.add(make_rows(start, start + 100))
    reference_ds = StreamingDataset(
        table, num_splits=NUM_SPLITS, shuffle_clump_size=3, shuffle_seed=7, rank=0, world_size=1
    )
    reference = [
        sorted(b["id"].tolist()) for b in StreamingDataLoader(reference_ds, batch_size=GLOBAL_BATCH)
    ]
    data = Path(table.to_lance().uri) / "data"
    limit = sum(p.stat().st_size for p in data.glob("*.lance")) // 2
    cache = {"cache_dir": str(tmp_path / "cache"), "cache_limit": limit}
    first = launch(
        2, {"db": str(db), "steps": 5, "save": str(tmp_path / "a.json"), **cache}, tmp_path / "w2"
    )
    warm = sorted((tmp_path / "cache").glob("*/files/data/*.lance"))
    assert warm, "the first run left files in the cache"
    second = launch(
        3,
        {
            "db": str(db),
            "save": str(tmp_path / "b.json"),
            "resume": str(tmp_path / "a.json"),
            **cache,
        },
        tmp_path / "w3",
    )
    got = global_batches(first) + global_batches(second)
    assert got == reference, "the global batches of one uncached uninterrupted rank"
    assert sorted(i for batch in got for i in batch) == list(range(600)), "every row once"
    kept = sum(p.stat().st_size for p in (tmp_path / "cache").glob("*/files/data/*.lance"))
    assert kept <= limit
