"""Reads in flight: the same batches and state for any number, and failures on a real store.

The object-store cases run the real Lance client against the moto S3 server through the
fault-injecting proxy (tests/netproxy.py): requests are cut, and the read path must retry
them, or fail with the table's URI, and never hand out part of a batch.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import lancedb
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loader import StreamingDataLoader, StreamingDataset
from loader.read.prefetch import (
    MIN_ROWS_PER_PART,
    auto_reads_in_flight,
    map_ahead,
    parts_of,
    take_in_parts,
)
from loader.sources import SourceSpec
from tests.batches import ids
from tests.netproxy import FaultProxy, Faults
from tests.object_store import S3Server
from tests.tables import lancedb_table, make_rows

ROWS, BATCH, READ = 6000, 256, 2048


def _loader(table: Any, **kw: Any) -> StreamingDataLoader:
    options = kw.pop("storage_options", None)
    ds = StreamingDataset(
        table, num_splits=4, shuffle_clump_size=5, rank=0, world_size=1, storage_options=options
    )
    return StreamingDataLoader(ds, batch_size=BATCH, **{"read_size": READ, **kw})


@pytest.fixture(scope="module")
def big_table(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Large enough that a read of 2,048 rows is cut into two sub-reads in a worker."""
    return lancedb_table(tmp_path_factory.mktemp("inflight"), rows=ROWS)


@pytest.mark.slow
def test_batches_and_state_are_the_same_for_any_reads_in_flight(big_table: Any) -> None:
    reference = ids(_loader(big_table, reads_in_flight=0))
    assert sorted(itertools.chain(*reference)) == list(range(ROWS))
    for kw in ({"reads_in_flight": 1}, {"reads_in_flight": 2}, {"reads_in_flight": 8}, {}):
        assert ids(_loader(big_table, **kw)) == reference, kw
    # in workers each read of 2,048 rows is two sub-reads of 1,024 run at once
    assert len(parts_of(READ, 4)) == 2
    assert ids(_loader(big_table, num_workers=2, reads_in_flight=4)) == reference

    states = []
    for r in (1, 8):
        dl = _loader(big_table, reads_in_flight=r)
        head = list(itertools.islice(dl, 5))  # 8 reads ahead were in flight when it stopped
        assert [b["id"].tolist() for b in head] == reference[:5]
        states.append(dl.state_dict())
    assert states[0] == states[1], "the state counts batches handed out, not reads in flight"


def test_the_default_follows_the_source(big_table: Any) -> None:
    assert _loader(big_table).reads_in_flight == 4
    assert _loader(big_table, num_workers=2).reads_in_flight == 1
    assert auto_reads_in_flight(SourceSpec("lance", "s3://bucket/db/t.lance"), 0) == 16
    assert auto_reads_in_flight(SourceSpec("parquet", "gs://bucket/pq"), 4) == 4
    assert auto_reads_in_flight(SourceSpec("lance", "file:///data/t.lance"), 0) == 4
    assert auto_reads_in_flight(SourceSpec("arrow", "memory://arrow-table"), 0) == 4  # in memory
    with pytest.raises(ValueError, match="reads_in_flight must be an integer >= 0, got -1"):
        _loader(big_table, reads_in_flight=-1)
    with pytest.warns(DeprecationWarning, match="reads_in_flight"):
        assert _loader(big_table, read_ahead=3).reads_in_flight == 3


@given(st.integers(0, 50_000), st.integers(1, 64))
def test_sub_reads_cover_a_read_once_in_order(count: int, reads: int) -> None:
    bounds = parts_of(count, reads)
    assert bounds[0][0] == 0 and bounds[-1][1] == count
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    assert len(bounds) <= reads
    assert len(bounds) == 1 or min(b - a for a, b in bounds) >= MIN_ROWS_PER_PART


# -- on the S3 server, through the proxy -------------------------------------------------


@pytest.fixture(scope="module")
def s3_table(s3_server: S3Server) -> tuple[str, str]:
    """A LanceDB table on the S3 server: (database URI, table name)."""
    db_uri = f"s3://{s3_server.make_bucket()}/db"
    db = lancedb.connect(db_uri, storage_options=s3_server.storage_options)
    db.create_table("rows", make_rows(0, 3000))
    return db_uri, "rows"


