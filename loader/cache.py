"""A node-local cache of a pinned Lance version's immutable data files.

Every process of a node (ranks and their DataLoader workers) shares one folder. Lance names
each data and deletion file it writes with a fresh random id and never rewrites it, so a
file, once whole, is valid for every version that lists it. The cache only decides where
bytes come from; the plan alone decides the order (design.md, "Round 5 contract").

How Lance reads from it: the dataset is opened on a *mirror* folder per pinned version
(`loader.cache_mirror`: its manifest, checked against the pin, and links to the shared file
store), so the plan and the read code are unchanged. Before a read touches a fragment, its
files are materialised (`ensure`).

Writers are safe together: one `fcntl` lock per file, so one process of the node downloads
and the others wait on it; bytes go to a temporary name, are fsynced, and renamed; a
checksum sidecar (`<file>.sum`: size and sha256) is written first, and a file is taken as
whole only when its bytes match it (checked once per process, on first use). A `kill -9`
mid-download leaves a temporary file, never a whole-looking one. A process reading a file
pins it (a shared lock on `<file>.pin`, from before the fetch); eviction takes the exclusive
locks without waiting, so it never removes a file a process reads or prefetched for its
next reads. Eviction goes by the plan's next uses when the reader knows them (Belady,
`loader.cache_plan`), else least recently used first.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import itertools
import json
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loader.cache_mirror import mirror_folder, open_mirror
from loader.cache_plan import FileUses, belady_order
from loader.cache_stats import CacheCounts
from loader.storage import is_object_store, normalise_uri
from loader.storage.locations import pyarrow_filesystem

ENV_DIR = "ELASTIC_LOADER_CACHE_DIR"
ENV_LIMIT = "ELASTIC_LOADER_CACHE_LIMIT"
STATS_EVERY_S = 1.0  # how often a process writes its counts for the node's telemetry
_READS = itertools.count()  # tokens of the reads under way (`NodeCache.at`)
CHUNK = 8 << 20  # one streamed GET per file, read in 8 MiB pieces
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}  # fmt: skip


class CacheFileError(OSError):
    """A cached file that cannot be made whole (the store refused, the disk is full)."""


def parse_limit(limit: int | str | None) -> int | None:
    """Bytes from 200_000_000, '200GB', '1.5TiB' (None: no limit)."""
    if limit is None or (isinstance(limit, int) and not isinstance(limit, bool)):
        if limit is not None and limit <= 0:
            raise ValueError(f"cache_limit={limit!r}: expected bytes > 0 (e.g. '200GB')")
        return limit
    if isinstance(limit, str):
        found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", limit)
        if found and found.group(2).upper() in _UNITS and float(found.group(1)) > 0:
            return int(float(found.group(1)) * _UNITS[found.group(2).upper()])
    raise ValueError(
        f"cache_limit={limit!r}: expected bytes > 0 as an int or a size such as '200GB', "
        f"'500MiB' (units {', '.join(u for u in _UNITS if u)})"
    )


@dataclass(frozen=True)
class CacheSpec:
    """Where the node's cache lives and how large it may grow (travels to workers)."""

    root: str
    limit: int | None = None

    @staticmethod
    def of(cache_dir: str | os.PathLike[str] | None, limit: int | str | None) -> CacheSpec | None:
        """From the arguments, else `ELASTIC_LOADER_CACHE_DIR` (None: no cache)."""
        where = cache_dir if cache_dir is not None else os.environ.get(ENV_DIR) or None
        if limit is None:
            limit = os.environ.get(ENV_LIMIT) or None
        if where is None:
            if limit is not None and cache_dir is None and ENV_LIMIT not in os.environ:
                raise ValueError("cache_limit needs cache_dir= (or ELASTIC_LOADER_CACHE_DIR)")
            return None
        if is_object_store(os.fspath(where)):
            raise ValueError(f"cache_dir={where!r}: expected a local folder (e.g. /local/nvme/x)")
        return CacheSpec(str(Path(where).expanduser().resolve()), parse_limit(limit))


