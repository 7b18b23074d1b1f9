"""`elastic-loader inspect`: what it prints, and that it refuses exactly what `load` refuses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import loader.tools as tools_package
from loader import checkpoint
from loader.checkpoint import save
from loader.tools.cli import main as cli_main
from loader.tools.inspect import print_inspect
from tests.imports import assert_no_cycle, import_graph
from tests.test_checkpoint import make_state


def test_inspect_prints_plan_source_progress_and_world_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cursors = [0, 10, 20, 30, 40, 50, 60, 125]
    path = save(make_state(cursors=cursors), tmp_path / "a.json")
    assert cli_main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    for expected in [
        str(path),
        "checksum ok",
        "source        lancedb  /data/db",
        "items, version 7 (pinned)",
        "id, label",
        "N=1,003 rows, S=8 splits x L=125 rows, shuffled, seed 17, clump 4",
        "label > 2",
        "epoch         2  (step 10, saved by world_size 4)",
        "cursor min 0 / median 35 / max 125 of 125 per split",
        "  read        335 rows, 33.5% of epoch, 1 of 8 splits finished",
        "world sizes 1, 2, 4, 8 (those dividing S=8)",
        "  version id  sha256:5eed",
    ]:
        assert expected in out, f"{expected!r} missing from:\n{out}"


def test_inspect_of_a_bad_file_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(checkpoint.encode(make_state())[:40])
    assert print_inspect(path) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert str(path) in captured.err and "truncated" in captured.err
    assert print_inspect(tmp_path / "missing.json") == 2
    assert "missing.json" in capsys.readouterr().err
    (tmp_path / "none").mkdir()
    assert print_inspect(tmp_path / "none") == 2
    assert "no checkpoint (*.json, *.ckpt) files" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"cursors": [2**62] * 8}, "payload.cursors[0]"),  # printed 7686143364045646848.0%
        ({"step": -1000}, "payload.step"),
        ({"source": {**make_state()["source"], "columns": [1, None]}}, "payload.source.columns"),
    ],
)
def test_inspect_refuses_what_load_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict, field: str
) -> None:
    path = tmp_path / "odd.json"
    path.write_bytes(checkpoint.encode({**make_state(), **changes}))
    assert cli_main(["inspect", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"checkpoint {path}: field {field!r}" in captured.err


def test_inspect_of_a_folder_describes_its_newest_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = save(make_state(epoch=1), tmp_path / "old.json")
    os.utime(old, ns=(1, 1))
    new = save(make_state(epoch=3), tmp_path / "new.json")
    assert print_inspect(tmp_path) == 0
    out = capsys.readouterr().out
    assert str(new) in out and "epoch         3" in out


def test_the_tools_import_without_a_cycle() -> None:
    """`inspect` describes a mixture through `inspect_mixture`, which must not import it
    back: the lines both print live in the lower `describe`."""
    graph = import_graph(Path(tools_package.__file__).parent, "loader.tools")
    assert "inspect" not in graph["inspect_mixture"]
    assert_no_cycle(graph)


def _aged(path: Path, seconds: int) -> Path:
    """Set `path`'s modification time `seconds` into the past (an order no clock can blur)."""
    stamp = 1_700_000_000 - seconds
    os.utime(path, (stamp, stamp))
    return path


def test_latest_and_inspect_find_what_the_examples_and_the_demo_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 24 item 15: latest(folder) returned a JSON file that is not a checkpoint, and
    inspect found neither `loader.ckpt` (the pretraining examples') nor the demo's nested
    folders (checkpoints/main-job/crash/*.json beside runs/*/result.json)."""
    run = tmp_path / "run"
    run.mkdir()
    _aged(save(make_state(), run / "loader-step-000012.json"), 60)
    (run / "result.json").write_text('{"loss": 1.5}')
    _aged(run / "result.json", 0)
    assert checkpoint.latest(run) == run / "loader-step-000012.json"
    pretrain = tmp_path / "pretrain"
    pretrain.mkdir()
    _aged(save(make_state(), pretrain / "loader.ckpt"), 30)
    assert checkpoint.latest(pretrain) == pretrain / "loader.ckpt"
    damaged = pretrain / "loader-step-000099.json"
    damaged.write_bytes(b'{"form')  # named as a checkpoint: returned, so load reports it
    _aged(damaged, 0)
    assert checkpoint.latest(pretrain) == damaged
    demo = tmp_path / "checkpoints"
    (demo / "main-job" / "crash").mkdir(parents=True)
    (demo / "main-job" / "runs" / "crash-w4").mkdir(parents=True)
    _aged(save(make_state(), demo / "main-job" / "crash" / "loader-step-000012.json"), 60)
    (demo / "main-job" / "runs" / "crash-w4" / "result.json").write_text("{}")
    assert print_inspect(demo) == 0
    assert "loader-step-000012.json" in capsys.readouterr().out
    assert print_inspect(pretrain / "loader.ckpt") == 0
