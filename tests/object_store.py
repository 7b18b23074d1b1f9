"""A real S3-compatible server on loopback for the tests: `moto_server` in its own process.

The real Lance, LanceDB and pyarrow clients talk to it over HTTP, exactly as they would to
S3; nothing of ours is mocked. One server per test session (moto keeps everything in
memory), buckets made per test. See ../shared/environment-notes.md: without `region`
Lance fails with "Failed to resolve region".
"""

from __future__ import annotations

import http.client
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.net import free_port, wait_until

ACCESS_KEY = "testing-access-key"
SECRET_KEY = "testing-secret-key-do-not-leak"  # tests check it never reaches a state or log


@dataclass(frozen=True)
class S3Server:
    """Where the server listens and the options every client needs to reach it."""

    host: str
    port: int

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def storage_options(self) -> dict[str, str]:
        """For Lance and LanceDB (`storage_options=`)."""
        return {
            "endpoint": self.endpoint,
            "allow_http": "true",
            "region": "us-east-1",
            "aws_access_key_id": ACCESS_KEY,
            "aws_secret_access_key": SECRET_KEY,
        }

    def pyarrow_fs(self):  # type: ignore[no-untyped-def]
        """A `pyarrow.fs.S3FileSystem` on this server."""
        from pyarrow import fs

        return fs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            endpoint_override=self.endpoint,
            scheme="http",
            region="us-east-1",
        )

    def make_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh unique one by default) and return its name."""
        name = name or f"test-{uuid.uuid4().hex[:12]}"
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            conn.request("PUT", f"/{name}")
            response = conn.getresponse()
            response.read()
            if response.status not in (200, 409):
                raise RuntimeError(f"creating bucket {name!r} answered HTTP {response.status}")
        finally:
            conn.close()
        return name


def _answers(host: str, port: int) -> bool:
    try:
        conn = http.client.HTTPConnection(host, port, timeout=1)
        conn.request("GET", "/")
        conn.getresponse().read()
        conn.close()
        return True
    except OSError:
        return False


def _moto_command(host: str, port: int) -> list[str]:
    exe = Path(sys.executable).with_name("moto_server")
    found = str(exe) if exe.exists() else shutil.which("moto_server")
    if found is None:
        raise RuntimeError("moto_server not found: pip install 'moto[server]' (a dev dependency)")
    return [found, "-H", host, "-p", str(port)]


@contextmanager
def running_s3_server(log: Path | None = None) -> Iterator[S3Server]:
    """Start `moto_server` on a free loopback port, wait until it answers, stop it after."""
    host, port = "127.0.0.1", free_port()
    out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    env = {**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"}
    proc = subprocess.Popen(_moto_command(host, port), stdout=out, stderr=out, env=env)
    try:
        wait_until(
            lambda: proc.poll() is not None or _answers(host, port), 30, "moto_server to start"
        )
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited with status {proc.returncode}")
        yield S3Server(host, port)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log is not None:
            out.close()  # type: ignore[union-attr]
