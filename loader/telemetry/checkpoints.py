"""How checkpoints reach the dashboard's timeline without a call the user must know about.

Two ways a checkpoint of a loader is written, two ways to notice it:

- `loader.checkpoint.save(state, path)` calls `loader.telemetry.reporter.checkpoint_written(state,
  path)` (a torch-free hook; nothing happens without a loader that has telemetry on). Every
  live loader's reporter of this process whose loader is at `state` — same epoch, same
  cursors of its splits (a mixture or packed data: the same global step) — has
  `saved_if_mine` send a `checkpoint_saved` event with the path. A stale state saved later matches no loader.
- `torch.distributed.checkpoint.save` with the loader as a `Stateful` calls the loader's
  `state_dict()`, and gives a `Stateful` no way to know it is being saved (`dcp.load` calls
  `state_dict()` too). So `state_dict()` has its reporter call `state_taken(client, state)`,
  which looks up
  the caller frames (only when telemetry is on, only on `state_dict()`): inside DCP's save
  function it sends `checkpoint_saved` with the `checkpoint_id` and `via: "dcp"`.
"""

from __future__ import annotations

import logging
import os
import sys
import types
from collections.abc import Mapping
from typing import Any

from loader import state as st
from loader.telemetry import client as telemetry
from loader.wire import CHECKPOINT_SAVED

logger = logging.getLogger(__name__)

# Where torch.distributed.checkpoint's save runs (dcp.load runs from state_dict_loader.py).
_DCP_SAVER = os.path.join("checkpoint", "state_dict_saver.py")
_DCP_SAVE_FUNCTIONS = ("save", "async_save", "save_state_dict")


def saved_if_mine(
    client: telemetry.TelemetryClient, state: Mapping[str, Any], path: str | os.PathLike[str]
) -> None:
    """Send `checkpoint_saved` if `state` is the client's loader's current position."""
    try:
        now = client.position()
        if now is None:
            return
        # a mixture's cursors are per dataset, packed data's count documents (the events'
        # count blocks): there the global step says where
        if state.get(st.KEY_FORMAT) == st.MIXTURE_FORMAT or st.KEY_TOKEN_OFFSETS in state:
            if state.get(st.KEY_GLOBAL_STEP) != now.get("global_step"):
                return
            client.event(CHECKPOINT_SAVED, path=path, epoch=now.get("epoch"), **_steps(state, now))
            return
        cursors = state.get(st.KEY_CURSORS)
        lo, hi = now["splits"]
        mine = list(cursors[lo:hi]) if isinstance(cursors, list) else None
        if state.get(st.KEY_EPOCH) != now.get("epoch") or mine != now.get("cursors"):
            return
    except Exception:  # an odd state or a snapshot racing the loader: no event
        logger.debug("telemetry: could not match a saved state", exc_info=True)
        return
    client.event(CHECKPOINT_SAVED, path=path, epoch=now.get("epoch"), **_steps(state, now))


def _steps(state: Mapping[str, Any], now: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "step": state.get(st.KEY_STEP, now.get("step")),
        "global_step": state.get(st.KEY_GLOBAL_STEP, now.get("global_step")),
    }


def dcp_save_target(max_depth: int = 40) -> str | None:
    """The `checkpoint_id` of the `torch.distributed.checkpoint.save` running on this thread
    (a loader passed as a `Stateful` is asked for its state from inside it), else None."""
    frame: types.FrameType | None = sys._getframe(1)
    for _ in range(max_depth):
        if frame is None:
            return None
        code = frame.f_code
        if code.co_name in _DCP_SAVE_FUNCTIONS and code.co_filename.endswith(_DCP_SAVER):
            target = frame.f_locals.get("checkpoint_id") or frame.f_locals.get("storage_writer")
            return telemetry.event_value(target) if target is not None else "DCP checkpoint"
        frame = frame.f_back
    return None


def state_taken(client: telemetry.TelemetryClient, state: Mapping[str, Any]) -> None:
    """The loader's `state_dict()` returned `state`: if a DCP save asked, that is a checkpoint."""
    target = dcp_save_target()
    if target is not None:
        client.event(
            CHECKPOINT_SAVED,
            path=target,
            via="dcp",
            epoch=state.get(st.KEY_EPOCH),
            step=state.get(st.KEY_STEP),
            global_step=state.get("global_step"),
        )
