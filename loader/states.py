"""Any loader state, a single dataset's or a mixture's: the one check that checkpoint files
and `inspect` run. It sits above both formats' modules (`loader.state` knows only a single
dataset's, `loader.mixture.state` the mixture's), so neither imports the other's room.
Standard library only."""

from __future__ import annotations

from typing import Any

from loader import state as st
from loader.mixture.state import check_mixture_state


def check_state(state: Any) -> None:
    """Raise `loader.state.StateError` (naming the field) unless `state` is a well-formed
    single dataset's state or mixture state."""
    if isinstance(state, dict) and state.get(st.KEY_FORMAT) == st.MIXTURE_FORMAT:
        check_mixture_state(state)
        return
    st.check_state(state)
