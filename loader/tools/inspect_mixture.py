"""`elastic-loader inspect` for a mixture's checkpoint: the weights, the phases, and per
dataset its pinned source, plan and where its current pass stands."""

from __future__ import annotations

from typing import Any

from loader import state as st
from loader.mixture import state as ms
from loader.tools.describe import plan_rows, source_rows


def mixture_rows(state: dict[str, Any]) -> list[tuple[str, str]]:
    """Rows for a checked mixture state (`check_mixture_state` has passed)."""
    names, weights = state[ms.KEY_NAMES], state[ms.KEY_WEIGHTS]
    rule = state[ms.KEY_EPOCH_RULE]
    if isinstance(rule, int):
        epoch_text = f"every {rule} steps"
    elif rule.startswith("pass_of:"):
        epoch_text = f"each pass of {names[int(rule[8:])]}"
    else:
        epoch_text = {"first_pass": "the first pass a dataset completes"}.get(rule, "all passes")
    rows = [
        ("mixture", f"{len(names)} datasets: " + ", ".join(f"{n} {w}" for n, w in zip(names, weights, strict=True))),
        ("  epoch", f"{state[st.KEY_EPOCH]}, step {state[st.KEY_STEP]} (an epoch ends with {epoch_text}); "
                    f"global step {state[st.KEY_GLOBAL_STEP]}, saved by world_size {state[st.KEY_WORLD_SIZE]} "
                    f"with G={state[st.KEY_GLOBAL_BATCH]:,}"),
        ("  weights", f"in effect since global step {state[ms.KEY_PHASE_START]}: "
                      f"{sum(state[ms.KEY_PHASE_COUNTS]):,} rows since then"),
        ("resumes on", "any W <= G (a mixture's step is one layout of G rows)"),
    ]  # fmt: skip
    phases = state.get(ms.KEY_PHASES, [])
    if len(phases) > 1:  # a schedule, set_weights or a resume with new weights
        shown = "; ".join(f"step {start}: {', '.join(shares)}" for start, shares in phases)
        rows.insert(3, ("  phases", shown))
    for name, source, supplied in zip(
        names, state[ms.KEY_SOURCES], state[ms.KEY_SUPPLIED], strict=True
    ):
        plan = source[st.KEY_PLAN]
        total = plan["num_splits"] * plan["rows_per_split"]
        read = sum(source[st.KEY_CURSORS])
        unit = "documents" if plan.get("pack_sequences") is not None else "rows"
        rows.append((f"[{name}]", f"pass {source[st.KEY_EPOCH]}: {read:,} of {total:,} {unit} "
                                  f"({100 * read / total:.1f}%); {supplied:,} supplied in all"))  # fmt: skip
        rows.extend(
            (f"  {label.strip()}", value) for label, value in source_rows(source[st.KEY_SOURCE])
        )
        rows.extend((f"  {label.strip()}", value) for label, value in plan_rows(plan))
    return rows
