"""A pinned version's mirror in the node cache: the table's identity, kept apart from its files.

Lance opens a cached table on a *mirror* folder per pinned version: that version's manifest
(`_versions/`) and links `data/` and `_deletions/` to the node's shared file store
(`loader.cache`), so the plan and the read code are unchanged. Manifests are never cached
blindly: one is fetched from the store when the mirror lacks it (by one process or thread
of the node at a time: a lock per mirror), and used only once the opened mirror's
`version_id` equals the pinned one, so a table rewritten under the same name and version
number never reads a stale copy.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from loader.storage.locations import pyarrow_filesystem


class MirroredCache(Protocol):
    """What the mirror needs of the node's cache (`loader.cache.NodeCache`)."""

    uri: str
    options: dict[str, str] | None

    @property
    def base(self) -> Path: ...

    @property
    def files(self) -> Path: ...

    def download(self, filesystem: Any, path: str, target: Path, count: bool) -> int: ...


def mirror_folder(cache: MirroredCache, version: int, version_id: str) -> Path:
    """The mirror of the pinned version: its version number and a digest of its identity."""
    return cache.base / f"v{version}-{hashlib.sha256(version_id.encode()).hexdigest()[:20]}"


def open_mirror(
    cache: MirroredCache, version: int, version_id: str, opener: Any, identity_of: Any
) -> Any | None:
    """The dataset at `version`, opened on the node's mirror and checked against the pin;
    None when it is not the pinned content even after fetching the manifest again (the
    caller, `NodeCache.mirror`, raises). The manifest is fetched when the mirror lacks it."""
    where = mirror_folder(cache, version, version_id)
    for sub in ("data", "_deletions"):
        (cache.files / sub).mkdir(parents=True, exist_ok=True)
    (where / "_versions").mkdir(parents=True, exist_ok=True)
    for sub in ("data", "_deletions"):
        link = where / sub
        if not link.is_symlink():
            with contextlib.suppress(FileExistsError):
                link.symlink_to(cache.files / sub, target_is_directory=True)
    for attempt in range(2):
        if attempt or not _has_manifest(where / "_versions", version):
            with _locked(where.with_name(f"{where.name}.lock")):  # one fetch per node
                if attempt or not _has_manifest(where / "_versions", version):
                    fetch_manifests(cache, version, where / "_versions")
        try:
            dataset = opener(str(where))
        except (ValueError, OSError, RuntimeError):
            continue  # no or a damaged manifest: fetched again
        if identity_of(dataset) == version_id:
            return dataset
    return None


def fetch_manifests(cache: MirroredCache, version: int, folder: Path) -> None:
    """Copy the store's manifests of `version` (either naming scheme) into the mirror; not
    counted in `bytes_from_store` (docs/cache.md, "What the counters count")."""
    from pyarrow import fs

    filesystem, root = pyarrow_filesystem(cache.uri, cache.options)
    names = _manifest_names(version)
    for info in filesystem.get_file_info(fs.FileSelector(f"{root}/_versions")):
        name = info.path.rsplit("/", 1)[-1]
        if name in names:
            cache.download(filesystem, info.path, folder / name, count=False)


def _manifest_names(version: int) -> set[str]:
    return {f"{version}.manifest", f"{(2**64 - 1) - version:020d}.manifest"}


def _has_manifest(folder: Path, version: int) -> bool:
    """A manifest of `version` in the mirror (a download's temporary name is not one)."""
    return any((folder / name).exists() for name in _manifest_names(version))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive `fcntl` lock on `path`: the node's processes, and threads opening the
    mirror at once (each holds its own open file), fetch its manifest one at a time."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
