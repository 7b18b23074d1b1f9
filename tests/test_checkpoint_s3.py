"""Checkpoint files on object storage, against a real S3-compatible server (moto) on loopback.

Same format and the same refusals as local files, named by URI; a save never exposes a
partial object; `latest` finds the newest object under a prefix; credentials never appear
in a message.
"""

from __future__ import annotations

from typing import Any

import pytest

from loader import checkpoint
from loader.checkpoint import CheckpointError, latest, load, save
from loader.storage import redact, s3_filesystem_args
from loader.storage.locations import S3
from loader.tools.cli import main as cli_main
from tests.object_store import ACCESS_KEY, SECRET_KEY, S3Server
from tests.test_checkpoint import make_state

pytestmark = pytest.mark.slow  # starts other processes (see pyproject's markers)


@pytest.fixture
def prefix(s3_server: S3Server) -> str:
    return f"s3://{s3_server.make_bucket()}/run-7/loader/"


def test_save_load_latest_and_the_bytes(s3_server: S3Server, prefix: str) -> None:
    opts = s3_server.storage_options
    first = save(make_state(epoch=3, step=7), prefix, storage_options=opts)  # a folder
    assert first == prefix + "loader-epoch0003-step00000007.json"
    fs = s3_server.pyarrow_fs()
    with fs.open_input_stream(first.removeprefix("s3://")) as f:
        assert f.read() == checkpoint.encode(make_state(epoch=3, step=7))  # the same format
    for leftover in (".step-300.json.123.ab.tmp", "deeper/step-999.json", "notes.txt"):
        with fs.open_output_stream(prefix.removeprefix("s3://") + leftover) as f:
            f.write(b"{")
    assert latest(prefix, storage_options=opts) == first
    # Newer, or (S3 keeps whole seconds) written in the same second with a greater name:
    # either way the newest, so the answer does not depend on the clock.
    second = save(make_state(step=100), prefix + "step-100.json", storage_options=opts)
    assert second == prefix + "step-100.json"
    assert load(second, storage_options=opts) == make_state(step=100)
    assert latest(prefix, storage_options=opts) == second
    assert latest(prefix.rstrip("/"), storage_options=opts) == second
    assert latest(prefix + "empty/", storage_options=opts) is None


def test_refusals_name_the_uri(s3_server: S3Server, prefix: str) -> None:
    opts = s3_server.storage_options
    uri = prefix + "bad.json"
    data = checkpoint.encode(make_state())
    with s3_server.pyarrow_fs().open_output_stream(uri.removeprefix("s3://")) as f:
        f.write(data[:100])
    with pytest.raises(CheckpointError, match=f"checkpoint {uri}: is truncated") as info:
        load(uri, storage_options=opts)
    assert info.value.path == uri
    odd = prefix + "odd.json"  # checksum-valid, but save() itself refuses to write it
    with s3_server.pyarrow_fs().open_output_stream(odd.removeprefix("s3://")) as f:
        f.write(checkpoint.encode({**make_state(), "step": -1000}))
    with pytest.raises(CheckpointError, match=f"checkpoint {odd}: field 'payload.step'"):
        load(odd, storage_options=opts)
    with pytest.raises(FileNotFoundError, match=f"checkpoint {prefix}nope.json: no such object"):
        load(prefix + "nope.json", storage_options=opts)
    with pytest.raises(CheckpointError, match="is a prefix"):
        load(prefix.rstrip("/"), storage_options=opts)


