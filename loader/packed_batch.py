"""What a packed batch holds: its fields, their dtype, and the fields derived from two.

The default batch holds all five fields, four of them int64: 32 bytes a token to write,
pickle from a worker and copy to the GPU. `pack_fields=` keeps fewer and `pack_dtype=`
narrows them (int32: what a tokenizer's ids fit), so a loader can hand out 4 bytes a token,
as LitData's `TokensLoader` does; `derive_packed_fields` then makes `labels`,
`position_ids` and `document_ids` on the GPU from `input_ids` and `cu_seqlens`, equal to the
default batch's. Neither choice is in the state: a run may switch at a resume.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

IGNORE_INDEX = -100  # what torch's cross_entropy ignores by default
# the packed batch's fields, in the order a batch holds them
PACK_FIELDS = ("input_ids", "labels", "position_ids", "document_ids", "cu_seqlens")
# pack_dtype's choices (also as torch or NumPy dtypes): the dtype of every field but
# cu_seqlens, which is int32 as FlashAttention's varlen functions take it
PACK_DTYPES: dict[str, np.dtype[Any]] = {"int64": np.dtype(np.int64), "int32": np.dtype(np.int32)}


def pack_fields(value: Any) -> tuple[str, ...]:
    """The checked `pack_fields`, in the batch's order (None: all of them)."""
    if value is None:
        return PACK_FIELDS
    try:
        names = None if isinstance(value, str | bytes) else list(value)
    except TypeError:  # not iterable
        names = None
    if names is None or not all(isinstance(name, str) for name in names):
        raise TypeError(
            f"pack_fields must be a list of field names among {list(PACK_FIELDS)} (or None for "
            f"all), got {value!r}"
        )
    unknown = [name for name in names if name not in PACK_FIELDS]
    if unknown or len(set(names)) != len(names) or "input_ids" not in names:
        why = f"unknown {unknown}" if unknown else "each name once, input_ids among them"
        raise ValueError(
            f"pack_fields={names!r}: {why}; choose from {list(PACK_FIELDS)} with input_ids "
            f"(e.g. ['input_ids', 'cu_seqlens'] and derive the rest with "
            f"loader.derive_packed_fields), or None for all"
        )
    return tuple(name for name in PACK_FIELDS if name in names)


def pack_dtype(value: Any) -> np.dtype[Any]:
    """The checked `pack_dtype` ("int64", "int32", or the torch/NumPy dtype of one; None:
    the default, int64)."""
    if value is None:
        return PACK_DTYPES["int64"]
    given = value
    if isinstance(value, torch.dtype):
        value = str(value).removeprefix("torch.")
    try:
        name = value if isinstance(value, str) else np.dtype(value).name
    except TypeError:
        name = None
    if name not in PACK_DTYPES:
        raise ValueError(
            f"pack_dtype={given!r}; expected one of {list(PACK_DTYPES)} (or torch.int64, "
            f"torch.int32): the dtype of input_ids, labels, position_ids and document_ids"
        )
    return PACK_DTYPES[name]


