"""The dashboard's colours, in one place: Okabe-Ito, safe for the common colour-vision
deficiencies. A state keeps its colour on every page, chart and table (crashed is vermillion,
never a green or a blue), and each timeline kind keeps its colour whichever kinds a run has.
"""

from __future__ import annotations

STATE_COLOURS = {"running": "#009e73", "closed": "#0072b2", "stalled": "#e69f00"}
STATE_COLOURS |= {"crashed": "#d55e00", "terminated": "#cc79a7", "previous world": "#999999"}
# not a state of the collector's: a running rank that has read less than the others (nodes.py)
STATE_COLOURS |= {"behind": "#f0e442"}
# The timeline's kinds (a routine epoch end is never the crash's colour).
KIND_COLOURS = {
    "checkpoint saved": "#0072b2", "checkpoint loaded": "#56b4e9", "epoch end": "#999999",
    "mixture": "#cc79a7", "steps skipped": "#f0e442", "crash": "#d55e00", "outage": "#e69f00",
    "terminated": "#000000",
}  # fmt: skip
DARK_TEXT_ON = ("stalled", "behind", "terminated", "previous world")  # light fills


def cell_style(state: str) -> str:
    """CSS for a table cell that names a rank in `state`: its colour, legible text on it."""
    text = "#000000" if state in DARK_TEXT_ON else "#ffffff"
    return f"background-color: {STATE_COLOURS[state]}; color: {text}; font-weight: 600"
