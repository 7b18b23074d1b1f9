"""Planner: before a run, what (rows, S, GPUs, workers, global batch) layouts fit."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard.placement import plan_fits, supported_world_sizes

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
    dropped, fits = plan_fits(int(rows), int(num_splits), candidates, int(global_batch), drop_last)
except ValueError as exc:
    st.error(str(exc))
    st.stop()

per_split = int(rows) // int(num_splits)
a, b, c = st.columns(3)
a.metric("rows per split", f"{per_split:,}")
b.metric("rows dropped per epoch", f"{dropped:,}")
c.metric("elastic (G % S == 0)", "yes" if fits and fits[0].elastic else "no")
st.caption(f"World sizes S = {num_splits} supports: {supported_world_sizes(int(num_splits))}")
table = pd.DataFrame(
    {
        "GPUs": [f.world_size for f in fits],
        "fits": ["yes" if f.fits else "no" for f in fits],
        "why": [f.reason for f in fits],
        "batch per GPU": [f.per_rank_batch if f.per_rank_batch else "—" for f in fits],
        "batches per epoch": [f"{f.batches_per_epoch:,}" if f.fits else "—" for f in fits],
        "worker processes": [f.world_size * int(workers) for f in fits],
    }
)
st.table(table.set_index("GPUs"))
