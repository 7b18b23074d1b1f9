"""Where bytes live: the one owner of locations, storage options and storage errors.

- `uri`: the one predicate (`is_object_store`) and the one parser of `scheme://bucket/key`
  (a path: `#` and `?` are part of the key), `normalise_uri`, and `lance_url` for Lance,
  which parses URLs.
- `options`: Lance-style `storage_options` mapped to pyarrow, the `AWS_*` environment, the
  loader's own `read_deadline`, and `redact` (no secret in any message).
- `locations`: local files and object-store objects behind one protocol, `Location` (read a
  whole regular file, write one atomically, list a folder); one `Store` class per kind of
  object store (S3 today).
- `errors`: `SourceUnreachableError` and `unreachable`, never chaining a store's raw error.
- `deadline`: a call to a store waited for at most a deadline (`within`, `Overdue`): read
  attempts and every object-store `Location` operation (checkpoints) use it.

Standard library only at import; pyarrow is imported when a filesystem is made.
"""

from loader.storage.errors import SourceUnreachableError, is_permanent, unreachable
from loader.storage.locations import (
    STORES,
    Blob,
    Entry,
    Location,
    NotAFile,
    TooBig,
    location,
    pyarrow_filesystem,
)
from loader.storage.options import (
    PUBLIC_OPTIONS,
    READ_DEADLINE,
    READ_DEADLINE_S,
    describe_options,
    lance_options,
    merge_options,
    options_from_env,
    options_of,
    read_deadline,
    redact,
    s3_filesystem_args,
)
from loader.storage.uri import (
    ObjectPath,
    has_scheme,
    is_object_store,
    lance_url,
    normalise_uri,
    object_path,
    path_of_lance_url,
)

__all__ = [
    "PUBLIC_OPTIONS",
    "READ_DEADLINE",
    "READ_DEADLINE_S",
    "STORES",
    "Blob",
    "Entry",
    "Location",
    "NotAFile",
    "ObjectPath",
    "SourceUnreachableError",
    "TooBig",
    "describe_options",
    "has_scheme",
    "is_object_store",
    "is_permanent",
    "lance_options",
    "lance_url",
    "location",
    "merge_options",
    "normalise_uri",
    "object_path",
    "options_from_env",
    "options_of",
    "path_of_lance_url",
    "pyarrow_filesystem",
    "read_deadline",
    "redact",
    "s3_filesystem_args",
    "unreachable",
]
