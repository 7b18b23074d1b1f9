"""Small tables the ledger tests share."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

EOS = -1  # the packed tests' end-of-document token


def token_docs(db: Any) -> Any:
    """A "docs" table in `db`: 90 documents of 1-29 tokens; document i holds tokens
    i * 1000 + 1, ...: every token tells where it came from."""
    count = 90
    rng = np.random.default_rng(3)
    tokens = [
        [i * 1000 + t + 1 for t in range(int(n))] for i, n in enumerate(rng.integers(1, 30, count))
    ]
    return db.create_table("docs", pa.table({"tokens": pa.array(tokens, pa.list_(pa.int64()))}))
