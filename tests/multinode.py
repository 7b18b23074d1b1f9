"""The multi-node rehearsal's commands and processes (tests/test_multinode.py runs them).

`COMMANDS` are the exact command lines the test runs, with shell variables (`$DB`, ...)
for ports, URIs and folders; docs/multinode.md shows the same lines (a test checks it
does), so the page says what was run. A "node" is one torchrun agent and the ranks it starts; killing a
node means SIGKILL to the agent and to every process below it (torchrun starts each rank
in a session of its own, so the agent's process group alone would leave the ranks).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from string import Template

REPO = Path(__file__).resolve().parent.parent
TRAIN = "examples/train_ddp.py"

COMMANDS = {
    "tables": "python examples/har_data.py --db $DB --rows $ROWS $OPTIONS",
    "collector": (
        "ELASTIC_LOADER_DASHBOARD_DB=$EVENTS ELASTIC_LOADER_DASHBOARD_TOKEN=$TOKEN "
        "python -m uvicorn --factory dashboard.collector.main:create_app "
        "--host 127.0.0.1 --port $COLLECTOR_PORT --log-level warning"
    ),
    "node": (
        "torchrun --nnodes $NNODES --nproc-per-node 2 --rdzv-backend c10d "
        "--rdzv-endpoint 127.0.0.1:$RDZV_PORT --rdzv-id $RDZV_ID "
        "examples/train_ddp.py --db $DB $OPTIONS $TRAIN_ARGS"
    ),
    "reference": "python examples/train_ddp.py --nproc 1 --db $DB $OPTIONS $TRAIN_ARGS",
    "elastic_node": (
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes 1:2 --nproc-per-node 2 "
        "--max-restarts 3 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:$RDZV_PORT "
        "--rdzv-id $RDZV_ID examples/train_ddp.py --db $DB $TRAIN_ARGS --resume"
    ),
}


def command(name: str, **values: object) -> list[str]:
    """One of `COMMANDS` with `values` for its variables (lower-case names), as argv."""
    line = Template(COMMANDS[name]).substitute({k.upper(): str(v) for k, v in values.items()})
    return shlex.split(line)


def popen(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start `argv` from the repository root (leading VAR=value words go to the env)."""
    env = dict(env)
    while argv and "=" in argv[0] and not argv[0].startswith("-"):
        key, _, value = argv.pop(0).partition("=")
        env[key] = value
    if argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
    elif argv[0] == "torchrun":
        argv = [str(Path(sys.executable).with_name("torchrun")), *argv[1:]]
    out = open(log, "wb")  # noqa: SIM115  (the child holds it; closed with the process)
    return subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children, their children, ...), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def rank_of(pid: int) -> int | None:
    """The RANK a torchrun worker was started with (None for other processes)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


@dataclass
class Node:
    """One torchrun agent and its log."""

    agent: subprocess.Popen[bytes]
    log: Path

    def ranks(self) -> set[int]:
        return {r for p in descendants(self.agent.pid) if (r := rank_of(p)) is not None}

    def kill(self) -> None:
        """SIGKILL the agent and every process below it at once, as when a machine dies."""
        victims = [self.agent.pid, *descendants(self.agent.pid)]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.agent.wait(30)

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]
