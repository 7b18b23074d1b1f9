"""The mixture state: its keys, how it is built, and how a loaded one is checked.

One object, JSON, O(total splits): the mixture's step and weight phase, and per dataset its
own state (`loader.state`, as that dataset read alone on one rank would save it: identity,
pinned version, pass and cursors). Standard library only, like `loader.state`;
`loader.states.check_state` sends a mixture state here, so checkpoint files and `inspect`
take both.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from loader import state as st

FORMAT = st.MIXTURE_FORMAT
FORMAT_VERSION = 1

KEY_NAMES = "names"
KEY_WEIGHTS = "weights"  # the shares in effect, reduced fractions as text ("7/10")
KEY_SEED = "seed"
KEY_EPOCH_RULE = "epoch_rule"  # "first_pass", "all_passes", "pass_of:K" or a number of steps
KEY_PHASE_START = "phase_start"  # the global step at which the weights took effect
KEY_PHASE_COUNTS = "phase_counts"  # rows per dataset since phase_start
KEY_EPOCH_PASSES = "epoch_passes"  # each dataset's pass when the mixture epoch began
KEY_SUPPLIED = "supplied"  # units (rows or blocks) per dataset since the run began
KEY_SOURCES = "sources"  # per dataset: its own state
KEY_STEPS_SKIPPED = "steps_skipped"  # optional: [first, stop) global steps jumped (skip_steps)
# optional (states before schedules lack it: one phase, `weights` from `phase_start`):
KEY_PHASES = "phases"  # [[global step, ["7/10", ...]], ...]: every weight phase, in order
KEY_EMPTY_PASSES = "empty_passes"  # optional: passes per dataset that held no row
KEY_SKIPS_PENDING = st.KEY_SKIPS_PENDING  # optional: [start, stop) ranges not yet reached

REQUIRED = (
    st.KEY_FORMAT,
    st.KEY_FORMAT_VERSION,
    KEY_NAMES,
    KEY_WEIGHTS,
    KEY_EPOCH_RULE,
    st.KEY_EPOCH,
    st.KEY_STEP,
    st.KEY_GLOBAL_STEP,
    st.KEY_WORLD_SIZE,
    st.KEY_GLOBAL_BATCH,
    KEY_PHASE_START,
    KEY_PHASE_COUNTS,
    KEY_EPOCH_PASSES,
    KEY_SUPPLIED,
    KEY_SOURCES,
)


def is_mixture(state: Any) -> bool:
    return isinstance(state, dict) and state.get(st.KEY_FORMAT) == FORMAT


def check_mixture_state(state: Any) -> None:
    """Raise StateError (naming the field) unless `state` is a well-formed mixture state."""
    if not isinstance(state, dict):
        raise st.StateError(None, f"must be a dict, got {type(state).__name__}")
    missing = [key for key in REQUIRED if key not in state]
    if missing:
        raise st.StateError(missing[0], f"is missing (missing fields {missing})")
    st.check_version(st.KEY_FORMAT_VERSION, state[st.KEY_FORMAT_VERSION], FORMAT_VERSION)
    names = state[KEY_NAMES]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise st.StateError(KEY_NAMES, f"is {names!r}, expected a non-empty list of names")
    count = len(names)
    shares = _fractions(state[KEY_WEIGHTS], count)
    rule = state[KEY_EPOCH_RULE]
    named = isinstance(rule, str) and rule.startswith("pass_of:") and rule[8:].isdigit()
    if named and int(rule[8:]) >= count:
        raise st.StateError(KEY_EPOCH_RULE, f"is {rule!r}, but there are {count} datasets")
    if (
        rule not in ("first_pass", "all_passes")
        and not named
        and not (st.is_count(rule) and rule >= 1)
    ):
        raise st.StateError(
            KEY_EPOCH_RULE, f"is {rule!r}, expected first_pass, all_passes, pass_of:K or steps >= 1"
        )
    if state.get(KEY_SEED) is not None:
        st.check_count(KEY_SEED, state[KEY_SEED])
    for key in (st.KEY_EPOCH, st.KEY_STEP, st.KEY_GLOBAL_STEP, KEY_PHASE_START):
        st.check_count(key, state[key])
    if state[KEY_PHASE_START] > state[st.KEY_GLOBAL_STEP]:
        raise st.StateError(KEY_PHASE_START, "is after global_step")
    batch = st.check_count(st.KEY_GLOBAL_BATCH, state[st.KEY_GLOBAL_BATCH], low=1)
    st.check_count(st.KEY_WORLD_SIZE, state[st.KEY_WORLD_SIZE], batch, low=1)
    for key in (KEY_PHASE_COUNTS, KEY_EPOCH_PASSES, KEY_SUPPLIED):
        _counts(key, state[key], count)
    _check_phase(state[KEY_PHASE_COUNTS], shares)
    if KEY_EMPTY_PASSES in state:
        _counts(KEY_EMPTY_PASSES, state[KEY_EMPTY_PASSES], count)
    if KEY_PHASES in state:
        _check_phases(state[KEY_PHASES], count, state[KEY_PHASE_START], shares)
    skipped = state.get(KEY_STEPS_SKIPPED, [])
    if not isinstance(skipped, list) or not all(
        isinstance(r, list) and len(r) == 2 and all(st.is_count(v) for v in r) for r in skipped
    ):
        raise st.StateError(KEY_STEPS_SKIPPED, f"is {skipped!r}, expected [[first, stop], ...]")
    if KEY_SKIPS_PENDING in state:
        st.check_pending_ranges(state[KEY_SKIPS_PENDING])
    sources = state[KEY_SOURCES]
    if not isinstance(sources, list) or len(sources) != count:
        raise st.StateError(KEY_SOURCES, f"must hold one state per name ({count})")
    for k, source in enumerate(sources):
        try:
            st.check_state(source)
        except st.StateError as err:
            inner = f".{err.field}" if err.field else ""
            raise st.StateError(f"{KEY_SOURCES}[{k}]{inner}", err.problem) from None


def _fractions(texts: Any, count: int, field: str = KEY_WEIGHTS) -> list[Fraction]:
    if not isinstance(texts, list) or len(texts) != count:
        raise st.StateError(field, f"is {texts!r}, expected {count} fractions (one per name)")
    try:
        out = [Fraction(str(t)) for t in texts]
    except (ValueError, ZeroDivisionError):
        raise st.StateError(field, f"is {texts!r}, expected fractions like '7/10'") from None
    if any(f < 0 for f in out) or sum(out) != 1:
        raise st.StateError(field, f"is {texts!r}: shares must be >= 0 and sum to 1")
    return out


def _check_phases(phases: Any, count: int, phase_start: int, shares: list[Fraction]) -> None:
    """Phases in increasing order of step, each [step, weights]; the one starting at
    `phase_start` holds the state's `weights` (those the phase counts are of)."""
    if not isinstance(phases, list) or not phases:
        raise st.StateError(KEY_PHASES, f"is {phases!r}, expected [[global step, weights], ...]")
    last = -1
    for i, phase in enumerate(phases):
        field = f"{KEY_PHASES}[{i}]"
        if not isinstance(phase, list) or len(phase) != 2:
            raise st.StateError(field, f"is {phase!r}, expected [global step, weights]")
        start = st.check_count(field, phase[0])
        if start <= last:
            raise st.StateError(field, f"starts at step {start}, not after the phase before")
        last = start
        weights = _fractions(phase[1], count, field)
        if start == phase_start and weights != shares:
            raise st.StateError(field, f"has weights {phase[1]}, but 'weights' says otherwise")


def _counts(field: str, values: Any, count: int) -> None:
    if not isinstance(values, list) or len(values) != count:
        raise st.StateError(field, f"is {values!r}, expected {count} counts (one per name)")
    for k, value in enumerate(values):
        st.check_count(f"{field}[{k}]", value)


def _check_phase(counts: list[int], shares: list[Fraction]) -> None:
    """The phase's counts must be where the row sequence can be: within one row of each share."""
    rows = sum(counts)
    for k, (count, share) in enumerate(zip(counts, shares, strict=True)):
        if abs(count - rows * share) >= 1:
            raise st.StateError(
                f"{KEY_PHASE_COUNTS}[{k}]",
                f"is {count}, but {rows} rows at share {share} give {float(rows * share):.1f}: "
                "no run of these weights can have saved it",
            )
