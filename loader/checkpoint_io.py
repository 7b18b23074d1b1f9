"""Where checkpoint bytes live: a local regular file, or an object behind an `s3://` URI.

Reading accepts regular files (objects) only, up to `MAX_FILE_BYTES`: a FIFO would block a
resume forever and a link to /dev/zero would fill memory. Writing never exposes a partial
file: locally a temporary file in the same folder is fsynced and renamed over the target;
on object storage the bytes go to a temporary object whose size is checked, then one
server-side copy makes the target (pyarrow uploads through multipart uploads and completes
them with whatever was written when a write fails, so the target is never written directly).

Standard library only at import; pyarrow is imported for URIs only.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loader.storage import is_uri, redact, s3_filesystem, split_uri

MAX_FILE_BYTES = 64 << 20  # a state is O(S) integers: 64 MiB holds millions of splits
SUFFIX = ".json"
TMP_SUFFIX = ".tmp"
Location = Path | str  # a local path, or a URI kept as the user wrote it


class CheckpointError(ValueError):
    """A checkpoint file that must not be resumed from; the message names file and field."""

    def __init__(self, path: str | os.PathLike[str], field: str | None, problem: str) -> None:
        self.path: Location = path if is_uri(path) else Path(path)  # type: ignore[assignment]
        self.field = field
        where = f"{self.path}: field {field!r}" if field else str(self.path)
        super().__init__(f"checkpoint {where}: {problem}")


@dataclass(frozen=True)
class Stored:
    """A checkpoint's bytes and when they were written."""

    location: Location
    data: bytes
    mtime_ns: int


def location(path: str | os.PathLike[str]) -> Location:
    return path if is_uri(path) else Path(path)  # type: ignore[return-value]


def is_folder(where: Location, storage_options: dict[str, Any] | None = None) -> bool:
    """A local folder, or a URI ending in '/' or naming a prefix with objects under it."""
    if isinstance(where, Path):
        return where.is_dir()
    if where.endswith("/"):
        return True
    from pyarrow import fs

    filesystem, key = _object_store(where, storage_options)
    return bool(
        _remote(where, storage_options, filesystem.get_file_info, key).type == fs.FileType.Directory
    )


def read(where: Location, storage_options: dict[str, Any] | None = None) -> Stored:
    """The bytes of one regular file or object, refused beyond `MAX_FILE_BYTES`."""
    if isinstance(where, Path):
        return _read_local(where)
    return _read_object(where, storage_options)


def write(where: Location, data: bytes, storage_options: dict[str, Any] | None = None) -> None:
    """Write `data` so that readers see the previous content or all of `data`, never a mix."""
    if len(data) > MAX_FILE_BYTES:
        raise CheckpointError(where, None, _too_big(len(data)))
    if isinstance(where, Path):
        where.parent.mkdir(parents=True, exist_ok=True)
        _write_local(where, data)
    else:
        _write_object(where, data, storage_options)


def newest(folder: Location, storage_options: dict[str, Any] | None = None) -> Location | None:
    """The newest `*.json` (by modification time, then name) in a folder or prefix."""
    if isinstance(folder, Path):
        if not folder.is_dir():
            return None
        files = [p for p in folder.glob(f"*{SUFFIX}") if _candidate(p.name) and p.is_file()]
        return max(files, key=lambda p: (p.stat().st_mtime_ns, p.name), default=None)
    from pyarrow import fs

    filesystem, key = _object_store(folder, storage_options)
    selector = fs.FileSelector(key.rstrip("/"), recursive=False, allow_not_found=True)
    infos = _remote(folder, storage_options, filesystem.get_file_info, selector)
    objects = [i for i in infos if i.type == fs.FileType.File and _candidate(i.base_name)]
    found = max(objects, key=lambda i: (i.mtime_ns or 0, i.base_name), default=None)
    return None if found is None else folder.rstrip("/") + "/" + found.base_name


def _candidate(name: str) -> bool:
    return name.endswith(SUFFIX) and not name.startswith(".")  # not a writer's temporary


def _too_big(size: int) -> str:
    return (
        f"is {size:,} bytes, over the {MAX_FILE_BYTES:,}-byte limit for a checkpoint "
        "(a state holds one cursor per split, so even millions of splits fit): "
        "not a checkpoint written by elastic-loader"
    )


