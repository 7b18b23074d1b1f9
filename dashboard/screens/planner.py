"""Planner: before a run, what (rows, S, GPUs, workers, global batch) layouts fit.

The answer is `loader.tools.planner.plan_report`, the one `elastic-loader plan` prints (and its
`batch_text`, `placement_text` and loss-scale note: the page and the CLI say the same).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import ui
from dashboard.placement import planner_defaults
from loader.tools.planner import LISTED, LOSS_SCALE_NOTE, batch_text, placement_text, plan_report

st.header("Planner")
st.caption(
    "S is fixed for the life of a run. With a global batch G that is a multiple of S, a "
    "start or resume may use any W up to G (same global batches on every W; a rank reads "
    "whole splits plus parts of the two at its edges); otherwise W must divide S."
)
run_id = ui.selected_run()
placement = ui.fetch("placement", run_id)
mixed = ((placement or {}).get("mixture") or {}).get("datasets") or []
chosen = 0
if mixed:  # a mixture has no splits of its own: plan one of its datasets
    names = [f"{d['name']} (weight {d['weight']}, S = {d['splits']})" for d in mixed]
    picked = st.selectbox("dataset of the mixture", names, key=f"dataset-{run_id}")
    chosen = names.index(picked) if picked is not None and picked in names else 0
start = planner_defaults(placement, chosen)
if mixed:
    st.caption(
        f"Starting from run {ui.plain(run_id)}, a mixture of {len(mixed)} datasets: dataset "
        f"{ui.plain(start['dataset'])}'s N and S, the mixture's G and world size."
    )
elif run_id:
    st.caption(f"Starting from run {ui.plain(run_id)}: its N (S × L), S, G and world size.")
key = f"-{run_id}-{chosen}"  # a new run or dataset: the inputs start again from its values
left, right = st.columns(2)
rows = left.number_input(
    "rows N (after the filter)", min_value=1, value=start["rows"], step=1000, key="rows" + key
)
num_splits = left.number_input(
    "splits S", min_value=1, value=start["num_splits"], step=1, key="splits" + key
)
gpus = right.text_input("candidate GPU counts", start["gpus"], key="gpus" + key)
global_batch = right.number_input(
    "global batch G", min_value=1, value=start["global_batch"], step=1, key="g" + key
)
workers = right.number_input("DataLoader workers per rank", min_value=0, value=4, step=1)
drop_last = left.checkbox("drop_last", value=start["drop_last"], key="drop" + key)

try:
    candidates = sorted({int(p) for p in gpus.replace(",", " ").split()})
    report = plan_report(
        int(rows), int(num_splits), candidates, int(global_batch), drop_last=drop_last
    )
except ValueError as exc:
    st.error(str(exc))
    st.stop()

a, b, c = st.columns(3)
a.metric("rows per split", f"{report.rows_per_split:,}")
b.metric("rows dropped per epoch", f"{report.rows_dropped:,}")
c.metric("elastic (G % S == 0)", "yes" if report.identical_global_batches else "no")
supported = report.supported_world_sizes
more = f" … ({len(supported) - LISTED:,} more)" if len(supported) > LISTED else ""
divisors = f"world sizes S = {num_splits} supports: {supported[:LISTED]}{more}"
if report.identical_global_batches:
    st.caption(f"Any world size up to G = {int(global_batch):,} fits; without such a G, {divisors}")
else:
    st.caption(divisors[0].upper() + divisors[1:])
fits = report.fits
table = pd.DataFrame(
    {
        "GPUs": [f.world_size for f in fits],
        "fits": ["yes" if f.supported else "no" for f in fits],
        "why": [f.reason or "fits" for f in fits],
        "batch per GPU": [batch_text(f) if f.batch_size else "—" for f in fits],
        "splits per GPU": [f.splits_per_rank or "—" for f in fits],
        "shared splits": ["yes" if f.shared_splits else "no" for f in fits],
        "batches per epoch": [
            f"{f.batches_per_epoch:,}" if f.batches_per_epoch is not None else "—" for f in fits
        ],
        "worker processes": [f.world_size * int(workers) for f in fits],
        "what the first ranks read": [
            placement_text(f, report) if f.supported else "—" for f in fits
        ],
    }
)
st.table(table.set_index("GPUs"))
if any(f.shared_splits for f in fits):
    st.caption(
        "s[a:b of G/S]: a split shared by two ranks, of which this rank reads rows a..b-1 "
        "of the split's G/S rows in every global step."
    )
if any(f.unequal for f in fits):
    st.info(LOSS_SCALE_NOTE.replace("batch/rank", "batch per GPU"))
