"""A mixture run's per-dataset table, from the loader's `mixture` events (loader/wire.py).

Standard library and pandas only (the Progress page draws it): per dataset its weight now,
the rows (or tokens) supplied since the run began, passes completed, and its share of the
rows read since the weights took effect against that weight.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pandas as pd


def mixture_frame(events: list[dict[str, Any]]) -> pd.DataFrame | None:
    """One row per dataset, or None when the run sent no mixture event."""
    facts = [e for e in events if isinstance(e.get("data"), dict) and e["data"].get("names")]
    if not facts:
        return None
    facts.sort(key=lambda e: (e.get("global_step") or 0, e.get("ts") or 0))
    last = facts[-1]["data"]
    names = str(last["names"]).split(",")
    weights = [Fraction(w) for w in str(last["weights"]).split(",")]
    supplied = list(last.get("supplied") or [0] * len(names))
    phase = [e["data"] for e in facts if e["data"].get("phase_start") == last.get("phase_start")]
    since = [
        now - then
        for now, then in zip(supplied, phase[0].get("supplied") or supplied, strict=False)
    ]
    total = sum(since)
    tokens = last.get("tokens")
    frame = pd.DataFrame(
        {
            "dataset": names,
            "weight": [f"{float(w):.1%}" for w in weights],
            "rows supplied": [f"{v:,}" for v in supplied],
            "passes completed": [str(p) for p in last.get("passes") or [0] * len(names)],
            "share since the weights took effect": [
                f"{v / total:.1%}" if total else "—" for v in since
            ],
        }
    )
    if tokens:
        frame.insert(3, "tokens supplied", [f"{t:,}" for t in tokens])
    return frame.set_index("dataset")
