"""Two torchrun nodes on one machine lose one, and the job resumes on one node, and on three.

Everything is real: the table and the checkpoints on the moto S3 server, the collector
with a token, two `torchrun` agents meeting through c10d rendezvous on 127.0.0.1, Gloo.
The node holding rank 3 freezes after step 10 (`--stall-at-step`, so the kill cannot come
after the job has moved on) and is SIGKILLed whole once the checkpoint of step 8 is on
the store; the other node's ranks then fail on their next collective, and its agent
exits. The job restarts as 1 node of 2 ranks, and (from a copy of the same checkpoints) as
3 nodes of 2: every row of every epoch trains the model exactly once, and the final
weights equal an uninterrupted run's (float64). S = 8 with G = 24 (a multiple of S) serves
any W <= 24: W = 6 on three nodes does not divide S, and each rank reads 4 rows a step.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from pyarrow import fs

from tests.multinode import COMMANDS, REPO, Node, command, popen
from tests.net import free_port, http_ok, wait_until
from tests.object_store import S3Server

SPLITS, GLOBAL_BATCH, EPOCHS, EVERY, STALL = 8, 24, 2, 4, 10
ROWS = (480, 60)  # 20 steps an epoch
TOLERANCE = 1e-9


@pytest.fixture(scope="module")
def job(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Tables on S3, a collector with a token, and the environment every command gets."""
    work = tmp_path_factory.mktemp("multinode")
    bucket = s3_server.make_bucket()
    options = " ".join(f"--storage-option {k}={v}" for k, v in s3_server.storage_options.items())
    values = {
        "db": f"s3://{bucket}/har.lancedb",
        "options": options,
        "token": uuid.uuid4().hex,
        "events": str(work / "events.db"),
    }
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}"}
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    tables = popen(
        command("tables", rows=",".join(map(str, ROWS)), **values), env, work / "tables.log"
    )
    assert tables.wait(120) == 0, (work / "tables.log").read_text()
    port = free_port()
    collector = popen(command("collector", collector_port=port, **values), env, work / "c.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: collector.poll() is not None or http_ok(url + "/health"), 60, "it")
        assert collector.poll() is None, (work / "c.log").read_text()
        env.update(
            ELASTIC_LOADER_TELEMETRY=url,
            ELASTIC_LOADER_TELEMETRY_TOKEN=values["token"],
            ELASTIC_LOADER_RUN_ID="har-multinode",
        )
        yield {"work": work, "env": env, "values": values, "bucket": bucket, "url": url}
    finally:
        collector.kill()
        collector.wait(10)


def train_args(checkpoints: str, out: Path, extra: str = "") -> str:
    return (
        f"--num-splits {SPLITS} --global-batch {GLOBAL_BATCH} --epochs {EPOCHS} "
        f"--dtype float64 --checkpoint-dir {checkpoints} --checkpoint-every {EVERY} "
        f"--out {out} {extra}"
    ).strip()


def start_nodes(job: dict[str, Any], nnodes: int, name: str, args: str) -> list[Node]:
    values = {**job["values"], "nnodes": nnodes, "rdzv_port": free_port(), "rdzv_id": name}
    nodes = []
    for i in range(nnodes):
        log = job["work"] / f"{name}-node{i}.log"
        nodes.append(Node(popen(command("node", train_args=args, **values), job["env"], log), log))
    return nodes


def finish(nodes: list[Node], deadline_s: float = 400) -> None:
    try:
        for node in nodes:
            code = node.agent.wait(deadline_s)
            assert code == 0, node.tail()
    finally:
        for node in nodes:
            if node.agent.poll() is None:
                node.kill()


def result(out: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    summary = json.loads((out / "result.json").read_text())
    return summary, torch.load(out / "weights.pt")


def copy_prefix(s3: fs.S3FileSystem, source: str, target: str) -> None:
    for info in s3.get_file_info(fs.FileSelector(source)):
        s3.copy_file(info.path, target + "/" + info.base_name)


@pytest.mark.slow
def test_a_node_dies_and_the_job_resumes_on_one_node_and_on_three(
    job: dict[str, Any], s3_server: S3Server
) -> None:
    work, bucket = job["work"], job["bucket"]
    ckpt_a, ckpt_b = f"s3://{bucket}/ckpt/a", f"s3://{bucket}/ckpt/b"
    s3 = s3_server.pyarrow_fs()

    reference = popen(
        command("reference", train_args=train_args("''", work / "ref"),
                **job["values"]),
        job["env"], work / "reference.log",
    )  # fmt: skip
    crash = start_nodes(job, 2, "crash", train_args(
        ckpt_a, work / "crash", f"--stall-at-step {STALL} --crash-rank 3"))  # fmt: skip
    try:
        wanted = f"{bucket}/ckpt/a/loader-step-{8:06d}.json"
        wait_until(
            lambda: s3.get_file_info(wanted).type == fs.FileType.File
            or any(n.agent.poll() is not None for n in crash),
            400, "the checkpoint of step 8",
        )  # fmt: skip
        assert all(n.agent.poll() is None for n in crash), crash[0].tail() + crash[1].tail()
        wait_until(lambda: all(n.ranks() for n in crash), 60, "both nodes' ranks")
        doomed = next(n for n in crash if 3 in n.ranks())
        doomed.kill()
        survivor = next(n for n in crash if n is not doomed)
        assert survivor.agent.wait(180) != 0, "the surviving node fails the job"
    finally:
        for node in crash:
            if node.agent.poll() is None:
                node.kill()
    names = sorted(i.base_name for i in s3.get_file_info(fs.FileSelector(f"{bucket}/ckpt/a")))
    assert f"loader-step-{8:06d}.json" in names and f"model-step-{8:06d}.pt" in names
    assert f"loader-step-{12:06d}.json" not in names, "the kill came before step 12"
    copy_prefix(s3, f"{bucket}/ckpt/a", f"{bucket}/ckpt/b")

    finish(start_nodes(job, 1, "resume-1", train_args(ckpt_a, work / "one", "--resume")))
    finish(start_nodes(job, 3, "resume-3", train_args(ckpt_b, work / "three", "--resume")))
    assert reference.wait(400) == 0, (work / "reference.log").read_text()[-3000:]

    _, ref_weights = result(work / "ref")
    for out, world in ((work / "one", 2), (work / "three", 6)):
        summary, weights = result(out)
        assert summary["world_size"] == world and summary["resumed_from_step"] == 8
        for epoch in summary["rows_per_epoch"]:
            assert epoch["min"] == epoch["max"] == 1, f"W={world}: {epoch}"
            assert epoch["rows"] == epoch["distinct"] == summary["rows_in_plan"]
        delta = max(float((weights[k] - ref_weights[k]).abs().max()) for k in ref_weights)
        assert delta <= TOLERANCE, f"W={world}: weights differ by {delta}"

    events = httpx.get(
        f"{job['url']}/api/runs/har-multinode/events",
        params={"kind": "checkpoint_loaded"},
        headers={"Authorization": f"Bearer {job['values']['token']}"},
        timeout=10,
    ).json()["data"]
    loads = {
        (e["data"]["world_size_before"], e["data"]["world_size_after"])
        for e in events
        if e["kind"] == "checkpoint_loaded"
    }
    assert loads == {(4, 2), (4, 6)}, "the collector saw both resumes of the W=4 checkpoint"
    unauthorised = httpx.get(f"{job['url']}/api/runs", timeout=10)
    assert unauthorised.status_code == 401, "the collector wants its token"


def test_docs_show_the_commands_this_test_runs() -> None:
    page = (REPO / "docs" / "multinode.md").read_text()
    missing = [name for name, line in COMMANDS.items() if line not in page]
    assert not missing, f"docs/multinode.md lacks the {missing} command(s) from tests/multinode.py"
