"""The `elastic-loader` command: a thin shell over library functions.

Each subcommand parses its arguments and calls one public function; no logic lives here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.replace(",", " ").split()]


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="elastic-loader", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    plan = sub.add_parser("plan", help="what a (rows, num_splits) layout supports")
    plan.add_argument("--rows", type=int, required=True, help="rows N after the filter")
    plan.add_argument("--num-splits", type=int, required=True, help="S")
    plan.add_argument("--world-sizes", type=_ints, default=None, help="e.g. '4,6,8'")
    plan.add_argument("--num-workers", type=int, default=0, help="DataLoader workers per rank")
    plan.add_argument("--global-batch", type=int, default=None, help="G = W * batch_size")

    inspect = sub.add_parser("inspect", help="describe a checkpoint file")
    inspect.add_argument("path")

    dash = sub.add_parser("dashboard", help="start the collector and the Streamlit dashboard")
    dash.add_argument("--host", default="127.0.0.1")
    dash.add_argument("--port", type=int, default=8765, help="collector port")
    dash.add_argument("--ui-port", type=int, default=8501, help="Streamlit port")
    dash.add_argument("--token", default=None, help="required to bind beyond loopback")
    dash.add_argument("--db", default="dashboard.db", help="SQLite file for events")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    if args.command == "plan":
        from loader.planner import print_plan

        return print_plan(
            rows=args.rows,
            num_splits=args.num_splits,
            world_sizes=args.world_sizes,
            num_workers=args.num_workers,
            global_batch=args.global_batch,
        )
    if args.command == "inspect":
        from loader.inspect import print_inspect

        return print_inspect(args.path)
    from dashboard.launch import run_dashboard

    return run_dashboard(
        host=args.host, port=args.port, ui_port=args.ui_port, token=args.token, db=args.db
    )


if __name__ == "__main__":
    sys.exit(main())
