"""Arrow columns to torch, column by column, with no per-row Python on numeric data.

What a batch holds, by Arrow type (the same whatever the read size; see docs/packing.md):

| Arrow type | in the batch |
| --- | --- |
| int, float, bool | a tensor (B,) |
| fixed_size_list of those | a tensor (B, width) |
| list / large_list of those | a `Ragged` (flat `values` + `offsets`, B + 1 of them) |
| binary / large_binary | a `Ragged` of uint8 (the bytes of each row; decoders take uint8) |
| string / large_string, anything else | a Python list |

A null in a numeric, list or binary column is an error naming the column: a tensor has no
null, and a fill value the loader picked would be silent garbage in training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.types as pat
import torch
from numpy.typing import NDArray

from loader.kernels.ragged import _ragged_take


@dataclass(frozen=True)
class Ragged:
    """Rows of different lengths: row i is `values[offsets[i]:offsets[i + 1]]`.

    `offsets` is what FlashAttention's varlen functions take as `cu_seqlens` (as int32,
    see `cu_seqlens`); `padded` gives the (B, longest) form with `lengths`.
    """

    values: torch.Tensor
    offsets: torch.Tensor  # int64, len(rows) + 1, offsets[0] == 0

    def __len__(self) -> int:
        return int(self.offsets.shape[0]) - 1

    def __getitem__(self, rows: slice) -> Ragged:
        """Consecutive rows as views (offsets rebased to 0)."""
        start, stop, step = rows.indices(len(self))
        if step != 1:
            raise IndexError("Ragged rows are sliced with step 1 only")
        stop = max(start, stop)
        offsets = self.offsets[start : stop + 1]
        first, last = int(offsets[0]), int(offsets[-1])
        return Ragged(self.values[first:last], offsets - first)

    @property
    def lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    @property
    def cu_seqlens(self) -> torch.Tensor:
        """Offsets as int32, the dtype FlashAttention's varlen kernels expect."""
        return self.offsets.to(torch.int32)

    def padded(self, pad_value: float = 0) -> torch.Tensor:
        """A (B, longest row) tensor, rows left-aligned and filled with `pad_value`."""
        lengths = self.lengths
        width = int(lengths.max()) if len(self) else 0
        out = torch.full((len(self), width), pad_value, dtype=self.values.dtype)
        mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
        out[mask] = self.values
        return out

    def tolist(self) -> list[torch.Tensor]:
        """One tensor per row (views)."""
        return list(torch.split(self.values, self.lengths.tolist()))

    def to(self, *args: Any, **kwargs: Any) -> Ragged:
        return Ragged(self.values.to(*args, **kwargs), self.offsets.to(*args, **kwargs))

    def pin_memory(self) -> Ragged:
        return Ragged(self.values.pin_memory(), self.offsets.pin_memory())


def _numeric_type(t: pa.DataType) -> bool:
    return bool(pat.is_integer(t) or pat.is_floating(t) or pat.is_boolean(t))


def _ragged_type(t: pa.DataType) -> bool:
    if pat.is_list(t) or pat.is_large_list(t):
        return _numeric_type(t.value_type)
    return bool(pat.is_binary(t) or pat.is_large_binary(t))


def null_count(arr: pa.Array) -> int:
    """Nulls of a column, those inside its lists included (a tensor has none of either)."""
    nulls = arr.null_count
    if pat.is_fixed_size_list(arr.type):
        nulls += _fixed_values(arr).null_count
    elif pat.is_list(arr.type) or pat.is_large_list(arr.type):
        nulls += arr.flatten().null_count
    return int(nulls)


def _fixed_values(arr: pa.FixedSizeListArray) -> pa.Array:
    """A fixed-size list column's values, its nulls' slots left out: a slice of the child
    array when no list is null (`flatten` costs ~0.1 ms a call on a fresh read)."""
    if arr.null_count:
        return arr.flatten()
    width = arr.type.list_size
    return arr.values.slice(arr.offset * width, len(arr) * width)


def _check_no_nulls(name: str, arr: pa.Array) -> None:
    nulls = null_count(arr)
    if nulls:
        raise ValueError(
            f"column {name!r} ({arr.type}) has {nulls} null value(s) in the rows read; a "
            f"tensor has no null. Fill them in the table, exclude the rows with the "
            f"dataset's filter (e.g. filter='{name} IS NOT NULL'), or leave the column out "
            f"of columns="
        )


