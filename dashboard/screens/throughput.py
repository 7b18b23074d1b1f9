"""Throughput: rows/s across ranks as a band, whether the GPU waits on data, stragglers,
and the node caches that feed the readers (a cache that misses is why data arrives slowly)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import charts, ui

WINDOWS = {"last 5 min": 300, "last 30 min": 1800, "last 2 h": 7200, "last 24 h": 86400}


def _pct(share: float) -> str:
    return f"{share:.0%}"


def _verdict(data: dict[str, Any], unit: str) -> None:
    verdict = data["input"]["verdict"]
    (st.warning if data["input"]["bound"] else st.success)(f"Data wait: {verdict}.")
    if data["stragglers"]:
        rows = [
            {
                "rank": f"rank {s['rank']}",
                unit: f"{s['rows_per_s']:,.0f}",
                "waiting for data": _pct(s["stall_frac"]),
                "why": s["reason"],
            }
            for s in data["stragglers"]
        ]
        st.error("Stragglers: " + ", ".join(r["rank"] for r in rows))
        st.table(pd.DataFrame(rows).set_index("rank"))
    else:
        st.success("No straggler in the last 30 s.")


@st.fragment(run_every=ui.REFRESH)
def live(window_s: int) -> None:
    run_id = ui.selected_run()
    data = ui.fetch("throughput", run_id, window_s=window_s, points=120)
    if data is None:
        return
    tokens_per_s = data.get("tokens_per_s")
    unit = "rows/s" if tokens_per_s is None else "blocks/s"  # packed: blocks of seq_len tokens
    _verdict(data, unit)
    if tokens_per_s is not None:
        st.metric("tokens/s (job, last 30 s)", f"{tokens_per_s:,.0f}")
    chart = charts.band_chart(
        data["band"], f"{unit} per rank", data["crashed_at"], data.get("crashed_before") or []
    )
    ui.show(chart)
    ui.show(charts.wait_chart(data["band"]))
    slowest = [
        {
            "rank": f"rank {s['rank']}",
            unit: f"{s['rows_per_s']:,.0f}",
            "waiting for data": _pct(s["wait_share"]),
        }
        for s in data["slowest"]
    ]
    if slowest:
        st.subheader("Slowest ranks in the window")
        st.table(pd.DataFrame(slowest).set_index("rank"))
    st.caption(f"{data['count']:,} points, {data['bucket_s']:.0f} s per point")


def _bytes(n: int | None) -> str:
    """'950.0 MiB', '1.2 GiB': binary units, as `cache_limit` is sized."""
    if n is None:
        return "—"
    size, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{size:,.0f} B" if unit == "B" else f"{size:,.1f} {unit}"


def _count(n: int | None) -> str:
    return "—" if n is None else f"{n:,}"


def _cache_row(n: dict[str, Any]) -> dict[str, str]:
    lead = n["prefetch_lead"]
    return {
        "node": f"{n['host']} · {n['cache_dir']}",
        "hit rate": "—" if n["hit_rate"] is None else f"{n['hit_rate']:.1%}",
        "from the store": _bytes(n["bytes_from_store"]),
        "from the cache": _bytes(n["bytes_from_cache"]),
        "store share": "—" if n["store_share"] is None else f"{n['store_share']:.0%}",
        "evictions": _count(n["evictions"]),
        "refetched": _count(n["refetched"]),
        "prefetched": _count(n["prefetched"]),
        "prefetch lead": "—" if lead is None else f"{lead:,.0f} steps",
        "as of": ui.clock(n["received_ts"]) + (" (stale)" if n["stale"] else ""),
    }


@st.fragment(run_every=ui.REFRESH)
def cache_panel() -> None:
    """Per node and cache folder, its latest report: totals since its loader started."""
    run_id = ui.selected_run()
    data = ui.fetch("caches", run_id)
    if data is None:
        return
    st.subheader("Node cache")
    nodes = data["nodes"]
    if not nodes:
        st.caption("This run reported no node cache.")
        return
    for n in nodes:
        for warning in n["warnings"]:
            st.warning(warning)
        if n["stale"]:
            st.info(
                f"{n['host']} ({n['cache_dir']}): no cache report since "
                f"{ui.clock(n['received_ts'])} UTC ({ui.ago(n['age_s'])}): its figures are as of then"
            )
    if not any(n["warnings"] for n in nodes):
        st.success("No node cache reports a problem.")
    st.table(pd.DataFrame([_cache_row(n) for n in nodes]).set_index("node"))
    st.caption(
        "Totals since each node's loader started (a report carries no epoch). Store share: "
        "bytes fetched from the object store over all bytes read; prefetch lead: steps the "
        "plan-driven prefetcher is ahead of the readers."
    )


st.header("Throughput")
choice = st.radio("window", list(WINDOWS), horizontal=True, label_visibility="collapsed")
live(WINDOWS[choice or next(iter(WINDOWS))])
cache_panel()
