"""The node-local cache on local Lance tables: what a crash, a damaged or deleted file, a
rewritten table and concurrent processes leave, and the arguments (issue #35)."""

from __future__ import annotations

import shutil
import threading
import warnings
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest

import loader
from loader import StreamingDataset
from loader.cache import CacheSpec, NodeCache, fragment_files, parse_limit
from loader.sources.lance import version_id
from tests.imports import assert_no_cycle, import_graph

ROWS, PER_FILE = 2000, 250


def _write(path: Path, offset: int = 0) -> str:
    ids = np.arange(offset, offset + ROWS, dtype=np.int64)
    lance.write_dataset(pa.table({"id": ids, "x": ids * 2.0}), path, max_rows_per_file=PER_FILE)
    return str(path)


def _ids(uri: str, **kw: object) -> list[int]:
    ds = StreamingDataset(uri, num_splits=4, rank=0, world_size=1, shuffle_seed=3, **kw)
    return [int(row["id"]) for row in ds]


@pytest.fixture
def table(tmp_path: Path) -> str:
    return _write(tmp_path / "t.lance")


def _cached(cache: Path) -> list[Path]:
    return sorted(cache.glob("*/files/data/*.lance"))


def test_cold_warm_and_over_the_limit_read_the_same_rows(table: str, tmp_path: Path) -> None:
    plain = _ids(table)
    cache = tmp_path / "c"
    assert _ids(table, cache_dir=cache) == plain  # cold
    assert len(_cached(cache)) == ROWS // PER_FILE
    assert _ids(table, cache_dir=cache) == plain  # warm
    assert _ids(table, cache_dir=tmp_path / "s", cache_limit="20KB") == plain  # over its limit
    assert sum(p.stat().st_size for p in _cached(tmp_path / "s")) <= 20_000


