"""Rows/s from an object store with and without the node cache (issue #35).

A Lance table on a local S3 server (moto) behind the tests' proxy, which adds a round trip
(`--delay-ms`) to every request, as a real store costs. One process, w = 0, S = 8,
C = 1,024, b = 1,024; each case reads one epoch: `uncached` straight from the store,
`cold` through an empty cache with prefetch off (`cache_prefetch_bytes=0`: every file
fetched once, whole, when a read first needs it), `prefetch` through another empty cache
with the default prefetch (the next tasks' files fetched in the background), `warm` from
the cache filled by `cold` (the store is not asked for data). The proxy counts the bytes
the store served in each (`store_mb`), the cache its own (`cache_mb`, `bytes_from_store`).
`benchmarks/issue35.py` runs `one_round` beside items 7 and 8.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/cache.py --rows 262144 --delay-ms 20
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loader import StreamingDataLoader, StreamingDataset
from loader.cache_stats import node_stats
from tests.netproxy import FaultProxy, Faults
from tests.object_store import running_s3_server


def _epoch(
    uri: str, options: dict[str, str], prefetch: int | None = 0, **cache: object
) -> tuple[int, float]:
    ds = StreamingDataset(
        uri, num_splits=8, shuffle_clump_size=1024, rank=0, world_size=1, shuffle_seed=1,
        storage_options=options, **cache,
    )  # fmt: skip
    started, rows = time.perf_counter(), 0
    loader = StreamingDataLoader(ds, batch_size=1024, num_workers=0, cache_prefetch_bytes=prefetch)
    for batch in loader:
        rows += len(batch["id"])
    return rows, time.perf_counter() - started


def s3_table(server: Any, rows: int, per_file: int = 32_768) -> str:
    """The benchmark's table (id, x, a 256 B blob; `per_file` rows a file) on `server`."""
    rng = np.random.default_rng(0)
    table = pa.table(
        {
            "id": np.arange(rows, dtype=np.int64),
            "x": rng.random((rows,)),
            "blob": pa.array([rng.bytes(256) for _ in range(rows)]),
        }
    )
    uri = f"s3://{server.make_bucket()}/t.lance"
    lance.write_dataset(
        table, uri, max_rows_per_file=per_file, storage_options=server.storage_options
    )
    return uri


def one_round(uri: str, server: Any, proxy: FaultProxy, folder: str) -> dict[str, dict[str, float]]:
    """One epoch of each case (uncached, cold, prefetch, warm), `cold` and `prefetch` in
    empty caches under `folder`: rows/s, seconds, MB the proxy saw and MB the cache counted
    from the store."""
    options = {**server.storage_options, "endpoint": proxy.endpoint}
    out = {}
    for name, cache in (
        ("uncached", {}),
        ("cold", {"cache_dir": f"{folder}/c"}),
        ("prefetch", {"cache_dir": f"{folder}/p", "prefetch": None}),
        ("warm", {"cache_dir": f"{folder}/c"}),
    ):
        before = proxy.counts.bytes_down
        counted = node_stats(str(cache["cache_dir"]), since=0) if cache else {}
        rows, seconds = _epoch(uri, options, **cache)
        after = node_stats(str(cache["cache_dir"]), since=0) if cache else {}
        out[name] = {
            "rows_per_s": round(rows / seconds),
            "seconds": round(seconds, 2),
            "store_mb": round((proxy.counts.bytes_down - before) / 1e6, 1),
            "cache_mb": round(
                ((after.get("bytes_from_store") or 0) - (counted.get("bytes_from_store") or 0))
                / 1e6,
                1,
            ),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=262_144)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    args = parser.parse_args()
    with running_s3_server() as server, tempfile.TemporaryDirectory() as tmp:
        uri = s3_table(server, args.rows)
        with FaultProxy((server.host, server.port), Faults(delay_s=args.delay_ms / 1000)) as proxy:
            out: dict[str, Any] = one_round(uri, server, proxy, tmp)
    out["prefetch_over_cold"] = round(out["prefetch"]["rows_per_s"] / out["cold"]["rows_per_s"], 2)
    out["warm_over_uncached"] = round(out["warm"]["rows_per_s"] / out["uncached"]["rows_per_s"], 1)
    print(json.dumps({"rows": args.rows, "delay_ms": args.delay_ms, **out}, indent=1))


if __name__ == "__main__":
    main()
