"""Direct reads of fixed-width rows from local Lance files: one copy, in stream order.

Lance's `take` of a read's rows (~56 runs of ~150 rows at S = 48) costs ~0.5 µs a row,
mostly per run, and the batch then needs a second copy to restore stream order. A Lance
file (format 2.1+) stores a fixed-width column without nulls (e.g. float32[128]
embeddings) in "full-zip" pages of plain little-endian values, `num_items` rows back to
back. Such a column is read here by mapping the file and copying each row straight from
its page into the batch's buffer in stream order (a Numba loop without the GIL): the
reorder is the read. The other columns must be small fixed-width ones (ids, labels, stored
bit-packed in mini-blocks): those are decoded whole once per process by Lance and kept
(`SMALL_BYTES` at most), then gathered with NumPy.

Only what the file's own metadata says matches exactly is read this way: a fragment with
deletions, a table on an object store, a node cache, any other encoding, a null, or a
column of another type leave the whole table on the `take` path (`open_direct` returns
None). Batches are the same either way (tests/test_direct.py checks them against `take`).
"""

from __future__ import annotations

import functools
import mmap
import os
import re
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.types as pat
import torch
from numpy.typing import NDArray

from loader.kernels.config import njit
from loader.read.convert import column_to_numpy, null_count, one_buffer

SMALL_BYTES = 64 << 20  # the non-direct columns a process keeps decoded, at most

_NUM = r"(\d+)"
_FLAT = rf"Flat\(Flat{{bits_per_value:{_NUM},data:None,}},?\),?"
_FIXED = rf"FixedSizeList\(FixedSizeList{{items_per_value:{_NUM},has_validity:false,values:Some\(CompressiveEncoding{{compression:Some\({_FLAT}\),?}},?\),?}},?\),?"
_PAGE = re.compile(
    rf"PageLayout{{layout:Some\(FullZipLayout\(FullZipLayout{{bits_rep:0,bits_def:0,"
    rf"num_items:{_NUM},num_visible_items:{_NUM},value_compression:Some\("
    rf"CompressiveEncoding{{compression:Some\((?:{_FIXED}|{_FLAT})\),?}},?\),?"
    rf"layers:\[RepdefAllValidItem,?\],details:Some\(BitsPerValue\({_NUM},?\),?\),?}},?\),?\),?}}"
)  # fmt: skip


@njit
def _copy_rows(
    src: NDArray[Any],
    starts: NDArray[np.int64],
    dest: NDArray[np.int64],
    words: int,
    out: NDArray[Any],
) -> None:
    """Row dest[i] of `out` (`words` words each) is `src[starts[i]:starts[i] + words]`: a word
    loop (a slice assignment a row measured 4x slower than NumPy's take, this as fast)."""
    for i in range(starts.shape[0]):
        s, d = starts[i], dest[i] * words
        for j in range(words):
            out[d + j] = src[s + j]