@pytest.mark.parametrize("damage", ["truncated", "corrupted", "deleted", "no sum", "tmp left"])
def test_a_damaged_cache_file_is_fetched_again_never_read_as_data(
    table: str, tmp_path: Path, damage: str
) -> None:
    """The states a kill -9 or a disk can leave: each is refetched, the rows unchanged."""
    cache = tmp_path / "c"
    plain = _ids(table, cache_dir=cache)
    victim = _cached(cache)[0]
    whole = victim.read_bytes()
    if damage == "truncated":
        victim.write_bytes(whole[: len(whole) // 2])
    elif damage == "corrupted":
        victim.write_bytes(bytes(len(whole)))
    elif damage == "deleted":
        victim.unlink()
    elif damage == "no sum":  # killed after the sum was removed: never whole without it
        Path(f"{victim}.sum").unlink()
    else:  # killed mid-download: a temporary file and no target
        victim.rename(victim.with_name(f".{victim.name}.123.4.tmp"))
    assert _ids(table, cache_dir=cache) == plain
    assert victim.read_bytes() == whole


def test_a_file_deleted_under_a_reader_is_fetched_again(table: str, tmp_path: Path) -> None:
    ds = StreamingDataset(
        table, num_splits=4, rank=0, world_size=1, shuffle_seed=3, cache_dir=tmp_path / "c"
    )
    rows = iter(ds)
    first = [int(next(rows)["id"]) for _ in range(10)]
    for path in _cached(tmp_path / "c"):
        path.unlink()
    rest = [int(row["id"]) for row in rows]
    assert first + rest == _ids(table)


def test_a_rewritten_table_is_never_served_from_the_stale_copy(tmp_path: Path) -> None:
    """Dropped and recreated at the same path and version number: other files, other ids."""
    uri = _write(tmp_path / "t.lance")
    cache = tmp_path / "c"
    old = _ids(uri, cache_dir=cache)
    shutil.rmtree(uri)
    _write(tmp_path / "t.lance", offset=10_000)
    new = _ids(uri, cache_dir=cache)
    assert min(new) >= 10_000 and sorted(old) != sorted(new)
    assert new == _ids(uri)


def test_one_downloader_per_file_among_concurrent_readers(table: str, tmp_path: Path) -> None:
    """Separate caches in threads stand for processes: fcntl locks are per open file."""
    ds = lance.dataset(table)
    files = [f for fragment in ds.get_fragments() for f in fragment_files(fragment)]
    spec = CacheSpec(str(tmp_path / "c"))
    caches = [NodeCache(spec, table, None) for _ in range(4)]
    threads = [threading.Thread(target=c.ensure, args=(files,)) for c in caches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(c.counts.misses for c in caches) == len(files)
    assert sum(c.counts.hits for c in caches) == 3 * len(files)
    assert version_id(
        caches[0].mirror(ds.version, version_id(ds), lance.dataset, version_id)
    ) == version_id(ds)


def test_the_cache_modules_import_without_a_cycle() -> None:
    """The mirror (table identity) is below the cache's files: it never imports them."""
    graph = import_graph(Path(loader.__file__).parent, "loader")
    cache = {name for name in graph if name.startswith("cache")}
    assert graph["cache_mirror"] & cache == set()
    assert_no_cycle({name: graph[name] & cache for name in cache})


def test_cache_arguments(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, table: str) -> None:
    assert parse_limit("200GB") == 200 * 10**9
    assert parse_limit("1.5KiB") == 1536
    assert parse_limit(10) == 10
    for bad in ("lots", "-1GB", 0, "12XB"):
        with pytest.raises(ValueError, match="cache_limit"):
            parse_limit(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cache_dir"):
        CacheSpec.of("s3://bucket/cache", None)
    monkeypatch.setenv("ELASTIC_LOADER_CACHE_DIR", str(tmp_path / "env"))
    assert _ids(table) == _ids(table, cache_dir=tmp_path / "other")
    assert _cached(tmp_path / "env")


def test_node_totals_reach_the_collector_and_metrics(table: str, tmp_path: Path) -> None:
    """Two readers of one node cache: their summed counts go out in a `cache` event, which
    the collector accepts and `/metrics` serves per host and folder."""
    from prometheus_client.parser import text_string_to_metric_families

    from loader import StreamingDataLoader
    from loader.telemetry.client import TelemetryClient
    from loader.telemetry.reporter import TelemetryReporter
    from tests.collector_api import collector_client, post

    cache = tmp_path / "c"
    plain = _ids(table, cache_dir=cache)
    assert _ids(table, cache_dir=cache) == plain  # a second process's read: all hits
    ds = StreamingDataset(table, num_splits=4, rank=0, world_size=1, cache_dir=cache)
    static = {"rank": 0, "world_size": 1, "num_splits": 4, "host": "node-a"}
    with warnings.catch_warnings():  # nothing listens on port 9: the warning is expected
        warnings.simplefilter("ignore")
        client = TelemetryClient("http://127.0.0.1:9", "cache-run", static, interval_s=3600)
        try:
            reporter = TelemetryReporter(client, StreamingDataLoader(ds, batch_size=8))
            reporter.tell_caches()
            events = [client._progress(), *client._drain()[1:]]
            client._number(events)  # as the sender thread does before a batch goes out
        finally:
            client.close(0.1)
    ours = [e for e in events if e["kind"] == "cache"]
    assert len(ours) == 1 and ours[0]["data"]["cache_dir"] == str(cache)
    files = ours[0]["data"]
    assert files["misses"] == ROWS // PER_FILE
    assert files["prefetched"] == 0 and files["prefetch_lead"] is None, "nothing prefetched"
    with collector_client(tmp_path / "m.db") as c:
        assert post(c, events).status_code == 202
        text = c.get("/metrics").text
        assert c.get("/api/runs/cache-run/timeline").json()["count"] == 0  # not a milestone
    found = {
        (s.name, s.labels.get("cache_dir")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert found[("elastic_loader_node_cache_misses_total", str(cache))] == files["misses"]
    assert found[("elastic_loader_node_cache_hits_total", str(cache))] == files["hits"] > 0
    table_bytes = sum(p.stat().st_size for p in _cached(cache))
    assert found[("elastic_loader_node_cache_bytes_from_store_total", str(cache))] == table_bytes


@pytest.mark.slow
def test_kill_9_mid_download_leaves_nothing_taken_as_whole(tmp_path: Path) -> None:
    """A downloader killed while writing: its lock dies with it, its temporary file is never
    read, and the next process fetches the file whole."""
    import os
    import signal
    import subprocess
    import sys

    from tests.net import wait_until

    ids = np.arange(200_000, dtype=np.int64)
    uri = str(tmp_path / "big.lance")
    lance.write_dataset(pa.table({"id": ids, "x": ids * 2.0}), uri)
    rel = fragment_files(lance.dataset(uri).get_fragments()[0])[0]
    root = tmp_path / "c"
    child = (
        "import sys, loader.cache as c; c.CHUNK = 1; "  # one byte a read: slow enough to kill
        "c.NodeCache(c.CacheSpec(sys.argv[1]), sys.argv[2], None).ensure([sys.argv[3]])"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", child, str(root), uri, rel], env=env)
    try:
        wait_until(
            lambda: any(p.stat().st_size > 0 for p in root.glob("*/files/data/.*.tmp")),
            60, "the download to begin",
        )  # fmt: skip
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL, "killed mid-download, not finished"
    assert list(root.glob("*/files/data/.*.tmp")), "the temporary file it left"
    assert not _cached(root), "nothing half-written under the file's name"
    cache = NodeCache(CacheSpec(str(root)), uri, None)
    cache.ensure([rel])
    assert cache.counts.misses == 1
    assert _cached(root)[0].read_bytes() == (Path(uri) / rel).read_bytes()
