"""The `elastic-loader` command: a thin shell over library functions.

Each subcommand parses its arguments and calls one public function; no logic lives here.
"""

from __future__ import annotations

import argparse
import decimal
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

# The dashboard is its own package with its own entry point; the loader does not import it
# (so `loader` works without FastAPI/Streamlit). `elastic-loader dashboard ARGS` hands ARGS
# to this module's `main` by name.
DASHBOARD_ENTRY = "dashboard.launch"
NUM_SPLITS_HELP = (
    "S, the number of disjoint streams the epoch is cut into (num_splits=; fixed for a run)"
)


def _count(low: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= `low`, written plainly or as `2e12` / `1_000`."""

    def parse(text: str) -> int:
        try:
            value = decimal.Decimal(text.strip())
        except decimal.InvalidOperation:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value.is_finite() or value != value.to_integral_value():
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
        if value < low:
            raise argparse.ArgumentTypeError(f"{text!r} is below {low}; it must be >= {low}")
        return int(value)

    return parse


def _world_sizes(text: str) -> list[int]:
    parse = _count(1)
    return [parse(part) for part in text.replace(",", " ").split()]


def _storage_option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError("expected KEY=VALUE")
    return key.strip(), value


def _schedule(text: str) -> tuple[tuple[int, int], ...]:
    """`3:16,6:32` -> ((3, 16), (6, 32)): a batch schedule's (global step, G) pairs."""
    parse, out = _count(1), []
    for part in text.replace(" ", "").split(","):
        step, sep, rows = part.partition(":")
        if not sep:
            raise argparse.ArgumentTypeError(f"{part!r} is not STEP:G")
        out.append((parse(step), parse(rows)))
    return tuple(out)


def _mix_spec(text: str) -> object:
    from loader.tools.mixplanner import parse_spec  # imported only when a mixture is planned

    return parse_spec(text)


def _build_parser() -> argparse.ArgumentParser:
    from loader import __version__

    parser = argparse.ArgumentParser(prog="elastic-loader", description=__doc__)
    parser.add_argument("--version", action="version", version=f"elastic-loader {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    plan = sub.add_parser(
        "plan",
        help="what a (rows, num_splits) layout supports",
        description="What a layout supports, without opening a table: for N rows cut into S "
        "splits, the rows per split and those dropped each epoch, the world sizes that can "
        "read it (with a global batch G that is a multiple of S, any W <= G; without one, "
        "the divisors of S), batches per epoch and, with --world-sizes, whether each fits. "
        "With --mixture (repeated), a mixture's exact shares, rows per step of each dataset, "
        "steps per pass and where its epoch ends. Exit 0 fits, 1 a world size asked for does "
        "not, 2 bad input.",
    )
    plan.add_argument("--rows", type=_count(1), default=None, help="rows N after the filter")
    plan.add_argument("--num-splits", type=_count(1), default=None, help=NUM_SPLITS_HELP)
    plan.add_argument("--world-sizes", type=_world_sizes, default=None, help="e.g. '4,6,8'")
    plan.add_argument(
        "--num-workers", type=_count(0), default=0, help="DataLoader workers per rank"
    )
    plan.add_argument("--global-batch", type=_count(1), default=None, help="G = W * batch_size")
    plan.add_argument(
        "--mixture",
        type=_mix_spec,
        action="append",
        default=[],
        metavar="NAME=ROWS/SPLITS[@WEIGHT]",
        help="a dataset of a mixture (repeat per dataset; then --global-batch is required)",
    )
    plan.add_argument(
        "--iterate-over-all", action="store_true", help="a mixture's epoch reads every pass"
    )

    inspect = sub.add_parser("inspect", help="describe a checkpoint file (path or s3:// URI)")
    inspect.add_argument("path")
    _storage_arg(inspect)

    _rows_parser(sub)
    dash = sub.add_parser(
        "dashboard",
        help="start the collector and the Streamlit dashboard (= elastic-loader-dashboard)",
        add_help=False,
    )
    dash.add_argument("args", nargs=argparse.REMAINDER, help="see elastic-loader-dashboard -h")
    return parser


def _rows_parser(sub: Any) -> None:
    rows = sub.add_parser(
        "rows",
        help="which rows were in global step T, and which rank read each",
        description="The table positions (and an id column) of global step T (0-based: the "
        "batch read while the loader's global_step went from T to T+1), without reading the "
        "data before it. From a checkpoint: every T from its global_step on, and the earlier "
        "steps of its epoch when the epoch ran on its global batch. From `plan`: a run that "
        "began at --epoch's start. Exit 0 answered, 2 bad input or a step it cannot answer.",
    )
    rows.add_argument(
        "where",
        metavar="CHECKPOINT_OR_PLAN",
        help="a checkpoint file, folder or s3:// URI, or `plan`",
    )
    rows.add_argument("--step", type=_count(0), required=True, help="global step T")
    rows.add_argument("--rank", type=_count(0), default=None, help="only this rank's rows")
    rows.add_argument(
        "--id-column", default=None, help="also print this column (reads just step T's rows)"
    )
    rows.add_argument(
        "--source",
        default=None,
        help="the table to read ids from (default: the checkpoint's); a mixture's: NAME=URI,...",
    )
    rows.add_argument(
        "--global-batch", type=_count(1), default=None, help="G (plan; old checkpoints)"
    )
    rows.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    plan = rows.add_argument_group("plan arguments (with `plan`)")
    plan.add_argument("--rows", type=_count(1), default=None, help="rows N after the filter")
    plan.add_argument("--num-splits", type=_count(1), default=None, help=NUM_SPLITS_HELP)
    plan.add_argument("--seed", type=_count(0), default=0, help="shuffle_seed (default 0)")
    plan.add_argument("--clump", type=_count(1), default=1, help="shuffle_clump_size (default 1)")
    plan.add_argument("--no-shuffle", action="store_true", help="shuffle=False")
    plan.add_argument("--world-size", type=_count(1), default=None, help="W")
    plan.add_argument("--epoch", type=_count(0), default=0, help="the epoch the run began with")
    plan.add_argument("--drop-last", action="store_true", help="drop_last=True")
    plan.add_argument(
        "--batch-schedule",
        type=_schedule,
        default=(),
        metavar="STEP:G,...",
        help="the run's batch_schedule (G from global step STEP on; --global-batch before)",
    )
    plan.add_argument("--filter", default=None, help="the dataset's filter (with --id-column)")
    _storage_arg(rows)


def _storage_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--storage-option",
        type=_storage_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="for s3:// URIs, as Lance takes them (endpoint, allow_http, region, "
        "aws_access_key_id, ...); AWS_* environment variables fill the rest",
    )