@dataclass
class NodeCache:
    """One table's files in the node's cache folder, as seen by this process."""

    spec: CacheSpec
    uri: str
    options: dict[str, str] | None
    counts: CacheCounts = field(default_factory=CacheCounts)
    uses: FileUses | None = None  # this epoch's next uses (Belady); None: least recently used
    _verified: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _written: float = 0.0
    _clock: dict[int, int] = field(default_factory=dict)  # a read under way: its time

    @property
    def base(self) -> Path:
        key = hashlib.sha256(normalise_uri(self.uri).encode()).hexdigest()[:20]
        return Path(self.spec.root) / key

    @property
    def files(self) -> Path:
        return self.base / "files"

    def mirror(self, version: int, version_id: str, opener: Any, identity_of: Any) -> Any:
        """The dataset at `version`, opened on this node's mirror and checked against the pin
        (`loader.cache_mirror`). `opener(url)` opens a Lance dataset at `version`;
        `identity_of(dataset)` is its version identity (the source's own rule, passed in so
        the cache never imports the source)."""
        dataset = open_mirror(self, version, version_id, opener, identity_of)
        if dataset is None:
            raise CacheFileError(
                f"the cache mirror {mirror_folder(self, version, version_id)} of {self.uri!r} "
                f"at version {version} does not match the pinned version's identity "
                f"{version_id} even after fetching its manifest again: the table was "
                f"rewritten; resume from a fresh state"
            )
        return dataset

    # -- files --------------------------------------------------------------------------

    def ensure(self, relative: Iterable[str]) -> None:
        """Make each file (e.g. 'data/x.lance') whole in the cache, fetching what is not."""
        wanted = list(relative)
        for rel in wanted:
            self._ensure_one(rel, keep=set(wanted))
        self._evict(keep=set(wanted))
        self.write_stats()

    def prefetch(self, rel: str, when: int | None = None, size: int = 0) -> int | None:
        """Fetch one file ahead of the read at clock time `when` (the prefetcher's call):
        its size when this call fetched it, None when it was whole already, -1 when there
        is no room without evicting a file needed no later (Belady: it waits)."""
        target = self.files / rel
        with self._lock:
            if rel in self._verified and target.exists():
                return None
        if self._whole(target):
            with self._lock:
                self._verified.add(rel)
            return None
        with self.at(when):  # files the reads before `when` need are pinned by the prefetcher
            if not self._evict(keep={rel}, room=size, before=when):
                return -1
        fetched = self._ensure_one(rel, prefetch=True)
        self.write_stats()
        return fetched

    @contextlib.contextmanager
    def at(self, time: int | None) -> Iterator[None]:
        """A read (and its sub-reads in other threads) at clock time `time`
        (`loader.cache_plan`): eviction counts next uses from the earliest time being read."""
        if time is None:
            yield
            return
        key = next(_READS)
        with self._lock:
            self._clock[key] = time
        try:
            yield
        finally:
            with self._lock:
                self._clock.pop(key, None)

    @contextlib.contextmanager
    def pinned(self, rel: str) -> Iterator[None]:
        """Keep a file from eviction (a read, the prefetch window): a shared lock on
        `<file>.pin`, which downloads never take, so a pinned file can be fetched again."""
        with self._file_lock(rel, fcntl.LOCK_SH, suffix=".pin"):
            yield

    def write_stats(self, force: bool = False) -> None:
        """This process's counts in `<root>/stats/<pid>.json`, for `node_stats` (lossy)."""
        now = time.monotonic()
        if not force and now - self._written < STATS_EVERY_S:
            return
        self._written = now
        folder = Path(self.spec.root) / "stats"
        with contextlib.suppress(OSError):
            folder.mkdir(parents=True, exist_ok=True)
            text = json.dumps(self.counts.as_dict()).encode()
            _write_atomic(folder / f"{os.getpid()}-{id(self)}.json", text)

    def trim(self) -> None:
        """Evict down to the limit; files other processes are reading stay."""
        self._evict(keep=set())
        self.write_stats()

    def forget(self, relative: Iterable[str]) -> None:
        """Check these files again on next use (a read found one missing or damaged)."""
        with self._lock:
            self._verified.difference_update(relative)

    @contextlib.contextmanager
    def reading(self, relative: Iterable[str]) -> Iterator[None]:
        """Pin the files a read uses, from before they are fetched until it is done:
        eviction passes over them (a download may still replace a damaged one)."""
        with contextlib.ExitStack() as stack:
            for rel in sorted(set(relative)):
                stack.enter_context(self.pinned(rel))
            yield

    def _ensure_one(
        self, rel: str, prefetch: bool = False, keep: set[str] | None = None
    ) -> int | None:
        """Make one file whole; the bytes fetched (None: it was whole, a hit). A fetch for
        a read first evicts down to the limit (never `keep`), so it lands in room."""
        target = self.files / rel
        fetched = None
        with self._lock:
            if not prefetch and rel in self._verified and target.exists():
                self.counts.hits += 1
                self.counts.bytes_from_cache += target.stat().st_size
                return None
        if not prefetch and self._whole(target):
            with self._lock:
                self._verified.add(rel)
                self.counts.hits += 1
                self.counts.bytes_from_cache += target.stat().st_size
            _touch(target)
            return None
        with self._file_lock(rel, fcntl.LOCK_EX):
            if not self._whole(target):  # another process may have fetched it meanwhile
                if keep is not None:
                    self._evict(keep)
                refetch = target.exists() or _sum_path(target).exists()
                filesystem, root = pyarrow_filesystem(self.uri, self.options)
                size = self.download(filesystem, f"{root}/{rel}", target, count=True)
                with self._lock:
                    self.counts.misses += 1
                    self.counts.refetched += int(refetch)
                    self.counts.bytes_from_store += size
                    self.counts.prefetched += int(prefetch)
                self._written = 0.0  # a fetch is reported at once
                fetched = size
            elif not prefetch:  # waited on another process's download
                with self._lock:
                    self.counts.hits += 1
                    self.counts.bytes_from_cache += target.stat().st_size
            with self._lock:
                self._verified.add(rel)
        return fetched

    def download(self, filesystem: Any, path: str, target: Path, count: bool) -> int:
        """Stream one object to a temporary name, sum it, write the sidecar, rename."""
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        digest, size = hashlib.sha256(), 0
        try:
            with filesystem.open_input_stream(path) as source, open(tmp, "wb") as out:
                while piece := source.read(CHUNK):
                    digest.update(piece)
                    out.write(piece)
                    size += len(piece)
                out.flush()
                os.fsync(out.fileno())
            if count:
                _write_atomic(_sum_path(target), f"{size} {digest.hexdigest()}\n".encode())
            os.replace(tmp, target)
        except OSError as err:
            with contextlib.suppress(OSError):
                tmp.unlink()
            full = getattr(err, "errno", None) == errno.ENOSPC
            why = (
                f"the cache disk is full (cache_limit={self.spec.limit}): set cache_limit "
                f"below the free space of the disk holding {self.spec.root}, or free space"
                if full
                else str(err)
            )
            raise CacheFileError(
                f"caching {path!r} of {self.uri!r} in {target.parent} failed: {why}"
            ) from None
        return size

    def _whole(self, target: Path) -> bool:
        return whole_file(target)

    # -- eviction -----------------------------------------------------------------------

    def _evict(self, keep: set[str], room: int = 0, before: int | None = None) -> bool:
        """Remove files until `room` more bytes fit under the limit: furthest next use
        first (Belady, when this epoch's uses are known; else least recently used). Skip
        a file another process reads or pins (its shared lock), any in `keep`, and with
        `before` (a prefetch at that time) any needed no later. True when it fits."""
        limit = self.spec.limit
        if limit is None:
            return True
        present = []
        for sub in ("data", "_deletions"):
            for path in (self.files / sub).glob("*"):
                if path.name.startswith(".") or path.suffix in (".sum", ".lock", ".pin"):
                    continue
                with contextlib.suppress(OSError):
                    st = path.stat()
                    present.append((st.st_mtime_ns, f"{sub}/{path.name}", st.st_size))
        total = sum(size for _, _, size in present)
        if total + room <= limit:
            return True
        rels = [rel for _, rel, _ in present]
        with self._lock:
            now = min(self._clock.values(), default=None)
        uses = self.uses
        if uses is not None and now is not None:
            upcoming = uses.next_use(rels, now)
            order = belady_order(upcoming, np.array([age for age, _, _ in present]))
        else:
            upcoming = None
            order = np.argsort([age for age, _, _ in present], kind="stable")
        for i in order.tolist():
            _, rel, size = present[i]
            if total + room <= limit:
                break
            if rel in keep or (
                before is not None and upcoming is not None and upcoming[i] <= before
            ):
                continue
            if before is not None and upcoming is None:
                break  # no plan: a prefetch never evicts
            with self._try_lock(rel) as got:
                if not got:
                    continue
                target = self.files / rel
                with contextlib.suppress(FileNotFoundError):
                    target.unlink()
                    _sum_path(target).unlink(missing_ok=True)  # evicted is not damaged
                    total -= size
                    with self._lock:
                        self.counts.evictions += 1
                        self._verified.discard(rel)
        return total + room <= limit

    # -- locks --------------------------------------------------------------------------

    def _lock_path(self, rel: str, suffix: str = ".lock") -> Path:
        path = self.files / f"{rel}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    @contextlib.contextmanager
    def _file_lock(self, rel: str, how: int, suffix: str = ".lock") -> Iterator[None]:
        fd = os.open(self._lock_path(rel, suffix), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, how)
            yield
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _try_lock(self, rel: str) -> Iterator[bool]:
        """The exclusive locks eviction needs, without waiting: none read it, none pin it."""
        fds = [
            os.open(self._lock_path(rel, s), os.O_RDWR | os.O_CREAT, 0o644)
            for s in (".lock", ".pin")
        ]
        try:
            try:
                for fd in fds:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
            else:
                yield True
        finally:
            for fd in fds:
                os.close(fd)


def fragment_files(fragment: Any) -> list[str]:
    """The cached files one fragment's read needs: its data files and deletion file."""
    meta = fragment.metadata
    files = [f"data/{f.path}" for f in meta.files]
    if meta.deletion_file is not None:
        files.append(f"_deletions/{meta.deletion_file.path(meta.id).rsplit('/', 1)[-1]}")
    return files


def whole_file(target: Path) -> bool:
    """The file's bytes match its sidecar (size and sha256): the only test of whole."""
    try:
        size, want = _sum_path(target).read_text().split()
        if target.stat().st_size != int(size):
            return False
        return _sha256(target) == want
    except (OSError, ValueError):
        return False


def _sum_path(target: Path) -> Path:
    return target.with_name(f"{target.name}.sum")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(CHUNK):
            digest.update(piece)
    return digest.hexdigest()


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.utime(path)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk leaves no temporary file behind
        raise