def _kind(mode: int) -> str:
    kinds = [
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ]
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _read_local(path: Path) -> Stored:
    info = os.stat(path)  # follows links; FileNotFoundError names the path
    if stat.S_ISDIR(info.st_mode):
        raise CheckpointError(
            path, None, "is a folder, not a checkpoint file; pass loader.checkpoint.latest(folder)"
        )
    _check_regular(path, info)
    # O_NONBLOCK: should the path be swapped for a FIFO after the stat, open does not wait.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        info = os.fstat(fd)
        _check_regular(path, info)
        chunks, size = [], 0
        while size <= MAX_FILE_BYTES and (chunk := os.read(fd, MAX_FILE_BYTES + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > MAX_FILE_BYTES:
        raise CheckpointError(path, None, _too_big(size))
    return Stored(path, b"".join(chunks), info.st_mtime_ns)


def _check_regular(path: Path, info: os.stat_result) -> None:
    if not stat.S_ISREG(info.st_mode):
        target = f" (a link to {os.path.realpath(path)})" if path.is_symlink() else ""
        raise CheckpointError(
            path,
            None,
            f"is {_kind(info.st_mode)}{target}, not a regular file: checkpoints are read "
            "from regular files only",
        )
    if info.st_size > MAX_FILE_BYTES:
        raise CheckpointError(path, None, _too_big(info.st_size))


def _write_local(target: Path, data: bytes) -> None:
    """Temporary file in the same folder, fsync, rename over the target, fsync the folder."""
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


def _fsync_folder(folder: Path) -> None:
    # Makes the rename itself durable. POSIX only: Windows cannot open a folder this way.
    if not hasattr(os, "O_DIRECTORY"):
        return
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- object storage


def _object_store(uri: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
    try:
        _, key = split_uri(uri)
        return s3_filesystem(storage_options), key
    except ValueError as exc:
        raise CheckpointError(uri, None, redact(str(exc), storage_options)) from None


def _remote(uri: str, storage_options: dict[str, Any] | None, call: Any, *args: Any) -> Any:
    """`call(*args)`, with a store error turned into an OSError naming the URI, no secrets."""
    try:
        return call(*args)
    except OSError as exc:
        raise OSError(
            f"checkpoint {uri}: the object store answered: {redact(str(exc), storage_options)}"
        ) from None


def _read_object(uri: str, storage_options: dict[str, Any] | None) -> Stored:
    from pyarrow import fs

    filesystem, key = _object_store(uri, storage_options)
    info = _remote(uri, storage_options, filesystem.get_file_info, key)
    if info.type == fs.FileType.NotFound:
        raise FileNotFoundError(f"checkpoint {uri}: no such object")
    if info.type == fs.FileType.Directory:
        raise CheckpointError(
            uri,
            None,
            "is a prefix (folder), not a checkpoint object; pass loader.checkpoint.latest(uri)",
        )
    if info.size is not None and info.size > MAX_FILE_BYTES:
        raise CheckpointError(uri, None, _too_big(info.size))
    stream = _remote(uri, storage_options, filesystem.open_input_stream, key)
    with stream:
        data = _remote(uri, storage_options, stream.read, MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise CheckpointError(uri, None, _too_big(len(data)))
    return Stored(uri, data, info.mtime_ns or 0)


def _write_object(uri: str, data: bytes, storage_options: dict[str, Any] | None) -> None:
    """Upload to a temporary object, check its size, then copy it over the target at once."""
    filesystem, key = _object_store(uri, storage_options)
    folder, _, name = key.rpartition("/")
    tmp = f"{folder}/.{name}.{os.getpid()}.{os.urandom(4).hex()}{TMP_SUFFIX}"
    stream = None
    try:
        stream = _remote(uri, storage_options, filesystem.open_output_stream, tmp)
        _remote(uri, storage_options, stream.write, data)
        _remote(uri, storage_options, stream.close)
        size = _remote(uri, storage_options, filesystem.get_file_info, tmp).size
        if size != len(data):
            raise OSError(f"checkpoint {uri}: the upload stored {size} of {len(data)} bytes")
        _remote(uri, storage_options, filesystem.move, tmp, key)  # one CopyObject: atomic
    except BaseException:
        _discard(filesystem, stream, tmp)
        raise


def _discard(filesystem: Any, stream: Any, tmp: str) -> None:
    """Best effort: close (pyarrow then completes the upload) and delete the temporary object."""
    with contextlib.suppress(OSError):
        if stream is not None:
            stream.close()
    with contextlib.suppress(OSError):
        filesystem.delete_file(tmp)
