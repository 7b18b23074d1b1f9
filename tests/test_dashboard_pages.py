"""The dashboard's script without a browser (Streamlit's AppTest): with the collector down,
a page says so once — not also "No runs yet"; and the Streamlit process's own imports."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboard.client import ENV_API
from tests.net import free_port

APP = Path(__file__).parent.parent / "dashboard" / "app.py"


def test_a_dead_collector_is_one_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_API, f"http://127.0.0.1:{free_port()}")  # nothing listens there
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    assert not at.exception
    assert len(at.error) == 1
    assert at.error[0].value.startswith("Collector unreachable at http://127.0.0.1:")
    shown = [e.value for e in [*at.info, *at.warning, *at.caption, *at.markdown]]
    assert not [text for text in shown if "No runs" in text or "no runs" in text]


def test_the_streamlit_process_does_not_import_the_collector() -> None:
    """Issue #17.6: the pages' modules import the client, never the collector's config (and
    through it its store and models) for an environment variable's name."""
    code = "import sys, dashboard.ui, dashboard.charts, dashboard.client, dashboard.placement; "
    code += "print(sorted(m for m in sys.modules if m.startswith('dashboard.collector')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    pages = [APP, *APP.parent.glob("screens/*.py")]
    for path in pages:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("dashboard.collector"), path


def test_the_planner_shows_unequal_batches_shared_splits_and_the_loss_scale() -> None:
    """S = 8, G = 256 on 3 GPUs: batches 85-86, split 2 shared by ranks 0 and 1."""
    at = AppTest.from_file(str(APP.parent / "screens" / "planner.py"), default_timeout=60).run()
    at.number_input[1].set_value(8)  # splits S
    at.number_input[2].set_value(256)  # global batch G
    at.text_input[0].set_value("3, 4").run()
    assert not at.exception
    table = at.table[0].value
    three, four = table.loc[3], table.loc[4]
    assert (three["fits"], three["batch per GPU"], three["shared splits"]) == (
        "yes",
        "85-86",
        "yes",
    )
    assert three["what the first ranks read"].startswith("r0:[0,2)+2[0:21 of 32] r1:2[21:32 of 32]")
    assert (four["batch per GPU"], four["shared splits"]) == ("64", "no")
    assert any("dl.loss_scale" in info.value for info in at.info)
    assert any(c.value.startswith("Any world size up to G = 256 fits") for c in at.caption)
