"""The main job: what elastic-loader is for, in a few minutes on a laptop.

1. Same training, split across ranks: the MLP trains at W = 1, 2 and 4 (Gloo on CPU,
   NCCL when every rank has a GPU); all replicas, and all three runs, end with the same
   weights, because the loader gives every W the same global batches.
2. Crash and resume elsewhere: a W = 4 run checkpoints every k steps, one rank SIGKILLs
   itself mid-epoch, and the job resumes on W = 3 from the last checkpoint: 3 does not
   divide S = 8, the case every peer refuses (per-rank batches of 85, 85 and 86 rows of
   G = 256, with the loss weighted by ``dl.loss_scale``). Each row trains the model
   exactly once per epoch, and the weights match the uninterrupted run.
3. Speed-up and efficiency for W = 1, 2, 4 at global batch 256 and 2,048.

The data is a synthetic table shaped like UCI HAR (``har_data.py``), made on first use
under ``data/``; ``--db``/``--train-table``/``--test-table`` point at a real table instead.
Parts 1 and 2 run in float64 by default so the runs agree to ~1e-16 and the check
(≤ 1e-9) is sharp; ``--dtype float32`` shows float32 instead, where rounding in a
different summation order grows over training (max |Δweight| ~7e-5 after 5 epochs here)
while the test accuracy stays the same.

    python examples/main_job.py    # or: make demo (which first makes the virtualenv)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from har_data import TEST_ROWS, TRAIN_ROWS, TableSpec, default_spec, ensure_synthetic
from job_report import print_summary
from local_launch import launch
from torch.multiprocessing import ProcessExitedException
from train_ddp import REPO, TrainConfig, cpu_threads, latest_checkpoint, run_rank, steps_per_epoch

TOLERANCE = 1e-9


@dataclass(frozen=True)
class JobOptions:
    """The driver's own settings (the training settings live in ``TrainConfig``)."""

    parts: tuple[int, ...]
    worlds: tuple[int, ...]
    work_dir: Path
    checkpoint_every: int
    crash_at_step: int | None
    crash_rank: int
    resume_world: int
    speed_batches: tuple[int, ...]
    speed_epochs: int
    dashboard: bool
    wait: bool
    summary_json: Path | None


class Runner:
    """Runs one training job per call and keeps its result (rank 0's ``result.json``)."""

    def __init__(self, base: TrainConfig, work_dir: Path) -> None:
        self.base = base
        self.work_dir = work_dir
        self.prefix = time.strftime("main-job-%H%M%S")  # run ids unique per invocation

    def train(self, world: int, name: str, **changes: Any) -> dict[str, Any]:
        out = self.work_dir / "runs" / name
        shutil.rmtree(out, ignore_errors=True)
        changes["run_id"] = f"{self.prefix}-{changes.get('run_id', name)}"
        cfg = replace(self.base, out=str(out), label=f"{name:<14}", **changes)
        launch(run_rank, cfg, world)
        result = json.loads((out / "result.json").read_text())
        result["weights"] = str(out / "weights.pt")
        return result


def max_weight_delta(a: dict[str, Any], b: dict[str, Any]) -> float:
    """max |Δweight| over every parameter of two runs' final models."""
    wa = torch.load(a["weights"], map_location="cpu")
    wb = torch.load(b["weights"], map_location="cpu")
    return max(float((wa[k].double() - wb[k].double()).abs().max()) for k in wa)


def rows_exactly_once(result: dict[str, Any]) -> bool:
    """Every epoch used each of the plan's rows once: as many distinct rows as rows used."""
    plan_rows = result["rows_in_plan"]
    return all(
        e["rows"] == e["distinct"] == plan_rows and e["max"] == 1 for e in result["rows_per_epoch"]
    )


def describe(result: dict[str, Any]) -> str:
    start = result["resumed_from_step"] or 0
    return (
        f"W={result['world_size']}: steps {start + 1}-{result['steps']} in {result['seconds']:.1f} s "
        f"({result['backend']}, {result['threads']} thread(s)/rank); replicas differ by "
        f"{result['replica_spread']:.1e}; test accuracy {result['accuracy']:.2%}"
    )


def same_training(runner: Runner, worlds: Sequence[int]) -> dict[str, Any]:
    """Part 1: the same job at every W; compare every pair of runs."""
    print(f"\n1. Same training, split across ranks ({runner.base.dtype})", flush=True)
    runs = {}
    for world in worlds:
        runs[world] = runner.train(world, f"same-w{world}")
        print("   " + describe(runs[world]), flush=True)
    delta = max(
        (max_weight_delta(runs[a], runs[b]) for a in worlds for b in worlds if a < b), default=0.0
    )
    print(f"   max |Δweight| between runs at W = {', '.join(map(str, worlds))}: {delta:.1e}")
    return {"runs": runs, "max_delta": delta}


