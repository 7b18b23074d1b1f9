"""Plain-Python twins of the kernels: slow, obvious, and what the kernels must equal."""

from __future__ import annotations

from typing import Any

M64 = (1 << 64) - 1


def mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def feistel(x: int, keys: list[int], half: int) -> int:
    mask = (1 << half) - 1
    left, right = x >> half, x & mask
    for key in keys:
        left, right = right, left ^ (mix(right ^ key) & mask)
    return (left << half) | right


def permutation(n: int, keys: list[int], half: int) -> list[int]:
    """The whole bijection on [0, n), by cycle walking each slot."""
    out = []
    for i in range(n):
        x = feistel(i, keys, half)
        while x >= n:
            x = feistel(x, keys, half)
        out.append(x)
    return out


def epoch_order(n: int, clump: int, keys: list[int], half: int) -> list[int]:
    """The full clump-shuffled order: clumps permuted, rows inside a clump kept in order."""
    n_clumps = -(-n // clump)
    order = []
    for c in permutation(n_clumps, keys, half):
        order.extend(range(c * clump, min((c + 1) * clump, n)))
    return order


def round_keys(seed: int, epoch: int, n: int, clump: int) -> list[int]:
    """The eight round keys of (seed, epoch, n, clump), by their definition."""
    golden = 0x9E3779B97F4A7C15
    state = mix(seed ^ 0x5EED5EED5EED5EED)
    for word in (epoch, n, clump):
        state = mix(state ^ mix((word + golden) & M64))
    return [mix((state + (i + 1) * golden) & M64) for i in range(8)]


def passes_positions(
    n: int, clump: int, seed: int, first: int, passes: int, idx: list[int]
) -> list[int]:
    """order[idx] of each epoch first, first + 1, ... (clump already n when not shuffled)."""
    half = max(1, (max(1, (-(-n // clump) - 1).bit_length()) + 1) // 2)
    out = []
    for epoch in range(first, first + passes):
        order = epoch_order(n, clump, round_keys(seed, epoch, n, clump), half)
        out.extend(order[i] for i in idx)
    return out


def stream(cursors: list[int], length: int) -> list[tuple[int, int]]:
    """The rank stream by its definition: repeatedly the smallest cursor, ties lowest index."""
    cur = list(cursors)
    out = []
    while True:
        live = [(c, s) for s, c in enumerate(cur) if c < length]
        if not live:
            return out
        c, s = min(live)
        out.append((s, c))
        cur[s] += 1


def advance(cursors: list[int], consumed: int, length: int) -> list[int]:
    cur = list(cursors)
    for s, _ in stream(cursors, length)[:consumed]:
        cur[s] += 1
    return cur


def ragged_take(
    values: list[Any], offsets: list[int], order: list[int]
) -> tuple[list[Any], list[int]]:
    """Rows `order` of a ragged array, row by row."""
    rows = [values[offsets[r] : offsets[r + 1]] for r in order]
    out_offsets = [0]
    for row in rows:
        out_offsets.append(out_offsets[-1] + len(row))
    return [v for row in rows for v in row], out_offsets


def cu_seqlens(document_ids: list[list[int]]) -> list[int]:
    """By the definition: where each run of equal document ids starts in the flattened
    batch (a new run at every block start), then the total length."""
    starts, at = [], 0
    for row in document_ids:
        starts.extend(at + i for i in range(len(row)) if i == 0 or row[i] != row[i - 1])
        at += len(row)
    return [*starts, at]


def pack_blocks(
    documents: list[list[int]], seq_len: int, eos_id: int, pad_id: int, blocks: int
) -> list[tuple[list[int], list[int], list[int], list[int]]]:
    """By the definition: one stream of documents each followed by eos, cut into blocks;
    labels are the next token of the same document in the block (else -100); positions
    restart at each document and each block; document ids count inside a block."""
    ignore = -100
    stream: list[tuple[int, int]] = []  # (token, document)
    for d, doc in enumerate(documents):
        stream.extend((t, d) for t in [*doc, eos_id])
    out = []
    for b in range(blocks):
        piece = stream[b * seq_len : (b + 1) * seq_len]
        ids = [t for t, _ in piece] + [pad_id] * (seq_len - len(piece))
        docs_seen: list[int] = []
        doc_ids, pos = [], []
        for i, (_, d) in enumerate(piece):
            if not docs_seen or docs_seen[-1] != d:
                docs_seen.append(d)
            doc_ids.append(len(docs_seen) - 1)
            pos.append(0 if i == 0 or piece[i - 1][1] != d else pos[-1] + 1)
        pad = seq_len - len(piece)
        labels = [
            ids[i + 1] if i + 1 < len(piece) and piece[i + 1][1] == piece[i][1] else ignore
            for i in range(seq_len)
        ]
        out.append((ids, labels, pos + [0] * pad, doc_ids + [-1] * pad))
    return out


def slice_runs(before: list[int], after: list[int], lo: int, hi: int) -> list[tuple[int, int, int]]:
    """A rank's part of a step by its definition: lay the step's rows out split after split,
    keep positions [lo, hi), and group them back into (split, start, stop) runs."""
    layout = [(s, level) for s in range(len(before)) for level in range(before[s], after[s])]
    runs: dict[int, list[int]] = {}
    for s, level in layout[lo:hi]:
        runs.setdefault(s, []).append(level)
    return [(s, levels[0], levels[-1] + 1) for s, levels in sorted(runs.items())]


def runs_order(runs: list[tuple[int, int, int]], length: int) -> list[int]:
    """Order indices of runs sorted by (level, split)."""
    pairs = sorted((level, s) for s, a, b in runs for level in range(a, b))
    return [s * length + level for level, s in pairs]


def mix_counts(weights: list[int], counts: list[int], rows: int) -> list[int]:
    """The mixture's row sequence, row by row in exact fractions (no periods skipped): the
    next row goes to the source with the earliest deadline among those not ahead."""
    from fractions import Fraction

    total = sum(weights)
    shares = [Fraction(w, total) for w in weights]
    out = list(counts)
    for _ in range(rows):
        i = sum(out) + 1  # the row being placed
        ready = [k for k, s in enumerate(shares) if s > 0 and out[k] < i * s]
        out[min(ready, key=lambda k: (-(-(out[k] + 1) // shares[k]), k))] += 1
    return out


def mix_labels(weights: list[int], counts: list[int], rows: int) -> list[int]:
    """The source of each of the next `rows` rows of the row sequence (`mix_counts` row by
    row, noting which count grew)."""
    out, now = [], list(counts)
    for _ in range(rows):
        nxt = mix_counts(weights, now, 1)
        out.append(next(k for k, (a, b) in enumerate(zip(now, nxt, strict=True)) if b > a))
        now = nxt
    return out


def place_rows(src: list[Any], rows: list[int], dest: list[Any], at: list[int]) -> list[Any]:
    """`dest` with row `at[i]` replaced by row `rows[i]` of `src`, one row at a time."""
    out = list(dest)
    for row, to in zip(rows, at, strict=True):
        out[to] = src[row]
    return out
