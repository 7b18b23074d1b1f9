"""LanceDB tables and Lance datasets: pinned to one version, read with positional `take`.

The identity of a pinned version is the digest of its fragments' data and deletion files:
Lance names every file it writes with a fresh random id, so a table dropped and recreated
with the same rows, schema and version number has other files and another `version_id`.
It is read from the manifest already in memory (no extra request), and the same version
always gives the same digest.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from loader.cache import CacheFileError, NodeCache, fragment_files
from loader.cache_plan import FileUses
from loader.read.direct import DirectColumns, open_direct
from loader.sources.base import (
    Backend,
    PinnedVersionGoneError,
    ResolvedSource,
    RowSource,
    SourceRequest,
    SourceSpec,
    check_columns,
    read_schema,
)
from loader.storage import (
    is_object_store,
    lance_options,
    lance_url,
    merge_options,
    normalise_uri,
    options_of,
    path_of_lance_url,
    redact,
    unreachable,
)

# What pylance raises (its LanceError is a ValueError).
LANCE_ERRORS = (ValueError, OSError, RuntimeError)
KEEP_VERSIONS = (
    "tag the versions a run may resume from (table.tags.create('run-x', {v})) so cleanup keeps them"
)


def is_lancedb_table(source: Any) -> bool:
    return type(source).__module__.startswith("lancedb") and hasattr(source, "to_lance")


def is_lance_dataset(source: Any) -> bool:
    return type(source).__module__.startswith("lance") and hasattr(source, "take")


def is_lance_path(source: Any) -> bool:
    if not isinstance(source, str | os.PathLike):
        return False
    path = os.fspath(source).rstrip("/")
    return path.endswith(".lance") or os.path.isdir(os.path.join(path, "_versions"))


def version_id(dataset: Any) -> str:
    """Digest of the version's fragments: ids, data files, physical rows, deletion files."""
    digest = hashlib.sha256()
    for fragment in dataset.get_fragments():
        meta = fragment.metadata
        files = ",".join(f.path for f in meta.files)
        deletion = meta.deletion_file
        deleted = "-" if deletion is None else f"{deletion.id}.{deletion.read_version}"
        digest.update(f"{meta.id}|{files}|{meta.physical_rows}|{deleted}\n".encode())
    return "sha256:" + digest.hexdigest()


def _latest_opens(uri: str, options: dict[str, str] | None) -> bool:
    import lance

    try:
        lance.dataset(lance_url(uri), storage_options=lance_options(options))
    except LANCE_ERRORS:
        return False
    return True


def open_lance(uri: str, version: int | None, options: dict[str, str] | None) -> Any:
    """Open a Lance dataset at `version`; tell "version gone" from "store unreachable".

    `uri` is a location (a path, even on an object store); Lance is handed it as a URL.
    Errors carry Lance's text redacted and never chain Lance's own error (it may hold a
    credential the store echoed).
    """
    import lance

    try:
        return lance.dataset(
            lance_url(uri), version=version, storage_options=lance_options(options)
        )
    except LANCE_ERRORS as err:
        raw = err
    raise _open_failure(uri, version, options, raw)


def _open_failure(
    uri: str, version: int | None, options: dict[str, str] | None, err: Exception
) -> Exception:
    detail = redact(str(err), options)
    missing = "not found" in detail.lower()  # not a connection or an auth failure
    if version is not None and missing and _latest_opens(uri, options):
        return PinnedVersionGoneError(
            f"cannot open version {version} of the table at {uri!r}: that version is gone "
            f"({detail}). The run is pinned to it; it was removed by "
            f"cleanup_old_versions/optimize (or the table was dropped and recreated). "
            f"Restore it from a backup or resume with a fresh state, and "
            f"{KEEP_VERSIONS.format(v=version)}"
        )
    if is_object_store(uri):
        return unreachable(uri, options, err)
    return ValueError(f"no Lance dataset at {uri!r}: {detail}. Was the table dropped or moved?")


def fragment_starts(dataset: Any) -> tuple[NDArray[np.int64], list[Any]] | None:
    """The first logical offset of each fragment (and one past the last), and the fragments,
    from the manifest in memory (physical rows less deleted rows): None when a fragment
    does not record those counts (files written by old Lance versions)."""
    fragments = list(dataset.get_fragments())
    live = []
    for fragment in fragments:
        meta = fragment.metadata
        deletion = meta.deletion_file
        deleted = 0 if deletion is None else deletion.num_deleted_rows
        if meta.physical_rows is None or deleted is None:
            return None
        live.append(meta.physical_rows - deleted)
    return np.cumsum([0, *live], dtype=np.int64), fragments


