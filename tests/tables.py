"""Small real tables on disk for the tests: the same rows as LanceDB, Arrow and Parquet."""

from __future__ import annotations

from pathlib import Path

import lancedb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROWS = 600
WIDTH = 4


def make_rows(start: int, stop: int) -> pa.Table:
    """Rows whose every column is derived from `id`, so a test can check what it got."""
    ids = np.arange(start, stop, dtype=np.int64)
    x = np.repeat(ids.astype(np.float32), WIDTH) + np.tile(
        np.arange(WIDTH, dtype=np.float32) / 10, len(ids)
    )
    return pa.table(
        {
            "id": ids,
            "x": pa.FixedSizeListArray.from_arrays(pa.array(x), WIDTH),
            "label": ids % 6,
            "name": [f"row-{i}" for i in ids],
        }
    )


def lancedb_table(root: Path, name: str = "rows", rows: int = ROWS) -> lancedb.table.Table:
    """A LanceDB table in two fragments (two writes), like a table that grew."""
    db = lancedb.connect(str(root))
    table = db.create_table(name, make_rows(0, rows // 2))
    table.add(make_rows(rows // 2, rows))
    return table


def parquet_dir(root: Path, rows: int = ROWS) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(make_rows(0, rows // 3), root / "part-0.parquet")
    pq.write_table(make_rows(rows // 3, rows), root / "part-1.parquet")
    return root
