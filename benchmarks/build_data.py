"""Build the benchmark tables: one LanceDB table, and the same rows in LitData's and Mosaic's
formats, under benchmarks/data/.

Rows are ``id`` int64 (= position), ``x`` float32[128] (seeded normal), ``label`` int64
(``id % 1000``): 528 bytes a row, as in issue #5. The LitData and MDS copies are written
from the LanceDB table, so every loader reads the same rows. Existing tables of the right
size are kept.

    benchmarks/.venv/bin/python benchmarks/build_data.py --rows 2000000
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from common import COLUMNS, DATA, DIM, LANCEDB_URI, LITDATA_DIR, MDS_DIR, TABLE, lance_path

CHUNK = 1 << 16  # rows generated or copied at a time
STAMP = DATA / "built.json"


def make_batch(start: int, stop: int, seed: int) -> pa.RecordBatch:
    """Rows ``[start, stop)``: deterministic for a seed, whatever the chunking."""
    ids = np.arange(start, stop, dtype=np.int64)
    x = np.random.default_rng([seed, start]).standard_normal((stop - start, DIM), np.float32)
    values = pa.array(x.reshape(-1))  # (rows * DIM,)
    return pa.RecordBatch.from_arrays(
        [pa.array(ids), pa.FixedSizeListArray.from_arrays(values, DIM), pa.array(ids % 1000)],
        names=list(COLUMNS),
    )


def build_lancedb(rows: int, seed: int) -> None:
    """Write the LanceDB table ``rows`` (one version, default fragment size)."""
    import lancedb

    shutil.rmtree(LANCEDB_URI, ignore_errors=True)
    batches = (make_batch(s, min(s + CHUNK, rows), seed) for s in range(0, rows, CHUNK))
    schema = make_batch(0, 1, seed).schema
    db = lancedb.connect(str(LANCEDB_URI))
    db.create_table(TABLE, data=pa.RecordBatchReader.from_batches(schema, batches))


def _rows_of(start: int, stop: int) -> Iterator[dict]:
    """The table's rows ``[start, stop)`` as one dict each (LitData and MDS write rows)."""
    import lance

    tbl = lance.dataset(lance_path()).to_table(offset=start, limit=stop - start)
    ids = tbl["id"].to_numpy()
    labels = tbl["label"].to_numpy()
    x = tbl["x"].combine_chunks().values.to_numpy().reshape(-1, DIM)  # (rows, DIM)
    for i in range(len(ids)):
        yield {"id": int(ids[i]), "x": x[i], "label": int(labels[i])}


def _litdata_rows(start: int, rows: int) -> Iterator[dict]:
    yield from _rows_of(start, min(start + CHUNK, rows))


def build_litdata(rows: int) -> None:
    """LitData ``optimize`` output (uncompressed 64 MB chunks, its defaults otherwise)."""
    import litdata

    shutil.rmtree(LITDATA_DIR, ignore_errors=True)
    litdata.optimize(
        fn=functools.partial(_litdata_rows, rows=rows),
        inputs=list(range(0, rows, CHUNK)),
        output_dir=str(LITDATA_DIR),
        chunk_bytes="64MB",
        num_workers=2,
        keep_data_ordered=True,
        verbose=False,
    )


def build_mds(rows: int) -> None:
    """Mosaic MDS shards (uncompressed, 64 MB shards)."""
    from streaming import MDSWriter

    shutil.rmtree(MDS_DIR, ignore_errors=True)
    columns = {"id": "int64", "x": f"ndarray:float32:{DIM}", "label": "int64"}
    with MDSWriter(out=str(MDS_DIR), columns=columns, size_limit=1 << 26) as out:
        for start in range(0, rows, CHUNK):
            for row in _rows_of(start, min(start + CHUNK, rows)):
                out.write(row)


BUILDERS = {
    "lancedb": lambda rows, seed: build_lancedb(rows, seed),
    "litdata": lambda rows, seed: build_litdata(rows),
    "mds": lambda rows, seed: build_mds(rows),
}


def build(rows: int, seed: int = 0, force: bool = False) -> dict[str, float]:
    """Build every table that is missing or of another size; returns seconds per table."""
    done = json.loads(STAMP.read_text()) if STAMP.exists() and not force else {}
    if done.get("rows") != rows or done.get("seed") != seed:
        done = {"rows": rows, "seed": seed, "tables": []}
    took = {}
    DATA.mkdir(parents=True, exist_ok=True)
    for name, builder in BUILDERS.items():  # lancedb first: the others copy from it
        if name in done["tables"]:
            continue
        t0 = time.perf_counter()
        builder(rows, seed)
        took[name] = time.perf_counter() - t0
        done["tables"].append(name)
        STAMP.write_text(json.dumps(done))
        print(f"built {name}: {rows} rows in {took[name]:.1f} s", flush=True)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="rebuild even if present")
    args = ap.parse_args()
    build(args.rows, args.seed, args.force)


if __name__ == "__main__":
    main()
