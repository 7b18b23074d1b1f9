"""The checkpoint description lines that a row dataset and a mixture's datasets share
(`elastic-loader inspect`): the pinned source and the plan. The lower module of the two
describers, imported by `loader.tools.inspect` and `loader.tools.inspect_mixture`."""

from __future__ import annotations

from typing import Any

__all__ = ["num", "packed", "plan_rows", "source_rows"]


def source_rows(source: dict[str, Any]) -> list[tuple[str, str]]:
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


def packed(plan: dict[str, Any]) -> bool:
    """A packed state (`pack_sequences` in its plan): its rows are documents of tokens."""
    return plan.get("pack_sequences") is not None


def plan_rows(plan: dict[str, Any]) -> list[tuple[str, str]]:
    n, s, length = plan["num_rows"], plan["num_splits"], plan["rows_per_split"]  # checked
    unit = "documents" if packed(plan) else "rows"
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
    if packed(plan):
        rows.append(("  packing", packing_text(plan)))
    return rows


def packing_text(plan: dict[str, Any]) -> str:
    """'blocks of 2,048 tokens of column tokens, eos_id 0, pad_id -, blocks_per_epoch -'."""
    seq_len, column = plan["pack_sequences"], plan.get("token_column")
    said = ", ".join(f"{k} {dash(plan.get(k))}" for k in ("eos_id", "pad_id", "blocks_per_epoch"))
    return f"blocks of {num(seq_len)} tokens of column {column}, {said}"


def dash(value: Any) -> str:
    return "-" if value is None else num(value)


def num(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:,}" if isinstance(value, (int, float)) else str(value)
