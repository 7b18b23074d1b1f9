"""Local files and object-store objects behind one small protocol, `Location`.

A location reads one whole regular file (or object) up to a limit, writes one atomically,
and lists the files of a folder (or prefix). Locally a FIFO would block a read forever and
a link to /dev/zero would fill memory, so reads accept regular files only; a write goes to
a temporary file in the same folder, fsynced, renamed over the target. On an object store
there is no rename, and pyarrow completes a multipart upload with whatever was written when
a write fails, so the bytes go to a temporary object whose size is checked, then one
server-side copy makes the target. A new store (GCS, Azure) is one `Store` subclass naming
its pyarrow filesystem, listed in `STORES`.

On an object store every operation is waited for at most the options' `read_deadline`
(`deadline.within`): a store that stops answering is an OSError naming the location, and an
upload abandoned at its deadline stops before its copy, so it never lands over a later save.

Errors name the location (prefixed by the caller's `label`, e.g. "checkpoint ") and never a
secret; a store's raw error is never chained. pyarrow is imported for object stores only.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from loader.storage.deadline import Overdue, within
from loader.storage.options import READ_DEADLINE, read_deadline, redact, s3_filesystem_args
from loader.storage.uri import ObjectPath, is_object_store, normalise_uri, object_path

__all__ = [
    "STORES", "Blob", "Entry", "Location", "NotAFile", "TooBig", "location", "pyarrow_filesystem",
]  # fmt: skip

FILE, FOLDER, MISSING, OTHER = "file", "folder", "missing", "other"
R = TypeVar("R")
TMP_SUFFIX = ".tmp"


@dataclass(frozen=True)
class Entry:
    """What is at a location: a regular file, a folder (prefix), nothing, or something else."""

    kind: str
    name: str = ""
    size: int | None = None
    mtime_ns: int = 0
    what: str = ""  # OTHER: what it is instead ("a named pipe (FIFO) (a link to /x)")


@dataclass(frozen=True)
class Blob:
    data: bytes
    mtime_ns: int


class NotAFile(Exception):
    """The location holds a folder (prefix) or something other than a regular file."""

    def __init__(self, entry: Entry) -> None:
        super().__init__(entry.what or entry.kind)
        self.entry = entry


class TooBig(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(f"{size} bytes")
        self.size = size


class Location(Protocol):
    """Where one file (or a folder of them) lives."""

    @property
    def shown(self) -> Path | str:
        """As the user wrote it: what save() and latest() return."""
        ...

    @property
    def folder_word(self) -> str:
        """'folder' or 'prefix (folder)', for messages."""
        ...

    @property
    def noun(self) -> str:
        """'file' or 'object', for messages."""
        ...

    @property
    def whole_reads(self) -> bool:
        """Whether `read` cannot mix two versions (one open file: a rename leaves it whole);
        False where a read is several requests (an object's size, then its bytes)."""
        ...

    def child(self, name: str) -> Location: ...
    def is_folder(self) -> bool: ...
    def read(self, limit: int) -> Blob:
        """All bytes (raises TooBig beyond `limit`, NotAFile, FileNotFoundError)."""
        ...

    def write_atomic(self, data: bytes) -> None:
        """Readers see the previous content or all of `data`, never a mix."""
        ...

    def files(self) -> list[Entry]:
        """The regular files directly inside this folder (none if it is not one)."""
        ...


def location(
    where: str | os.PathLike[str], storage_options: Mapping[str, Any] | None, label: str = ""
) -> Location:
    """The location of a local path or an object-store URI (a clear ValueError otherwise)."""
    if isinstance(where, str) and is_object_store(where):
        path = object_path(where)
        store = STORES.get(path.scheme)
        if store is None:
            raise ValueError(
                f"{where!r}: scheme {path.scheme!r} is not supported here; supported: "
                f"{', '.join(s + '://' for s in STORES)} or a local path"
            )
        return ObjectLocation(where, path, store(storage_options), label)
    return LocalLocation(Path(where))


# ---------------------------------------------------------------- local files


def _kind(mode: int) -> str:
    kinds = [
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ]
    return next((name for test, name in kinds if test(mode)), "not a regular file")


@dataclass(frozen=True)
class LocalLocation:
    shown: Path
    folder_word: ClassVar[str] = "folder"
    noun: ClassVar[str] = "file"
    whole_reads: ClassVar[bool] = True

    def child(self, name: str) -> LocalLocation:
        return LocalLocation(self.shown / name)

    def is_folder(self) -> bool:
        return self.shown.is_dir()

    def _entry(self, info: os.stat_result) -> Entry:
        if stat.S_ISDIR(info.st_mode):
            return Entry(FOLDER, self.shown.name)
        if not stat.S_ISREG(info.st_mode):
            link = f" (a link to {os.path.realpath(self.shown)})" if self.shown.is_symlink() else ""
            return Entry(OTHER, self.shown.name, what=f"{_kind(info.st_mode)}{link}")
        return Entry(FILE, self.shown.name, info.st_size, info.st_mtime_ns)

    def _checked(self, info: os.stat_result, limit: int) -> Entry:
        entry = self._entry(info)
        if entry.kind != FILE:
            raise NotAFile(entry)
        if info.st_size > limit:
            raise TooBig(info.st_size)
        return entry

    def read(self, limit: int) -> Blob:
        self._checked(os.stat(self.shown), limit)  # follows links; FileNotFoundError names it
        # O_NONBLOCK: should the path be swapped for a FIFO after the stat, open does not wait.
        fd = os.open(self.shown, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            entry = self._checked(os.fstat(fd), limit)
            chunks, size = [], 0
            while size <= limit and (chunk := os.read(fd, limit + 1 - size)):
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
        if size > limit:
            raise TooBig(size)
        return Blob(b"".join(chunks), entry.mtime_ns)

    def write_atomic(self, data: bytes) -> None:
        """Temporary file in the same folder, fsync, rename over the target, fsync the folder."""
        target = self.shown
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}{TMP_SUFFIX}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_folder(target.parent)

    def files(self) -> list[Entry]:
        if not self.shown.is_dir():
            return []
        found = []
        for path in self.shown.iterdir():
            with contextlib.suppress(OSError):  # removed or unreadable while listed
                entry = LocalLocation(path)._entry(path.stat())
                if entry.kind == FILE:
                    found.append(entry)
        return found


def _fsync_folder(folder: Path) -> None:
    # Makes the rename itself durable. POSIX only: Windows cannot open a folder this way.
    if not hasattr(os, "O_DIRECTORY"):
        return
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- object stores


class Store:
    """One kind of object store: how to make its pyarrow filesystem from storage options."""

    def __init__(self, storage_options: Mapping[str, Any] | None) -> None:
        self.options = dict(storage_options or {})

    def filesystem(self) -> Any:
        raise NotImplementedError


class S3(Store):
    """S3 and S3-compatible stores, with Lance-style options (`s3_filesystem_args`)."""

    def filesystem(self) -> Any:
        from pyarrow import fs

        return fs.S3FileSystem(**s3_filesystem_args(self.options))


STORES: dict[str, type[Store]] = {"s3": S3, "s3a": S3}


@dataclass
class ObjectLocation:
    """An object (or a prefix) on a store, named by a path: bucket and key, never a URL."""

    shown: str
    path: ObjectPath
    store: Store
    label: str = ""
    folder_word: ClassVar[str] = "prefix (folder)"
    noun: ClassVar[str] = "object"
    whole_reads: ClassVar[bool] = False

    def child(self, name: str) -> ObjectLocation:
        return ObjectLocation(
            self.shown.rstrip("/") + "/" + name, self.path.child(name), self.store, self.label
        )

    def _ask(self, call: Any, *args: Any) -> Any:
        """`call(*args)` (a filesystem's or a stream's method); a store error becomes an
        OSError naming the location, with secrets replaced by '***' and the raw error not
        chained."""
        try:
            return call(*args)
        except OSError as exc:
            detail = redact(str(exc), self.store.options)
        raise OSError(f"{self.label}{self.shown}: the object store answered: {detail}")

    @property
    def _fs(self) -> Any:
        if "_filesystem" not in self.__dict__:
            self.__dict__["_filesystem"] = self.store.filesystem()
        return self.__dict__["_filesystem"]

    def _entry(self) -> Entry:
        from pyarrow import fs

        info = self._ask(self._fs.get_file_info, self.path.bucket_and_key)
        kinds = {fs.FileType.File: FILE, fs.FileType.Directory: FOLDER}
        return Entry(kinds.get(info.type, MISSING), info.base_name, info.size, info.mtime_ns or 0)

    def _bounded(self, call: Callable[[], R], on_overdue: Callable[[], None] | None = None) -> R:
        """`call()` within the store's `read_deadline`, else an OSError naming the location
        (a store that stops answering must not hang a save or a resume)."""
        seconds = read_deadline(self.store.options)
        what = f"storage_options[{READ_DEADLINE!r}] ({seconds:g} s)"
        try:
            return within(call, seconds, what, on_overdue)
        except Overdue as late:
            problem = str(late)
        raise OSError(
            f"{self.label}{self.shown}: the object store gave {problem}; check that it is "
            f"reachable (endpoint, network), or raise {READ_DEADLINE!r} for a slow one"
        )

    def is_folder(self) -> bool:
        return self.shown.endswith("/") or self._bounded(self._entry).kind == FOLDER

    def read(self, limit: int) -> Blob:
        return self._bounded(lambda: self._read(limit))

    def write_atomic(self, data: bytes) -> None:
        """Upload to a temporary object, check its size, then copy it over the target at once
        (never after the deadline: an abandoned upload does not replace a later save)."""
        abandoned = threading.Event()
        self._bounded(lambda: self._write_atomic(data, abandoned), abandoned.set)

    def files(self) -> list[Entry]:
        return self._bounded(self._files)

    def _read(self, limit: int) -> Blob:
        entry = self._entry()
        if entry.kind == MISSING:
            raise FileNotFoundError(f"{self.label}{self.shown}: no such object")
        if entry.kind != FILE:
            raise NotAFile(entry)
        if entry.size is not None and entry.size > limit:
            raise TooBig(entry.size)
        stream = self._ask(self._fs.open_input_stream, self.path.bucket_and_key)
        with stream:
            data = self._ask(stream.read, limit + 1)
        if len(data) > limit:
            raise TooBig(len(data))
        return Blob(data, entry.mtime_ns)

    def _write_atomic(self, data: bytes, abandoned: threading.Event) -> None:
        key = self.path.bucket_and_key
        folder, _, name = key.rpartition("/")
        tmp = f"{folder}/.{name}.{os.getpid()}.{os.urandom(4).hex()}{TMP_SUFFIX}"
        stream = None
        try:
            stream = self._ask(self._fs.open_output_stream, tmp)
            self._ask(stream.write, data)
            self._ask(stream.close)
            size = self._ask(self._fs.get_file_info, tmp).size
            if size != len(data):
                raise OSError(
                    f"{self.label}{self.shown}: the upload stored {size} of {len(data)} bytes"
                )
            if abandoned.is_set():
                raise OSError(f"{self.label}{self.shown}: abandoned at its deadline")
            self._ask(self._fs.move, tmp, key)  # one CopyObject: atomic
        except BaseException:
            self._discard(stream, tmp)
            raise

    def _discard(self, stream: Any, tmp: str) -> None:
        """Best effort: close (pyarrow then completes the upload) and delete the temporary."""
        with contextlib.suppress(OSError):
            if stream is not None:
                stream.close()
        with contextlib.suppress(OSError):
            self._fs.delete_file(tmp)

    def _files(self) -> list[Entry]:
        from pyarrow import fs

        prefix = self.path.bucket_and_key.rstrip("/")
        selector = fs.FileSelector(prefix, recursive=False, allow_not_found=True)
        infos = self._ask(self._fs.get_file_info, selector)
        return [
            Entry(FILE, i.base_name, i.size, i.mtime_ns or 0)
            for i in infos
            if i.type == fs.FileType.File
        ]


def pyarrow_filesystem(uri: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    """A pyarrow filesystem for `uri` and the path inside it (for datasets of many files):
    the local filesystem, a store of `STORES` with the Lance-style options, or any other
    scheme pyarrow knows (gs://, az://) by pyarrow's own configuration."""
    from pyarrow import fs

    if not is_object_store(uri):
        return fs.LocalFileSystem(), normalise_uri(uri)
    path = object_path(uri)
    store = STORES.get(path.scheme)
    if store is not None:
        return store(storage_options).filesystem(), path.bucket_and_key.rstrip("/")
    filesystem, _ = fs.FileSystem.from_uri(path.root)  # the bucket only: no URL parsing of keys
    return filesystem, path.bucket_and_key.rstrip("/")
