"""The one parser of locations: a local path, or `scheme://bucket/key` on an object store.

An object-store location is a path, not a URL: every character after `scheme://bucket/`
is part of the key (`#`, `?`, `%`, spaces), because S3 and its peers allow them all and a
run's folder called `exp#1` is not `exp` with a fragment. Lance, in contrast, parses what
it is given as a URL, so `lance_url` escapes the characters a URL would cut or decode.

Standard library only.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

__all__ = [
    "FILE_SCHEME",
    "ObjectPath",
    "has_scheme",
    "is_object_store",
    "lance_url",
    "normalise_uri",
    "object_path",
    "path_of_lance_url",
]

FILE_SCHEME = "file"
# Two characters at least, so that a Windows drive (C:/...) is a local path.
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")
_URL_SPECIAL = "%#?"  # what a URL parser would decode, or cut off as a fragment or query


def has_scheme(location: object) -> bool:
    """True for `scheme://...` text (an object store or a file:// URI)."""
    return isinstance(location, str) and bool(_SCHEME.match(location))


def is_object_store(location: object) -> bool:
    """The one predicate: `scheme://...` with a scheme other than file:// (s3://, gs://, ...).

    Whether a *source* is read over the network is its backend's to say (an Arrow table in
    memory has the placeholder URI memory://arrow-table): `loader.sources.is_remote`.
    """
    match = _SCHEME.match(location) if isinstance(location, str) else None
    return match is not None and match.group(1).lower() != FILE_SCHEME


@dataclass(frozen=True)
class ObjectPath:
    """`scheme://bucket/key`, split without URL parsing; `key` may be empty (the bucket)."""

    scheme: str
    bucket: str
    key: str

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key}" if self.key else self.root

    @property
    def root(self) -> str:
        return f"{self.scheme}://{self.bucket}"

    @property
    def bucket_and_key(self) -> str:
        """The path as pyarrow's filesystems name it: 'bucket/key'."""
        return f"{self.bucket}/{self.key}" if self.key else self.bucket

    def child(self, name: str) -> ObjectPath:
        folder = self.key.rstrip("/")
        return ObjectPath(self.scheme, self.bucket, f"{folder}/{name}" if folder else name)


def object_path(uri: str) -> ObjectPath:
    """Split an object-store URI into scheme, bucket and key, or a ValueError saying why not."""
    match = _SCHEME.match(uri)
    if match is None or match.group(1).lower() == FILE_SCHEME:
        raise ValueError(f"{uri!r} is not an object-store URI (scheme://bucket/key)")
    scheme = match.group(1).lower()
    bucket, _, key = uri[match.end() :].partition("/")
    if "@" in bucket:
        raise ValueError(
            f"{scheme}://…@{bucket.rsplit('@', 1)[1]}: credentials do not belong in the URI; "
            "pass them as storage_options (aws_access_key_id, aws_secret_access_key) or AWS_* "
            "environment variables"
        )
    if not bucket:
        raise ValueError(f"{uri!r} names no bucket; expected {scheme}://bucket/key")
    return ObjectPath(scheme, bucket, key)


def normalise_uri(uri: str | os.PathLike[str]) -> str:
    """Absolute and normalised: local paths (and file:// URIs) become absolute paths;
    object-store URIs stay URIs, without a trailing slash (the key kept character for
    character)."""
    text = os.fspath(uri)
    if is_object_store(text):
        return text.rstrip("/")
    if has_scheme(text):  # file://[localhost]/path, percent-encoded; '#' and '?' kept as written
        rest = text[_SCHEME.match(text).end() :]  # type: ignore[union-attr]
        text = unquote(rest[len("localhost") :] if rest.startswith("localhost/") else rest)
    return os.path.normpath(os.path.abspath(text))


def lance_url(uri: str) -> str:
    """What to hand Lance for a location: an object-store key with `%`, `#` and `?` escaped
    (Lance parses URLs: unescaped, `s3://b/exp#1/t.lance` would open `s3://b/exp`)."""
    if not is_object_store(uri):
        return uri
    where = object_path(uri)
    return f"{where.root}/{quote(where.key, safe=_SAFE)}" if where.key else where.root


def path_of_lance_url(url: str) -> str:
    """The location (a path, as users write it) of a URL that Lance reports (`dataset.uri`)."""
    if not is_object_store(url):
        return url
    where = object_path(url)
    return str(ObjectPath(where.scheme, where.bucket, unquote(where.key)))


# Everything but the URL-special characters stays as it is (keys are UTF-8 paths).
_SAFE = "".join(chr(c) for c in range(32, 127) if chr(c) not in _URL_SPECIAL)
