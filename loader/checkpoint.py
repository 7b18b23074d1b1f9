"""Checkpoint files for the loader state: refuse loudly, otherwise resume exactly.

A weeks-long job resumes from these files after a crash, and a wrong resume silently
poisons the run, so every way a file can be wrong (truncated, bit-flipped, foreign, from a
newer release, half-written) is an error that names the file and the field. The price is
a few microseconds of SHA-256 and two fsyncs per save, which is nothing next to a step.

File format (see `checkpoints/README.md`): one JSON object, written by orjson,

    {"format": "elastic-loader/checkpoint", "format_version": 1,
     "checksum": "sha256:<hex>", "payload": <the loader state dict>}

where the checksum is over the canonical payload (orjson, sorted keys, no spaces), so it
covers the content, not the layout. Where the bytes live (a local file written by
rename, or an `s3://` object written by one server-side copy; regular files only, at most
`MAX_FILE_BYTES`) is `loader.checkpoint_io`; what a state must be is `loader.state`.

This module imports only the standard library and orjson (pyarrow for URIs), so tools
(and the crash test) can load it without torch or LanceDB.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import orjson

from loader import checkpoint_io as io
from loader.checkpoint_io import MAX_FILE_BYTES, SUFFIX, CheckpointError, Location
from loader.state import FORMAT as STATE_FORMAT
from loader.state import KEY_EPOCH, KEY_STEP, StateError, check_version, is_count
from loader.states import check_state
from loader.telemetry import reporter

__all__ = [
    "DEFAULT_FOLDER",
    "FORMAT",
    "FORMAT_VERSION",
    "MAX_FILE_BYTES",
    "CheckpointError",
    "latest",
    "load",
    "restore",
    "save",
]

FORMAT = "elastic-loader/checkpoint"
FORMAT_VERSION = 1
DEFAULT_FOLDER = Path("checkpoints")
_CHECKSUM_PREFIX = "sha256:"
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip archive
_HEAD = b'{"format":' + orjson.dumps(FORMAT)  # how every checkpoint file begins (`encode`)


class _Resumable(Protocol):
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def save(
    state: Mapping[str, Any],
    path: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Location:
    """Write `state` atomically to `path` and return where it was written.

    Args:
        state: the loader state (`StreamingDataLoader.state_dict()`), plain JSON values.
        path: a file, or a folder to put a default-named file in (`loader-epoch{E}-step{S}.json`);
            a local path or an `s3://bucket/key` URI (a URI ending in '/' is a folder).
            Default: `checkpoints/` under the current directory.
        storage_options: for URIs, Lance-style options (`endpoint`, `allow_http`, `region`,
            `aws_access_key_id`, ...); `AWS_*` environment variables fill the rest.

    Returns:
        The path (or URI) of the checkpoint file.
    """
    if not isinstance(state, Mapping):
        raise TypeError(
            f"save() takes the state dict, got {type(state).__name__}; "
            "pass loader.state_dict(), not the loader"
        )
    target = _target(state, path, storage_options)
    _check_plain(state, target, "payload")
    _check_state(target, dict(state))  # never write a file that `load` would refuse
    io.write(target, encode(state), storage_options)
    reporter.checkpoint_written(state, target)  # the dashboard's timeline (telemetry on)
    return target


def encode(state: Mapping[str, Any]) -> bytes:
    """The file's bytes for `state`: the envelope with the canonical payload inlined."""
    payload = _canonical(state)
    header = orjson.dumps(
        {"format": FORMAT, "format_version": FORMAT_VERSION, "checksum": _digest(payload)}
    )
    return header[:-1] + b',"payload":' + payload + b"}\n"