def test_inspect_with_flags_and_with_the_environment(
    s3_server: S3Server,
    prefix: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opts = s3_server.storage_options
    uri = save(make_state(), prefix + "step-1.json", storage_options=opts)
    flags = [f"--storage-option={k}={v}" for k, v in opts.items()]
    assert cli_main(["inspect", str(uri), *flags]) == 0
    out = capsys.readouterr().out
    assert f"checkpoint    {uri}" in out and "checksum ok" in out
    assert "N=1,003 rows, S=8 splits x L=125 rows" in out
    for key, value in opts.items():
        monkeypatch.setenv(key.upper() if key.startswith("aws_") else f"AWS_{key.upper()}", value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", opts["endpoint"])
    assert cli_main(["inspect", prefix]) == 0  # a prefix: its newest object
    assert f"checkpoint    {uri}" in capsys.readouterr().out
    bad = prefix + "step-2.json"
    with s3_server.pyarrow_fs().open_output_stream(bad.removeprefix("s3://")) as f:
        f.write(checkpoint.encode({**make_state(), "cursors": [2**62] * 8}))
    assert cli_main(["inspect", str(bad)]) == 2
    captured = capsys.readouterr()
    assert f"checkpoint {bad}: field 'payload.cursors[0]'" in captured.err
    assert SECRET_KEY not in captured.out + captured.err


def test_lance_options_map_to_pyarrow(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_ALLOW_HTTP"):
        monkeypatch.delenv(name, raising=False)
    assert s3_filesystem_args(s3_server.storage_options) == {
        "endpoint_override": f"127.0.0.1:{s3_server.port}",
        "scheme": "http",
        "region": "us-east-1",
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
        "request_timeout": 30.0,
    }
    assert s3_filesystem_args({"endpoint": "minio:9000", "allow_http": "true"}) == {
        "endpoint_override": "minio:9000",
        "scheme": "http",
        "request_timeout": 30.0,
    }
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert s3_filesystem_args({"aws_session_token": "t"}) == {
        "region": "eu-west-1",
        "session_token": "t",
        "request_timeout": 30.0,
    }
    assert s3_filesystem_args({"region": "us-east-2"})["region"] == "us-east-2"  # options win


def test_credentials_stay_out_of_errors(s3_server: S3Server, prefix: str) -> None:
    shown = redact(f"signature mismatch for {SECRET_KEY}", s3_server.storage_options)
    assert shown == "signature mismatch for ***"
    lance_only = {**s3_server.storage_options, "timeout": "30s"}  # a table's options work
    assert "30s" not in str(s3_filesystem_args(lance_only))  # Lance's own, not pyarrow's
    wrong = {**s3_server.storage_options, "aws_access_key_id": "someone-else"}
    save(make_state(), prefix + "a.json", storage_options=s3_server.storage_options)
    # moto accepts any key, so provoke a store error another way: a bucket that is not there
    with pytest.raises(OSError) as failed:
        save(make_state(), "s3://no-such-bucket-here/a.json", storage_options=wrong)
    assert "s3://no-such-bucket-here/a.json" in str(failed.value)
    assert SECRET_KEY not in str(failed.value) and "someone-else" not in str(failed.value)
    with pytest.raises(CheckpointError, match="credentials do not belong in the URI"):
        load("s3://key:secret@bucket/a.json")


class _FailingUpload:
    """An upload that stores half the bytes, then fails (a dropped connection mid-write)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, data: bytes) -> None:
        self._stream.write(data[: len(data) // 2])
        raise OSError("connection reset by peer (injected)")

    def close(self) -> None:
        self._stream.close()  # pyarrow completes the upload with the half written


class _FailingFilesystem:
    def __init__(self, real: Any) -> None:
        self._real = real

    def open_output_stream(self, path: str) -> _FailingUpload:
        return _FailingUpload(self._real.open_output_stream(path))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_a_failed_upload_leaves_the_previous_object(
    s3_server: S3Server, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyarrow completes a multipart upload with whatever was written when the stream is
    closed or freed after an error; writing the target directly would publish half a file.
    The save uploads a temporary object and copies it over the target only when whole."""
    opts = s3_server.storage_options
    uri = save(make_state(epoch=1), prefix + "step.json", storage_options=opts)
    real = S3.filesystem
    monkeypatch.setattr(S3, "filesystem", lambda store: _FailingFilesystem(real(store)))
    with pytest.raises(OSError, match=f"checkpoint {uri}: .*injected"):
        save(make_state(epoch=2), uri, storage_options=opts)
    monkeypatch.undo()
    assert load(uri, storage_options=opts) == make_state(epoch=1)
    assert latest(prefix, storage_options=opts) == uri
    from pyarrow import fs

    names = [i.base_name for i in s3_server.pyarrow_fs().get_file_info(
        fs.FileSelector(prefix.removeprefix("s3://"), recursive=True))]  # fmt: skip
    assert names == ["step.json"]  # the temporary object was removed too
