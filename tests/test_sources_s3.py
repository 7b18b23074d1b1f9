"""Tables on object storage: the real Lance, LanceDB and pyarrow clients against the loopback
S3 server (tests/object_store.py). Options come from the table; they reach workers under
every start method; the secret never reaches a state, file, repr or error; an unreachable
store and a removed version are told apart.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import lance
import lancedb
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from loader import StreamingDataLoader, StreamingDataset, checkpoint
from loader.sources import PinnedVersionGoneError, SourceUnreachableError
from tests.object_store import SECRET_KEY, S3Server
from tests.tables import ROWS, make_rows

pytestmark = pytest.mark.slow  # starts other processes (see pyproject's markers)

SPLITS, BATCH = 4, 64


def _s3_table(server: S3Server, name: str = "rows") -> Any:
    db = lancedb.connect(f"s3://{server.make_bucket()}/db", storage_options=server.storage_options)
    table = db.create_table(name, make_rows(0, ROWS // 2))
    table.add(make_rows(ROWS // 2, ROWS))
    return table


def _dataset(source: Any, **kwargs: Any) -> StreamingDataset:
    return StreamingDataset(source, num_splits=SPLITS, rank=0, world_size=1, **kwargs)


def _ids(loader: StreamingDataLoader) -> list[int]:
    return sorted(i for batch in loader for i in batch["id"].tolist())


@pytest.fixture(autouse=True)
def _no_cloud_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client missing credentials must not look for them beyond loopback."""
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.mark.parametrize("context", [None, "spawn"], ids=["w2-forkserver", "w2-spawn"])
def test_lancedb_table_on_s3_needs_no_options_and_reaches_workers(
    s3_server: S3Server, tmp_path: Path, context: str | None
) -> None:
    """`context=None` is the loader's default start method, forkserver."""
    ds = _dataset(_s3_table(s3_server))
    loader = StreamingDataLoader(
        ds, batch_size=BATCH, num_workers=2, multiprocessing_context=context
    )
    assert _ids(loader) == list(range(ROWS))  # every row once, read by two workers
    path = checkpoint.save(loader.state_dict(), tmp_path / "ckpt.json")
    assert loader.state_dict()["source"]["uri"].startswith("s3://")
    texts = [path.read_text(), repr(ds), repr(ds.source), repr(loader.state_dict())]
    assert not [t for t in texts if SECRET_KEY in t]


@pytest.fixture
def telemetry_bodies() -> Iterator[tuple[str, list[bytes]]]:
    """A loopback HTTP endpoint that keeps every body POSTed to it (a stand-in collector)."""
    bodies: list[bytes] = []

    class Keep(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Keep)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", bodies
    finally:
        server.shutdown()
        server.server_close()


def test_telemetry_never_carries_the_secret(
    s3_server: S3Server, telemetry_bodies: tuple[str, list[bytes]]
) -> None:
    url, bodies = telemetry_bodies
    ds = _dataset(_s3_table(s3_server))
    loader = StreamingDataLoader(ds, batch_size=BATCH, telemetry=url, run_id="s3-secret-check")
    assert _ids(loader) == list(range(ROWS))
    loader.close()
    assert bodies, "the client sent its events"
    assert not [b for b in bodies if SECRET_KEY.encode() in b]


def test_lance_dataset_and_parquet_on_s3(s3_server: S3Server) -> None:
    table = _s3_table(s3_server)
    dataset = lance.dataset(table.to_lance().uri, storage_options=s3_server.storage_options)
    assert _ids(StreamingDataLoader(_dataset(dataset), batch_size=BATCH)) == list(range(ROWS))

    bucket, fs = s3_server.make_bucket(), s3_server.pyarrow_fs()
    pq.write_table(make_rows(0, 200), f"{bucket}/pq/part-0.parquet", filesystem=fs)
    pq.write_table(make_rows(200, ROWS), f"{bucket}/pq/part-1.parquet", filesystem=fs)
    ds = _dataset(f"s3://{bucket}/pq/", storage_options=s3_server.storage_options)
    assert ds.source.spec.uri == f"s3://{bucket}/pq"
    loader = StreamingDataLoader(ds, batch_size=BATCH, num_workers=2)
    assert _ids(loader) == list(range(ROWS))
    own = pads.dataset(f"{bucket}/pq", format="parquet", filesystem=fs)  # the user's filesystem
    ds = _dataset(own)
    assert ds.source.spec.uri == f"s3://{bucket}/pq"
    assert (
        ds.source.spec.fingerprint
        == _dataset(
            f"s3://{bucket}/pq", storage_options=s3_server.storage_options
        ).source.spec.fingerprint
    )
    assert _ids(StreamingDataLoader(ds, batch_size=BATCH, num_workers=2)) == list(range(ROWS))


def _without(options: dict[str, str], *keys: str) -> dict[str, str]:
    return {k: v for k, v in options.items() if k not in keys}


UNREACHABLE = {  # options, the hint expected, and whether they override a table's own
    "no-credentials": (
        lambda o: _without(o, "aws_access_key_id", "aws_secret_access_key"),
        "credentials",
        False,
    ),
    "http-not-allowed": (lambda o: _without(o, "allow_http"), "'allow_http'", False),
    "wrong-endpoint": (lambda o: {**o, "endpoint": "http://127.0.0.1:9"}, "'endpoint'", False),
    "explicit-wins": (lambda o: {"endpoint": "http://127.0.0.1:9"}, "'endpoint'", True),
}


@pytest.mark.parametrize("case", sorted(UNREACHABLE))
def test_unreachable_store_names_the_uri_and_the_likely_option(
    s3_server: S3Server, case: str
) -> None:
    """A URI opened with broken options, or a table whose options an explicit
    storage_options= overrides key by key, fails as "cannot reach", never as cleanup."""
    table = _s3_table(s3_server)
    broken, hint, via_table = UNREACHABLE[case]
    uri = table.to_lance().uri
    with pytest.raises(SourceUnreachableError) as info:
        _dataset(table if via_table else uri, storage_options=broken(s3_server.storage_options))
    message = str(info.value)
    assert f"{uri!r}" in message and "cannot reach or authorise" in message
    assert hint in message and SECRET_KEY not in message
    assert "cleanup" not in message  # nothing was cleaned up


def test_unreachable_parquet_store(s3_server: S3Server) -> None:
    options = {**s3_server.storage_options, "endpoint": "http://127.0.0.1:9"}
    with pytest.raises(SourceUnreachableError) as info:
        _dataset("s3://nowhere/pq", storage_options=options)
    assert "'s3://nowhere/pq'" in str(info.value) and SECRET_KEY not in str(info.value)


@pytest.mark.filterwarnings("ignore:optimize.cleanup_older_than=0.:UserWarning")
def test_removed_version_on_s3_is_not_blamed_on_the_store(s3_server: S3Server) -> None:
    table = _s3_table(s3_server)
    state = StreamingDataLoader(_dataset(table), batch_size=BATCH).state_dict()
    table.add(make_rows(ROWS, ROWS + 10))
    table.optimize(cleanup_older_than=dt.timedelta(0), delete_unverified=True)
    with pytest.raises(PinnedVersionGoneError) as info:
        StreamingDataLoader(_dataset(table), batch_size=BATCH).load_state_dict(state)
    message = str(info.value)
    assert f"version {state['source']['version']}" in message and "is gone" in message
    assert "cannot reach" not in message and SECRET_KEY not in message
