"""Issue #35 in one run: rows/s with and without the node cache, and items 7 and 8's ratios.

One process (and its moto server), `--reps` repetitions; each repetition measures, in turn:

- **cache** (`cache.one_round`): one epoch of a Lance table on moto behind the tests' proxy
  adding `--delay-ms` a request (w = 0, S = 8, C = 1,024, b = 1,024): `uncached`, `cold`
  (an empty cache, prefetch off), `prefetch` (an empty cache, the default prefetch), `warm`
  (the cache `cold` filled); fresh caches each repetition. Also the MB the proxy saw and
  the MB the cache counted (`bytes_from_store`) in the cold epoch.
- **item 7** (`rows35`): one epoch of ours at w = 0 (S = 48, C = 1,024, b = 1,024) and one
  of lance.torch's `ShardedBatchSampler` (b = 1,024) on the same local table, in a shuffled
  order, after the first batch; rows/s and rows per CPU-second.
- **item 8** (`packing.scan_pairs`): one epoch of ours' default packed batch (blocks of
  2,048, S = 4, b = 8) and one raw Lance scan of the token column, tokens/s.

Ratios are taken within a repetition; the table shows their median and range over the
repetitions, and the last line is the same as JSON.

    PYTHONPATH=$PWD:$PWD/benchmarks NUMBA_THREADING_LAYER=workqueue \\
        .venv/bin/python benchmarks/issue35.py [--reps 3] [--cache-rows 131072] \\
        [--rows-uri /tmp/rows35/rows.lance --rows 1000000] [--docs 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for where in (HERE, HERE.parent):  # rows35 imports build_data; packing imports loader
    if str(where) not in sys.path:
        sys.path.insert(0, str(where))

import cache as cache_bench  # noqa: E402
import lancedb  # noqa: E402
import packing  # noqa: E402
import rows35  # noqa: E402

from tests.netproxy import FaultProxy, Faults  # noqa: E402
from tests.object_store import running_s3_server  # noqa: E402


def _rows_case(name: str, uri: str) -> Callable[[], Iterable[Any]]:
    fn = rows35.ours if name == "ours" else rows35.lance_torch
    return lambda: fn(uri, 0, None)


def measure(args: argparse.Namespace, server: Any = None) -> dict[str, Any]:
    """Every repetition's figures: {"cache": [...], "item7": [...], "item8": [...]}, and
    the load average as the repetitions start."""
    with ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        if server is None:
            server = stack.enter_context(running_s3_server())
        s3_uri = cache_bench.s3_table(server, args.cache_rows, args.per_file)
        faults = Faults(delay_s=args.delay_ms / 1000)
        proxy = stack.enter_context(FaultProxy((server.host, server.port), faults))
        rows_uri = args.rows_uri or f"{tmp}/rows.lance"
        rows35.build(rows_uri, args.rows)
        tokens = packing.token_table(lancedb.connect(f"{tmp}/db"), args.docs)
        for name in ("ours", "lance_torch"):  # warm-up: page cache, Numba, imports
            rows35.rate(_rows_case(name, rows_uri), min(50_000, args.rows // 2))
        next(iter(packing.ours(tokens)))  # the packing kernels load
        out: dict[str, Any] = {"cache": [], "item7": [], "item8": []}
        out["load_start"] = os.getloadavg()[0]
        for rep in range(args.reps):
            out["cache"].append(cache_bench.one_round(s3_uri, server, proxy, f"{tmp}/c{rep}"))
            seven = {}
            for name in random.Random(rep).sample(["ours", "lance_torch"], 2):
                seven[name] = rows35.rate(_rows_case(name, rows_uri), 1 << 40)
            out["item7"].append(seven)
            out["item8"].append(packing.scan_pairs(tokens, 1, None)[0])
            print(f"  rep {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)
    return out


def summary(runs: dict[str, Any]) -> dict[str, dict[str, list[float]]]:
    """Per section, each figure's values over the repetitions (ratios within each)."""
    cache: dict[str, list[float]] = {}
    for r in runs["cache"]:
        for case in ("uncached", "cold", "prefetch", "warm"):
            cache.setdefault(f"{case} rows/s", []).append(r[case]["rows_per_s"])
        cache.setdefault("warm ÷ uncached", []).append(
            r["warm"]["rows_per_s"] / r["uncached"]["rows_per_s"]
        )
        cache.setdefault("prefetch ÷ uncached", []).append(
            r["prefetch"]["rows_per_s"] / r["uncached"]["rows_per_s"]
        )
        cache.setdefault("cold MB: proxy", []).append(r["cold"]["store_mb"])
        cache.setdefault("cold MB: cache's bytes_from_store", []).append(r["cold"]["cache_mb"])
        cache.setdefault("warm MB: proxy", []).append(r["warm"]["store_mb"])
    seven: dict[str, list[float]] = {}
    for r in runs["item7"]:
        (ours, ours_cpu), (theirs, theirs_cpu) = r["ours"], r["lance_torch"]
        seven.setdefault("ours rows/s (w = 0)", []).append(ours)
        seven.setdefault("lance.torch rows/s", []).append(theirs)
        seven.setdefault("ours ÷ lance.torch, wall", []).append(ours / theirs)
        seven.setdefault("ours ÷ lance.torch, CPU", []).append(ours_cpu / theirs_cpu)
    eight: dict[str, list[float]] = {}
    for ratio, ours_ns, scan_ns in runs["item8"]:
        eight.setdefault("ours ÷ raw scan, wall", []).append(ratio)
        eight.setdefault("ours CPU ns a token", []).append(ours_ns)
        eight.setdefault("scan CPU ns a token", []).append(scan_ns)
    return {"cache": cache, "item7": seven, "item8": eight}


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"


def report(args: argparse.Namespace, runs: dict[str, Any]) -> dict[str, Any]:
    """Print the table and the JSON line; return the JSON's object."""
    figures = summary(runs)
    load = os.getloadavg()[0]
    print(
        f"\nissue #35, one run: {args.reps} repetitions, load average {runs['load_start']:.1f} "
        f"at the start, {load:.1f} at the end; cache: "
        f"{args.cache_rows:,} rows on moto +{args.delay_ms:g} ms; item 7: {args.rows:,} rows; "
        f"item 8: {args.docs:,} documents\n"
    )
    print("| section | figure | median | range |\n|---|---|---:|---:|")
    medians: dict[str, Any] = {
        "reps": args.reps,
        "load_average": [round(runs["load_start"], 2), round(load, 2)],
    }
    for section, values in figures.items():
        medians[section] = {}
        for name, series in values.items():
            mid = statistics.median(series)
            medians[section][name] = round(mid, 3)
            spread = f"{_fmt(min(series))}–{_fmt(max(series))}"
            print(f"| {section} | {name} | {_fmt(mid)} | {spread} |")
    print(json.dumps(medians, ensure_ascii=False))
    return medians


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--cache-rows", type=int, default=131_072, help="the cache's table")
    p.add_argument("--per-file", type=int, default=32_768, help="its rows a data file")
    p.add_argument("--delay-ms", type=float, default=20.0, help="the store's round trip")
    p.add_argument("--rows", type=int, default=1_000_000, help="item 7's table")
    p.add_argument("--rows-uri", default="", help="item 7's table, kept (default: a temp dir)")
    p.add_argument("--docs", type=int, default=20_000, help="item 8's documents")
    return p


def main(argv: list[str] | None = None, server: Any = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    for flag in ("reps", "cache_rows", "per_file", "rows", "docs"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"--{flag.replace('_', '-')} must be >= 1")
    return report(args, measure(args, server))


if __name__ == "__main__":
    main()
