"""Object storage under attack, against the real S3 server (moto) on loopback: keys with `#`
and `?`, a store that answers 500 or nothing, a revoked key whose 403 echoes the key id
(as AWS writes it: the proxy answers in the server's place), and loads during saves."""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import lance
import lancedb
import pyarrow.parquet as pq
import pytest
from pyarrow import fs

from loader import StreamingDataLoader, StreamingDataset, checkpoint
from loader.checkpoint import CheckpointError
from loader.sources import SourceUnreachableError
from loader.tools.cli import main as cli_main
from tests.net import wait_until
from tests.netproxy import FaultProxy, Faults, http_response
from tests.object_store import ACCESS_KEY, SECRET_KEY, S3Server
from tests.tables import make_rows
from tests.test_checkpoint import make_state

pytestmark = pytest.mark.slow  # starts other processes (see pyproject's markers)

ROWS, BATCH = 8192, 128  # 64 reads: many still to come when the store fails
DEADLINE_S = 3.0
ECHOED_403 = http_response(
    403,
    "Forbidden",
    b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>InvalidAccessKeyId</Code><Message>The "
    b"AWS Access Key Id you provided does not exist in our records.</Message><AWSAccessKeyId>"
    + ACCESS_KEY.encode()
    + b"</AWSAccessKeyId><RequestId>1</RequestId></Error>",
)
ERROR_500 = http_response(
    500, "Internal Server Error", b"<Error><Code>InternalError</Code></Error>"
)


@pytest.fixture(autouse=True)
def _no_cloud_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def _keys(server: S3Server, bucket: str) -> list[str]:
    infos = server.pyarrow_fs().get_file_info(fs.FileSelector(bucket, recursive=True))
    return sorted(i.path.removeprefix(bucket + "/") for i in infos if i.type == fs.FileType.File)


# -- 1. a key is a path: '#' and '?' are part of it ---------------------------------------


def test_checkpoint_keys_with_hash_and_question_mark(
    s3_server: S3Server, capsys: pytest.CaptureFixture[str]
) -> None:
    opts, bucket = s3_server.storage_options, s3_server.make_bucket()
    one, two = f"s3://{bucket}/runs/exp#1/loader.json", f"s3://{bucket}/runs/exp#2/loader.json"
    checkpoint.save(make_state(step=1), one, storage_options=opts)
    checkpoint.save(make_state(step=2), two, storage_options=opts)
    assert checkpoint.load(one, storage_options=opts) == make_state(step=1)
    assert checkpoint.load(two, storage_options=opts) == make_state(step=2)
    for folder in (f"s3://{bucket}/fold#3/", f"s3://{bucket}/q?x=1/"):
        first = checkpoint.save(make_state(step=5), folder, storage_options=opts)
        second = checkpoint.save(make_state(step=6), folder + "z.json", storage_options=opts)
        assert first == folder + "loader-epoch0002-step00000005.json"
        assert checkpoint.latest(folder, storage_options=opts) == second
        flags = [f"--storage-option={k}={v}" for k, v in opts.items()]
        assert cli_main(["inspect", folder, *flags]) == 0
        assert f"checkpoint    {second}" in capsys.readouterr().out
    assert _keys(s3_server, bucket) == [
        "fold#3/loader-epoch0002-step00000005.json", "fold#3/z.json",
        "q?x=1/loader-epoch0002-step00000005.json", "q?x=1/z.json",
        "runs/exp#1/loader.json", "runs/exp#2/loader.json",
    ]  # fmt: skip


def _ids(loader: Any) -> list[int]:
    return sorted(i for batch in loader for i in batch["id"].tolist())


def _dataset(source: Any, **kwargs: Any) -> StreamingDataset:
    return StreamingDataset(source, num_splits=4, rank=0, world_size=1, **kwargs)


def test_sources_at_keys_with_hash(s3_server: S3Server) -> None:
    """Two Lance datasets and two Parquet folders whose keys differ only after a '#'."""
    opts, bucket = s3_server.storage_options, s3_server.make_bucket()
    ranges = {"1": (0, 200), "2": (200, 300)}
    for run, (a, b) in ranges.items():
        lance.write_dataset(
            make_rows(a, b), f"s3://{bucket}/exp%23{run}/t.lance", storage_options=opts
        )  # Lance's own writer takes a URL: %23 is '#'
        for part, rows in enumerate((make_rows(a, a + 50), make_rows(a + 50, b))):
            where = f"{bucket}/pq#{run}/{part}.parquet"
            pq.write_table(rows, where, filesystem=s3_server.pyarrow_fs())
    for run, (a, b) in ranges.items():
        for uri in (f"s3://{bucket}/exp#{run}/t.lance", f"s3://{bucket}/pq#{run}"):
            ds = _dataset(uri, storage_options=opts)
            assert ds.source.spec.uri == uri
            assert _ids(StreamingDataLoader(ds, batch_size=50)) == list(range(a, b))
    opened = lance.dataset(f"s3://{bucket}/exp%231/t.lance", storage_options=opts)
    assert _dataset(opened).source.spec.uri == f"s3://{bucket}/exp#1/t.lance"  # the same place


