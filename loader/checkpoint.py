"""Checkpoint files for the loader state: refuse loudly, otherwise resume exactly.

A weeks-long job resumes from these files after a crash, and a wrong resume silently
poisons the run, so every way a file can be wrong (truncated, bit-flipped, foreign, from a
newer release, half-written) is an error that names the file and the field. The price is
a few microseconds of SHA-256 and two fsyncs per save, which is nothing next to a step.

File format (see `checkpoints/README.md`): one JSON object, written by orjson,

    {"format": "elastic-loader/checkpoint", "format_version": 1,
     "checksum": "sha256:<hex>", "payload": <the loader state dict>}

where the checksum is over the canonical payload (orjson, sorted keys, no spaces), so it
covers the content, not the layout. `save` writes a temporary file in the same folder,
fsyncs it, renames it over the target and fsyncs the folder: a reader sees the old file
or the new one, never a mix, even when the writer is killed mid-write.

This module imports only the standard library and orjson, so tools (and the crash test)
can load it without torch or LanceDB.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import orjson

__all__ = [
    "DEFAULT_FOLDER",
    "FORMAT",
    "FORMAT_VERSION",
    "CheckpointError",
    "latest",
    "load",
    "restore",
    "save",
]

FORMAT = "elastic-loader/checkpoint"
FORMAT_VERSION = 1
STATE_FORMAT = "elastic-loader/state"  # the payload's own tag (`loader.state`)
STATE_FORMAT_VERSION = 1
DEFAULT_FOLDER = Path("checkpoints")
SUFFIX = ".json"
_TMP_SUFFIX = ".tmp"
_CHECKSUM_PREFIX = "sha256:"
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip archive


class _Resumable(Protocol):
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class CheckpointError(ValueError):
    """A checkpoint file that must not be resumed from; the message names file and field."""

    def __init__(self, path: str | os.PathLike[str], field: str | None, problem: str) -> None:
        self.path = Path(path)
        self.field = field
        where = f"{self.path}: field {field!r}" if field else str(self.path)
        super().__init__(f"checkpoint {where}: {problem}")


def save(state: Mapping[str, Any], path: str | os.PathLike[str] | None = None) -> Path:
    """Write `state` atomically to `path` and return the file written.

    Args:
        state: the loader state (`StreamingDataLoader.state_dict()`), plain JSON values.
        path: a file, or a folder to put a default-named file in. Default: `checkpoints/`
            under the current directory, file `loader-epoch{E}-step{S}.json`.

    Returns:
        The path of the checkpoint file.
    """
    if not isinstance(state, Mapping):
        raise TypeError(
            f"save() takes the state dict, got {type(state).__name__}; "
            "pass loader.state_dict(), not the loader"
        )
    target = _target_path(state, path)
    _check_plain(state, target, "payload")
    data = encode(state)
    target.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(target, data)
    _tell_telemetry(state, target)
    return target


def _tell_telemetry(state: Mapping[str, Any], target: Path) -> None:
    """Put the checkpoint on the dashboard's timeline: live telemetry clients of this process
    whose loader is at `state` send it (telemetry off: the module was never imported)."""
    telemetry = sys.modules.get("loader.telemetry")
    if telemetry is not None:
        telemetry.checkpoint_saved(state, target)


def encode(state: Mapping[str, Any]) -> bytes:
    """The file's bytes for `state`: the envelope with the canonical payload inlined."""
    payload = _canonical(state)
    header = orjson.dumps(
        {"format": FORMAT, "format_version": FORMAT_VERSION, "checksum": _digest(payload)}
    )
    return header[:-1] + b',"payload":' + payload + b"}\n"


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read, verify and return the state stored at `path`.

    Raises:
        FileNotFoundError: nothing at `path`.
        CheckpointError: the file is truncated, corrupt, foreign or from a newer release.
    """
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(
            path, None, "is a folder, not a checkpoint file; pass loader.checkpoint.latest(folder)"
        )
    data = path.read_bytes()
    envelope = _parse(path, data)
    _check_envelope(path, envelope)
    payload = envelope["payload"]
    if not isinstance(payload, dict):
        raise CheckpointError(path, "payload", f"must be an object, got {_kind(payload)}")
    actual = _digest(_canonical(payload))
    if envelope["checksum"] != actual:
        raise CheckpointError(
            path,
            "checksum",
            f"the file says {envelope['checksum']} but its payload hashes to {actual}: "
            "the file was corrupted or edited after it was written; do not resume from it, "
            "use an earlier checkpoint",
        )
    _check_payload(path, payload)
    return payload


def restore(loader: _Resumable, path: str | os.PathLike[str]) -> dict[str, Any]:
    """`load(path)` then `loader.load_state_dict(state)`, with the file named in any refusal.

    The loader's own check (another num_splits, seed, clump, filter or source than the
    file's) raises a ValueError naming the field; this adds which file it came from.
    """
    state = load(path)
    try:
        loader.load_state_dict(state)
    except ValueError as exc:
        raise CheckpointError(path, None, f"cannot resume this loader from it: {exc}") from exc
    return state


def latest(folder: str | os.PathLike[str] = DEFAULT_FOLDER) -> Path | None:
    """The most recently written checkpoint file in `folder`, or None if there is none.

    Temporary files left by a writer that was killed are ignored; a damaged newest file is
    returned as is, so that `load` reports it instead of silently resuming from an older one.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return None
    files = [p for p in folder.glob(f"*{SUFFIX}") if p.is_file() and not p.name.startswith(".")]
    if not files:
        return None
    return max(files, key=lambda p: (p.stat().st_mtime_ns, p.name))


