"""`elastic-loader inspect PATH`: what a checkpoint will resume, before a job commits to it.

It verifies the file exactly as a resume would (the checks of `loader.checkpoint.load`, the
same bytes), so a file that inspects cleanly is one that loads and a file `load` refuses
exits non-zero here; then it prints the plan, the pinned source, the epoch, per-split
progress and the world sizes the file can resume on. Given a folder (or an `s3://` prefix),
it describes the newest checkpoint file in it. Errors go to stderr with exit status 2,
without a traceback: the message already names the file (or URI) and the field.
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import sys
from typing import Any, TextIO

from loader import checkpoint_io as io
from loader import state as st
from loader.checkpoint import CheckpointError, checkpoint_filter, verify
from loader.checkpoint_io import SUFFIXES
from loader.layout import supported_world_sizes
from loader.tools.describe import num, packed, plan_rows, source_rows
from loader.tools.inspect_mixture import mixture_rows

__all__ = ["format_inspect", "print_inspect"]


def print_inspect(
    path: str | os.PathLike[str],
    out: TextIO | None = None,
    storage_options: dict[str, Any] | None = None,
) -> int:
    """Print the description of the checkpoint at `path`; return the exit status."""
    try:
        text = format_inspect(path, storage_options)
    except (CheckpointError, OSError) as exc:
        print(f"elastic-loader inspect: {exc}", file=sys.stderr)
        return 2
    print(text, file=out or sys.stdout)
    return 0


def format_inspect(
    path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> str:
    """The report for one checkpoint file (or a folder's newest), as `print_inspect` prints it."""
    where = io.location(path)
    if io.is_folder(where, storage_options):  # its newest checkpoint, in folders below too
        accept = checkpoint_filter(storage_options)
        newest = io.newest(where, storage_options, accept, nested=True)
        if newest is None:
            raise CheckpointError(
                where,
                None,
                f"is a folder with no checkpoint ({', '.join('*' + x for x in SUFFIXES)}) files",
            )
        where = newest
    stored, state = io.read_checked(where, verify, storage_options)
    saved = dt.datetime.fromtimestamp(stored.mtime_ns / 1e9, tz=dt.timezone.utc)
    rows = [
        ("checkpoint", str(where)),
        (
            "  file",
            f"{len(stored.data):,} bytes, written {saved:%Y-%m-%d %H:%M:%S} UTC, checksum ok",
        ),
    ]
    if state[st.KEY_FORMAT] == st.MIXTURE_FORMAT:
        rows.extend(mixture_rows(state))
    else:
        rows.extend(
            [
                *source_rows(state[st.KEY_SOURCE]),
                *plan_rows(state[st.KEY_PLAN]),
                *_progress_rows(state),
            ]
        )
    return "\n".join(f"{label:<14}{value}" for label, value in rows)


def _progress_rows(state: dict[str, Any]) -> list[tuple[str, str]]:
    """Every value here was checked by `check_state`: S >= 1, L >= 1, 0 <= cursor <= L.
    A packed state's cursors count documents (the next token's document per split) and its
    `skipped` counts blocks, so it is labelled so, with the tokens past the cursors."""
    cursors: list[int] = state[st.KEY_CURSORS]
    s, length = state[st.KEY_PLAN]["num_splits"], state[st.KEY_PLAN]["rows_per_split"]
    is_packed = packed(state[st.KEY_PLAN])
    unit = "documents" if is_packed else "rows"
    read = sum(cursors)
    finished = sum(c == length for c in cursors)
    saver = f"step {state[st.KEY_STEP]}, saved by world_size {state[st.KEY_WORLD_SIZE]}"
    median = num(statistics.median(cursors))
    cursor = "document cursor" if is_packed else "cursor"
    into, dropped = _token_texts(state) if is_packed else ("", "")
    read_text = f"{read:,} {unit}{into}"
    skipped = f"{state[st.KEY_SKIPPED]:,}" + (f" blocks{dropped}" if is_packed else "")
    return [
        ("epoch", f"{state[st.KEY_EPOCH]}  ({saver})"),
        ("progress", f"{cursor} min {min(cursors):,} / median {median} / max {max(cursors):,} "
                     f"of {length:,}{' documents' if is_packed else ''} per split"),
        ("  read", f"{read_text}, {100 * read / (s * length):.1f}% of epoch, {finished} of {s} "
                   f"splits finished; skipped {skipped}"),
        *_schedule_rows(state),
        ("resumes on", _resumes_on(state, s)),
    ]  # fmt: skip


def _schedule_rows(state: dict[str, Any]) -> list[tuple[str, str]]:
    """'G 8 from step 0, 16 from step 3, ...' for a state with a batch schedule."""
    schedule = state.get(st.KEY_BATCH_SCHEDULE)
    if not schedule:
        return []
    text = ", ".join(f"{g:,} from step {at:,}" for at, g in schedule)
    return [
        (
            "  batch ramp",
            f"G {text}; G {state[st.KEY_GLOBAL_BATCH]:,} at step {state[st.KEY_GLOBAL_STEP]:,}",
        )
    ]


def _resumes_on(state: dict[str, Any], num_splits: int) -> str:
    """Any W <= G with a global batch G that is a multiple of S; the divisors of S with any."""
    saved = state.get(st.KEY_GLOBAL_BATCH)
    by = f", saved with G={saved:,}" if isinstance(saved, int) else ""
    divisors = ", ".join(map(str, supported_world_sizes(num_splits)))
    return (
        f"any W <= G with a global batch G that is a multiple of S={num_splits}{by}; "
        f"with any other batch, world sizes {divisors} (those dividing S={num_splits})"
    )


def _token_texts(state: dict[str, Any]) -> tuple[str, str]:
    """(' + 37 tokens into the next ones', '; 12 tokens of the epoch dropped'): a packed
    state's token fields, each empty when absent."""
    offsets, dropped = state.get(st.KEY_TOKEN_OFFSETS), state.get(st.KEY_TOKENS_DROPPED)
    into = f" + {sum(offsets):,} tokens into the next ones" if offsets is not None else ""
    return into, f"; {dropped:,} tokens of the epoch dropped" if dropped is not None else ""
