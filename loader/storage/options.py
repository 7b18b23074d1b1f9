"""Storage options: the Lance-style dict users already hold, for every client that reads bytes.

Users hold their credentials as the options Lance and LanceDB take (`endpoint`,
`allow_http`, `region`, `aws_access_key_id`, ...), so everything that reaches an object
store through pyarrow (checkpoint files, Parquet) takes the same dict and the same `AWS_*`
environment variables. One option is the loader's own: `read_deadline` (seconds), the most
a read of rows may take, retries included, before it fails (`READ_DEADLINE_S` by default).
Credentials stay out of every message: `redact` removes their values from any text.

Standard library only.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "PUBLIC_OPTIONS",
    "READ_DEADLINE",
    "READ_DEADLINE_S",
    "describe_options",
    "lance_options",
    "merge_options",
    "options_from_env",
    "options_of",
    "read_deadline",
    "redact",
    "s3_filesystem_args",
]

READ_DEADLINE = "read_deadline"  # the loader's own option (Lance and pyarrow never see it)
READ_DEADLINE_S = 60.0  # rides out a store's restart; a store down for good fails in a minute

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
    {
        "endpoint",
        "aws_endpoint",
        "region",
        "aws_region",
        "allow_http",
        "aws_allow_http",
        READ_DEADLINE,
    }
)
_CLOUD_PREFIXES = ("AWS_", "AZURE_", "GOOGLE_", "GCS_")
_SECRET_WORDS = ("SECRET", "TOKEN", "KEY", "PASSWORD", "CREDENTIAL")
# Secrets a store writes back in its own error bodies, whoever supplied them (a profile, an
# instance role): S3's 403 names the access key id.
_ECHOED = (
    re.compile(r"(<AWSAccessKeyId>)[^<]*(</AWSAccessKeyId>)"),
    re.compile(r"(\b)(?:AKIA|ASIA)[A-Z0-9]{16}(\b)"),
)


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
    ...) are left out, so the dict that opens a table also opens its checkpoints. One request
    may stall for half the `read_deadline` (the AWS SDK's own 3 s would fail a checkpoint on a
    store that is merely slow); the deadline still bounds the whole operation.
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
    args["request_timeout"] = read_deadline(merged) / 2
    return args


def read_deadline(storage_options: Mapping[str, Any] | None) -> float:
    """`read_deadline` in seconds (a number, or text such as '30' or '30s'); a clear error
    naming the option otherwise."""
    value = (storage_options or {}).get(READ_DEADLINE, READ_DEADLINE_S)
    text = str(value).strip().lower().removesuffix("s")
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(
            f"storage_options[{READ_DEADLINE!r}]={value!r}: expected seconds > 0 (e.g. '60' or "
            f"'60s'), the most a read may take, retries included (default {READ_DEADLINE_S:g})"
        )
    return seconds


def lance_options(storage_options: Mapping[str, Any] | None) -> dict[str, str] | None:
    """The options to open a Lance dataset with: the loader's own left out, and Lance's
    retries of one request (`client_retry_timeout`) kept within the read deadline unless the
    user set them."""
    if not storage_options:
        return None
    options = {k: str(v) for k, v in storage_options.items() if k != READ_DEADLINE}
    deadline = math.ceil(read_deadline(storage_options))
    options.setdefault("client_retry_timeout", str(deadline))
    return options


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


def describe_options(options: Mapping[str, Any] | None) -> str:
    if not options:
        return "no storage_options"
    return "storage_options with keys " + ", ".join(sorted(options)) + " (values not shown)"


def _secret_environment() -> dict[str, str]:
    """Credentials the object-store clients read from the environment (AWS_*, AZURE_*, ...)."""
    return {
        name: value
        for name, value in os.environ.items()
        if name.startswith(_CLOUD_PREFIXES) and any(w in name for w in _SECRET_WORDS)
    }


# where in Lance's Rust source an error was raised (", /home/runner/.../commit.rs:653:26"):
# noise to a user, cut from every store error the loader shows
_RUST_LOCATION = re.compile(r",?\s*(?:[\w.~-]*/)+[\w.-]+\.rs:\d+:\d+")


def redact(text: str, storage_options: Mapping[str, Any] | None) -> str:
    """`text` with every secret value (of the options or the environment, or echoed by a
    store in its error body) replaced by '***', and without the Rust source locations Lance
    appends to its errors."""
    text = _RUST_LOCATION.sub("", text)
    options = storage_options or {}
    secrets = [str(v) for k, v in options.items() if k.lower() not in PUBLIC_OPTIONS]
    for value in (*secrets, *_secret_environment().values()):
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    for pattern in _ECHOED:
        text = pattern.sub(r"\1***\2", text)
    return text
