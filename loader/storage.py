"""Object-storage URIs and options: one mapping from Lance-style `storage_options` to pyarrow.

Users already hold their credentials as the options Lance and LanceDB take
(`endpoint`, `allow_http`, `region`, `aws_access_key_id`, ...), so everything that reaches
an object store through pyarrow (checkpoint files, and the readers) takes the same dict and
the same `AWS_*` environment variables. Credentials stay out of every message: `redact`
removes their values from any text shown to a user.

Standard library only at import; pyarrow is imported when a filesystem is made.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "SUPPORTED_SCHEMES",
    "is_uri",
    "options_from_env",
    "redact",
    "s3_filesystem",
    "s3_filesystem_args",
    "split_uri",
]

SUPPORTED_SCHEMES = ("s3",)
_URI = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]+://")  # two letters at least: not a Windows drive

# Lance-style option -> pyarrow.fs.S3FileSystem argument. Aliases as object_store accepts them.
_S3_ARGUMENTS = {
    "endpoint": "endpoint_override",
    "endpoint_url": "endpoint_override",
    "aws_endpoint": "endpoint_override",
    "aws_endpoint_url": "endpoint_override",
    "region": "region",
    "aws_region": "region",
    "aws_default_region": "region",
    "access_key_id": "access_key",
    "aws_access_key_id": "access_key",
    "secret_access_key": "secret_key",
    "aws_secret_access_key": "secret_key",
    "session_token": "session_token",
    "aws_session_token": "session_token",
}
_ALLOW_HTTP = ("allow_http", "aws_allow_http")
_CREDENTIALS = ("access_key", "secret_key", "session_token")  # pyarrow names: never shown


def is_uri(location: object) -> bool:
    """True for `scheme://...` strings (object storage), False for local paths."""
    return isinstance(location, str) and bool(_URI.match(location))


def split_uri(uri: str) -> tuple[str, str]:
    """(scheme, 'bucket/key') of a supported URI; a clear ValueError otherwise."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme not in SUPPORTED_SCHEMES:
        raise ValueError(
            f"{uri!r}: scheme {scheme!r} is not supported for checkpoint files; supported: "
            f"{', '.join(s + '://' for s in SUPPORTED_SCHEMES)} or a local path"
        )
    if "@" in parts.netloc:
        raise ValueError(
            f"{scheme}://…@{parts.netloc.rsplit('@', 1)[1]}: credentials do not belong in the URI; "
            "pass them as storage_options (aws_access_key_id, aws_secret_access_key) or AWS_* "
            "environment variables"
        )
    if not parts.netloc:
        raise ValueError(f"{uri!r} names no bucket; expected {scheme}://bucket/key")
    return scheme, f"{parts.netloc}{parts.path}"


def options_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The options set as `AWS_*` environment variables (the names Lance's object_store reads)."""
    environ = os.environ if environ is None else environ
    known = (*_S3_ARGUMENTS, *_ALLOW_HTTP)
    return {
        name.lower(): value
        for name, value in environ.items()
        if name.startswith("AWS_") and name.lower() in known
    }


def s3_filesystem_args(storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Keyword arguments for `pyarrow.fs.S3FileSystem` from Lance-style `storage_options`.

    The environment's `AWS_*` variables fill what the options leave out (options win).
    Options pyarrow has no equivalent for (Lance's `timeout`, `virtual_hosted_style_request`,
    ...) are left out, so the dict that opens a table also opens its checkpoints.
    """
    merged: dict[str, Any] = {**options_from_env(), **(storage_options or {})}
    args: dict[str, Any] = {}
    allow_http = False
    for key, value in merged.items():
        name = key.lower()
        if name in _ALLOW_HTTP:
            allow_http = str(value).strip().lower() in ("1", "true", "yes")
        elif name in _S3_ARGUMENTS:
            args[_S3_ARGUMENTS[name]] = str(value)
    endpoint = args.get("endpoint_override", "")
    scheme = urlsplit(endpoint).scheme.lower() if "://" in endpoint else ""
    if scheme == "http" and not allow_http:
        raise ValueError(
            f"storage option endpoint={endpoint!r} is plain HTTP but allow_http is not 'true'; "
            "set allow_http='true' (as Lance requires) or use an https:// endpoint"
        )
    args["scheme"] = scheme or ("http" if allow_http else "https")
    return args


def s3_filesystem(storage_options: Mapping[str, Any] | None) -> Any:
    """A `pyarrow.fs.S3FileSystem` for these options (see `s3_filesystem_args`)."""
    from pyarrow import fs

    return fs.S3FileSystem(**s3_filesystem_args(storage_options))


def redact(text: str, storage_options: Mapping[str, Any] | None) -> str:
    """`text` with every credential value of the options (and of `AWS_*`) replaced by ***."""
    merged = {**options_from_env(), **(storage_options or {})}
    for key, value in merged.items():
        if _S3_ARGUMENTS.get(key.lower()) in _CREDENTIALS and value:
            text = text.replace(str(value), "***")
    return text
