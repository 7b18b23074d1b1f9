"""Sources: read rows by position from one pinned version of a table.

`resolve_source` turns what the user passed (a LanceDB table, a Lance dataset, an Arrow
table or dataset, a path or object-store URI) into a `ResolvedSource`: a small picklable
`SourceSpec` that any process can reopen (`open_source`) after a fork, plus the positions
that pass the filter. One module per backend (`lance`, `arrow`), listed in `registry`.
"""

from loader.sources.base import (
    PinnedVersionGoneError,
    ResolvedSource,
    RowSource,
    SourceSpec,
    SourceUnreachableError,
)
from loader.sources.registry import SOURCES, identity_for, is_remote, open_source, resolve_source

__all__ = [
    "SOURCES",
    "PinnedVersionGoneError",
    "ResolvedSource",
    "RowSource",
    "SourceSpec",
    "SourceUnreachableError",
    "identity_for",
    "is_remote",
    "open_source",
    "resolve_source",
]
