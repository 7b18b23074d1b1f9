"""A mixture run's per-dataset table, from the loader's `mixture` events (loader/wire.py).

Standard library and pandas only (the Progress page draws it): per dataset its weight now,
the rows (or tokens) supplied since the run began, passes completed, and its share of the
rows read in the last 100 global steps (from the weights of the phases in them) and since the weights took effect, beside that weight.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pandas as pd

from loader.wire import text_list

# The window of the recent-share column: the last report at least this many global steps
# before the latest (or the weights' first, when the phase is younger).
WINDOW_STEPS = 100


def mixture_frame(events: list[dict[str, Any]]) -> pd.DataFrame | None:
    """One row per dataset, or None when the run sent no mixture event."""
    facts = [e for e in events if isinstance(e.get("data"), dict) and e["data"].get("names")]
    if not facts:
        return None
    facts.sort(key=lambda e: (e.get("global_step") or 0, e.get("ts") or 0))
    last = facts[-1]["data"]
    names = text_list(last, "names")
    weights = [Fraction(w) for w in text_list(last, "weights")]
    supplied = list(last.get("supplied") or [0] * len(names))
    phase = [e for e in facts if e["data"].get("phase_start") == last.get("phase_start")]
    end = facts[-1].get("global_step") or 0
    since = _since(supplied, phase[0]["data"])
    window = _window(facts, end, len(names))
    tokens = last.get("tokens_supplied")
    unit = "blocks" if tokens else "rows"  # packed: the datasets hand out blocks of tokens
    frame = pd.DataFrame(
        {
            "dataset": names,
            "weight": [f"{float(w):.1%}" for w in weights],
            f"{unit} supplied": [f"{v:,}" for v in supplied],
            "passes completed": [str(p) for p in last.get("passes") or [0] * len(names)],
            f"share of the last {WINDOW_STEPS} steps": _shares(window),
            "share since the weights took effect": _shares(since),
        }
    )
    if tokens:
        frame.insert(3, "tokens supplied", [f"{t:,}" for t in tokens])
    return frame.set_index("dataset")


def _window(facts: list[dict[str, Any]], end: int, count: int) -> list[Fraction]:
    """Each dataset's share of the last `WINDOW_STEPS` global steps before `end`, from the
    weights of every phase in them (a phase's counts are its weights', within a row: the
    mixture's contract), not from reports that straddle a weight change."""
    phases: dict[int, list[Fraction]] = {}
    for e in facts:
        start = e["data"].get("phase_start")
        start = start if isinstance(start, int) else e.get("global_step") or 0
        phases.setdefault(start, [Fraction(w) for w in text_list(e["data"], "weights")])
    starts = sorted(phases)
    lo = max(0, end - WINDOW_STEPS)
    shares = [Fraction(0)] * count
    for start, stop in zip(starts, [*starts[1:], end], strict=True):
        steps = max(0, min(stop, end) - max(start, lo))
        weights = phases[start]
        for k, w in enumerate(weights[:count]):
            shares[k] += steps * w / sum(weights)
    return shares


def _since(supplied: list[int], then: dict[str, Any]) -> list[int]:
    """Rows each dataset supplied after the event whose data is `then`."""
    return [now - was for now, was in zip(supplied, then.get("supplied") or supplied, strict=False)]


def _shares(counts: list[int] | list[Fraction]) -> list[str]:
    total = sum(counts)
    return [f"{float(v / total):.1%}" if total else "—" for v in counts]
