"""Issue 34: Hugging Face's Trainer and Lightning Fabric, in real torchrun jobs on Gloo
(tests/trainers_job.py): 2 processes SIGKILLed after a checkpoint (one job for each), then 3
that resume from it. Every row trained on once an epoch, against the
table, and every global step the rows of an uninterrupted run's; the plain
`Trainer(train_dataset=StreamingDataset)` refused on every process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from loader import StreamingDataLoader
from tests import trainers_job as job
from tests.mesh_job import table
from tests.net import free_port

pytestmark = pytest.mark.slow  # starts other processes (see pyproject's markers)

REPO = Path(__file__).resolve().parents[1]
STEPS = job.NUM_ROWS // job.GLOBAL_BATCH  # loader steps an epoch
HF_RESUMED = (job.HF_KILL_AT // job.HF_SAVE_EVERY) * job.HF_SAVE_EVERY  # Trainer step 12


def torchrun(world: int, spec: Path, phase: str, log: Path) -> int:
    argv = [
        str(Path(sys.executable).with_name("torchrun")), "--nnodes", "1",
        "--nproc-per-node", str(world), "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "tests/trainers_job.py", str(spec), phase,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "wb") as out:
        return subprocess.run(
            argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=900
        ).returncode


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("trainers")
    spec = {"uri": str(tmp / "rows.lance"), "out": str(tmp), "hf": str(tmp / "hf")}
    spec["fabric"] = str(tmp / "fabric.ckpt")
    table(Path(spec["uri"]), 0, job.NUM_ROWS)
    (tmp / "job.json").write_bytes(orjson.dumps(spec))
    for phase in ("hf", "fabric"):
        killed = torchrun(2, tmp / "job.json", phase, tmp / f"{phase}.log")
        log = (tmp / f"{phase}.log").read_text()[-3000:]
        assert killed != 0 and "Signal 9 (SIGKILL)" in log, f"{phase} was not SIGKILLed:\n{log}"
    resumed = torchrun(3, tmp / "job.json", "resume", tmp / "resume.log")
    log = (tmp / "resume.log").read_text()[-3000:]
    assert resumed == 0, f"the 3-process resume failed:\n{log}"
    records = {
        (name, w): [
            [orjson.loads(line) for line in (tmp / f"{name}-w{w}-rank{r}.jsonl").open("rb")]
            for r in range(w)
        ]
        for name in ("hf", "fabric")
        for w in (2, 3)
    }
    return {"records": records, "uri": spec["uri"]}


def reference(uri: str) -> list[list[int]]:
    """The global batches of an uninterrupted run (one process: global step t is the same
    rows on any world size), EPOCHS epochs."""
    dl = StreamingDataLoader(job.dataset({"uri": uri}), global_batch_size=job.GLOBAL_BATCH)
    return [sorted(b["id"].tolist()) for _ in range(job.EPOCHS) for b in dl]


def global_batches(ranks: list[list[dict[str, Any]]], keep: Any) -> dict[int, list[int]]:
    """Loader step -> the rows all processes trained on at that step."""
    steps: dict[int, list[int]] = {}
    for records in ranks:
        for record in records:
            if "ids" in record and keep(record):
                steps.setdefault(record["at"], []).extend(record["ids"])
    return {t: sorted(ids) for t, ids in steps.items()}


def assert_every_row_once(steps: dict[int, list[int]], want: list[list[int]]) -> None:
    assert sorted(steps) == list(range(len(want))), "a step trained twice or never"
    assert [steps[t] for t in sorted(steps)] == want, "not the uninterrupted run's batches"
    for epoch in range(job.EPOCHS):
        rows = [i for t in range(epoch * STEPS, (epoch + 1) * STEPS) for i in steps[t]]
        assert sorted(rows) == list(range(job.NUM_ROWS)), f"epoch {epoch}: not every row once"


def test_hf_trainer_train_dataset_is_refused_on_every_process(runs: dict[str, Any]) -> None:
    plain = [r for rank in runs["records"]["hf", 2] for r in rank if "plain" in r]
    assert len(plain) == 6, plain  # 2 processes x (2 dispatch settings, prepare)
    for record in plain:
        assert record["refused"] is not None, "Trainer(train_dataset=) trained 1 row in 2"
        assert "loader.trainers.hf.StreamingTrainer" in record["refused"]
        assert "1 row in 2" in record["refused"]


def test_hf_streaming_trainer_resumes_on_3_processes(runs: dict[str, Any]) -> None:
    """Checkpoint at Trainer step 12 (epoch 1, batch 4 of 20: 2 micro-batches a step), the
    2-process run goes on to 14 and is SIGKILLed; 3 processes resume from checkpoint-12."""
    ranks = {w: runs["records"]["hf", w] for w in (2, 3)}
    for w in (2, 3):  # each Trainer step's micro-batches, in order, as loader steps
        for records in ranks[w]:
            seen: dict[int, int] = {}
            for r in (r for r in records if "ids" in r):
                r["at"] = r["step"] * job.ACCUMULATION + seen.get(r["step"], 0)
                seen[r["step"]] = seen.get(r["step"], 0) + 1
            full = {n for step, n in seen.items() if step < job.HF_KILL_AT}  # not the killed one
            assert full == {job.ACCUMULATION}, "gradient accumulation"
    resumed_steps = [r["step"] for rank in ranks[3] for r in rank if "ids" in r]
    assert min(resumed_steps) == HF_RESUMED, "Trainer's step after the resume"
    before = global_batches(ranks[2], lambda r: r["step"] < HF_RESUMED)
    after = global_batches(ranks[3], lambda r: True)
    assert not set(before) & set(after)
    assert_every_row_once({**before, **after}, reference(runs["uri"]))
    ends = [r for rank in ranks[3] for r in rank if "end_step" in r]
    assert [(e["end_step"], e["end_epoch"]) for e in ends] == [
        (job.EPOCHS * STEPS // job.ACCUMULATION, 2.0)
    ] * 3, "Trainer's step and epoch at the end"


def test_fabric_setup_dataloaders_defaults_and_save_load_on_3_processes(
    runs: dict[str, Any],
) -> None:
    """`fabric.setup_dataloaders(dl)` as it is (no use_distributed_sampler=False), state in
    fabric.save at loader step 26; SIGKILL at 30; 3 processes fabric.load and finish."""
    ranks = {w: runs["records"]["fabric", w] for w in (2, 3)}
    for w in (2, 3):
        for records in ranks[w]:
            for r in records:
                r["at"] = r.get("step")
    heads = [rank[0] for w in (2, 3) for rank in ranks[w]]
    assert [h["len"] for h in heads] == [STEPS] * 5, "len() of the epoch"
    assert [h["resumed_at"] for h in heads] == [0, 0] + [job.FABRIC_SAVE_AT] * 3
    before = global_batches(ranks[2], lambda r: r["step"] < job.FABRIC_SAVE_AT)
    after = global_batches(ranks[3], lambda r: True)
    assert_every_row_once({**before, **after}, reference(runs["uri"]))