def crash_and_resume(runner: Runner, opts: JobOptions, reference: dict[str, Any]) -> dict[str, Any]:
    """Part 2: W = 4 crashes mid-epoch; W = ``resume_world`` resumes from the last checkpoint."""
    folder = opts.work_dir / "crash"
    shutil.rmtree(folder, ignore_errors=True)
    crash_at = opts.crash_at_step or default_crash_step(runner.base)
    print(
        f"\n2. Crash and resume elsewhere: W=4, checkpoint every {opts.checkpoint_every} steps "
        f"to {folder}, rank {opts.crash_rank} SIGKILLs itself after step {crash_at}",
        flush=True,
    )
    kw = {"checkpoint_dir": str(folder), "checkpoint_every": opts.checkpoint_every}
    try:
        runner.train(4, "crash-w4", crash_at_step=crash_at, crash_rank=opts.crash_rank,
                     run_id="crash", **kw)  # fmt: skip
    except ProcessExitedException as err:
        failure = str(err)
        # \r: rank 0's progress bar may have been cut mid-line by the kill.
        print(f"\r   the W=4 job failed as planned: {failure}", flush=True)
    else:
        raise RuntimeError(f"the crash run finished: is --crash-at-step {crash_at} past the end?")
    latest = latest_checkpoint(folder)
    print(f"   latest complete checkpoint: {latest}; resuming on W={opts.resume_world}", flush=True)
    resumed = runner.train(opts.resume_world, f"resume-w{opts.resume_world}", resume=True,
                           run_id="crash", **kw)  # fmt: skip
    print("   " + describe(resumed))
    for e in resumed["rows_per_epoch"]:
        once = "each exactly once" if e["min"] == e["max"] == 1 else f"{e['min']}-{e['max']} times"
        print(f"   epoch {e['epoch']}: {e['rows']} rows trained, {e['distinct']} distinct, {once}")
    delta = max_weight_delta(resumed, reference)
    print(f"   max |Δweight| against the uninterrupted W=4 run: {delta:.1e}", flush=True)
    return {
        "crash_at_step": crash_at,
        "failure": failure,
        "resumed_from_step": resumed["resumed_from_step"],
        "resumed": resumed,
        "exactly_once": rows_exactly_once(resumed),
        "max_delta": delta,
    }


def default_crash_step(cfg: TrainConfig) -> int:
    """Halfway through the middle epoch, so the crash is mid-epoch and after a checkpoint."""
    from har_data import open_table

    per_epoch = steps_per_epoch(open_table(cfg.tables, cfg.train_table).count_rows(), cfg)
    return per_epoch * (cfg.epochs // 2) + per_epoch // 2


def speed(runner: Runner, opts: JobOptions) -> dict[str, Any]:
    """Part 3: time per W and global batch in float32, as the tutorial reports it."""
    print(f"\n3. Speed-up and efficiency (float32, {opts.speed_epochs} epochs per run)", flush=True)
    table: dict[int, dict[int, float]] = {}
    for batch in opts.speed_batches:
        table[batch] = {}
        for world in opts.worlds:
            result = runner.train(
                world, f"speed-g{batch}-w{world}", dtype="float32", epochs=opts.speed_epochs,
                global_batch=batch,
            )  # fmt: skip
            table[batch][world] = result["seconds"]
            print(f"   global batch {batch}: " + describe(result), flush=True)
    return {"seconds": table, "epochs": opts.speed_epochs}


def check(summary: dict[str, Any], dtype: str) -> list[str]:
    """What failed, in words; empty when every promise of parts 1 and 2 held."""
    problems = []
    strict = dtype == "float64"
    if "same" in summary and strict and summary["same"]["max_delta"] > TOLERANCE:
        problems.append(f"part 1: runs differ by {summary['same']['max_delta']:.1e} > {TOLERANCE}")
    crash = summary.get("crash")
    if crash and not crash["exactly_once"]:
        problems.append("part 2: some row was not trained exactly once per epoch")
    if crash and strict and crash["max_delta"] > TOLERANCE:
        problems.append(f"part 2: resumed run differs by {crash['max_delta']:.1e} > {TOLERANCE}")
    return problems


def start_dashboard(ui_port: int) -> Any:
    """Start the collector and the dashboard; None (and the reason, printed) when it cannot.

    The job does not depend on it: telemetry to a collector that is missing costs the
    ranks nothing (the README's contract), so a dashboard that fails to start is reported, not fatal.
    """
    try:
        from dashboard.launch import start_dashboard as start

        handle = start(port=0, ui_port=ui_port, db=str(REPO / "dashboard.db"))
    except (ImportError, OSError, RuntimeError, ValueError) as err:
        print(f"dashboard: not started ({err}); the job runs without it", flush=True)
        return None
    print(f"dashboard: {handle.ui_url}  (collector {handle.api_url})", flush=True)
    return handle


def stop_dashboard(handle: Any, wait: bool) -> None:
    if handle is None:
        return
    if wait:
        print(f"\nThe dashboard stays up at {handle.ui_url}; press Enter (or Ctrl-C) to stop it.")
        with contextlib.suppress(KeyboardInterrupt, EOFError):
            input()
    handle.stop()


def prepare_tables(args: argparse.Namespace) -> TableSpec:
    """The synthetic tables (made when missing, or at ``--synthetic-rows``), or the user's."""
    spec = TableSpec(uri=args.db, train=args.train_table, test=args.test_table)
    if args.synthetic_rows:
        train_rows, test_rows = args.synthetic_rows
        ensure_synthetic(spec, train_rows, test_rows)
    elif args.db == default_spec(REPO).uri:
        ensure_synthetic(spec, TRAIN_ROWS, TEST_ROWS)
    return spec


def run_job(opts: JobOptions, base: TrainConfig) -> dict[str, Any]:
    runner = Runner(base, opts.work_dir)
    summary: dict[str, Any] = {"dtype": base.dtype, "worlds": list(opts.worlds)}
    if 1 in opts.parts or 2 in opts.parts:
        worlds = opts.worlds if 1 in opts.parts else (4,)
        summary["same"] = same_training(runner, worlds)
    if 2 in opts.parts:
        summary["crash"] = crash_and_resume(runner, opts, summary["same"]["runs"][4])
    if 3 in opts.parts:
        summary["speed"] = speed(runner, opts)
    return summary


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.replace(",", " ").split())


