"""torchrun --nnodes 1:2: a node dies and the job goes on with fewer ranks; a node joins and it
goes on with more; every row once across both changes, and the weights of an uninterrupted run.

Three torchrun agents on one machine (never more than two at once, so a rendezvous with two
completes without waiting for a third), one elastic rendezvous, `--max-restarts 3`: no test
code restarts anything, the agents do. The job holds at known steps (`--hold-at-step`,
examples/drills.py) so that each change lands at a known place:

1. agents A and B start: W = 4. It checkpoints every 4 steps and holds at step 10.
2. B is SIGKILLed whole (agent and ranks). A's ranks fail on their next collective; A
   restarts them on the one node left: W = 2, from the checkpoint of step 8. They hold at 14.
3. Agent C starts. A sees a node waiting, stops its ranks and restarts them with C's:
   W = 4, from the checkpoint of step 12, to the end of epoch 2.

Joining needs TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in torch 2.13 (docs/multinode.md):
without it the joined agents deadlock in the rendezvous. B is never the agent that hosts
the rendezvous store (A, started first), as a dead host takes the store with it.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.multinode import REPO, Node, command, popen
from tests.net import free_port, wait_until

pytestmark = pytest.mark.slow  # starts other processes (see pyproject's markers)

SPLITS, GLOBAL_BATCH, EPOCHS, EVERY = 8, 24, 2, 4
ROWS = (480, 60)  # 20 steps an epoch
TOLERANCE = 1e-9
DEADLINE_S = 420.0  # a rendezvous waits 30 s for late nodes; torch imports are slow under load


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def holding(node: Node, step: int, world: int) -> int:
    """How many of the node's ranks said they hold at `step` on `world` ranks."""
    return node.log.read_text(errors="replace").count(f"holding at step {step} (W={world})")


def test_a_node_leaves_and_another_joins_every_row_once(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}"}
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    db = tmp_path / "har.lancedb"
    tables = popen(command("tables", db=db, rows="480,60", options=""), env, tmp_path / "t.log")
    assert tables.wait(120) == 0, (tmp_path / "t.log").read_text()
    common = (
        f"--num-splits {SPLITS} --global-batch {GLOBAL_BATCH} --epochs {EPOCHS} --dtype float64"
    )
    reference = popen(
        command("reference", db=db, options="", train_args=f"{common} --out {tmp_path / 'ref'}"),
        env, tmp_path / "reference.log",
    )  # fmt: skip
    ckpt, out = tmp_path / "ckpt", tmp_path / "elastic"
    args = (
        f"{common} --checkpoint-dir {ckpt} --checkpoint-every {EVERY} --out {out} "
        "--hold-at-step 10:4 --hold-at-step 14:2"
    )
    port = free_port()

    def agent(name: str) -> Node:
        log = tmp_path / f"{name}.log"
        line = command("elastic_node", db=db, rdzv_port=port, rdzv_id="elastic", train_args=args)
        return Node(popen(line, env, log), log)

    nodes: list[Node] = []
    try:
        a = agent("a")
        nodes.append(a)
        wait_until(lambda: listening(port) or a.agent.poll() is not None, 120, "A's store")
        b = agent("b")
        nodes.append(b)
        # 1. W = 4 holds at step 10, after the checkpoint of step 8
        wait_until(
            lambda: holding(a, 10, 4) + holding(b, 10, 4) == 4
            or any(n.agent.poll() is not None for n in nodes),
            DEADLINE_S, "W = 4 at step 10",
        )  # fmt: skip
        assert a.agent.poll() is None and b.agent.poll() is None, a.tail() + b.tail()
        assert (ckpt / f"loader-step-{8:06d}.json").is_file()
        b.kill()
        # 2. A alone goes on: W = 2 from step 8, holding at 14 after the checkpoint of step 12
        wait_until(
            lambda: holding(a, 14, 2) == 2 or a.agent.poll() is not None,
            DEADLINE_S, "W = 2 at step 14",
        )  # fmt: skip
        assert a.agent.poll() is None, a.tail()
        # 3. C joins: W = 4 from step 12 to the end
        c = agent("c")
        nodes.append(c)
        for node in (a, c):
            assert node.agent.wait(DEADLINE_S) == 0, node.tail()
    finally:
        for node in nodes:
            if node.agent.poll() is None:
                node.kill()
    assert reference.wait(DEADLINE_S) == 0, (tmp_path / "reference.log").read_text()[-3000:]

    summary: dict[str, Any] = json.loads((out / "result.json").read_text())
    assert summary["world_size"] == 4 and summary["resumed_from_step"] == 12
    assert summary["steps"] == EPOCHS * ROWS[0] // GLOBAL_BATCH
    for epoch in summary["rows_per_epoch"]:  # the ledger saved with the checkpoints
        assert epoch["min"] == epoch["max"] == 1, epoch
        assert epoch["rows"] == epoch["distinct"] == summary["rows_in_plan"]
    weights = torch.load(out / "weights.pt")
    ref = torch.load(tmp_path / "ref" / "weights.pt")
    delta = max(float((weights[k] - ref[k]).abs().max()) for k in ref)
    assert delta <= TOLERANCE, f"weights differ from the uninterrupted run's by {delta}"
    # A ran three times: W = 4, then W = 2 from step 8, then W = 4 from step 12
    log = a.log.read_text(errors="replace")
    assert log.count("holding at step 10 (W=4)") >= 1 and "holding at step 14 (W=2)" in log
