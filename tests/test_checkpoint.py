"""Checkpoint files: format, atomic writes, every bad-input case, SIGKILL mid-save.

No loader needed: the state is built by hand in the documented shape (docs/internals.md).
The rule under test is "refuse loudly, otherwise resume exactly": every damaged or foreign
file raises a CheckpointError whose message contains the path; nothing else loads.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loader import checkpoint
from loader.checkpoint import CheckpointError, latest, load, save


def make_state(num_splits: int = 8, epoch: int = 2, step: int = 10, **changes: Any) -> dict:
    rows_per_split = 125
    state = {
        "format": "elastic-loader/state",
        "format_version": 1,
        "plan": {
            "num_rows": num_splits * rows_per_split + 3,
            "num_splits": num_splits,
            "rows_per_split": rows_per_split,
            "shuffle": True,
            "shuffle_seed": 17,
            "shuffle_clump_size": 4,
            "filter": "label > 2",
            "drop_last": False,
        },
        "source": {
            "kind": "lancedb",
            "uri": "/data/db",
            "table": "items",
            "version": 7,
            "columns": ["id", "label"],
            "fingerprint": None,
            "version_id": "sha256:5eed",
        },
        "epoch": epoch,
        "cursors": [(3 * s) % 11 + step for s in range(num_splits)],
        "skipped": 0,
        "world_size": 4,
        "step": step,
    }
    state.update(changes)
    return state


def assert_refused(path: Path, field: str | None = None, fragment: str = "") -> CheckpointError:
    with pytest.raises(CheckpointError) as info:
        load(path)
    message = str(info.value)
    assert str(path) in message
    assert fragment in message
    if field is not None:
        assert info.value.field == field
        assert repr(field) in message
    return info.value


# ---------------------------------------------------------------- format


def test_round_trip_and_layout(tmp_path: Path) -> None:
    state = make_state()
    path = save(state, tmp_path / "a.json")
    assert load(path) == state
    data = path.read_bytes()
    envelope = orjson.loads(data)
    assert list(envelope) == ["format", "format_version", "checksum", "payload"]
    assert envelope["format"] == "elastic-loader/checkpoint"
    assert envelope["format_version"] == 1
    canonical = orjson.dumps(state, option=orjson.OPT_SORT_KEYS)
    assert envelope["checksum"] == "sha256:" + hashlib.sha256(canonical).hexdigest()
    assert data.endswith(b"}\n")
    assert os.listdir(tmp_path) == ["a.json"]  # no temporary file left behind


@pytest.mark.slow
def test_checkpoint_and_inspect_import_without_torch() -> None:
    """The state's checks live in loader/state.py, which stays standard-library only."""
    code = (
        "import sys, loader.checkpoint, loader.tools.inspect, loader.states\n"
        "heavy = sorted({'torch', 'numba', 'lance', 'pyarrow'} & set(sys.modules))\n"
        "assert not heavy, heavy\n"
        "assert loader.checkpoint.check_state is loader.states.check_state"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_checksum_covers_content_not_layout(tmp_path: Path) -> None:
    """Reformatting the JSON (e.g. with jq) keeps the file loadable; changing a value does not."""
    path = save(make_state(), tmp_path / "a.json")
    pretty = orjson.dumps(orjson.loads(path.read_bytes()), option=orjson.OPT_INDENT_2)
    path.write_bytes(pretty)
    assert load(path) == make_state()


def test_default_folder_and_latest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert latest() is None
    first = save(make_state(epoch=1, step=5))
    assert first == Path("checkpoints/loader-epoch0001-step00000005.json")
    second = save(make_state(epoch=1, step=9), "checkpoints")
    assert second == Path("checkpoints/loader-epoch0001-step00000009.json")
    os.utime(first, ns=(1, 1))  # make the first one clearly older
    (tmp_path / "checkpoints" / ".x.json.123.tmp").write_bytes(b"{")  # a killed writer's leftover
    assert latest() == second
    assert load(latest("checkpoints")) == make_state(epoch=1, step=9)  # type: ignore[arg-type]


def test_torch_save_of_plain_state_keeps_working(tmp_path: Path) -> None:
    import torch

    state = make_state()
    torch.save(state, tmp_path / "state.pt")
    assert torch.load(tmp_path / "state.pt", weights_only=True) == state
    # ...and our loader points a user who mixes the two up at torch.load.
    assert_refused(tmp_path / "state.pt", None, "torch.load")


def test_save_rejects_values_json_would_change(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    cursors: list[Any] = [1, np.int64(2), 3, 4, 5, 6, 7, 8]
    with pytest.raises(CheckpointError, match=r"'payload\.cursors\[1\]'.*numpy"):
        save(make_state(cursors=cursors), path)
    with pytest.raises(CheckpointError, match=r"'payload\.plan\.ratio'.*nan"):
        save(make_state(plan={**make_state()["plan"], "ratio": float("nan")}), path)
    with pytest.raises(TypeError, match="state_dict"):
        save(object(), path)  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match=r"'payload\.step': is -1000"):
        save({**make_state(), "step": -1000}, path)  # what load would refuse
    assert not path.exists()


# ---------------------------------------------------------------- atomicity


def test_failed_rename_keeps_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = save(make_state(epoch=1), tmp_path / "a.json")

    def broken_replace(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space"):
        save(make_state(epoch=2), path)
    assert load(path) == make_state(epoch=1)
    assert os.listdir(tmp_path) == ["a.json"]


def test_fsyncs_file_then_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[bool] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.path.isdir(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(checkpoint.os, "fsync", spy)
    save(make_state(), tmp_path / "a.json")
    assert synced == [False, True]


_CHILD = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("ckpt", sys.argv[1])
ckpt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ckpt)
state = {"format": "elastic-loader/state", "format_version": 1, "source": {},
         "plan": {"num_rows": 300000 * 1000, "num_splits": 300000, "rows_per_split": 1000},
         "epoch": 0, "skipped": 0, "world_size": 1, "step": 0}
for epoch in range(10**9):
    state["epoch"] = epoch
    state["cursors"] = [(epoch * 7 + s) % 1000 for s in range(300000)]
    ckpt.save(state, sys.argv[2])
"""


def _kill_mid_save(folder: Path, target: Path) -> bool:
    """Run a saver in a loop and SIGKILL it while a temporary file exists; True if it was."""
    module = Path(checkpoint.__file__)
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(module), str(target)])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and child.poll() is None:
            if target.exists() and any(n.endswith(".tmp") for n in os.listdir(folder)):
                child.send_signal(signal.SIGKILL)
                break
        else:
            pytest.fail(f"the saver never got to a second save (exit status {child.poll()})")
    finally:
        child.kill()
        child.wait()
    return any(n.endswith(".tmp") for n in os.listdir(folder))


def test_sigkill_during_save_leaves_previous_checkpoint_loadable(tmp_path: Path) -> None:
    target = tmp_path / "big.json"
    for _ in range(5):  # the kill lands mid-write nearly always; retry the rare miss
        if _kill_mid_save(tmp_path, target):
            break
    else:
        pytest.fail("could not kill the saver while it was writing")
    state = load(target)  # the last complete save, never a torn one
    epoch = state["epoch"]
    assert state["cursors"] == [(epoch * 7 + s) % 1000 for s in range(300000)]
    assert latest(tmp_path) == target  # the torn temporary file is not a candidate


# ---------------------------------------------------------------- bad input


def test_truncated_at_every_length_is_refused(tmp_path: Path) -> None:
    data = checkpoint.encode(make_state())
    for size in range(len(data) - 1):  # `data[:-1]` only drops the final newline: still whole
        path = tmp_path / f"cut-{size}.json"  # a new file each time: ext4 makes re-truncating slow
        path.write_bytes(data[:size])
        assert_refused(path, None, "empty" if size == 0 else "truncated")


def test_every_single_bit_flip_is_refused(tmp_path: Path) -> None:
    data = checkpoint.encode(make_state())
    path = tmp_path / "flip.json"
    path.write_bytes(data)
    fd = os.open(path, os.O_WRONLY)
    try:
        for bit in range(8 * len(data)):
            index = bit // 8
            os.pwrite(fd, bytes([data[index] ^ (1 << (bit % 8))]), index)  # in place, same size
            try:
                load(path)
            except CheckpointError as exc:
                assert str(path) in str(exc)
            else:
                pytest.fail(f"flipping bit {bit % 8} of byte {index} went unnoticed")
            os.pwrite(fd, data[index : index + 1], index)
    finally:
        os.close(fd)


def test_edited_value_fails_the_checksum(tmp_path: Path) -> None:
    path = save(make_state(), tmp_path / "a.json")
    path.write_bytes(path.read_bytes().replace(b'"epoch":2', b'"epoch":3'))
    assert_refused(path, "checksum", "hashes to sha256:")


@pytest.mark.parametrize(
    ("content", "field", "fragment"),
    [
        (b'{"hello": 1}', "format", "is missing, expected 'elastic-loader/checkpoint'"),
        (b"[1, 2, 3]", None, "an array in JSON"),
        (b'"checkpoint"', None, "a string in JSON"),
        (b"\x00\x01\x02binary", None, "not valid JSON at byte 0"),
        (orjson.dumps(make_state()), "format", "bare loader state"),
        (b'{"format": "elastic-loader/checkpoint", "format_version": 1}', "checksum", ""),
        (
            b'{"format": "elastic-loader/checkpoint", "format_version": 1, "checksum": "sha256:0"}',
            "payload",
            "missing",
        ),
        (
            b'{"format": "elastic-loader/checkpoint", "format_version": "1", "checksum": "x"}',
            "format_version",
            "integer",
        ),
    ],
    ids=[
        "foreign-json",
        "array",
        "string",
        "binary",
        "bare-state",
        "no-checksum",
        "no-payload",
        "version-str",
    ],
)
def test_foreign_files_are_refused(
    tmp_path: Path, content: bytes, field: str | None, fragment: str
) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(content)
    assert_refused(path, field, fragment)


def test_future_format_versions_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.json"
    data = checkpoint.encode(make_state())
    path.write_bytes(
        data.replace(b'"format_version":1,"checksum"', b'"format_version":2,"checksum"')
    )
    assert_refused(path, "format_version", "upgrade elastic-loader")
    path.write_bytes(checkpoint.encode(make_state(format_version=2)))
    assert_refused(path, "payload.format_version", "upgrade elastic-loader")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"format": "something/else"}, "payload.format"),
        ({"cursors": [1, 2, 3]}, "payload.cursors"),
        ({"cursors": [1, 2, 3, -4, 5, 6, 7, 8]}, "payload.cursors[3]"),
        ({"epoch": -1}, "payload.epoch"),
        ({"plan": {"num_splits": 0}}, "payload.plan.num_splits"),
        ({"source": None}, "payload.source"),
        # Counters out of range (issue 10, item 19): each loaded before and broke later.
        ({"step": -1000}, "payload.step"),
        ({"step": 2**63}, "payload.step"),
        ({"epoch": 2**63}, "payload.epoch"),
        ({"skipped": -1}, "payload.skipped"),
        ({"skipped": 8 * 125 + 1}, "payload.skipped"),
        ({"world_size": 0}, "payload.world_size"),
        ({"world_size": 3}, "payload.world_size"),
        ({"world_size": 16}, "payload.world_size"),
        ({"cursors": [126, 0, 0, 0, 0, 0, 0, 0]}, "payload.cursors[0]"),
        ({"cursors": [0, 0, 0, 0, 0, 0, 0, 2**62]}, "payload.cursors[7]"),
        ({"cursors": [0, 0, 1.5, 0, 0, 0, 0, 0]}, "payload.cursors[2]"),
        (
            {"plan": {**make_state()["plan"], "rows_per_split": 2**62}},
            "payload.plan.rows_per_split",
        ),
        ({"plan": {**make_state()["plan"], "num_rows": 7}}, "payload.plan.num_rows"),
        ({"plan": {**make_state()["plan"], "num_splits": True}}, "payload.plan.num_splits"),
        ({"source": {**make_state()["source"], "columns": [1, 2]}}, "payload.source.columns"),
        ({"source": {**make_state()["source"], "columns": "id"}}, "payload.source.columns"),
        ({"step": None}, "payload.step"),
        ({"global_step": -3}, "payload.global_step"),
        ({"global_step": "7"}, "payload.global_step"),
    ],
)
def test_malformed_payload_with_valid_checksum_is_refused(
    tmp_path: Path, changes: dict, field: str
) -> None:
    path = tmp_path / "odd.json"
    path.write_bytes(checkpoint.encode({**make_state(), **changes}))
    assert_refused(path, field)


def test_missing_state_fields_are_named(tmp_path: Path) -> None:
    state = make_state()
    del state["step"], state["world_size"]
    path = tmp_path / "old.json"
    path.write_bytes(checkpoint.encode(state))
    assert_refused(path, "payload.world_size", "missing fields ['world_size', 'step']")


def test_unknown_keys_are_kept(tmp_path: Path) -> None:
    """A newer optional field (say a version identity in `source`) does not break loading."""
    state = make_state(source={**make_state()["source"], "version_id": "uuid:1234"}, extra=1)
    assert load(save(state, tmp_path / "a.json")) == state


def test_a_state_written_before_the_shared_checks_still_loads() -> None:
    """A file saved by the release before this change (tests/fixtures), byte for byte."""
    fixture = Path(__file__).parent / "fixtures" / "checkpoint-v1.json"
    state = load(fixture)
    assert state["plan"]["num_splits"] == 8 and state["cursors"] == [240] * 8
    assert checkpoint.encode(state) == fixture.read_bytes()


def test_load_state_dict_runs_the_same_checks(arrow_rows: Any) -> None:
    """`restore` = load + load_state_dict, and a dict given straight to the loader is
    checked the same way: a checksum-valid step=-1000 is refused, not saved later."""
    from loader import StreamingDataLoader, StreamingDataset

    dl = StreamingDataLoader(StreamingDataset(arrow_rows, num_splits=4), batch_size=8)
    good = dl.state_dict()
    # world_size 9 > G = 8: no run of this layout can have saved it (3 could: any W <= G)
    for field, value in [("step", -1000), ("skipped", -1), ("world_size", 9), ("epoch", -1)]:
        with pytest.raises(ValueError, match=rf"field '{field}': is {value}"):
            dl.load_state_dict({**good, field: value})
    dl.load_state_dict(good)


@st.composite
def _states(draw: st.DrawFn) -> dict:
    """Any state a loader can save: W divides S, cursors within L, counters in range."""
    num_splits = draw(st.integers(1, 24))
    rows_per_split = draw(st.integers(1, 50))
    divisors = [w for w in range(1, num_splits + 1) if num_splits % w == 0]
    state = make_state(num_splits=num_splits)
    state["plan"].update(num_rows=num_splits * rows_per_split + draw(st.integers(0, num_splits - 1)),
                         rows_per_split=rows_per_split)  # fmt: skip
    state.update(
        cursors=draw(
            st.lists(st.integers(0, rows_per_split), min_size=num_splits, max_size=num_splits)
        ),
        epoch=draw(st.integers(0, 2**63 - 1)),
        step=draw(st.integers(0, 2**63 - 1)),
        skipped=draw(st.integers(0, num_splits * rows_per_split)),
        world_size=draw(st.sampled_from(divisors)),
    )
    return state


@given(_states(), st.sampled_from(["epoch", "step", "skipped", "world_size", "cursors"]))
def test_every_saveable_state_loads_and_one_bad_counter_is_named(state: dict, field: str) -> None:
    data = checkpoint.encode(state)
    assert checkpoint.verify("mem.json", data) == state
    bad = dict(state)
    if field == "cursors":
        split = len(state["cursors"]) - 1
        bad["cursors"] = [*state["cursors"][:-1], state["plan"]["rows_per_split"] + 1]
        field = f"cursors[{split}]"
    else:
        bad[field] = -1
    with pytest.raises(CheckpointError) as info:
        checkpoint.verify("mem.json", checkpoint.encode(bad))
    assert info.value.field == f"payload.{field}"
