"""Errors about where bytes live, worded for the user and free of secrets.

A store's own error text can carry credentials (S3's 403 body echoes the access key id),
so an error shown to a user is built fresh from redacted text and never chains the raw
error: not as `__cause__`, not as `__context__` (a DataLoader worker sends the whole
traceback text to the main process). Callers raise what these functions return outside
their `except` block.

Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loader.storage.options import describe_options, redact

__all__ = ["SourceUnreachableError", "is_permanent", "unreachable"]


class SourceUnreachableError(ConnectionError):
    """The store holding the table cannot be reached or refuses our credentials.

    `permanent` is True when retrying cannot help (refused credentials, a wrong region):
    the loader then raises at once instead of retrying.
    """

    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent

    def __reduce__(self) -> tuple[Any, ...]:  # crosses process boundaries whole
        return (type(self), (str(self), self.permanent))


# Phrases of S3 errors (object_store, pyarrow) that point at one option. Whole phrases, not
# bare status codes: "403" also occurs in request timings such as "in 661.403551ms".
_REGION_ERRORS = ("resolve region", "authorizationheadermalformed", "permanentredirect")
_AUTH_ERRORS = (
    "credential", "forbidden", "access denied", "accessdenied", "invalidaccesskeyid",
    "signaturedoesnotmatch", "status code: 403", "expiredtoken", "lacked the necessary privileges",
    "unauthenticated", "invalidtoken",
)  # fmt: skip


def is_permanent(error_text: str) -> bool:
    """Whether a store's error says that asking again cannot help (auth, region)."""
    lowered = error_text.lower()
    return any(phrase in lowered for phrase in (*_REGION_ERRORS, *_AUTH_ERRORS))


def _likely_missing(uri: str, options: Mapping[str, Any] | None, error: str) -> str:
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


def unreachable(
    uri: str, options: Mapping[str, Any] | None, err: BaseException
) -> SourceUnreachableError:
    """An error saying the store at `uri` cannot be reached or authorised, and what to check
    (raise it outside the `except` block that caught `err`, so `err` is not its context)."""
    detail = redact(str(err), options)
    return SourceUnreachableError(
        f"cannot reach or authorise the store holding {uri!r} (opened with "
        f"{describe_options(options)}): {detail}. Likely missing or wrong: "
        f"{_likely_missing(uri, options, detail)}. Pass storage_options= to StreamingDataset, "
        f"or open the LanceDB connection with them",
        permanent=is_permanent(detail),
    )