def _words(data: NDArray[np.uint8], word: int) -> NDArray[Any]:
    """`data` as unsigned words of `word` bytes (its tail cut to whole words)."""
    return data[: len(data) // word * word].view(f"u{word}")


def _element(kind: pa.DataType) -> tuple[np.dtype[Any], tuple[int, ...]] | None:
    """The NumPy dtype and row shape of a fixed-width numeric type (no bools), or None."""
    shape: tuple[int, ...] = ()
    if pat.is_fixed_size_list(kind):
        kind, shape = kind.value_type, (kind.list_size,)
    if not (pat.is_integer(kind) or pat.is_floating(kind)):
        return None
    return np.dtype(kind.to_pandas_dtype()), shape


@dataclass(frozen=True)
class FileColumn:
    """One direct column of one data file: its pages' first rows and byte positions."""

    page_rows: NDArray[np.int64]  # first row of each page, and the file's rows at the end
    page_bytes: NDArray[np.int64]  # byte position of each page's values
    width: int  # bytes a row

    @property
    def word(self) -> int:
        """The widest word (8, 4, 2 or 1 bytes) that divides the width and every page start."""
        gcd = int(np.gcd.reduce(np.append(self.page_bytes, self.width)))
        return next(w for w in (8, 4, 2, 1) if gcd % w == 0)

    def starts(self, rows: NDArray[np.int64], word: int) -> NDArray[np.int64]:
        """Position of each of `rows` (rows of this file), in words of `word` bytes."""
        page = np.searchsorted(self.page_rows, rows, side="right") - 1
        return (self.page_bytes[page] + (rows - self.page_rows[page]) * self.width) // word


def _direct_column(column: Any, dtype: np.dtype[Any], shape: tuple[int, ...]) -> FileColumn | None:
    """The column's page map if every page is a full-zip page of plain values of this type."""
    rows, starts = [0], []
    for page in column.pages:
        m = _PAGE.fullmatch(re.sub(r"\s+", "", str(page.encoding)))
        if m is None or len(page.buffers) != 1:
            return None
        items, visible, per_list, bits_list, bits_flat, bits = m.groups()
        if shape:  # a fixed-size list: its values plain, of the dtype's width
            plain = per_list is not None and (int(per_list),) == shape
            plain = plain and int(bits_list) == 8 * dtype.itemsize
        else:
            plain = bits_flat is not None and int(bits_flat) == 8 * dtype.itemsize
        width = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        if not plain or items != visible or int(bits) != 8 * width:
            return None
        starts.append(int(page.buffers[0].position))
        rows.append(rows[-1] + int(items))
    width = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    return FileColumn(np.array(rows, np.int64), np.array(starts, np.int64), width)


@dataclass
class DirectColumns:
    """A table's columns read directly (mapped files) or from decoded copies, by position."""

    names: list[str]  # in the order `take` returns them
    kinds: dict[str, tuple[np.dtype[Any], tuple[int, ...]]]  # dtype and row shape
    fragment_rows: NDArray[np.int64]  # first table position of each fragment, and the end
    files: list[tuple[NDArray[np.uint8], dict[str, FileColumn]]]  # per fragment
    small: dict[str, NDArray[Any]]  # the other columns, decoded, by table position

    def gather(self, positions: NDArray[np.int64]) -> dict[str, torch.Tensor]:
        """The rows at table `positions` (any order), in that order: one copy a column, into
        views of one storage (as `table_to_batch` makes them)."""
        n = len(positions)
        like = {k: np.empty((0, *shape), dtype) for k, (dtype, shape) in self.kinds.items()}
        outs = one_buffer(like, n)
        assert outs is not None  # numeric dtypes only
        if len(self.files) == 1:
            parts = [(0, positions, np.arange(n, dtype=np.int64))]
        else:
            fragment = np.searchsorted(self.fragment_rows, positions, side="right") - 1
            parts = []
            for f in np.unique(fragment).tolist():
                dest = np.flatnonzero(fragment == f)
                parts.append((f, positions[dest] - self.fragment_rows[f], dest))
        for name in self.names:
            out = outs[name].numpy()
            if name in self.small:
                np.take(self.small[name], positions, axis=0, out=out, mode="clip")
                continue
            raw = out.reshape(-1).view(np.uint8)
            for f, rows, dest in parts:
                src, columns = self.files[f]
                column = columns[name]
                word = column.word
                starts = column.starts(rows, word)
                _copy_rows(_words(src, word), starts, dest, column.width // word, _words(raw, word))
        return {name: outs[name] for name in self.names}


_MAPS: dict[tuple[str, int, int, int], NDArray[np.uint8]] = {}  # this process's mapped files
_MAPS_LOCK = threading.Lock()


def _key(path: str) -> tuple[str, int, int, int]:
    """A data file's identity: its path, inode, size and time (a path reused is another)."""
    info = os.stat(path)
    return path, info.st_ino, info.st_size, info.st_mtime_ns


def _map(path: str) -> NDArray[np.uint8]:
    """The file mapped read-only, once per process (a fresh mapping faults in every page
    again: ~0.2 s an epoch of a 0.5 GB table). Lance never rewrites a data file."""
    key = _key(path)
    with _MAPS_LOCK:
        if key not in _MAPS:
            with open(path, "rb") as handle:
                size = key[2]
                mapped = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_READ) if size else b""
            _MAPS[key] = np.frombuffer(mapped, dtype=np.uint8)
        return _MAPS[key]


def open_direct(
    dataset: Any, columns: list[str] | None, fragments: list[Any], base: str
) -> DirectColumns | None:
    """Direct reads of `columns` of a local Lance dataset (`base`: its directory), or None
    when any part of it must be read by `take` (see the module docstring)."""
    from lance.file import LanceFileReader

    schema = dataset.schema
    names = list(schema.names) if columns is None else list(columns)
    kinds = {}
    for name in names:
        kind = _element(schema.field(name).type)
        if kind is None:
            return None
        kinds[name] = kind
    paths, found, rows = [], [], [0]
    for fragment in fragments:
        meta = fragment.metadata
        if meta.deletion_file is not None or len(meta.files) != 1 or meta.physical_rows is None:
            return None
        path = os.path.join(base, "data", meta.files[0].path)
        if not os.path.isfile(path):
            return None
        info = LanceFileReader(path).metadata()
        file_names = info.schema.names
        if len(info.columns) != len(file_names) or not set(names) <= set(file_names):
            return None  # a nested field spans several columns: not mapped here
        mine = {}
        for name in names:
            column = _direct_column(info.columns[file_names.index(name)], *kinds[name])
            if column is not None and int(column.page_rows[-1]) == meta.physical_rows:
                mine[name] = column
        paths.append(path)
        found.append(mine)
        rows.append(rows[-1] + meta.physical_rows)
    direct = set.intersection(*(set(mine) for mine in found)) if found else set()
    small_names = [name for name in names if name not in direct]
    row_bytes = sum(kinds[k][0].itemsize * int(np.prod(kinds[k][1])) for k in small_names)
    if not direct or row_bytes * rows[-1] > SMALL_BYTES:
        return None
    small = _decode_small(tuple(_key(p) for p in paths), tuple(small_names)) if small_names else {}
    if small is None:
        return None
    files = [
        (_map(path), {k: v for k, v in mine.items() if k in direct})
        for path, mine in zip(paths, found, strict=True)
    ]
    return DirectColumns(names, kinds, np.array(rows, np.int64), files, small)


@functools.lru_cache(maxsize=2)  # a loader made again (each epoch, say) decodes nothing
def _decode_small(
    files: tuple[tuple[str, int, int, int], ...], names: tuple[str, ...]
) -> dict[str, NDArray[Any]] | None:
    """The non-direct columns of every file (keyed as `_key`), decoded by Lance once; None
    if one has nulls."""
    from lance.file import LanceFileReader

    columns = list(names)
    tables = [LanceFileReader(key[0], columns=columns).read_all().to_table() for key in files]
    table = pa.concat_tables(tables)
    out = {}
    for name in names:
        arr = table.column(name).combine_chunks()
        values = column_to_numpy(arr)
        if values is None or null_count(arr):
            return None
        out[name] = values
    return out
