"""Where a table lives: normalised URIs, storage options, and errors that never leak secrets.

Storage options are Lance's (`endpoint`, `region`, `allow_http`, `aws_access_key_id`,
`aws_secret_access_key`, `aws_session_token`, ...). The same dictionary opens Lance
datasets, LanceDB tables and, mapped here, Parquet files through `pyarrow.fs`.
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import unquote, urlsplit

from loader.sources.base import SourceUnreachableError
from loader.storage import redact, s3_filesystem_args

__all__ = ["normalise_uri", "pyarrow_filesystem", "redact", "unreachable"]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_object_store(uri: str) -> bool:
    """A URI with a scheme other than file:// (s3://, gs://, az://, ...)."""
    return bool(_SCHEME.match(uri)) and not uri.startswith("file://")


def normalise_uri(uri: str | os.PathLike[str]) -> str:
    """Absolute and normalised: local paths (and file:// URIs) become absolute paths;
    object-store URIs stay URIs, without a trailing slash."""
    text = os.fspath(uri)
    if is_object_store(text):
        return text.rstrip("/")
    if text.startswith("file://"):
        text = unquote(urlsplit(text).path)
    return os.path.normpath(os.path.abspath(text))


def options_of(handle: Any) -> dict[str, str] | None:
    """The storage options a LanceDB table or Lance dataset was opened with, if any."""
    for name in ("initial_storage_options", "_storage_options"):
        value = getattr(handle, name, None)
        if callable(value):
            try:
                value = value()
            except Exception:  # an internal API in lancedb 0.40: absence is not an error
                value = None
        if value:
            return {k: str(v) for k, v in value.items() if k != "user_agent"}
    return None


def merge_options(
    found: dict[str, str] | None, explicit: dict[str, str] | None
) -> dict[str, str] | None:
    """The table's own options, with each explicitly passed option winning."""
    merged = {**(found or {}), **(explicit or {})}
    return merged or None


def describe_options(options: dict[str, str] | None) -> str:
    if not options:
        return "no storage_options"
    return "storage_options with keys " + ", ".join(sorted(options)) + " (values not shown)"


# Phrases of S3 errors (object_store, pyarrow) that point at one option. Whole phrases, not
# bare status codes: "403" also occurs in request timings such as "in 661.403551ms".
_REGION_ERRORS = ("resolve region", "authorizationheadermalformed", "permanentredirect")
_AUTH_ERRORS = (
    "credential", "forbidden", "access denied", "accessdenied", "invalidaccesskeyid",
    "signaturedoesnotmatch", "status code: 403",
)  # fmt: skip


def _likely_missing(uri: str, options: dict[str, str] | None, error: str) -> str:
    opts = options or {}
    lowered = error.lower()
    endpoint = opts.get("endpoint") or opts.get("aws_endpoint") or ""
    no_region = uri.startswith("s3://") and not opts.keys() & {"region", "aws_region"}
    if no_region or any(phrase in lowered for phrase in _REGION_ERRORS):
        return "'region' (e.g. storage_options={'region': 'us-east-1', ...})"
    if any(phrase in lowered for phrase in _AUTH_ERRORS):
        return "credentials ('aws_access_key_id'/'aws_secret_access_key', or a session token)"
    if endpoint.startswith("http://") and not opts.keys() & {"allow_http", "aws_allow_http"}:
        return "'allow_http': 'true' for an http:// endpoint"
    return "'endpoint' (is the store's address right and is it running?) or credentials"


def unreachable(uri: str, options: dict[str, str] | None, err: BaseException) -> Exception:
    """An error saying the store at `uri` cannot be reached or authorised, and what to check."""
    detail = redact(str(err), options)
    return SourceUnreachableError(
        f"cannot reach or authorise the store holding {uri!r} (opened with "
        f"{describe_options(options)}): {detail}. Likely missing or wrong: "
        f"{_likely_missing(uri, options, detail)}. Pass storage_options= to StreamingDataset, "
        f"or open the LanceDB connection with them"
    )


def pyarrow_filesystem(uri: str, options: dict[str, str] | None) -> tuple[Any, str]:
    """A pyarrow filesystem for `uri` and the path inside it: S3 through the same mapping of
    Lance-style options as checkpoint files (`loader.storage`), other stores by pyarrow's
    own configuration."""
    from pyarrow import fs

    if not is_object_store(uri):
        return fs.LocalFileSystem(), normalise_uri(uri)
    scheme, rest = uri.split("://", 1)
    if scheme not in ("s3", "s3a"):
        filesystem, path = fs.FileSystem.from_uri(uri)  # gs://, az://
        return filesystem, path
    return fs.S3FileSystem(**s3_filesystem_args(options)), rest.rstrip("/")