# -- 5, 7, 11. a store that fails: bounded, typed, not retried when refused, no key shown --


@pytest.fixture(scope="module")
def s3_table(s3_server: S3Server) -> str:
    """A Lance table's URI on the S3 server."""
    db_uri = f"s3://{s3_server.make_bucket()}/db"
    db = lancedb.connect(db_uri, storage_options=s3_server.storage_options)
    return str(db.create_table("rows", make_rows(0, ROWS)).to_lance().uri)


@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy((s3_server.host, s3_server.port)) as running:
        yield running


def _through(proxy: FaultProxy, server: S3Server) -> dict[str, str]:
    return {**server.storage_options, "endpoint": proxy.endpoint, "read_deadline": str(DEADLINE_S)}


def _error_within(run: Callable[[], Any], limit_s: float) -> tuple[BaseException | None, float]:
    """Run `run` in a thread; the exception it ended with and how long it took (a run still
    going after `limit_s` fails the test instead of hanging it)."""
    box: dict[str, BaseException | None] = {"error": None}

    def target() -> None:
        try:
            run()
        except BaseException as err:
            box["error"] = err

    start = time.monotonic()
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), f"no error after {limit_s} s"
    return box["error"], time.monotonic() - start


def _chain(err: BaseException) -> Iterator[BaseException]:
    seen: BaseException | None = err
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


def _assert_no_key(err: BaseException) -> None:
    texts = [str(e) for e in _chain(err)] + ["".join(traceback.format_exception(err))]
    assert not [t for t in texts if ACCESS_KEY in t or SECRET_KEY in t]


def _fail_after_first_batch(
    proxy: FaultProxy, options: dict[str, str], uri: str, answer: bytes | None, **kw: Any
) -> tuple[BaseException | None, float]:
    """Read one batch through the proxy, then make the store fail (answer, or close: down for
    good) and read on; the error and the seconds from the failure to it."""
    loader = StreamingDataLoader(
        _dataset(uri, storage_options=options), batch_size=BATCH, read_size=BATCH, **kw
    )
    batches = iter(loader)
    next(batches)
    if answer is None:
        proxy.close()  # the port is closed from now on: refused connections
    else:
        proxy.faults = Faults(answer=answer)
    return _error_within(lambda: [b for b in batches], 120)


@pytest.mark.parametrize("failure", ["500", "closed"])
def test_a_store_down_for_good_fails_within_the_read_deadline(
    s3_server: S3Server, s3_table: str, proxy: FaultProxy, failure: str
) -> None:
    answer = ERROR_500 if failure == "500" else None
    options = _through(proxy, s3_server)
    err, elapsed = _fail_after_first_batch(proxy, options, s3_table, answer, reads_in_flight=16)
    assert isinstance(err, SourceUnreachableError), repr(err)
    assert elapsed < DEADLINE_S + 3, f"{elapsed:.1f} s for a read_deadline of {DEADLINE_S} s"
    assert "'read_deadline'" in str(err) and "rows.lance" in str(err)
    _assert_no_key(err)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_revoked_key_mid_epoch_is_unreachable_at_once_and_its_id_never_shown(
    s3_server: S3Server, s3_table: str, proxy: FaultProxy, workers: int
) -> None:
    options = _through(proxy, s3_server)
    err, _ = _fail_after_first_batch(proxy, options, s3_table, ECHOED_403, num_workers=workers)
    assert isinstance(err, SourceUnreachableError), repr(err)
    assert "not retried" in str(err) and "credentials" in str(err)
    assert proxy.counts.answered > 0, "the store's 403 was met"
    _assert_no_key(err)


