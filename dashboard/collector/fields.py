"""The field types of the events ranks send (`models.EventIn`): texts that SQLite and orjson
can store, 64-bit integers, seconds, a mixture's lists of names, run ids and mesh dims, and
the bounds every event keeps (kept apart so `models.py` reads as the API's models)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

from loader.wire import (
    MAX_MIXTURE_DATASETS,
    MAX_NAME_CHARS,
    MAX_SPLITS,
    MAX_TEXT,
    RUN_ID_PATTERN,
)

MAX_EVENTS = 2000
MAX_CURSORS = MAX_SPLITS  # a rank may own every split of a run (W = 1)
MAX_DATA_KEYS = 32
MAX_DATA_LIST = 1 << 16
# Distinct runs one POST may touch (a rank sends one): with retention, this bounds how fast
# one client can churn runs.
MAX_RUNS_PER_REQUEST = 8


def _utf8(text: str) -> str:
    """Refuse lone surrogates (JSON allows '\\ud800'); SQLite and orjson cannot store them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (it has a lone surrogate)") from None
    return text


def _int64(value: Any) -> Any:
    """Refuse integers SQLite and orjson cannot hold (before a float could silently take them)."""
    ints = value if isinstance(value, list) else [value]
    if any(type(v) is int and not -(1 << 63) <= v < 1 << 63 for v in ints):
        raise ValueError("integers must fit in 64 bits")
    return value


Text = Annotated[str, AfterValidator(_utf8)]
NonNeg = Annotated[int, Field(ge=0, le=1 << 62)]
Int64 = Annotated[int, Field(ge=-(1 << 63), lt=1 << 63)]
Seconds = Annotated[float, Field(ge=0, le=1e12)]
Scalar = Annotated[Text, Field(max_length=MAX_TEXT)] | Int64 | float | bool | None
# A list of short texts: a mixture's dataset names and weights (a name may hold a comma).
Texts = Annotated[
    list[Annotated[Text, Field(max_length=MAX_NAME_CHARS)]],
    Field(max_length=MAX_MIXTURE_DATASETS),
]
DataValue = Annotated[
    Scalar | Annotated[list[Int64], Field(max_length=MAX_DATA_LIST)] | Texts,
    BeforeValidator(_int64),
]
# Any printable text but '/', which could not be one URL path segment (same rule as the client).
# (The constraints before the validator: after it, pydantic leaves `pattern` out of the schema.)
RunId = Annotated[
    str, Field(pattern=RUN_ID_PATTERN, min_length=1, max_length=128), AfterValidator(_utf8)
]


MAX_PROCESSES = 1 << 24
MeshDim = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")]
