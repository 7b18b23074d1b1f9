"""Where bytes live (`loader/storage/`): object-store paths are paths, secrets never shown,
and a read fails within its deadline, retried only while retrying can help. No server here:
tests/test_storage_s3.py runs the same rules against the real S3 server."""

from __future__ import annotations

import threading
import time
import traceback
from pathlib import Path

import pytest

from loader import StreamingDataLoader, StreamingDataset
from loader.read.retry import ReadPolicy, with_retries
from loader.storage import (
    ObjectPath,
    SourceUnreachableError,
    is_object_store,
    lance_url,
    normalise_uri,
    object_path,
    path_of_lance_url,
    read_deadline,
    redact,
    unreachable,
)
from tests.tables import parquet_dir


@pytest.mark.parametrize(
    ("uri", "bucket", "key"),
    [
        ("s3://b/runs/exp#1/loader.json", "b", "runs/exp#1/loader.json"),
        ("s3://b/fold#3/", "b", "fold#3/"),
        ("S3://b/q?x=1&y=2/a b%20c.json", "b", "q?x=1&y=2/a b%20c.json"),
        ("gs://bucket", "bucket", ""),
    ],
)
def test_an_object_store_uri_is_a_path_every_character_of_the_key_kept(
    uri: str, bucket: str, key: str
) -> None:
    where = object_path(uri)
    assert (where.bucket, where.key) == (bucket, key)
    assert is_object_store(uri) and normalise_uri(uri) == uri.rstrip("/")
    assert path_of_lance_url(lance_url(uri)) == str(where)  # Lance's URL names the same key


def test_lance_is_handed_a_url_that_names_the_key() -> None:
    assert lance_url("s3://b/exp#1/t.lance") == "s3://b/exp%231/t.lance"
    assert lance_url("s3://b/q?x/100%/t.lance") == "s3://b/q%3Fx/100%25/t.lance"
    assert lance_url("/data/exp#1/t.lance") == "/data/exp#1/t.lance"  # a local path: as is
    assert ObjectPath("s3", "b", "fold#3").child("a.json") == object_path("s3://b/fold#3/a.json")


def test_what_is_not_an_object_store() -> None:
    assert not is_object_store("/data/t.lance") and not is_object_store("C:/data/t.lance")
    assert not is_object_store("file:///data/t.lance") and not is_object_store(Path("s3:/x"))
    assert normalise_uri("file:///data/exp#1/t.lance") == "/data/exp#1/t.lance"
    with pytest.raises(ValueError, match="credentials do not belong in the URI"):
        object_path("s3://key:secret@bucket/a.json")
    with pytest.raises(ValueError, match="names no bucket"):
        object_path("s3:///a.json")


def test_a_key_id_the_store_echoes_is_redacted_even_when_we_never_held_it() -> None:
    body = "<Error><AWSAccessKeyId>from-a-profile</AWSAccessKeyId></Error> for AKIAIOSFODNN7EXAMPLE"
    assert redact(body, None) == "<Error><AWSAccessKeyId>***</AWSAccessKeyId></Error> for ***"


@pytest.mark.parametrize("value", ["0", "-1", "soon", "inf", ""])
def test_a_bad_read_deadline_names_the_option(value: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"storage_options\['read_deadline'\]"):
        read_deadline({"read_deadline": value})
    with pytest.raises(ValueError, match=r"storage_options\['read_deadline'\]"):
        StreamingDataset(
            str(parquet_dir(tmp_path / "pq")), num_splits=2, rank=0, world_size=1,
            storage_options={"read_deadline": value},
        )  # fmt: skip
    assert read_deadline({"read_deadline": "2.5s"}) == 2.5 and read_deadline(None) == 60


class _Reads:
    """A fake read that fails with `error` every time (or blocks until released)."""

    def __init__(self, error: OSError | None = None) -> None:
        self.error, self.calls, self.release = error, 0, threading.Event()

    def __call__(self) -> str:
        self.calls += 1
        if self.error is None:
            self.release.wait(60)  # a store that never answers
            return "late"
        raise self.error


REMOTE = ReadPolicy("s3://b/t.lance", remote=True, deadline_s=30)


def test_a_read_that_never_answers_fails_at_the_deadline() -> None:
    reads = _Reads()
    start = time.monotonic()
    with pytest.raises(SourceUnreachableError, match=r"'s3://b/t.lance' failed in") as info:
        with_retries(reads, ReadPolicy("s3://b/t.lance", remote=True, deadline_s=0.5))
    reads.release.set()
    assert time.monotonic() - start < 5 and reads.calls == 1
    assert "storage_options['read_deadline'] (0.5 s" in str(info.value)


def test_transient_failures_are_retried_and_refusals_are_not() -> None:
    transient = _Reads(unreachable("s3://b/t.lance", None, OSError("500 Internal Server Error")))
    with pytest.raises(SourceUnreachableError, match="failed 4 times"):
        with_retries(transient, REMOTE)
    assert transient.calls == 4
    refused = _Reads(
        unreachable("s3://b/t.lance", None, OSError("403 Forbidden: InvalidAccessKeyId"))
    )
    with pytest.raises(SourceUnreachableError, match="not retried") as info:
        with_retries(refused, REMOTE)
    assert refused.calls == 1 and info.value.permanent


def test_the_error_carries_no_raw_store_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The message is redacted, and nothing unredacted hangs off it as cause or context."""
    options = {"aws_access_key_id": "AKID-in-options"}
    raw = OSError("403 Forbidden: <AWSAccessKeyId>AKID-in-options</AWSAccessKeyId>")

    def read() -> None:
        try:
            raise raw
        except OSError as err:
            failure = unreachable("s3://b/t.lance", options, err)
        raise failure

    with pytest.raises(SourceUnreachableError) as info:
        with_retries(read, REMOTE)
    err: BaseException | None = info.value
    text = "".join(traceback.format_exception(info.value))
    assert "AKID-in-options" not in text
    while err is not None:
        assert "AKID-in-options" not in str(err)
        err = err.__cause__ or err.__context__


def test_a_deleted_local_parquet_file_is_named_without_a_store(tmp_path: Path) -> None:
    folder = parquet_dir(tmp_path / "pq")
    ds = StreamingDataset(str(folder), num_splits=2, rank=0, world_size=1)
    (folder / "part-1.parquet").unlink()
    with pytest.raises(FileNotFoundError) as info:
        list(StreamingDataLoader(ds, batch_size=50))
    message = str(info.value)
    assert str(folder / "part-1.parquet") in message and "missing" in message
    assert "credentials" not in message and "store" not in message
