"""Sources behind one registry: each backend its own module, no import cycle, clear refusals.

Real tables on disk (tests/tables.py); the resume-identity cases live in
test_resume_pinning.py and the object-store cases in test_sources_s3.py.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

import loader.sources as sources_package
from loader import StreamingDataLoader, StreamingDataset
from loader.sources import SOURCES, SourceSpec, open_source, resolve_source
from loader.sources.arrow import table_fingerprint
from loader.storage import normalise_uri, redact, unreachable
from tests.imports import assert_no_cycle, import_graph
from tests.tables import make_rows


def test_source_modules_import_without_a_cycle() -> None:
    graph = import_graph(Path(sources_package.__file__).parent, "loader.sources")
    assert graph["base"] == set(), "base is the seam: it imports no backend"
    assert_no_cycle(graph)


def test_registry_knows_each_kind_and_lists_them_for_an_unknown_one() -> None:
    assert sorted(SOURCES) == ["arrow", "lance", "lancedb", "parquet"]
    with pytest.raises(ValueError, match="unknown source kind 'delta'; known kinds: arrow, lance"):
        open_source(SourceSpec("delta", "/data/t"))
    with pytest.raises(TypeError, match=r"unsupported source dict.*known kinds: arrow, lance"):
        resolve_source({"id": [1]})


@pytest.mark.parametrize(
    ("second", "complaint"),
    [
        (make_rows(300, 600).set_column(0, "id", pa.array([str(i) for i in range(300, 600)])),
         "has column 'id' as string where the dataset has int64"),
        (make_rows(300, 600).drop_columns(["label"]), "lacks columns ['label']"),
        (make_rows(300, 600).append_column("extra", pa.array(range(300))),
         "has columns ['extra'] that the dataset's schema does not"),
    ],
    ids=["int-became-string", "dropped-column", "extra-column"],
)  # fmt: skip
def test_parquet_files_with_another_schema_are_refused_naming_the_file(
    tmp_path: Path, second: pa.Table, complaint: str
) -> None:
    pq.write_table(make_rows(0, 300), tmp_path / "part-0.parquet")
    pq.write_table(second, tmp_path / "part-1.parquet")
    with pytest.raises(ValueError) as info:
        StreamingDataset(str(tmp_path), num_splits=2, rank=0, world_size=1)
    message = str(info.value)
    assert str(tmp_path / "part-1.parquet") in message and complaint in message


def test_parquet_uri_is_absolute(parquet_rows: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(parquet_rows.parent)
    ds = StreamingDataset(parquet_rows.name, num_splits=2, rank=0, world_size=1)
    assert ds.source.spec.uri == str(parquet_rows)
    assert all(Path(f).is_absolute() for f in ds.source.spec.data.files)


@pytest.mark.slow  # a DataLoader worker
def test_hive_partitioned_parquet_keeps_its_partition_column_in_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = make_rows(0, 300).append_column("year", pa.array([2020 + i % 3 for i in range(300)]))
    pads.write_dataset(rows, tmp_path / "hive", format="parquet", partitioning=["year"],
                       partitioning_flavor="hive")  # fmt: skip
    monkeypatch.chdir(tmp_path)
    source = pads.dataset("hive", format="parquet", partitioning="hive")
    ds = StreamingDataset(source, num_splits=2, rank=0, world_size=1)
    pairs = sorted(
        (i, y)
        for batch in StreamingDataLoader(ds, batch_size=50, num_workers=1)
        for i, y in zip(batch["id"].tolist(), batch["year"].tolist(), strict=True)
    )
    assert pairs == [(i, 2020 + i % 3) for i in range(300)]


@given(
    rows=st.integers(1, 3000),
    cuts=st.lists(st.integers(0, 3000), max_size=4),
    changed=st.integers(0, 2999),
)
@hyp_settings(max_examples=40)
def test_arrow_fingerprint_covers_every_value_and_ignores_chunking(
    rows: int, cuts: list[int], changed: int
) -> None:
    table = make_rows(0, rows)
    bounds = sorted({0, rows, *(c for c in cuts if c < rows)})
    rechunked = pa.concat_tables([table.slice(a, b - a) for a, b in itertools.pairwise(bounds)])
    assert table_fingerprint(rechunked) == table_fingerprint(table)
    row = changed % rows
    ids = table.column("id").to_pylist()
    ids[row] = -1
    assert table_fingerprint(table.set_column(0, "id", pa.array(ids))) != table_fingerprint(table)


@given(parts=st.lists(st.sampled_from(["a", "b.lance", "..", ".", ""]), max_size=5))
def test_uris_are_absolute_normalised_and_stable(parts: list[str]) -> None:
    local = normalise_uri("/".join(parts) or ".")
    assert os.path.isabs(local) and normalise_uri(local) == local
    assert normalise_uri(f"file://{local}") == local
    remote = "s3://bucket/" + "/".join(p for p in parts if p not in ("..", "."))
    assert normalise_uri(remote + "/") == remote.rstrip("/") == normalise_uri(remote)


def test_redact_hides_option_and_environment_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret-value")
    options = {"endpoint": "http://127.0.0.1:9", "aws_secret_access_key": "opt-secret-value"}
    text = redact("GET http://127.0.0.1:9 key=opt-secret-value env=env-secret-value", options)
    assert text == "GET http://127.0.0.1:9 key=*** env=***"


@pytest.mark.parametrize(
    ("error", "hint"),
    [
        ("error sending request in 661.403551ms, after 3 retries", "'endpoint'"),
        ("Failed to resolve region for bucket 'b'", "'region'"),
        ("Failed to get AWS credentials: CredentialsNotLoaded", "credentials"),
        ("Server returned non-2xx status code: 403 Forbidden", "credentials"),
    ],
)
def test_unreachable_names_the_likely_option(error: str, hint: str) -> None:
    options = {"endpoint": "http://127.0.0.1:9", "allow_http": "true", "region": "us-east-1"}
    message = str(unreachable("s3://b/t.lance", options, OSError(error)))
    assert f"Likely missing or wrong: {hint}" in message and "'s3://b/t.lance'" in message


def test_the_errors_a_job_may_catch_are_public() -> None:
    import loader
    from loader.sources import base

    assert loader.SourceUnreachableError is base.SourceUnreachableError
    assert loader.PinnedVersionGoneError is base.PinnedVersionGoneError
    assert {"SourceUnreachableError", "PinnedVersionGoneError"} <= set(loader.__all__)


def test_an_empty_table_and_a_missing_lance_path_say_so_plainly(tmp_path: Path) -> None:
    """Issue 24 item 17: an empty table suggested "lower num_splits to at most 0", and a
    missing Lance path's message carried Lance's Rust source paths."""
    empty = pa.table({"id": pa.array([], pa.int64())})
    with pytest.raises(ValueError, match="has no rows") as refused:
        StreamingDataset(empty, num_splits=4)
    assert "at most 0" not in str(refused.value)
    with pytest.raises(ValueError, match="no Lance dataset at") as missing:
        StreamingDataset(str(tmp_path / "nope.lance"), num_splits=2)
    assert ".rs:" not in str(missing.value), missing.value


@pytest.fixture(scope="module")
def fragmented_lance(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Lance dataset of three fragments (40, 25 and 35 rows), rows deleted from two."""
    import lance

    path = str(tmp_path_factory.mktemp("fragments") / "rows.lance")
    for start, stop in ((0, 40), (40, 65), (65, 100)):
        lance.write_dataset(make_rows(start, stop), path, mode="append" if start else "create")
    lance.dataset(path).delete("id % 7 = 3 AND id >= 40")
    return path


