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
        from loader.tools.inspect_mixture import mixture_rows

        rows.extend(mixture_rows(state))
    else:
        rows.extend(
            [
                *_source_rows(state[st.KEY_SOURCE]),
                *_plan_rows(state[st.KEY_PLAN]),
                *_progress_rows(state),
            ]
        )
    return "\n".join(f"{label:<14}{value}" for label, value in rows)


def _source_rows(source: dict[str, Any]) -> list[tuple[str, str]]:
    version = source.get("version")
    pinned = f"version {version} (pinned)" if version is not None else "no version (unpinned)"
    columns = source.get("columns")
    return [
        ("source", f"{source.get('kind', '?')}  {source.get('uri', '?')}"),
        ("  table", f"{source.get('table') or '-'}, {pinned}"),
        ("  columns", ", ".join(map(str, columns)) if columns else "all"),
        ("  fingerprint", source.get("fingerprint") or "-"),
        ("  version id", source.get("version_id") or "-"),  # Lance: what a recreate changes
    ]


def _packed(plan: dict[str, Any]) -> bool:
    """A packed state (`pack_sequences` in its plan): its rows are documents of tokens."""
    return plan.get("pack_sequences") is not None


def _plan_rows(plan: dict[str, Any]) -> list[tuple[str, str]]:
    n, s, length = plan["num_rows"], plan["num_splits"], plan["rows_per_split"]  # checked
    unit = "documents" if _packed(plan) else "rows"
    order = (
        f"shuffled, seed {plan.get('shuffle_seed')}, clump {plan.get('shuffle_clump_size')}"
        if plan.get("shuffle")
        else "not shuffled"
    )
    rows = [
        ("plan", f"N={n:,} {unit}, S={s} splits x L={length:,} {unit}, {order}"),
        ("  filter", str(plan.get("filter") or "-")),
        ("  drop_last", str(plan.get("drop_last"))),
    ]
    if _packed(plan):
        rows.append(("  packing", _packing_text(plan)))
    return rows


def _packing_text(plan: dict[str, Any]) -> str:
    """'blocks of 2,048 tokens of column tokens, eos_id 0, pad_id -, blocks_per_epoch -'."""
    seq_len, column = plan["pack_sequences"], plan.get("token_column")
    said = ", ".join(f"{k} {_dash(plan.get(k))}" for k in ("eos_id", "pad_id", "blocks_per_epoch"))
    return f"blocks of {_num(seq_len)} tokens of column {column}, {said}"


def _dash(value: Any) -> str:
    return "-" if value is None else _num(value)


def _progress_rows(state: dict[str, Any]) -> list[tuple[str, str]]:
    """Every value here was checked by `check_state`: S >= 1, L >= 1, 0 <= cursor <= L.
    A packed state's cursors count documents (the next token's document per split) and its
    `skipped` counts blocks, so it is labelled so, with the tokens past the cursors."""
    cursors: list[int] = state[st.KEY_CURSORS]
    s, length = state[st.KEY_PLAN]["num_splits"], state[st.KEY_PLAN]["rows_per_split"]
    packed = _packed(state[st.KEY_PLAN])
    unit = "documents" if packed else "rows"
    read = sum(cursors)
    finished = sum(c == length for c in cursors)
    saver = f"step {state[st.KEY_STEP]}, saved by world_size {state[st.KEY_WORLD_SIZE]}"
    median = _num(statistics.median(cursors))
    cursor = "document cursor" if packed else "cursor"
    into, dropped = _token_texts(state) if packed else ("", "")
    read_text = f"{read:,} {unit}{into}"
    skipped = f"{state[st.KEY_SKIPPED]:,}" + (f" blocks{dropped}" if packed else "")
    return [
        ("epoch", f"{state[st.KEY_EPOCH]}  ({saver})"),
        ("progress", f"{cursor} min {min(cursors):,} / median {median} / max {max(cursors):,} "
                     f"of {length:,}{' documents' if packed else ''} per split"),
        ("  read", f"{read_text}, {100 * read / (s * length):.1f}% of epoch, {finished} of {s} "
                   f"splits finished; skipped {skipped}"),
        ("resumes on", _resumes_on(state, s)),
    ]  # fmt: skip


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


def _num(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:,}" if isinstance(value, (int, float)) else str(value)