def column_to_numpy(arr: pa.Array) -> NDArray[Any] | None:
    """A NumPy view of a null-free numeric column (fixed-size lists as 2-D), or None."""
    if _numeric_type(arr.type):
        return arr.to_numpy(zero_copy_only=False)
    if pat.is_fixed_size_list(arr.type) and _numeric_type(arr.type.value_type):
        width = arr.type.list_size
        values = _fixed_values(arr).to_numpy(zero_copy_only=False)
        return values.reshape(len(arr), width)  # (rows, width)
    return None


def ragged_parts(arr: pa.Array) -> tuple[NDArray[Any], NDArray[np.int64]]:
    """Flat values and int64 offsets (from the array's own, so a sliced array works)."""
    if pat.is_binary(arr.type) or pat.is_large_binary(arr.type):
        offsets_buf, data_buf = arr.buffers()[1], arr.buffers()[2]
        dtype = np.int32 if pat.is_binary(arr.type) else np.int64
        offsets = np.frombuffer(offsets_buf, dtype=dtype)[arr.offset : arr.offset + len(arr) + 1]
        data = (
            np.frombuffer(data_buf, dtype=np.uint8)
            if data_buf is not None
            else np.empty(0, np.uint8)
        )
        return data, offsets.astype(np.int64)
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.to_numpy(zero_copy_only=False)
    return values, offsets


def take_ragged(arr: pa.Array, order: NDArray[np.int64]) -> Ragged:
    """Rows `order` of a list/binary column as a Ragged: one copy of the values."""
    values, offsets = ragged_parts(arr)
    out, out_offsets = _ragged_take(values, offsets, np.ascontiguousarray(order, dtype=np.int64))
    return Ragged(torch.from_numpy(out), torch.from_numpy(out_offsets))


def single_array(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """The column as one array: its only chunk as is (`combine_chunks` copies even one)."""
    if not isinstance(column, pa.ChunkedArray):
        return column
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


ALIGN = 64  # bytes: each column's start in a read's one buffer (a cache line)


def one_buffer(arrays: dict[str, NDArray[Any]], rows: int) -> dict[str, torch.Tensor] | None:
    """Writable tensors of the arrays' dtypes and shapes (`rows` first), all views of one
    uint8 storage: a DataLoader worker hands a storage to the main process with one file
    descriptor round trip, ~0.1-0.2 ms each, so one storage for the read instead of one a
    column. None when torch cannot view one of the dtypes."""
    sizes = {
        k: rows * int(np.prod(v.shape[1:], dtype=np.int64)) * v.itemsize for k, v in arrays.items()
    }
    starts, total = {}, 0
    for name, size in sizes.items():
        starts[name], total = total, total + -(-size // ALIGN) * ALIGN
    base = torch.empty(total, dtype=torch.uint8)
    out = {}
    try:
        for name, values in arrays.items():
            dtype = torch.from_numpy(np.empty(0, values.dtype)).dtype
            raw = base[starts[name] : starts[name] + sizes[name]]
            out[name] = raw.view(dtype).view((rows, *values.shape[1:]))
    except (RuntimeError, TypeError):
        return None
    return out


def table_to_batch(table: pa.Table, order: NDArray[np.int64]) -> dict[str, Any]:
    """Columns of `table` reordered by `order`, in the forms of the table above.

    The reorder (a gather) is the one copy: Arrow's buffers are read-only to NumPy, so it
    writes into writable tensors that torch owns, the fixed-width columns side by side in
    one buffer (see `one_buffer`).
    """
    batch: dict[str, Any] = {}
    fixed: dict[str, NDArray[Any]] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        arr = single_array(column)
        kind = arr.type
        values = column_to_numpy(arr)
        if values is not None or _ragged_type(kind):
            _check_no_nulls(name, arr)
        if values is not None:
            fixed[name] = values
            batch[name] = None  # keeps the column order
        elif _ragged_type(kind):
            batch[name] = take_ragged(arr, order)
        else:
            batch[name] = arr.take(pa.array(order)).to_pylist()
    outs = one_buffer(fixed, len(order)) if fixed else {}
    for name, values in fixed.items():
        if outs is None:  # np.take, not values[order]: the same copy, twice as fast on 2-D
            batch[name] = torch.from_numpy(np.take(values, order, axis=0))
            continue
        # order is a permutation of the rows read: "clip" never clips, and unlike the
        # default it writes into `out` directly (the default buffers: ~3x slower)
        np.take(values, order, axis=0, out=outs[name].numpy(), mode="clip")
        batch[name] = outs[name]
    return batch
