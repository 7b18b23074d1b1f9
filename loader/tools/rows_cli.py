"""`elastic-loader rows`: the ledger (`loader.tools.rows`) from a checkpoint or plan
arguments, printed as lines or JSON; every failure one line on stderr and exit status 2."""

from __future__ import annotations

import json
import sys
from typing import Any

from loader.plan import PlanSpec
from loader.stream import Batching
from loader.tools.rows import MixRun, RunPosition, rows_at_step
from loader.tools.rows_base import StepRows

__all__ = ["format_rows", "load_position", "print_rows"]

PLAN_NEEDS = ("rows", "num_splits", "world_size", "global_batch")


def load_position(
    where: str,
    global_batch_size: int | None = None,
    storage_options: dict[str, Any] | None = None,
    source: Any = None,
) -> RunPosition | MixRun:
    """The position of the checkpoint at `where` (a file, or a folder's / prefix's newest)."""
    from loader import checkpoint
    from loader import checkpoint_io as io

    location = io.location(where)
    if io.is_folder(location, storage_options):
        newest = checkpoint.latest(where, storage_options)
        if newest is None:
            raise checkpoint.CheckpointError(location, None, "is a folder with no checkpoint")
        location = newest
    state = checkpoint.load(location, storage_options)
    return RunPosition.from_state(
        state, global_batch_size, source=source, storage_options=storage_options
    )


def _columns(found: StepRows) -> dict[str, list[Any]]:
    columns: dict[str, list[Any]] = {"rank": found.ranks.tolist()}
    if found.datasets is not None and found.names is not None:
        columns["dataset"] = [found.names[k] for k in found.datasets.tolist()]
    columns["block" if found.documents is not None else "position"] = found.positions.tolist()
    if found.table_positions is not None:
        columns["table_position"] = found.table_positions.tolist()
    if found.ids is not None:
        columns[found.id_column or "id"] = found.ids
    if found.documents is not None:
        columns["documents"] = found.documents
    return columns


def format_rows(found: StepRows, as_json: bool = False) -> str:
    """`elastic-loader rows`'s output: a `#` header line, then one tab-separated line a row
    (rank[, dataset], position or block[, table_position][, the id column][, documents as
    position[first:stop] ...]); or one JSON object. A skipped step says so, with no rows."""
    columns = _columns(found)
    if as_json:
        head = {k: v for k, v in found.__dict__.items() if isinstance(v, int) and k != "skipped"}
        head["skipped"] = found.skipped
        rows = [
            dict(zip(columns, values, strict=True))
            for values in zip(*columns.values(), strict=True)
        ]
        for row in rows:
            if "documents" in row:
                row["documents"] = [
                    {"position": p, "start": a, "stop": z} for p, a, z in row["documents"]
                ]
        return json.dumps({**head, "rows": rows}, default=str)
    unit = "blocks" if found.documents is not None else "rows"
    what = (
        "skipped (skip_steps): no rank read it"
        if found.skipped
        else f"{len(found.positions):,} {unit}"
    )
    lines = [
        f"# global step {found.step:,}: epoch {found.epoch}, step {found.epoch_step:,} of the "
        f"epoch; W = {found.world_size}, G = {found.global_batch_size:,}; {what}",
        "\t".join(columns),
    ]
    for values in zip(*columns.values(), strict=True):
        cells = list(values)
        if found.documents is not None:
            cells[-1] = " ".join(f"{p}[{a}:{z}]" for p, a, z in cells[-1])
        lines.append("\t".join(map(str, cells)))
    return "\n".join(lines)


def _source_arg(text: str | None) -> str | dict[str, str] | None:
    """`--source`: one table's URI, or a mixture's NAME=URI[,NAME=URI ...]."""
    if text is None or "=" not in text:
        return text
    pairs = [part.partition("=") for part in text.split(",") if part.strip()]
    if any(not sep or not name.strip() for name, sep, _ in pairs):
        raise ValueError(
            f"--source {text!r}: a mixture's sources are NAME=URI[,NAME=URI ...] (its "
            "dataset names, as `elastic-loader inspect` prints them)"
        )
    return {name.strip(): uri for name, _, uri in pairs}


def position_from_args(args: Any) -> RunPosition | MixRun:
    """The CLI's position: a checkpoint's, or (`plan`) the start of `--epoch`."""
    options = dict(args.storage_option) or None
    if args.where != "plan":
        return load_position(args.where, args.global_batch, options, _source_arg(args.source))
    missing = [f"--{name.replace('_', '-')}" for name in PLAN_NEEDS if getattr(args, name) is None]
    if missing:
        raise ValueError(f"`plan` needs {', '.join(missing)} (the run's N, S, W and G)")
    spec = PlanSpec(args.rows, args.num_splits, not args.no_shuffle, args.seed, args.clump)
    batching = Batching(None, args.drop_last, args.global_batch, tuple(args.batch_schedule))
    source = None if args.source is None else {"uri": args.source}
    return RunPosition(spec, args.world_size, batching, args.epoch, None, 0, 0, args.filter, source)


def print_rows(args: Any) -> int:
    """`elastic-loader rows`: print step T's rows; 2 (and why, on stderr) when it cannot."""
    from loader.checkpoint_io import CheckpointError

    try:
        run = position_from_args(args)
        source = _source_arg(args.source) if args.where != "plan" else None
        found = rows_at_step(
            run,
            args.step,
            args.rank,
            id_column=args.id_column,
            source=source,
            storage_options=dict(args.storage_option) or None,
        )
    except (CheckpointError, ValueError, OSError) as exc:  # the message says why
        print(f"elastic-loader rows: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # the CLI's boundary: one line naming the error, never a traceback
        print(f"elastic-loader rows: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(format_rows(found, args.json))
    return 0
