"""Where checkpoint bytes live: a local regular file, or an object behind an `s3://` URI.

The bytes themselves are `loader.storage`'s (`Location`: regular files only, atomic writes,
one server-side copy on object stores); this module adds what a checkpoint needs: at most
`MAX_FILE_BYTES`, refusals that name the file as a `CheckpointError`, the newest file of a
folder, and a read that a concurrent save cannot make look truncated (`read_checked`).

Standard library only at import; pyarrow is imported for URIs only.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from loader import storage
from loader.storage import has_scheme, redact

MAX_FILE_BYTES = 64 << 20  # a state is O(S) integers: 64 MiB holds millions of splits
SUFFIX = ".json"  # what `save` names its files
SUFFIXES = (SUFFIX, ".ckpt")  # what a folder's checkpoints may be called (`loader.ckpt`)
TMP_SUFFIX = ".tmp"
Location = Path | str  # a local path, or a URI kept as the user wrote it
REREADS = 3  # an object refused while it changes is read again, up to this many times
T = TypeVar("T")


class CheckpointError(ValueError):
    """A checkpoint file that must not be resumed from; the message names file and field."""

    def __init__(self, path: str | os.PathLike[str], field: str | None, problem: str) -> None:
        self.path: Location = location(path)
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
    return path if has_scheme(path) else Path(path)  # type: ignore[return-value]


def _place(where: Location, storage_options: dict[str, Any] | None) -> storage.Location:
    try:
        return storage.location(where, storage_options, label="checkpoint ")
    except ValueError as exc:
        problem = redact(str(exc), storage_options)
    raise CheckpointError(where, None, problem)


def is_folder(where: Location, storage_options: dict[str, Any] | None = None) -> bool:
    """A local folder, or a URI ending in '/' or naming a prefix with objects under it."""
    return _place(where, storage_options).is_folder()


def read(where: Location, storage_options: dict[str, Any] | None = None) -> Stored:
    """The bytes of one regular file or object, refused beyond `MAX_FILE_BYTES`."""
    return _read(_place(where, storage_options))


def _read(place: storage.Location) -> Stored:
    try:
        blob = place.read(MAX_FILE_BYTES)
    except storage.NotAFile as refusal:
        problem = _not_a_file(place, refusal.entry)
    except storage.TooBig as refusal:
        problem = _too_big(refusal.size)
    else:
        return Stored(place.shown, blob.data, blob.mtime_ns)
    raise CheckpointError(place.shown, None, problem)


def read_checked(
    where: Location,
    check: Callable[[Location, bytes], T],
    storage_options: dict[str, Any] | None = None,
) -> tuple[Stored, T]:
    """`read` then `check(location, data)`. An object store reads an object in more than one
    request (its size, then its bytes), so an object replaced meanwhile by a save can come
    back cut at the old size: a refused object is read again, and refused only when the
    same bytes come back (a file that is damaged stays damaged)."""
    place = _place(where, storage_options)
    stored = _read(place)
    for _ in range(0 if place.whole_reads else REREADS):
        try:
            return stored, check(stored.location, stored.data)
        except CheckpointError:
            again = _read(place)
        if again.data == stored.data:
            break
        stored = again
    return stored, check(stored.location, stored.data)


def write(where: Location, data: bytes, storage_options: dict[str, Any] | None = None) -> None:
    """Write `data` so that readers see the previous content or all of `data`, never a mix."""
    if len(data) > MAX_FILE_BYTES:
        raise CheckpointError(where, None, _too_big(len(data)))
    _place(where, storage_options).write_atomic(data)


def newest(
    folder: Location,
    storage_options: dict[str, Any] | None = None,
    accept: Callable[[Location, str], bool] | None = None,
    nested: bool = False,
) -> Location | None:
    """The newest checkpoint-named file (`*.json`, `*.ckpt`; by modification time, then
    name) in a folder or prefix that `accept(location, name)` takes (default: any). With
    `nested` (local folders only), the folders below it are searched too."""
    place = _place(folder, storage_options)
    found = [(e.mtime_ns, e.name, place.child(e.name).shown) for e in place.files()]
    if nested and isinstance(folder, Path):
        found += [
            (path.stat().st_mtime_ns, path.name, path)
            for path in folder.rglob("*")
            if path.parent != folder and path.is_file() and not path.is_symlink()
        ]
    for _, name, where in sorted(found, key=lambda f: (f[0], f[1]), reverse=True):
        if _candidate(name) and (accept is None or accept(where, name)):
            return where
    return None


def _candidate(name: str) -> bool:
    return name.endswith(SUFFIXES) and not name.startswith(".")  # not a writer's temporary


def _too_big(size: int) -> str:
    return (
        f"is {size:,} bytes, over the {MAX_FILE_BYTES:,}-byte limit for a checkpoint "
        "(a state holds one cursor per split, so even millions of splits fit): "
        "not a checkpoint written by elastic-loader"
    )


def _not_a_file(place: storage.Location, entry: storage.Entry) -> str:
    if entry.kind == "folder":
        where = "folder" if place.noun == "file" else "uri"
        return (
            f"is a {place.folder_word}, not a checkpoint {place.noun}; "
            f"pass loader.checkpoint.latest({where})"
        )
    return f"is {entry.what}, not a regular file: checkpoints are read from regular files only"
