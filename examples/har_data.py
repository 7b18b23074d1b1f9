"""A synthetic stand-in for the UCI HAR smartphone data, written to an embedded LanceDB table.

The main job must run with no network, so it cannot download UCI HAR. This module makes
a table of the same shape instead: 561 bounded float features and 6 activity classes,
7,352 training and 2,947 test rows. The classes are drawn around centres in a small
latent space, in two groups of three (moving and still, as in HAR), with the centres
inside a group close together: a linear model gets most rows right but not all, so the
MLP has something to learn and the test accuracy tells runs apart when they differ.

The rows come from NumPy's ``default_rng(seed)``. NumPy does not promise that stream
across versions, so another NumPy could give other rows; within one environment the
table is the same every time, which is all the experiment needs (every run reads the
same table, pinned at one version). The training examples make the tables under ``data/``
when they are missing; for a table every node reads (``docs/multinode.md``):

    python examples/har_data.py --db /shared/har.lancedb
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

NUM_FEATURES = 561
NUM_CLASSES = 6
TRAIN_ROWS = 7352
TEST_ROWS = 2947
LATENT_DIM = 24
FEATURES, LABEL, ROW_ID = "features", "label", "row_id"


@dataclass(frozen=True)
class TableSpec:
    """Where the experiment's tables live: an embedded LanceDB directory (or ``s3://…``)."""

    uri: str
    train: str = "har_train"
    test: str = "har_test"
    storage_options: tuple[tuple[str, str], ...] = ()  # e.g. (("region", "eu-west-1"),)

    def connect(self):
        """The LanceDB connection (object-store credentials and endpoint via storage_options)."""
        import lancedb

        return lancedb.connect(self.uri, storage_options=dict(self.storage_options) or None)


def _centres(rng: np.random.Generator) -> np.ndarray:
    """Class centres, shape (6, LATENT_DIM): two groups of three close neighbours."""
    groups = rng.normal(0.0, 1.6, size=(2, LATENT_DIM))
    offsets = rng.normal(0.0, 0.55, size=(NUM_CLASSES, LATENT_DIM))
    return np.repeat(groups, 3, axis=0) + offsets  # (6, LATENT_DIM)


def make_rows(num_rows: int, seed: int, split_seed: int) -> pa.Table:
    """Rows of one split: ``features`` (fixed-size list of 561 float32), ``label``, ``row_id``.

    Args:
        num_rows: rows to draw.
        seed: fixes the class centres and the projection (shared by train and test).
        split_seed: fixes this split's samples, so train and test rows differ.
    """
    shared = np.random.default_rng(seed)
    centres = _centres(shared)
    projection = shared.normal(0.0, 1.0, size=(LATENT_DIM, NUM_FEATURES)) / np.sqrt(LATENT_DIM)
    rng = np.random.default_rng([seed, split_seed])
    labels = rng.integers(0, NUM_CLASSES, size=num_rows)
    latent = centres[labels] + rng.normal(0.0, 1.0, size=(num_rows, LATENT_DIM))
    noise = rng.normal(0.0, 0.6, size=(num_rows, NUM_FEATURES))
    x = np.tanh(0.6 * (latent @ projection) + noise).astype(np.float32)  # (rows, 561) in (-1, 1)
    flat = pa.array(x.reshape(-1), type=pa.float32())
    return pa.table(
        {
            FEATURES: pa.FixedSizeListArray.from_arrays(flat, NUM_FEATURES),
            LABEL: pa.array(labels, type=pa.int64()),
            ROW_ID: pa.array(np.arange(num_rows), type=pa.int64()),
        }
    )


def ensure_synthetic(
    spec: TableSpec, train_rows: int = TRAIN_ROWS, test_rows: int = TEST_ROWS, seed: int = 7
) -> bool:
    """Create the two tables unless both already hold the expected row counts.

    Returns:
        True when the tables were (re)written, False when they were already there.
    """
    db = spec.connect()
    existing = set(db.list_tables().tables)
    wanted = {spec.train: (train_rows, 1), spec.test: (test_rows, 2)}
    if all(
        name in existing and db.open_table(name).count_rows() == n
        for name, (n, _) in wanted.items()
    ):
        return False
    for name, (rows, split_seed) in wanted.items():
        db.create_table(name, data=make_rows(rows, seed, split_seed), mode="overwrite")
    return True


def open_table(spec: TableSpec, name: str):
    """Open one table of the experiment (a LanceDB ``Table``, the loader's default source)."""
    return spec.connect().open_table(name)


def load_test_set(spec: TableSpec) -> tuple[np.ndarray, np.ndarray]:
    """The whole test table as arrays: features (rows, 561) float32 and labels (rows,) int64."""
    table = open_table(spec, spec.test).to_arrow()
    column = table.column(FEATURES).combine_chunks()
    x = column.values.to_numpy().reshape(len(table), -1).copy()  # (rows, 561), writable for torch
    return x, table.column(LABEL).to_numpy().copy()


def default_spec(root: Path) -> TableSpec:
    """The synthetic tables under ``<repo>/data/`` (git-ignored)."""
    return TableSpec(uri=str(root / "data" / "har.lancedb"))


def main(argv: list[str] | None = None) -> int:
    """Write the synthetic tables somewhere (a folder or ``s3://…``), e.g. for a multi-node job."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--db", required=True, help="LanceDB URI, e.g. s3://bucket/har.lancedb")
    p.add_argument("--rows", default=f"{TRAIN_ROWS},{TEST_ROWS}", help="TRAIN,TEST row counts")
    p.add_argument(
        "--storage-option", action="append", default=[], metavar="KEY=VALUE",
        help="LanceDB storage option (repeat), e.g. endpoint=http://127.0.0.1:9000",
    )  # fmt: skip
    args = p.parse_args(argv)
    train, test = (int(n) for n in args.rows.split(","))
    options = tuple(tuple(o.split("=", 1)) for o in args.storage_option)
    written = ensure_synthetic(TableSpec(args.db, storage_options=options), train, test)  # type: ignore[arg-type]
    print(f"{args.db}: {'written' if written else 'already there'} ({train} + {test} rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