def _target_path(state: Mapping[str, Any], path: str | os.PathLike[str] | None) -> Path:
    if path is not None and not (Path(path).is_dir() or os.fspath(path).endswith(("/", os.sep))):
        return Path(path)
    folder = DEFAULT_FOLDER if path is None else Path(path)
    epoch, step = state.get("epoch", 0), state.get("step", 0)
    for field, value in (("epoch", epoch), ("step", step)):
        if not _is_count(value):
            raise CheckpointError(folder, field, f"is {value!r}, expected an integer >= 0")
    return folder / f"loader-epoch{epoch:04d}-step{step:08d}{SUFFIX}"


def _write_atomic(target: Path, data: bytes) -> None:
    """Temporary file in the same folder, fsync, rename over the target, fsync the folder."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}{_TMP_SUFFIX}")
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


def _canonical(payload: Mapping[str, Any]) -> bytes:
    return orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)


def _digest(canonical: bytes) -> str:
    return _CHECKSUM_PREFIX + hashlib.sha256(canonical).hexdigest()


def _parse(path: Path, data: bytes) -> Any:
    if not data:
        raise CheckpointError(path, None, "is empty (0 bytes); use an earlier checkpoint")
    if data.startswith(_ZIP_MAGIC):
        raise CheckpointError(
            path,
            None,
            "is a zip archive (a torch.save file?), not an elastic-loader checkpoint; "
            "read it with torch.load(path, weights_only=True) and pass the dict to "
            "load_state_dict",
        )
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if exc.pos >= len(data.rstrip()):
            problem = f"is truncated: the JSON stops after {len(data)} bytes"
        else:
            problem = f"is not valid JSON at byte {exc.pos} of {len(data)} ({exc.msg}): corrupt"
        raise CheckpointError(path, None, f"{problem}; use an earlier checkpoint") from exc


def _check_envelope(path: Path, envelope: Any) -> None:
    if not isinstance(envelope, dict):
        raise CheckpointError(
            path, None, f"holds {_kind(envelope)}, not an elastic-loader checkpoint object"
        )
    fmt = envelope.get("format")
    if fmt == STATE_FORMAT:
        raise CheckpointError(
            path,
            "format",
            f"is a bare loader state ({STATE_FORMAT!r}) without the checkpoint envelope and its "
            "checksum; write checkpoints with loader.checkpoint.save(state, path)",
        )
    if fmt != FORMAT:
        shown = repr(fmt) if "format" in envelope else "missing"
        raise CheckpointError(
            path, "format", f"is {shown}, expected {FORMAT!r}: not an elastic-loader checkpoint"
        )
    _check_version(path, "format_version", envelope.get("format_version"), FORMAT_VERSION)
    checksum = envelope.get("checksum")
    if not (isinstance(checksum, str) and checksum.startswith(_CHECKSUM_PREFIX)):
        raise CheckpointError(
            path, "checksum", f"is {checksum!r}, expected 'sha256:<64 hex digits>'"
        )
    if "payload" not in envelope:
        raise CheckpointError(path, "payload", "is missing")


def _check_version(path: Path, field: str, version: Any, supported: int) -> None:
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CheckpointError(path, field, f"is {version!r}, expected an integer >= 1")
    if version > supported:
        raise CheckpointError(
            path,
            field,
            f"is {version}, but this elastic-loader reads format version {supported} at most: "
            "the file was written by a newer release; upgrade elastic-loader to resume from it",
        )


def _check_payload(path: Path, payload: dict[str, Any]) -> None:
    """The shape every reader relies on; the loader checks it against the dataset itself."""
    if payload.get("format") != STATE_FORMAT:
        raise CheckpointError(
            path, "payload.format", f"is {payload.get('format')!r}, expected {STATE_FORMAT!r}"
        )
    _check_version(
        path, "payload.format_version", payload.get("format_version"), STATE_FORMAT_VERSION
    )
    for key in ("plan", "source"):
        if not isinstance(payload.get(key), dict):
            raise CheckpointError(
                path, f"payload.{key}", f"must be an object, got {_kind(payload.get(key))}"
            )
    num_splits = payload["plan"].get("num_splits")
    if not _is_count(num_splits) or num_splits < 1:
        raise CheckpointError(
            path, "payload.plan.num_splits", f"is {num_splits!r}, expected an integer >= 1"
        )
    if not _is_count(payload.get("epoch")):
        raise CheckpointError(
            path, "payload.epoch", f"is {payload.get('epoch')!r}, expected an integer >= 0"
        )
    cursors = payload.get("cursors")
    if not isinstance(cursors, list) or len(cursors) != num_splits:
        got = f"{len(cursors)} entries" if isinstance(cursors, list) else _kind(cursors)
        raise CheckpointError(
            path, "payload.cursors", f"must list one cursor per split ({num_splits}), got {got}"
        )
    bad = next((i for i, c in enumerate(cursors) if not _is_count(c)), None)
    if bad is not None:
        raise CheckpointError(
            path, f"payload.cursors[{bad}]", f"is {cursors[bad]!r}, expected an integer >= 0"
        )


def _check_plain(value: Any, path: Path, field: str) -> None:
    """Reject what JSON would not give back unchanged (NumPy ints, tuples' cousins, NaN)."""
    if value is None or isinstance(value, (str, bool)):
        return
    if isinstance(value, int) and type(value) is int:
        if not -(2**63) <= value < 2**64:
            raise CheckpointError(path, field, f"integer {value} does not fit in 64 bits")
        return
    if type(value) is float:
        if not math.isfinite(value):
            raise CheckpointError(path, field, f"is {value}, which JSON cannot store")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise CheckpointError(path, field, f"has key {key!r}; keys must be strings")
            _check_plain(item, path, f"{field}.{key}")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_plain(item, path, f"{field}[{i}]")
        return
    raise CheckpointError(
        path,
        field,
        f"is a {type(value).__module__}.{type(value).__name__}; the state must hold plain "
        "JSON values (convert NumPy/torch numbers with int() or .tolist())",
    )


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", type(None): "null"}
    return names.get(type(value), f"a {type(value).__name__}") + " in JSON"
