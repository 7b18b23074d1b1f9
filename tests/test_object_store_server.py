"""The test S3 server is real: LanceDB, Lance and pyarrow read back what they wrote."""

from __future__ import annotations

import lance
import lancedb
import pyarrow as pa
import pytest

from tests.object_store import S3Server

pytestmark = pytest.mark.slow  # starts other processes (see pyproject's markers)


def test_lancedb_and_pyarrow_round_trip_on_the_loopback_s3_server(s3_server: S3Server) -> None:
    bucket = s3_server.make_bucket()
    db = lancedb.connect(f"s3://{bucket}/db", storage_options=s3_server.storage_options)
    table = db.create_table("t", pa.table({"id": list(range(10))}))
    ds = lance.dataset(table.to_lance().uri, storage_options=s3_server.storage_options)
    assert ds.take([3, 7]).column("id").to_pylist() == [3, 7]

    fs = s3_server.pyarrow_fs()
    with fs.open_output_stream(f"{bucket}/probe.txt") as out:
        out.write(b"hello")
    with fs.open_input_stream(f"{bucket}/probe.txt") as src:
        assert src.read() == b"hello"
