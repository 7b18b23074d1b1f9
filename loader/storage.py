"""Object-storage URIs and options: one mapping from Lance-style `storage_options` to pyarrow.

Users already hold their credentials as the options Lance and LanceDB take
(`endpoint`, `allow_http`, `region`, `aws_access_key_id`, ...), so everything that reaches
an object store through pyarrow (checkpoint files, and the readers) takes the same dict and
the same `AWS_*` environment variables. Credentials stay out of every message: `redact`
removes their values from any text shown to a user. (`loader.sources.storage` builds on this
for tables: URI normalisation, options found on a table, "store unreachable" errors.)

Standard library only at import; pyarrow is imported when a filesystem is made.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "PUBLIC_OPTIONS",
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
# Option values that are safe to print; every other value is treated as a secret.
PUBLIC_OPTIONS = frozenset(
    {"endpoint", "aws_endpoint", "region", "aws_region", "allow_http", "aws_allow_http"}
)
_CLOUD_PREFIXES = ("AWS_", "AZURE_", "GOOGLE_", "GCS_")
_SECRET_WORDS = ("SECRET", "TOKEN", "KEY", "PASSWORD", "CREDENTIAL")


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
    endpoint = args.pop("endpoint_override", "")
    if endpoint:
        parts = urlsplit(endpoint if "://" in endpoint else f"//{endpoint}")
        args["endpoint_override"] = parts.netloc
        args["scheme"] = parts.scheme.lower() or ("http" if allow_http else "https")
    elif allow_http:
        args["scheme"] = "http"
    return args


def s3_filesystem(storage_options: Mapping[str, Any] | None) -> Any:
    """A `pyarrow.fs.S3FileSystem` for these options (see `s3_filesystem_args`)."""
    from pyarrow import fs

    return fs.S3FileSystem(**s3_filesystem_args(storage_options))


def _secret_environment() -> dict[str, str]:
    """Credentials the object-store clients read from the environment (AWS_*, AZURE_*, ...)."""
    return {
        name: value
        for name, value in os.environ.items()
        if name.startswith(_CLOUD_PREFIXES) and any(w in name for w in _SECRET_WORDS)
    }


def redact(text: str, storage_options: Mapping[str, Any] | None) -> str:
    """`text` with every secret value (of the options or the environment) replaced by '***'."""
    options = storage_options or {}
    secrets = [str(v) for k, v in options.items() if k.lower() not in PUBLIC_OPTIONS]
    for value in (*secrets, *_secret_environment().values()):
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text
