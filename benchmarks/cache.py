"""Rows/s from an object store with and without the node cache (issue #35).

A Lance table on a local S3 server (moto) behind the tests' proxy, which adds a round trip
(`--delay-ms`) to every request, as a real store costs. One process, w = 0, S = 8,
C = 1,024, b = 1,024; each case reads one epoch: `uncached` straight from the store,
`cold` through an empty cache with prefetch off (`cache_prefetch_bytes=0`: every file
fetched once, whole, when a read first needs it), `prefetch` through another empty cache
with the default prefetch (the next tasks' files fetched in the background), `warm` from
the cache filled by `cold` (the store is not asked for data). The proxy counts the bytes
the store served in each.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/cache.py --rows 262144 --delay-ms 20
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loader import StreamingDataLoader, StreamingDataset
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=262_144)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    table = pa.table(
        {
            "id": np.arange(args.rows, dtype=np.int64),
            "x": rng.random((args.rows,)),
            "blob": pa.array([rng.bytes(256) for _ in range(args.rows)]),
        }
    )
    with running_s3_server() as server, tempfile.TemporaryDirectory() as tmp:
        uri = f"s3://{server.make_bucket()}/t.lance"
        lance.write_dataset(
            table, uri, max_rows_per_file=32_768, storage_options=server.storage_options
        )
        with FaultProxy((server.host, server.port)) as proxy:
            proxy.faults = Faults(delay_s=args.delay_ms / 1000)
            options = {**server.storage_options, "endpoint": proxy.endpoint}
            out = {}
            for name, cache in (
                ("uncached", {}),
                ("cold", {"cache_dir": f"{tmp}/c"}),
                ("prefetch", {"cache_dir": f"{tmp}/p", "prefetch": None}),
                ("warm", {"cache_dir": f"{tmp}/c"}),
            ):
                before = proxy.counts.bytes_down
                rows, seconds = _epoch(uri, options, **cache)
                out[name] = {
                    "rows_per_s": round(rows / seconds),
                    "seconds": round(seconds, 2),
                    "store_mb": round((proxy.counts.bytes_down - before) / 1e6, 1),
                }
    out["prefetch_over_cold"] = round(out["prefetch"]["rows_per_s"] / out["cold"]["rows_per_s"], 2)
    out["warm_over_uncached"] = round(out["warm"]["rows_per_s"] / out["uncached"]["rows_per_s"], 1)
    print(json.dumps({"rows": args.rows, "delay_ms": args.delay_ms, **out}, indent=1))


if __name__ == "__main__":
    main()