@pytest.fixture
def proxied(s3_server: S3Server) -> Iterator[tuple[FaultProxy, dict[str, str]]]:
    """A proxy in front of the server, and options that send Lance through it.

    Lance's own client retries (client_max_retries) are off, so what recovers from a cut
    request is the loader's retry, not the object-store client's.
    """
    with FaultProxy((s3_server.host, s3_server.port)) as proxy:
        options = {
            **s3_server.storage_options,
            "endpoint": proxy.endpoint,
            "client_max_retries": "0",
            "download_retry_count": "0",
        }
        yield proxy, options


def _open(s3_table: tuple[str, str], options: dict[str, str]) -> Any:
    return lancedb.connect(s3_table[0], storage_options=options).open_table(s3_table[1])


@pytest.mark.slow
def test_cut_requests_are_retried_and_every_row_comes_once(
    s3_table: tuple[str, str], proxied: tuple[FaultProxy, dict[str, str]]
) -> None:
    proxy, options = proxied
    one_batch_reads = {"storage_options": options, "reads_in_flight": 4, "read_size": BATCH}
    dl = _loader(_open(s3_table, options), **one_batch_reads)
    start = dl.state_dict()
    reference = ids(dl)  # a clean run (the reader opened the table then)
    proxy.faults = Faults(drop_every=2)
    dl.load_state_dict(start)  # the same epoch again, through a proxy that cuts requests
    got = ids(dl)
    assert proxy.counts.dropped > 0, "the proxy did cut requests"
    assert got == reference
    assert sorted(itertools.chain(*got)) == list(range(3000))


@pytest.mark.slow
def test_a_store_that_keeps_failing_raises_naming_the_uri_after_whole_batches_only(
    s3_table: tuple[str, str], proxied: tuple[FaultProxy, dict[str, str]]
) -> None:
    proxy, options = proxied
    dl = _loader(
        _open(s3_table, options), storage_options=options, read_size=BATCH, reads_in_flight=1
    )
    start = dl.state_dict()
    reference = ids(dl)
    dl.load_state_dict(start)
    it = iter(dl)
    received = [next(it)["id"].tolist()]
    proxy.faults = Faults(drop_every=1)  # from now on every request is cut
    with pytest.raises(OSError, match=r"rows\.lance.*failed 4 times") as err:
        received.extend(b["id"].tolist() for b in it)
    assert options["aws_secret_access_key"] not in str(err.value)
    assert received == reference[: len(received)], "whole batches, then the error"
    assert len(received) < len(reference)
    assert proxy.counts.dropped >= 4


class _OneFails:
    """Read 0 fails once read 1 has started; read 1 is still running then (it ends on its
    own within `RUN_S`). What the caller sees must come after read 1 has ended: a failed read
    leaves nothing running behind its error (a cache download still writing its temporary
    file, issue 35's full-disk test)."""

    RUN_S = 1.0

    def __init__(self) -> None:
        self.started, self.ended = threading.Event(), threading.Event()

    def __call__(self, item: Any) -> Any:
        first = int(item if isinstance(item, int) else item[0]) == 0
        if first:
            assert self.started.wait(30), "read 1 never started"
            raise OSError("the cache disk is full")
        self.started.set()
        threading.Event().wait(self.RUN_S)  # a read that takes a while, then ends
        self.ended.set()
        return item


def test_a_failed_read_raises_after_the_reads_in_flight_end() -> None:
    read = _OneFails()
    with pytest.raises(OSError, match="full"):
        list(map_ahead(read, range(3), depth=3))
    assert read.ended.is_set(), "the error was raised while another read still ran"


def test_a_failed_part_raises_after_the_other_parts_end() -> None:
    read = _OneFails()
    positions = np.arange(2 * MIN_ROWS_PER_PART, dtype=np.int64)
    pool = ThreadPoolExecutor(2)
    try:
        with pytest.raises(OSError, match="full"):
            take_in_parts(read, positions, pool, reads_in_flight=2)
        assert read.ended.is_set(), "the error was raised while another part still ran"
    finally:
        pool.shutdown(wait=True)
