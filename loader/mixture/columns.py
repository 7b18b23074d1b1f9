"""What a mixture's datasets must agree on before a row is read: the columns and their types.

Judged from each dataset's schema when the mixture is built, so the verdict is the same on
every rank and world size and never depends on which datasets' rows a rank's batch happens
to hold (a batch of one dataset alone would pass any check made while joining). Types are
never promoted: torch.cat of int64 and float32 gives float32, which reads 2**24 + 1 as
2**24. Datasets with a per-row `transform` (their output is known only once rows are
read) are checked when their batches are joined (`reader.join_batches`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

SOURCE_FIELD = "source"  # the batch key holding each row's dataset index


def check_columns(names: Sequence[str], datasets: Sequence[Any]) -> None:
    """Refuse datasets whose columns or column types differ, or that have a `source` column.

    Packed datasets are compared by `_check_packing` (one seq_len, fields and dtype).
    """
    schemas = [
        (name, ds.source.schema)
        for name, ds in zip(names, datasets, strict=True)
        if ds.packing is None and ds.transform is None and ds.source.schema is not None
    ]
    for name, schema in schemas:
        if SOURCE_FIELD in schema.names:
            raise ValueError(
                f"datasets[{name!r}] has a column named {SOURCE_FIELD!r}, the key under which a "
                f"mixture's batches carry each row's dataset index; leave it out with "
                f"columns=[...] or rename it in a transform (e.g. lambda row: "
                f"{{**row, 'origin': row.pop('source')}})"
            )
    if not schemas:
        return
    first_name, first = schemas[0]
    for name, schema in schemas[1:]:
        _same_columns(first_name, first, name, schema)


def _same_columns(a: str, first: pa.Schema, b: str, other: pa.Schema) -> None:
    if set(first.names) != set(other.names):
        raise ValueError(
            f"the datasets of a mixture must give the same columns: datasets[{a!r}] has "
            f"{sorted(first.names)}, datasets[{b!r}] {sorted(other.names)}; pass the same "
            f"columns=[...] to each StreamingDataset"
        )
    for column in first.names:
        ta, tb = first.field(column).type, other.field(column).type
        if ta != tb:
            raise ValueError(
                f"column {column!r} is {ta} in datasets[{a!r}] and {tb} in datasets[{b!r}]: a "
                f"mixture never casts (int64 values read as float32 lose digits); give the "
                f"tables the same schema, or cast in a transform of one dataset (e.g. lambda "
                f"row: {{**row, {column!r}: ...}}) so both give one type"
            )


def check_pieces(pieces: Sequence[dict[str, Any]]) -> None:
    """At join time (datasets with a transform): the same keys, no `source`, one dtype per key."""
    first = pieces[0]
    for piece in pieces:
        if piece.keys() != first.keys():
            raise ValueError(
                f"the datasets of a mixture must give the same columns: {sorted(first)} and "
                f"{sorted(piece)}; pass columns=[...] to each StreamingDataset"
            )
        if SOURCE_FIELD in piece:
            raise ValueError(
                f"a mixture's dataset gives a column named {SOURCE_FIELD!r}, the key under "
                f"which its batches carry each row's dataset index; rename it in the transform"
            )
        for key, value in piece.items():
            kind, want = getattr(value, "dtype", None), getattr(first[key], "dtype", None)
            if kind != want:
                raise ValueError(
                    f"column {key!r} is {want} in one dataset of the mixture and {kind} in "
                    f"another: a mixture never casts; make the transforms give one dtype"
                )