def derive_packed_fields(
    input_ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    pad_id: int | None = None,
    dtype: torch.dtype = torch.int64,
    check: bool | None = None,
) -> dict[str, torch.Tensor]:
    """`labels`, `position_ids` and `document_ids` of a packed batch from its (B, seq_len)
    `input_ids` and `cu_seqlens`, equal to the default batch's, on their device (a few
    vectorised ops): so a loader can hand out only those two.

    `pad_id`: with `blocks_per_epoch` (padding), the pad id; a block's last piece made only
    of `pad_id` is then its padding (exact when `pad_id` is no document's token, as a
    special pad token is not). None (the default packing: no padding ever): no padding.
    `dtype`: int64 or int32. Wrong inputs are refused, never turned into wrong fields:
    integer tensors of the right shapes always; `cu_seqlens`' values too (0 first,
    strictly increasing, every block's start b*seq_len among them, B*seq_len last) when
    `check` is True, or None (the default) and `cu_seqlens` is on the CPU: reading a GPU
    tensor's values would sync with the host every step, so pass check=True to pay that
    (or check the CPU batch before moving it).
    """
    blocks, seq_len = _check_packed_inputs(input_ids, cu_seqlens, dtype, check)
    flat = input_ids.reshape(-1)
    cu = cu_seqlens.to(device=flat.device, dtype=torch.int64)
    starts = torch.zeros(flat.numel(), dtype=torch.int64, device=flat.device)
    starts[cu[1:-1]] = 1
    piece = torch.cumsum(starts, 0)  # which piece each token is in
    index = torch.arange(flat.numel(), device=flat.device)
    positions = index - cu[piece]
    documents = (piece.view(blocks, seq_len) - piece.view(blocks, seq_len)[:, :1]).reshape(-1)
    labels = torch.roll(flat, -1).to(torch.int64)
    labels[cu[1:] - 1] = IGNORE_INDEX  # a piece's last token predicts nothing
    if pad_id is not None:
        real = torch.zeros(len(cu) - 1, dtype=torch.int64, device=flat.device)
        real.index_add_(0, piece, (flat != pad_id).to(torch.int64))
        padding = ((real == 0) & (cu[1:] % seq_len == 0))[piece]  # last piece, pads only
        # torch.where, not mask assignment: a boolean index would sync with the host
        labels = torch.where(padding, IGNORE_INDEX, labels)
        positions = torch.where(padding, 0, positions)
        documents = torch.where(padding, -1, documents)
    shape = (blocks, seq_len)
    return {
        "labels": labels.view(shape).to(dtype),
        "position_ids": positions.view(shape).to(dtype),
        "document_ids": documents.view(shape).to(dtype),
    }


_INDEX_DTYPES = (torch.int64, torch.int32)


def _check_packed_inputs(
    input_ids: Any, cu_seqlens: Any, dtype: Any, check: bool | None
) -> tuple[int, int]:
    """(B, seq_len) of checked inputs; a ValueError/TypeError naming the argument otherwise."""
    if dtype not in _INDEX_DTYPES:
        raise TypeError(f"dtype={dtype!r}; expected torch.int64 or torch.int32 (token indices)")
    for name, value, ndim in (("input_ids", input_ids, 2), ("cu_seqlens", cu_seqlens, 1)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise TypeError(
                f"{name} has dtype {value.dtype}; expected an integer tensor (as the packed "
                f"batch gives it: input_ids int64/int32, cu_seqlens int32)"
            )
        if value.ndim != ndim:
            raise ValueError(f"{name} has shape {tuple(value.shape)}; expected {ndim} dimensions")
    blocks, seq_len = input_ids.shape
    if blocks == 0 or seq_len == 0 or len(cu_seqlens) < blocks + 1:
        raise ValueError(
            f"input_ids of shape {tuple(input_ids.shape)} with cu_seqlens of {len(cu_seqlens)} "
            f"entries: a packed batch has B >= 1 blocks of seq_len >= 1 tokens and at least "
            f"B + 1 boundaries"
        )
    if check or (check is None and cu_seqlens.device.type == "cpu"):
        cu = cu_seqlens.detach().to("cpu", torch.int64)
        starts = torch.arange(blocks + 1, dtype=torch.int64) * seq_len
        ok = (
            int(cu[0]) == 0
            and int(cu[-1]) == blocks * seq_len
            and bool((cu[1:] > cu[:-1]).all())
            and bool(torch.isin(starts, cu).all())
        )
        if not ok:
            raise ValueError(
                f"cu_seqlens {cu.tolist()[:12]}{' ...' if len(cu) > 12 else ''} does not "
                f"describe {blocks} blocks of {seq_len} tokens: it must start at 0, increase "
                f"strictly, hold every block's start (multiples of {seq_len}) and end at "
                f"{blocks * seq_len}; pass the packed batch's own cu_seqlens"
            )
    return int(blocks), int(seq_len)