class LanceRows:
    """A Lance dataset at one version, read with positional `take` (logical offsets).

    A read whose rows all lie in one fragment goes to that fragment's `take` (offsets in
    it, deletions skipped the same way): the dataset's `take` has a fixed cost of a few
    hundred µs more a call, which a mixture, with a read per dataset, pays once per
    dataset (benchmarks/README.md, issue #27)."""

    def __init__(self, spec: SourceSpec) -> None:
        self._spec = spec
        self.cache: NodeCache | None = None
        if spec.cache is not None and spec.version is not None and spec.version_id:
            self.cache = NodeCache(spec.cache, spec.uri, spec.storage_options)
            self._dataset = self.cache.mirror(
                spec.version, spec.version_id, self._open_mirror, version_id
            )
        else:
            self._dataset = open_lance(spec.uri, spec.version, spec.storage_options)
        self._columns = list(spec.columns) if spec.columns is not None else None
        self._len = self._dataset.count_rows()
        self._fragments = fragment_starts(self._dataset)
        self._direct: DirectColumns | None = None  # made on first use (`direct`)
        self._direct_looked = False
        self._direct_lock = threading.Lock()

    def __len__(self) -> int:
        return self._len

    def _open_mirror(self, url: str) -> Any:
        import lance

        return lance.dataset(url, version=self._spec.version)

    def take(self, positions: NDArray[np.int64]) -> pa.Table:
        if self.cache is not None:
            return self._take_cached(positions, self.cache)
        try:
            return self._take(positions)
        except LANCE_ERRORS as err:
            raw = err
        raise self._explain(raw)  # outside the handler: Lance's error is not the context

    def _take_cached(self, positions: NDArray[np.int64], cache: NodeCache) -> pa.Table:
        """Materialise the fragments the read touches, then read them from the node's disk
        holding shared locks; a file deleted or damaged under the read is fetched again."""
        files = self.files_of(positions)
        for attempt in range(2):
            try:
                with cache.reading(files):  # held from before the fetch: never evicted between
                    cache.ensure(files)
                    table = self._take(positions)
            except LANCE_ERRORS as err:
                if attempt:
                    raise CacheFileError(
                        f"reading {self._spec.uri!r} from the node cache {cache.base} failed "
                        f"after fetching its files again: {redact(str(err), self._spec.storage_options)}"
                    ) from None
                cache.forget(files)
                continue
            cache.trim()  # a read needing more than the limit leaves it at the limit
            return table
        raise AssertionError("unreachable")

    def file_uses(self, split_positions: Any, splits: Any, rows_per_split: int) -> FileUses | None:
        """When the node reads each cached file this epoch (`loader.cache_plan`); None
        without fragment row counts in the manifest."""
        if self._fragments is None:
            return None
        starts, fragments = self._fragments
        files = [fragment_files(fragment) for fragment in fragments]
        return FileUses.build(split_positions, splits, starts, files, rows_per_split)

    def file_size(self, rel: str) -> int:
        """A cached file's size from the manifest (0 when it does not say)."""
        if not hasattr(self, "_sizes"):
            self._sizes = {
                f"data/{f.path}": int(f.file_size_bytes or 0)
                for fragment in self._dataset.get_fragments()
                for f in fragment.metadata.files
            }
        return self._sizes.get(rel, 0)

    def files_of(self, positions: NDArray[np.int64]) -> list[str]:
        """The cached files a read of `positions` needs."""
        found = self._fragments
        if found is None or not len(positions):
            fragments = list(self._dataset.get_fragments()) if len(positions) else []
        else:
            starts, all_fragments = found
            touched = np.unique(np.searchsorted(starts, positions, side="right") - 1)
            fragments = [all_fragments[int(i)] for i in touched]
        return [name for fragment in fragments for name in fragment_files(fragment)]

    def _take(self, positions: NDArray[np.int64]) -> pa.Table:
        found = self._fragments
        if found is not None and len(positions):
            starts, fragments = found
            low, high = int(positions.min()), int(positions.max())
            i = int(np.searchsorted(starts, low, side="right")) - 1
            if 0 <= i < len(fragments) and high < starts[i + 1]:
                return fragments[i].take(positions - starts[i], columns=self._columns)
        return self._dataset.take(positions, columns=self._columns)

    def direct(self) -> DirectColumns | None:
        """Direct reads of this table's columns (loader.read.direct), or None where rows
        are read by `take`: a table on an object store or in a node cache among others."""
        with self._direct_lock:
            if not self._direct_looked:
                self._direct_looked = True
                local = self.cache is None and not is_object_store(self._spec.uri)
                found = self._fragments
                if local and found is not None and self._len:
                    base = path_of_lance_url(self._dataset.uri)
                    try:  # a file system that cannot map, a file Lance cannot describe
                        self._direct = open_direct(self._dataset, self._columns, found[1], base)
                    except (*LANCE_ERRORS, TypeError):
                        self._direct = None  # read by take, which reports what is wrong
            return self._direct

    def _explain(self, err: Exception) -> Exception:
        """Why a read failed: the pinned version's files removed, or the store unreachable."""
        spec = self._spec
        try:  # raises SourceUnreachableError if the store itself cannot be reached now
            open_lance(spec.uri, spec.version, spec.storage_options)
            gone = "not found" in str(err).lower()  # the manifest is there, a data file is not
        except PinnedVersionGoneError:
            gone = True
        if gone:
            return PinnedVersionGoneError(
                f"reading version {spec.version} of {spec.uri!r}, which this run is pinned to, "
                f"failed because its data files were removed ({redact(str(err), spec.storage_options)}): "
                f"cleanup_old_versions/optimize ran during the epoch. Resume from a fresh state "
                f"(or restore the files from a backup), and {KEEP_VERSIONS.format(v=spec.version)}"
            )
        if is_object_store(spec.uri):
            return unreachable(spec.uri, spec.storage_options, err)
        return err  # a local dataset: no store, no credentials, Lance's own error


