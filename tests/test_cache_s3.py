"""The node-local cache on a real S3 server (moto) behind a counting proxy (issue #35).

Two processes of one node, two DataLoader workers each, share one cache folder for several
epochs. The batches are compared with an uncached read of the same pinned version; the
proxy counts the bytes the store served; the store is stopped after the cache is warm; a
cached file is corrupted; a limit below the table's size is set.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pytest
from pyarrow import fs

from loader import StreamingDataLoader, StreamingDataset
from tests.netproxy import FaultProxy, Faults, http_response
from tests.object_store import S3Server

ROWS, PER_FILE, WORLD, SPLITS, BATCH = 4096, 512, 2, 4, 64
DOWN = http_response(503, "Slow Down", b"<Error><Code>SlowDown</Code></Error>")


def _table() -> pa.Table:
    rng = np.random.default_rng(0)
    payload = [rng.bytes(200) for _ in range(ROWS)]
    return pa.table({"id": np.arange(ROWS, dtype=np.int64), "blob": pa.array(payload)})


def _dataset(uri: str, options: dict[str, str], rank: int, **kw: Any) -> StreamingDataset:
    return StreamingDataset(
        uri, num_splits=SPLITS, rank=rank, world_size=WORLD, shuffle_seed=7, version=1,
        storage_options=options, **kw,
    )  # fmt: skip


def _ids(loader: Any) -> list[list[int]]:
    return [batch["id"].tolist() for batch in loader]


def _node_process(uri: str, options: dict[str, str], rank: int, cache: str, go: Any, out: Any):
    """One rank: builds its dataset once, then reads each epoch the driver asks for."""
    ds = _dataset(uri, options, rank, cache_dir=cache)
    loader = StreamingDataLoader(ds, batch_size=BATCH, num_workers=2)
    while (epoch := go.get()) is not None:
        try:
            ds.set_epoch(epoch)
            out.put((rank, epoch, _ids(loader)))
        except Exception as err:  # the driver reports it
            out.put((rank, epoch, repr(err)))


def _uncached(uri: str, options: dict[str, str], epoch: int, **kw: Any) -> dict[int, list]:
    found = {}
    for rank in range(WORLD):
        ds = _dataset(uri, options, rank, epoch=epoch, **kw)
        found[rank] = _ids(StreamingDataLoader(ds, batch_size=BATCH, num_workers=0))
    return found


def _whole(path: Path) -> bool:
    size, want = Path(f"{path}.sum").read_text().split()
    data = path.read_bytes()
    return len(data) == int(size) and hashlib.sha256(data).hexdigest() == want


@pytest.mark.slow
def test_a_cached_node_reads_identical_batches_from_the_store_once(
    s3_server: S3Server, tmp_path: Path
) -> None:
    bucket = s3_server.make_bucket()
    uri = f"s3://{bucket}/t.lance"
    lance.write_dataset(
        _table(), uri, max_rows_per_file=PER_FILE, storage_options=s3_server.storage_options
    )
    store = s3_server.pyarrow_fs()
    data = store.get_file_info(fs.FileSelector(f"{bucket}/t.lance/data"))
    table_bytes = sum(info.size for info in data)
    reference = {e: _uncached(uri, s3_server.storage_options, e) for e in range(4)}
    cache = tmp_path / "cache"

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with FaultProxy((s3_server.host, s3_server.port)) as proxy:
        options = {**s3_server.storage_options, "endpoint": proxy.endpoint}
        gos = [ctx.Queue() for _ in range(WORLD)]
        procs = [
            ctx.Process(target=_node_process, args=(uri, options, r, str(cache), gos[r], out))
            for r in range(WORLD)
        ]
        for p in procs:
            p.start()

        def epoch(e: int) -> int:
            before = proxy.counts.bytes_down
            for go in gos:
                go.put(e)
            got = dict((rank, ids) for rank, _, ids in (out.get(timeout=300) for _ in gos))
            assert got == reference[e], f"epoch {e}: batches differ from the uncached read"
            return proxy.counts.bytes_down - before

        try:
            cold = epoch(0)
            first = dict(proxy.counts.by_request)
            warm = epoch(1)
            proxy.faults = Faults(answer=DOWN)  # the store stops answering
            epoch(2)
            proxy.faults = Faults()
            files = sorted((cache).glob("*/files/data/*.lance"))
            assert len(files) == len(data), "every data file cached once on the node"
            victim = files[0]
            victim.write_bytes(b"\0" * victim.stat().st_size)  # corrupted, same size
            refetched = epoch(3)
        finally:
            for go in gos:
                go.put(None)
            for p in procs:
                p.join(60)
    assert cold >= table_bytes * 0.9, (cold, table_bytes)
    for info in data:  # one downloader per node: each file's bytes and one answer's head
        assert info.size <= first[f"GET /{info.path}"] <= info.size + 1024, info.path
    assert warm <= 0.05 * table_bytes, f"epoch 2 read {warm} of {table_bytes} bytes from the store"
    assert refetched > 0 and _whole(victim), "the corrupted file was fetched again"

    # A limit below the table's size: the same batches, the folder kept near the limit.
    small = tmp_path / "small"
    limit = table_bytes // 3
    limited = _uncached(uri, s3_server.storage_options, 1, cache_dir=small, cache_limit=limit)
    assert limited == reference[1]
    kept = sum(p.stat().st_size for p in small.glob("*/files/data/*.lance"))
    assert kept <= limit


@pytest.mark.slow
@pytest.mark.parametrize("prefetch", [0, None], ids=["prefetch-off", "prefetch-on"])
def test_the_store_bytes_it_counts_are_the_proxys_but_manifests_and_headers(
    s3_server: S3Server, tmp_path: Path, prefetch: int | None
) -> None:
    """`bytes_from_store` counts each data file fetched whole, once; what else the store
    serves is the manifest (read by Lance to pin the version, fetched once into the mirror),
    the listing of `_versions/`, HEADs and HTTP headers (docs/cache.md, "What the counters
    count"). A cold epoch, w = 0, the default reads in flight (the read threads open the
    mirror at once when nothing prefetches); the proxy counts per request."""
    from loader.cache_stats import node_stats

    bucket = s3_server.make_bucket()
    uri = f"s3://{bucket}/t.lance"
    lance.write_dataset(
        _table(), uri, max_rows_per_file=PER_FILE, storage_options=s3_server.storage_options
    )
    store = s3_server.pyarrow_fs()
    sizes = {
        f"GET /{info.path}": info.size
        for folder in ("data", "_versions")
        for info in store.get_file_info(fs.FileSelector(f"{bucket}/t.lance/{folder}"))
    }
    (manifest,) = [key for key in sizes if "/_versions/" in key]
    manifest_size = sizes.pop(manifest)
    with FaultProxy((s3_server.host, s3_server.port)) as proxy:
        options = {**s3_server.storage_options, "endpoint": proxy.endpoint}
        ds = StreamingDataset(
            uri, num_splits=8, shuffle_seed=7, version=1, storage_options=options,
            cache_dir=tmp_path / "cache", rank=0, world_size=1, shuffle_clump_size=64,
        )  # fmt: skip
        loader = StreamingDataLoader(ds, batch_size=16, cache_prefetch_bytes=prefetch)
        assert sum(map(len, _ids(loader))) == ROWS
        served = dict(proxy.counts.by_request)
    counts = node_stats(str(tmp_path / "cache"), since=0)
    assert counts["misses"] == len(sizes) and counts["bytes_from_store"] == sum(sizes.values())
    for key, size in sizes.items():  # each file whole, once: its bytes and one answer's head
        assert size <= served.pop(key) <= size + 1024, key
    assert served.pop(manifest) <= 2 * (manifest_size + 1024), "the manifest: the pin, the mirror"
    rest = {k: v for k, v in served.items() if not k.startswith("HEAD ")}
    outside = [k for k in rest if k != f"GET /{bucket}" and "/_versions/" not in k]
    assert not outside, f"the store served more than the cache counted: {outside}"
    assert sum(served.values()) <= 0.05 * sum(sizes.values()), served


@pytest.mark.slow
def test_threads_opening_one_mirror_at_once_fetch_its_manifest_once(
    s3_server: S3Server, tmp_path: Path
) -> None:
    """A node's read threads (and processes) opening a mirror together, before any has it:
    one fetches the manifest, the others wait for it (a lock per mirror), not one fetch
    each. Separate `NodeCache`s stand for processes; 50 ms a request widens the window."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    from loader.cache import CacheSpec, NodeCache
    from loader.sources.lance import version_id

    bucket = s3_server.make_bucket()
    uri = f"s3://{bucket}/t.lance"
    lance.write_dataset(_table(), uri, storage_options=s3_server.storage_options)
    pinned = lance.dataset(uri, storage_options=s3_server.storage_options)
    store = s3_server.pyarrow_fs()
    (manifest,) = store.get_file_info(fs.FileSelector(f"{bucket}/t.lance/_versions"))
    spec, start = CacheSpec(str(tmp_path / "c")), Barrier(8)
    with FaultProxy((s3_server.host, s3_server.port), Faults(delay_s=0.05)) as proxy:
        options = {**s3_server.storage_options, "endpoint": proxy.endpoint}

        def open_mirror(_: int) -> str:
            cache = NodeCache(spec, uri, options)
            start.wait(timeout=60)
            opened = cache.mirror(
                pinned.version,
                version_id(pinned),
                lambda url: lance.dataset(url, version=pinned.version),
                version_id,
            )
            return version_id(opened)

        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(open_mirror, range(8))) == [version_id(pinned)] * 8
        served = proxy.counts.by_request.get(f"GET /{manifest.path}", 0)
    assert manifest.size <= served <= manifest.size + 1024, (
        f"{served} bytes served for a manifest of {manifest.size}: fetched more than once"
    )
