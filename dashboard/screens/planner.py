"""Planner: before a run, what (rows, S, GPUs, workers, global batch) layouts fit.

The answer is `loader.planner.plan_report`, the one `elastic-loader plan` prints.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from loader.planner import LISTED, plan_report

st.header("Planner")
st.caption(
    "S is fixed for the life of a run; a resume may use any W that divides it. "
    "A global batch that is a multiple of S gives the same batches on every W."
)
left, right = st.columns(2)
rows = left.number_input("rows N (after the filter)", min_value=1, value=1_000_000, step=1000)
num_splits = left.number_input("splits S", min_value=1, value=48, step=1)
gpus = right.text_input("candidate GPU counts", "1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64")
global_batch = right.number_input("global batch G", min_value=1, value=1536, step=1)
workers = right.number_input("DataLoader workers per rank", min_value=0, value=4, step=1)
drop_last = left.checkbox("drop_last", value=True)

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
st.caption(f"World sizes S = {num_splits} supports: {supported[:LISTED]}{more}")
fits = report.fits
table = pd.DataFrame(
    {
        "GPUs": [f.world_size for f in fits],
        "fits": ["yes" if f.supported else "no" for f in fits],
        "why": [f.reason or "fits" for f in fits],
        "batch per GPU": [f.batch_size if f.batch_size else "—" for f in fits],
        "batches per epoch": [
            f"{f.batches_per_epoch:,}" if f.batches_per_epoch is not None else "—" for f in fits
        ],
        "worker processes": [f.world_size * int(workers) for f in fits],
    }
)
st.table(table.set_index("GPUs"))