def _filtered(
    dataset: Any, filter: str | None, options: dict[str, str] | None
) -> tuple[int, NDArray[np.int64] | None]:
    if filter is None:
        return dataset.count_rows(), None
    try:
        offsets = dataset.to_table(columns=["_rowoffset"], filter=filter).column(0)
    except Exception as err:  # Lance raises several types for a bad SQL predicate
        detail = redact(str(err), options)
    else:
        rows = np.sort(offsets.to_numpy().astype(np.int64, copy=False))
        return len(rows), rows
    raise ValueError(f"filter {filter!r} failed on {dataset.uri!r}: {detail}")  # not chained


def _pin(
    kind: str,
    uri: str,
    name: str | None,
    options: dict[str, str] | None,
    version: int | None,
    request: SourceRequest,
) -> ResolvedSource:
    """Open `uri` at `version` (latest if None) and describe it for the plan and the state."""
    dataset = open_lance(uri, version, options)
    check_columns(request.columns, dataset.schema.names, uri)
    n, rows = _filtered(dataset, request.filter, options)
    spec = SourceSpec(
        kind,
        uri,
        name,
        dataset.version,
        request.columns,
        None,
        version_id(dataset),
        options,
        cache=request.cache,
    )
    schema = read_schema(dataset.schema, request.columns)
    return ResolvedSource(spec, n, rows, request.filter, schema)


def resolve_lancedb(source: Any, request: SourceRequest) -> ResolvedSource:
    """A LanceDB table: its connection's storage options unless passed explicitly."""
    base = source.to_lance()
    options = merge_options(options_of(source) or options_of(base), request.storage_options)
    version = request.version if request.version is not None else base.version
    uri = normalise_uri(path_of_lance_url(base.uri))
    return _pin("lancedb", uri, source.name, options, version, request)


def resolve_lance(source: Any, request: SourceRequest) -> ResolvedSource:
    """A Lance dataset, or a path/URI to one (opened at its latest version unless pinned)."""
    if is_lance_path(source):
        uri, options = normalise_uri(source), request.storage_options
        return _pin("lance", uri, None, options, request.version, request)
    options = merge_options(options_of(source), request.storage_options)
    version = request.version if request.version is not None else source.version
    uri = normalise_uri(path_of_lance_url(source.uri))
    return _pin("lance", uri, None, options, version, request)


def open_lance_rows(spec: SourceSpec) -> RowSource:
    return LanceRows(spec)


LANCEDB = Backend("lancedb", is_lancedb_table, resolve_lancedb, open_lance_rows)
LANCE = Backend(
    "lance", lambda s: is_lance_dataset(s) or is_lance_path(s), resolve_lance, open_lance_rows
)