def load(
    path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Read, verify and return the state stored at `path` (a local file or a URI).

    Raises:
        FileNotFoundError: nothing at `path`.
        CheckpointError: not a regular file, too big, truncated, corrupt, foreign, from a
            newer release, or a state that is wrong in itself (a counter out of range).
        OSError: the object store cannot be reached or refuses (the URI is named).
    """
    return io.read_checked(io.location(path), verify, storage_options)[1]


def verify(where: Location, data: bytes) -> dict[str, Any]:
    """The state in a checkpoint file's bytes, or a CheckpointError naming `where`."""
    envelope = _parse(where, data)
    _check_envelope(where, envelope)
    payload = envelope["payload"]
    if not isinstance(payload, dict):
        raise CheckpointError(where, "payload", f"must be an object, got {_kind(payload)}")
    actual = _digest(_canonical(payload))
    if envelope["checksum"] != actual:
        raise CheckpointError(
            where,
            "checksum",
            f"the file says {envelope['checksum']} but its payload hashes to {actual}: "
            "the file was corrupted or edited after it was written; do not resume from it, "
            "use an earlier checkpoint",
        )
    _check_state(where, payload)
    return payload


def _check_state(where: Location, payload: dict[str, Any]) -> None:
    try:
        check_state(payload)
    except StateError as exc:
        field = "payload" if exc.field is None else f"payload.{exc.field}"
        raise CheckpointError(where, field, exc.problem) from None


def restore(
    loader: _Resumable,
    path: str | os.PathLike[str],
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`load(path)` then `loader.load_state_dict(state)`, with the file named in any refusal.

    The loader's own check (another num_splits, seed, clump, filter or source than the
    file's) raises a ValueError naming the field; this adds which file it came from.
    """
    state = load(path, storage_options)
    try:
        loader.load_state_dict(state)
    except ValueError as exc:
        raise CheckpointError(path, None, f"cannot resume this loader from it: {exc}") from exc
    return state


def latest(
    folder: str | os.PathLike[str] = DEFAULT_FOLDER,
    storage_options: dict[str, Any] | None = None,
) -> Location | None:
    """The most recently written checkpoint file in `folder` (or under a URI prefix), or None.

    Newest by modification time, ties by name (object stores keep whole seconds, so name
    files so that they sort: the default names do), among `*.json` and `*.ckpt` files.
    Temporary files left by a writer that was killed are ignored, and so are other JSON
    files (a run's `result.json`): a file counts if it begins as a checkpoint does, or is
    named as one (`*.ckpt`, `loader-*.json`). So a damaged newest checkpoint is returned as
    is, and `load` reports it instead of silently resuming from an older one.
    """
    return io.newest(io.location(folder), storage_options, checkpoint_filter(storage_options))


def checkpoint_filter(storage_options: dict[str, Any] | None) -> Callable[[Location, str], bool]:
    """Whether a file of a folder is a checkpoint: named as one (`*.ckpt`, `loader-*`), so
    even a damaged one counts, or beginning as `encode` begins every checkpoint."""

    def accept(where: Location, name: str) -> bool:
        if name.endswith(".ckpt") or name.startswith("loader-"):
            return True
        try:
            head = io.read(where, storage_options).data[: len(_HEAD)]
        except (OSError, CheckpointError):
            return True  # unreadable now: `load` says why
        return head == _HEAD

    return accept


def _target(
    state: Mapping[str, Any],
    path: str | os.PathLike[str] | None,
    storage_options: dict[str, Any] | None,
) -> Location:
    where = io.location(DEFAULT_FOLDER if path is None else path)
    if path is not None and not (
        os.fspath(path).endswith(("/", os.sep)) or io.is_folder(where, storage_options)
    ):
        return where
    epoch, step = state.get(KEY_EPOCH, 0), state.get(KEY_STEP, 0)
    for field, value in ((KEY_EPOCH, epoch), (KEY_STEP, step)):
        if not is_count(value):
            raise CheckpointError(where, field, f"is {value!r}, expected an integer >= 0")
    name = f"loader-epoch{epoch:04d}-step{step:08d}{SUFFIX}"
    return where / name if isinstance(where, Path) else where.rstrip("/") + "/" + name


def _canonical(payload: Mapping[str, Any]) -> bytes:
    return orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)


def _digest(canonical: bytes) -> str:
    return _CHECKSUM_PREFIX + hashlib.sha256(canonical).hexdigest()


def _parse(path: Location, data: bytes) -> Any:
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


def _check_envelope(path: Location, envelope: Any) -> None:
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


def _check_version(path: Location, field: str, version: Any, supported: int) -> None:
    try:
        check_version(field, version, supported)
    except StateError as exc:
        raise CheckpointError(path, field, exc.problem) from None


def _check_plain(value: Any, path: Location, field: str) -> None:
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


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", type(None): "null"}
    return names.get(type(value), f"a {type(value).__name__}") + " in JSON"
