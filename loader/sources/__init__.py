"""Sources: read rows by position from one pinned version of a table.

`resolve_source` turns what the user passed (a LanceDB table, a Lance dataset, an Arrow
table or dataset, a path) into a `SourceSpec`: a small picklable description that any
process can reopen after a fork, plus the positions that pass the filter.
"""

from loader.sources.base import ResolvedSource, RowSource, SourceSpec
from loader.sources.resolve import resolve_source

__all__ = ["ResolvedSource", "RowSource", "SourceSpec", "resolve_source"]