@hyp_settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_lance_reads_through_one_fragment_give_the_rows_a_dataset_take_gives(
    fragmented_lance: str, data: st.DataObject
) -> None:
    """Issue #27 (speed): a read whose rows lie in one fragment goes through that fragment's
    `take` (offsets within it): the same rows, values and schema as the dataset's `take`
    for any sorted positions, inside a fragment, at its edges, across fragments, with and
    without `columns`, deletions included; only reads across fragments use the dataset's."""
    import lance

    dataset = lance.dataset(fragmented_lance)
    n = dataset.count_rows()
    columns = data.draw(st.sampled_from([None, ["x", "id"], ["name"]]))
    resolved = resolve_source(fragmented_lance, columns=columns)
    rows = open_source(resolved.spec)
    lo = data.draw(st.integers(0, n - 1))
    hi = data.draw(st.integers(lo, min(n - 1, lo + data.draw(st.sampled_from([3, 30, n])))))
    positions = np.array(
        sorted(data.draw(st.sets(st.integers(lo, hi), min_size=1, max_size=hi - lo + 1))),
        dtype=np.int64,
    )
    calls: list[int] = []
    whole = rows._dataset  # type: ignore[attr-defined]

    class Counting:
        def take(self, *args: Any, **kwargs: Any) -> pa.Table:
            calls.append(1)
            return whole.take(*args, **kwargs)

    rows._dataset = Counting()  # type: ignore[attr-defined]
    got = rows.take(positions)
    assert got.equals(dataset.take(positions, columns=columns))
    live = [f.count_rows() for f in dataset.get_fragments()]
    edges = np.cumsum(live)
    one_fragment = np.searchsorted(edges, positions[0], "right") == np.searchsorted(
        edges, positions[-1], "right"
    )
    assert calls == ([] if one_fragment else [1])
