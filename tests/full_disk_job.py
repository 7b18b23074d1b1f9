"""Run by tests/test_cache_plan.py inside a private mount namespace whose cache folder is a
small tmpfs: read through the cache until the disk is full, then report what is left."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from loader import StreamingDataLoader, StreamingDataset
from loader.cache import whole_file


def _ids(uri: str, cache: str, limit: int | None) -> list[list[int]]:
    ds = StreamingDataset(
        uri, num_splits=4, rank=0, world_size=1, shuffle_seed=3, shuffle_clump_size=64,
        cache_dir=cache, cache_limit=limit,
    )  # fmt: skip
    loader = StreamingDataLoader(ds, batch_size=64, read_size=64, cache_prefetch_bytes=0)
    return [batch["id"].tolist() for batch in loader]


def main(uri: str, cache: str) -> None:
    stat = os.statvfs(cache)
    report: dict[str, object] = {"mounted": stat.f_blocks * stat.f_frsize, "error": ""}
    try:
        _ids(uri, cache, None)
    except OSError as err:
        report["error"] = str(err)
    files = [p for p in Path(cache).glob("*/files/data/*.lance")]
    report["partial"] = [str(p) for p in files if not whole_file(p)]
    report["whole"] = len(files)
    report["tmp"] = [str(p) for p in Path(cache).rglob(".*.tmp")]
    report["limited"] = _ids(uri, cache, 200_000)
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
