"""The process that died first is the cause (issue 25 point 2): real processes, one SIGKILLed,
the others SIGTERMed milliseconds later as `torch.multiprocessing` and torchrun do. The
terminated ones say so as they go (`closed`, reason `terminated`), the dashboard names the
killed one; under a torchrun agent with restarts left the run reads "restarted"."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from dashboard.launch import DashboardHandle
from tests.net import get_json, wait_until

pytestmark = pytest.mark.slow  # real processes (each imports torch through `loader`)

PROCESS = """
import sys, threading, time
from loader.telemetry.client import TelemetryClient
from tests.net import wait_until
rank, world = int(sys.argv[3]), int(sys.argv[4])
static = {{"rank": rank, "world_size": world, "num_splits": world, "rows_per_split": 10}}
client = TelemetryClient(sys.argv[1], sys.argv[2], static, interval_s=0.2, timeout_s=2.0)
client.set_snapshot(lambda: {{"epoch": 0, "step": int(time.time() * 10), "global_step": 0}})
wait_until(lambda: client.sent, 60, "a first report sent")
print("ready", flush=True)
threading.Event().wait()  # "training" until the test terminates it
"""


def _start(url: str, run: str, world: int, **env: str) -> list[subprocess.Popen[str]]:
    code = PROCESS.replace("{{", "{").replace("}}", "}")
    return [
        subprocess.Popen(
            [sys.executable, "-c", code, url, run, str(rank), str(world)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        for rank in range(world)
    ]


def _status(url: str, run: str) -> dict[str, Any]:
    return dict(get_json(f"{url}/api/runs/{run}/status"))


def test_the_first_death_is_named_and_the_terminated_say_so(collector: DashboardHandle) -> None:
    url = collector.api_url
    agent = {"TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "3"}
    jobs = {"killed": _start(url, "killed", 3), "restart": _start(url, "restart", 2, **agent)}
    try:
        for procs in jobs.values():
            for proc in procs:
                assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for procs in jobs.values():  # rank 1 is killed, the launcher terminates the others
            procs[1].send_signal(signal.SIGKILL)
            for proc in procs[:1] + procs[2:]:
                proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(30) for procs in jobs.values() for proc in procs]
    finally:
        for procs in jobs.values():
            for proc in procs:
                proc.kill()
    # a terminated process still dies of its signal, as it would without the loader
    assert codes == [
        -signal.SIGTERM,
        -signal.SIGKILL,
        -signal.SIGTERM,
        -signal.SIGTERM,
        -signal.SIGKILL,
    ]
    closed = get_json(f"{url}/api/runs/killed/events?kind=closed")["data"]
    assert sorted((e["rank"], e["data"]["reason"], e["data"]["signal"]) for e in closed) == [
        (0, "terminated", "SIGTERM"),
        (2, "terminated", "SIGTERM"),
    ]
    expected = "Crashed: rank 1 died first (stopped reporting without closing"
    status = wait_until(
        lambda: (s := _status(url, "killed"))["headline"].startswith(expected) and s,
        30,
        "rank 1 named as the cause",
    )
    assert status["headline"].endswith("; ranks 0, 2 terminated after rank 1 died")
    first, *rest = [(r["rank"], r["state"], r["first"]) for r in status["ranks"]]
    assert first == (1, "crashed", True)  # the cause comes first
    assert sorted(rest) == [(0, "terminated", False), (2, "terminated", False)]
    restarted = wait_until(
        lambda: (s := _status(url, "restart"))["state"] == "restarted" and s,
        30,
        "the planned restart",
    )
    assert restarted["headline"] == (
        "Restarted: the elastic agent is restarting the workers after rank 1 died"
    )


def test_a_process_that_ignores_sigterm_keeps_ignoring_it() -> None:
    """The handler is chained only where SIGTERM is handled: an ignored signal stays ignored."""
    code = (
        "import signal, sys\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "from loader.telemetry.client import TelemetryClient\n"
        "c = TelemetryClient('http://127.0.0.1:9', 'ign', {'rank': 0, 'world_size': 1, "
        "'num_splits': 1}, timeout_s=0.1)\n"
        "print(signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)\n"
        "c.close(0.1)\n"
    )
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip() == "True", out.stderr
