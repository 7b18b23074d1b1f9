"""Issue 26.4: `torchrun --nnodes=1:3` with 3 agents (one rank each) on one machine. A node
dies (SIGKILL to the agent and its rank): the others restart on 2 ranks from
`checkpoint.latest`; a new agent joins: all restart on 3. Every row of the epoch is trained
on once across both changes (tests/elastic_job.py). Every agent runs with
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, without which a node joining deadlocks in torch
2.13's rendezvous. Slow: each change waits for the rendezvous (about a minute)."""

from __future__ import annotations

import os
import socket
import sys
import uuid
from pathlib import Path

import orjson
import pytest

from tests.elastic_job import NUM_ROWS
from tests.mesh_job import table
from tests.multinode import REPO, Node, popen
from tests.net import free_port, wait_until

pytestmark = pytest.mark.slow  # starts other processes (see pyproject's markers)


def agent(work: Path, name: str, port: int, run_id: str) -> Node:
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    argv = [
        torchrun, "--nnodes=1:3", "--nproc-per-node=1", "--max-restarts=3",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}",
        "--monitor-interval=1", str(REPO / "tests" / "elastic_job.py"), str(work),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    return Node(popen(argv, env, work / f"{name}.log"), work / f"{name}.log")


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def held(work: Path, step: int, world: int) -> bool:
    return len(list(work.glob(f"held-{step}-w{world}-rank*"))) == world


def test_nnodes_min_max_down_and_up_every_row_once(tmp_path: Path) -> None:
    table(tmp_path / "rows.lance", 0, NUM_ROWS)
    port, run_id = free_port(), uuid.uuid4().hex[:8]
    nodes = [agent(tmp_path, "node0", port, run_id)]  # it hosts the rendezvous store
    try:
        wait_until(lambda: listening(port), 120, "the first agent's rendezvous store")
        nodes += [agent(tmp_path, f"node{i}", port, run_id) for i in (1, 2)]
        wait_until(lambda: held(tmp_path, 6, 3), 400, "3 ranks at step 6")
        nodes[2].kill()  # a machine dies
        (tmp_path / "go-6").touch()
        wait_until(lambda: held(tmp_path, 12, 2), 400, "the 2 ranks left at step 12")
        nodes.append(agent(tmp_path, "node3", port, run_id))  # a machine joins
        for node in (nodes[0], nodes[1], nodes[3]):
            assert node.agent.wait(600) == 0, node.tail()
    finally:
        for node in nodes:
            if node.agent.poll() is None:
                node.kill()

    incarnations = sorted(tmp_path.glob("inc-*.jsonl"))
    worlds = {p.name.split("-")[2] for p in incarnations}
    assert worlds == {"w3", "w2"}, [p.name for p in incarnations]
    starts = sorted({int(p.name.split("-")[1][4:]) for p in incarnations})
    assert starts == [0, 6, 12], starts
    rows: list[int] = []
    for log in incarnations:  # each incarnation's steps up to the checkpoint the next took
        start = int(log.name.split("-")[1][4:])
        upto = min([s for s in starts if s > start], default=None)
        for line in log.read_bytes().splitlines():
            entry = orjson.loads(line)
            if upto is None or entry["step"] <= upto:
                rows.extend(entry["ids"])
    assert sorted(rows) == list(range(NUM_ROWS)), "every row once across both changes"
