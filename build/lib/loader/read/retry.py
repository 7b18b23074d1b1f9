"""A read of rows, retried while that can help, and never longer than a stated deadline.

An object store answers 500 or stops answering; Lance's client retries each request inside
one read, and many reads share Lance's runtime, so counting attempts alone bounds nothing.
So a read has a deadline (`storage_options['read_deadline']`, 60 s by default) from its
start to its error, retries included: on an object store each attempt is waited for at most
the time left (an attempt still running then is abandoned to Lance's own timeouts), and no
retry starts that would end after it. What cannot recover (refused credentials, a missing
local file) is not retried. The error is a `SourceUnreachableError` for a store, and names
the missing file for a local dataset; it never chains the store's raw error.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from loader.sources import SourceSpec, is_remote
from loader.storage import READ_DEADLINE, SourceUnreachableError, read_deadline, redact
from loader.storage.deadline import Overdue, within

R = TypeVar("R")

READ_ATTEMPTS = 4  # a transient failure is retried 3 times ...
FIRST_BACKOFF_S = 0.1  # ... after 0.1, 0.2, 0.4 s, and never past the read deadline
# Local errors that the same read cannot cure by asking again.
_LOCAL_FINAL = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


@dataclass(frozen=True)
class ReadPolicy:
    """How one source's reads are retried: where (for messages), whether over the network,
    and the deadline from a read's start to its error."""

    where: str
    remote: bool
    deadline_s: float
    attempts: int = READ_ATTEMPTS
    first_backoff_s: float = FIRST_BACKOFF_S

    @classmethod
    def of(cls, spec: SourceSpec) -> ReadPolicy:
        return cls(spec.uri, is_remote(spec), read_deadline(spec.storage_options))


def _within(read: Callable[[], R], timeout_s: float) -> R:
    """`read()` waited for at most `timeout_s` (then `Overdue`), abandoned to Lance after."""
    what = f"the {READ_DEADLINE} of {timeout_s:.1f} s left"
    return within(read, timeout_s, what, name="elastic-loader-read-attempt")


def _final(err: OSError, remote: bool) -> bool:
    """Whether asking again cannot help."""
    if remote:
        return isinstance(err, Overdue) or bool(getattr(err, "permanent", False))
    return isinstance(err, _LOCAL_FINAL)


def with_retries(read: Callable[[], R], policy: ReadPolicy) -> R:
    """`read()`, retried with doubling back-off while it fails with an I/O error (OSError)
    that may pass, within the policy's deadline. Anything else (a bug, a bad argument, a
    removed version) is raised at once."""
    start = time.monotonic()
    end = start + policy.deadline_s
    attempt = 0
    while True:
        attempt += 1
        try:
            return _within(read, end - time.monotonic()) if policy.remote else read()
        except OSError as err:
            last = err
        backoff = policy.first_backoff_s * 2 ** (attempt - 1)
        if attempt == policy.attempts or _final(last, policy.remote):
            break
        if time.monotonic() + backoff >= end:
            break
        time.sleep(backoff)  # back-off before the next attempt
    raise _failure(policy, last, attempt, time.monotonic() - start)  # not chained: no secrets


def _failure(policy: ReadPolicy, err: OSError, attempts: int, elapsed_s: float) -> OSError:
    """The error a read ends with, worded for where the rows live."""
    detail = redact(str(err), None)  # backends redact their options; this catches echoes
    tried = f"failed {attempts} times" if attempts > 1 else "failed"
    head = f"reading rows of {policy.where!r} {tried} in {elapsed_s:.1f} s, the last with: {detail}"
    rule = (
        f"transient failures are retried up to {policy.attempts - 1} times with back-off "
        f"within storage_options[{READ_DEADLINE!r}] ({policy.deadline_s:g} s from the read's "
        f"start; raise it to ride out longer outages)"
    )
    if policy.remote:
        permanent = bool(getattr(err, "permanent", False))
        advice = (
            "not retried: the store refuses these credentials or this region (a revoked or "
            "expired key?); fix storage_options and resume from the last checkpoint"
            if permanent
            else f"check that the store is reachable and the credentials in storage_options "
            f"are valid; {rule}"
        )
        return SourceUnreachableError(f"{head}. {advice}", permanent=permanent)
    if isinstance(err, FileNotFoundError):
        return FileNotFoundError(
            f"reading rows of the local dataset {policy.where!r} failed: a file of it is "
            f"missing ({detail}). Was it deleted or moved after the dataset was opened? Put it "
            "back, or build the dataset again (a resume then needs a fresh state)"
        )
    return OSError(
        f"{head}. It is a local path: check that the disk or shared filesystem holding it is "
        f"mounted and readable; {rule}"
    )