def test_a_refused_open_and_checkpoint_show_no_key(
    s3_server: S3Server, s3_table: str, proxy: FaultProxy
) -> None:
    # the store's refusal, not the deadline, is what this checks: the default deadline, so a
    # loaded machine's slow round trip through the proxy is not taken for an unanswered one
    options = {**_through(proxy, s3_server), "read_deadline": "60"}
    uri = checkpoint.save(
        make_state(), f"s3://{s3_server.make_bucket()}/c/", storage_options=options
    )
    proxy.faults = Faults(answer=ECHOED_403)
    with pytest.raises(SourceUnreachableError) as opened:
        _dataset(s3_table, storage_options=options)
    _assert_no_key(opened.value)
    assert opened.value.permanent
    with pytest.raises(OSError, match=r"checkpoint s3://.*the object store answered") as loaded:
        checkpoint.load(uri, storage_options=options)
    _assert_no_key(loaded.value)


def test_a_store_slower_than_the_sdks_3_s_still_loads_a_checkpoint(
    s3_server: S3Server, proxy: FaultProxy
) -> None:
    # every answer 3.5 s late: the AWS SDK's own 3 s request timeout failed this load
    options = {**_through(proxy, s3_server), "read_deadline": "60"}
    state = make_state()
    uri = checkpoint.save(state, f"s3://{s3_server.make_bucket()}/c/", storage_options=options)
    proxy.faults = Faults(delay_s=3.5)
    assert checkpoint.load(uri, storage_options=options) == state


# -- 12. a load during a save of the same object -------------------------------------------


def test_loads_during_saves_of_the_same_object_never_read_it_as_damaged(
    s3_server: S3Server,
) -> None:
    """Two states of different sizes saved in turn while another thread loads: every load
    returns one of them whole, never "truncated"."""
    opts = s3_server.storage_options
    uri = f"s3://{s3_server.make_bucket()}/race/loader.json"
    short, long = make_state(), make_state(num_splits=256)  # ~0.5 kB and ~1.5 kB
    checkpoint.save(short, uri, storage_options=opts)
    stop, saves = threading.Event(), [0]

    def save_in_turn() -> None:
        while not stop.is_set():
            checkpoint.save((short, long)[saves[0] % 2], uri, storage_options=opts)
            saves[0] += 1

    saver = threading.Thread(target=save_in_turn, daemon=True)
    saver.start()
    refused, loads, end = [], 0, time.monotonic() + 12
    try:
        while time.monotonic() < end and (loads < 150 or saves[0] < 50):
            try:
                assert checkpoint.load(uri, storage_options=opts) in (short, long)
            except CheckpointError as err:
                refused.append(str(err))
            loads += 1
    finally:
        stop.set()
        saver.join(30)
    assert saves[0] > 10 and loads > 10, "the loop ran saves and loads together"
    assert not refused, f"{len(refused)} of {loads} loads refused: {refused[0]}"


# -- a checkpoint on a store that stops answering -----------------------------------------


def _store_calls_alive() -> bool:
    return any(t.name == "elastic-loader-store-call" for t in threading.enumerate())


def test_checkpoints_on_a_store_that_stops_answering_fail_within_the_read_deadline(
    s3_server: S3Server, proxy: FaultProxy
) -> None:
    """save, load and latest end with an error naming the URI within `read_deadline`, and a
    save abandoned at its deadline never lands over a later save of the same object."""
    options = {**_through(proxy, s3_server), "read_deadline": "1"}
    prefix = f"s3://{s3_server.make_bucket()}/stalled/"
    first, later = make_state(step=1), make_state(step=1, num_splits=16)  # one name, two states
    uri = checkpoint.save(first, prefix, storage_options=options)
    assert uri == prefix + "loader-epoch0002-step00000001.json"
    proxy.faults = Faults(delay_s=2.0)  # every request answered after the 1 s deadline
    for call in (
        lambda: checkpoint.load(uri, storage_options=options),
        lambda: checkpoint.latest(prefix, storage_options=options),
        lambda: checkpoint.save(first, prefix, storage_options=options),  # no lookup: a folder
    ):
        err, elapsed = _error_within(call, 60)
        assert isinstance(err, OSError) and "/stalled/" in str(err), repr(err)
        assert "storage_options['read_deadline'] (1 s)" in str(err), err
        assert elapsed < 1 + 5, (elapsed, err)
    # The abandoned save is still uploading through the slow proxy; a save straight to the
    # store lands first, and stays the object's content once the abandoned one ends.
    direct = s3_server.storage_options
    assert checkpoint.save(later, prefix, storage_options=direct) == uri
    wait_until(lambda: not _store_calls_alive(), 60, "the abandoned calls to end")
    assert checkpoint.load(uri, storage_options=direct) == later
    assert _keys(s3_server, uri.split("/")[2]) == ["stalled/loader-epoch0002-step00000001.json"]
