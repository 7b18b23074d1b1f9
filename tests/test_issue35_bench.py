"""`benchmarks/issue35.py` (issue #35's one run) at tiny sizes, so it cannot rot: the table
and the JSON line carry the cache's rows/s, item 7's and item 8's ratios, all positive."""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

import pytest

from tests.object_store import S3Server

TINY = ["--reps", "1", "--cache-rows", "2048", "--per-file", "1024", "--delay-ms", "1",
        "--rows", "49152", "--docs", "100"]  # fmt: skip


@pytest.mark.slow
def test_one_run_reports_the_cache_and_both_ratios(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    issue35 = importlib.import_module("issue35")
    returned = issue35.main(TINY, server=s3_server)
    lines = capsys.readouterr().out.strip().splitlines()
    assert json.loads(lines[-1]) == returned
    for section, names in {
        "cache": ["uncached rows/s", "cold rows/s", "prefetch rows/s", "warm rows/s",
                  "warm ÷ uncached", "cold MB: proxy", "cold MB: cache's bytes_from_store"],
        "item7": ["ours rows/s (w = 0)", "lance.torch rows/s", "ours ÷ lance.torch, wall"],
        "item8": ["ours ÷ raw scan, wall", "ours CPU ns a token", "scan CPU ns a token"],
    }.items():  # fmt: skip
        for name in names:
            value = returned[section][name]
            assert math.isfinite(value) and value > 0, (section, name, value)
            assert any(line.startswith(f"| {section} | {name} |") for line in lines), name
    assert returned["cache"]["warm MB: proxy"] < returned["cache"]["cold MB: proxy"]
