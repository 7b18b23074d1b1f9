"""The dashboard's script without a browser (Streamlit's AppTest): with the collector down,
a page says so once — not also "No runs yet"."""

from __future__ import annotations

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