def parse_args(argv: Sequence[str] | None) -> tuple[JobOptions, TrainConfig, argparse.Namespace]:
    spec = default_spec(REPO)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", type=_ints, default=(1, 2, 3), help="which of 1, 2, 3 to run")
    p.add_argument("--worlds", type=_ints, default=(1, 2, 4), help="world sizes for 1 and 3")
    p.add_argument("--db", default=spec.uri, help="LanceDB URI (a real table instead)")
    p.add_argument("--train-table", default=spec.train)
    p.add_argument("--test-table", default=spec.test)
    p.add_argument("--synthetic-rows", type=_ints, default=None, help="TRAIN,TEST: make these")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    p.add_argument("--global-batch", type=int, default=256)
    p.add_argument("--num-splits", type=int, default=8)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--crash-at-step", type=int, default=None, help="default: mid-epoch")
    p.add_argument("--crash-rank", type=int, default=1)
    p.add_argument(
        "--resume-world", type=int, default=3, help="any W <= G (3 does not divide S = 8)"
    )
    p.add_argument("--speed-batches", type=_ints, default=(256, 2048))
    p.add_argument("--speed-epochs", type=int, default=4)
    p.add_argument("--work-dir", type=Path, default=REPO / "checkpoints" / "main-job")
    p.add_argument("--no-dashboard", action="store_true")
    p.add_argument("--ui-port", type=int, default=8501, help="dashboard port (0: any free)")
    p.add_argument("--no-wait", action="store_true", help="stop the dashboard at the end")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--summary-json", type=Path, default=None)
    args = p.parse_args(argv)
    opts = JobOptions(
        parts=args.parts, worlds=args.worlds, work_dir=args.work_dir,
        checkpoint_every=args.checkpoint_every, crash_at_step=args.crash_at_step,
        crash_rank=args.crash_rank, resume_world=args.resume_world,
        speed_batches=args.speed_batches, speed_epochs=args.speed_epochs,
        dashboard=not args.no_dashboard, wait=not args.no_wait and sys.stdin.isatty(),
        summary_json=args.summary_json,
    )  # fmt: skip
    base = TrainConfig(
        db=args.db, train_table=args.train_table, test_table=args.test_table,
        epochs=args.epochs, global_batch=args.global_batch, num_splits=args.num_splits,
        dtype=args.dtype, progress=not args.no_progress,
    )  # fmt: skip
    return opts, base, args


def main(argv: Sequence[str] | None = None) -> int:
    opts, base, args = parse_args(argv)
    prepare_tables(args)
    handle = start_dashboard(args.ui_port) if opts.dashboard else None
    try:
        if handle is not None:
            base = replace(base, telemetry_url=handle.api_url)
        summary = run_job(opts, base)
        summary["problems"] = check(summary, base.dtype)
        summary["cores_per_rank"] = {w: cpu_threads(w) for w in opts.worlds}
        print_summary(summary, base, handle.ui_url if handle else None)
        if opts.summary_json:
            opts.summary_json.write_text(json.dumps(summary, indent=1, default=str))
    finally:
        stop_dashboard(handle, opts.wait)
    return 1 if summary["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