def _dashboard(args: list[str]) -> int:
    try:
        launch = importlib.import_module(DASHBOARD_ENTRY)
    except ImportError as exc:
        print(
            f"elastic-loader dashboard: the dashboard is not importable ({exc}); install the "
            "package with its dashboard dependencies, then run elastic-loader-dashboard",
            file=sys.stderr,
        )
        return 2
    code: int = launch.main(args, prog="elastic-loader dashboard")
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand. Output cut short by its reader (`| head`) ends quietly, exit 0."""
    try:
        code = _run(argv)
        sys.stdout.flush()  # a closed pipe shows here, not at exit where it cannot be caught
    except BrokenPipeError:
        # Python's advice: point stdout at devnull, so the interpreter's last flush is quiet
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    return code


def _run(argv: Sequence[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["dashboard"]:
        return _dashboard(argv[1:])
    args = _build_parser().parse_args(argv)
    if args.command == "plan":
        from loader.tools.planner import print_plan

        try:
            if args.mixture:
                from loader.tools.mixplanner import print_mixture_plan

                return print_mixture_plan(args.mixture, args.global_batch, args.iterate_over_all)
            if args.rows is None or args.num_splits is None:
                raise ValueError("--rows and --num-splits are required (or --mixture)")
            return print_plan(
                rows=args.rows,
                num_splits=args.num_splits,
                world_sizes=args.world_sizes,
                num_workers=args.num_workers,
                global_batch=args.global_batch,
            )
        except ValueError as exc:
            print(f"elastic-loader plan: error: {exc}", file=sys.stderr)
            return 2
    if args.command == "inspect":
        from loader.tools.inspect import print_inspect

        return print_inspect(args.path, storage_options=dict(args.storage_option) or None)
    if args.command == "rows":
        from loader.tools.rows_cli import print_rows

        return print_rows(args)
    return _dashboard(args.args)


if __name__ == "__main__":
    sys.exit(main())
