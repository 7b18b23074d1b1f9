"""One event contract: every event a real loader of any kind sends is accepted by the real
collector (issue 25 point 1).

No hand-written JSON: loaders of every kind (rows with W dividing S or not, packed blocks,
a mixture, a packed mixture, DataLoader workers, a checkpoint saved and resumed on another
world size, steps skipped, a mixture of 50 datasets with long names holding commas) report
to a collector on 127.0.0.1, and every client must end with nothing refused and every event
stored. A refusal reaches the user with the collector's reason; names a user gives fit or
are refused when the loader is built.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from dashboard.launch import DashboardHandle
from loader import MixedDataset, StreamingDataLoader, StreamingDataset, checkpoint
from loader.telemetry.client import TelemetryClient, TelemetryWarning
from tests.net import get_json, wait_until

pytestmark = pytest.mark.slow  # starts the collector and real loaders

SEQ = 4
Build = Callable[[int, int], Any]  # (rank, world size) -> a dataset


def _rows(n: int, start: int = 0) -> pa.Table:
    return pa.table({"id": list(range(start, start + n))})


def _docs(n: int, seed: int) -> pa.Table:
    docs = [[seed * 1000 + d * 10 + k + 1 for k in range(2 + (d * 7 + seed) % 6)] for d in range(n)]
    return pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))})


def rows(splits: int) -> Build:
    return lambda r, w: StreamingDataset(
        _rows(96), num_splits=splits, shuffle_seed=1, rank=r, world_size=w
    )


def packed(r: int, w: int) -> StreamingDataset:
    return StreamingDataset(
        _docs(80, 1),
        columns=["tokens"],
        num_splits=4,
        shuffle_seed=2,
        rank=r,
        world_size=w,
        pack_sequences=SEQ,
        eos_id=0,
    )


def mixture(names: list[str], pack: bool = False) -> Build:
    def build(r: int, w: int) -> MixedDataset:
        kw: dict[str, Any] = {"rank": r, "world_size": w}
        if pack:
            kw |= {"columns": ["tokens"], "pack_sequences": SEQ, "eos_id": 0}
        parts = {
            name: StreamingDataset(
                _docs(20 + 3 * k, k) if pack else _rows(20 + 3 * k, 1000 * k),
                num_splits=2,
                shuffle_seed=k,
                **kw,
            )
            for k, name in enumerate(names)
        }
        return MixedDataset(parts, [k % 3 + 1 for k in range(len(names))])

    return build


# A long name holding commas: 50 of them join to ~5,000 characters.
LONG = [f"web,en/{'common-crawl-' * 7}{k:02d}" for k in range(50)]
NAMES = {"mixture": ["web,en", "code"], "packed-mixture": ["web", "code", "math"]}
NAMES["mixture-50-long-names"] = LONG
KINDS: dict[str, tuple[Build, int, int, int]] = {
    # kind: (dataset, W, W after the resume, G); each run reads 2 epochs' worth of steps
    "rows": (rows(4), 2, 4, 8),  # W divides S
    "rows-shared": (rows(4), 3, 2, 12),  # W = 3 does not divide S = 4: shared splits
    "packed": (packed, 2, 1, 4),
    "mixture": (mixture(NAMES["mixture"]), 2, 3, 6),
    "packed-mixture": (mixture(NAMES["packed-mixture"], pack=True), 2, 1, 4),
    "mixture-50-long-names": (mixture(LONG), 2, 2, 100),
}


def _loaders(
    collector: DashboardHandle, kind: str, world: int, workers: int = 0
) -> list[StreamingDataLoader]:
    build, _, _, g = KINDS[kind]
    return [
        StreamingDataLoader(
            build(r, world),
            global_batch_size=g,
            telemetry=collector.api_url,
            run_id=kind,
            num_workers=workers,
            total_epochs=2,
        )
        for r in range(world)
    ]


def _read(loaders: list[StreamingDataLoader], steps: int) -> None:
    """`steps` global steps, rank by rank; a live mixture report at every step (rank 0)."""
    for dl in loaders:
        dl._telemetry.mixture_every_s = 0.0  # type: ignore[attr-defined]
    running = [iter(dl) for dl in loaders]
    for _ in range(steps):
        for it in running:
            next(it)


def _clients(loaders: list[StreamingDataLoader]) -> list[TelemetryClient]:
    return [dl._telemetry.client for dl in loaders]


@pytest.mark.usefixtures("patient_telemetry")  # refusals, not load
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_event_of_every_kind_of_loader_is_accepted(
    collector: DashboardHandle, kind: str, tmp_path: Path
) -> None:
    _, world, world_after, _ = KINDS[kind]
    stored_before = get_json(collector.api_url + "/health")["events"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", TelemetryWarning)  # a refusal warns: fail on it here
        first = _loaders(collector, kind, world, workers=1 if kind == "rows" else 0)
        steps = 4  # every kind's epoch has 8 steps or more
        _read(first, steps)
        state = first[0].state_dict()
        checkpoint.save(state, tmp_path / "ckpt.json")  # `checkpoint_saved`
        clients = _clients(first)
        for dl in first:
            dl.close()
        resumed = _loaders(collector, kind, world_after)
        for dl in resumed:
            dl.load_state_dict(state)  # `checkpoint_loaded` (and a mixture's new facts)
            dl.skip_steps(steps + 1, steps + 2)
        _read(resumed, 3)  # past the skipped step
        clients += _clients(resumed)
        for dl in resumed:
            dl.close()
    refused = {c.static["rank"]: c.dropped for c in clients if c.dropped}
    assert not refused, f"{kind}: events refused or dropped per rank: {refused}"
    sent = sum(c.sent for c in clients)
    wait_until(
        lambda: get_json(collector.api_url + "/health")["events"] - stored_before == sent,
        30,
        f"the {sent} events of {kind} stored",
    )
    kinds = {e["kind"] for e in get_json(f"{collector.api_url}/api/runs/{kind}/events")["data"]}
    expected = {"checkpoint_saved", "checkpoint_loaded", "closed", "steps_skipped"}
    if kind.startswith(("mixture", "packed-mixture")):
        expected |= {"mixture", "mixture_progress"}
    assert expected <= kinds, f"{kind} sent {kinds}"
    if kind in NAMES:  # each name whole, commas and all
        placement = get_json(f"{collector.api_url}/api/runs/{kind}/placement")
        assert [d["name"] for d in placement["mixture"]["datasets"]] == NAMES[kind]


def test_a_refusal_reaches_the_user_with_the_collectors_reason(
    collector: DashboardHandle,
) -> None:
    static = {"rank": 3, "world_size": 2, "num_splits": 4, "rows_per_split": 10}
    with pytest.warns(TelemetryWarning) as seen:
        client = TelemetryClient(collector.api_url, "refused", static)
        client.close()
    message = str(seen[0].message)
    assert "HTTP Error 422" in message
    assert "rank 3 is not below world_size 2" in message, message


@pytest.mark.parametrize(
    ("names", "match"),
    [
        ({"x" * 257: None}, "1-256 characters"),
        ({"": None}, "1-256 characters"),
        ({"tab\there": None}, "control characters"),
    ],
)
def test_a_name_that_cannot_travel_is_refused_when_the_mixture_is_built(
    names: dict[str, None], match: str
) -> None:
    datasets = {name: StreamingDataset(_rows(8), num_splits=2) for name in names}
    with pytest.raises(ValueError, match=match):
        MixedDataset(datasets)


def test_a_run_id_that_cannot_travel_is_refused_when_the_loader_is_built() -> None:
    with pytest.raises(ValueError, match="run_id"):
        StreamingDataLoader(
            StreamingDataset(_rows(8), num_splits=2),
            batch_size=2,
            telemetry="http://127.0.0.1:9",
            run_id="a/b",
        )


@pytest.mark.usefixtures("patient_telemetry")  # refusals, not load
def test_a_path_longer_than_the_collectors_limit_keeps_its_end(
    collector: DashboardHandle,
) -> None:
    """A checkpoint's path of 5,000 characters (an object-store key) is not a refusal."""
    path = "s3://bucket/" + "deep/" * 1000 + "step-7.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("error", TelemetryWarning)
        dl = StreamingDataLoader(
            StreamingDataset(_rows(8), num_splits=2),
            batch_size=2,
            telemetry=collector.api_url,
            run_id="long-path",
        )
        dl.note_checkpoint_saved(path)
        client = dl._telemetry.client  # type: ignore[attr-defined]
        dl.close()
    assert client.dropped == 0
    [saved] = get_json(f"{collector.api_url}/api/runs/long-path/events?kind=checkpoint_saved")[
        "data"
    ]
    assert saved["data"]["path"].endswith("deep/step-7.pt") and len(saved["data"]["path"]) == 4096


@pytest.mark.usefixtures("patient_telemetry")  # refusals, not load
def test_a_batch_ramp_over_shared_splits_reports_the_g_of_its_splits(
    collector: DashboardHandle,
) -> None:
    """Found by tests/test_joints.py (packed, one dataset, batch_schedule, W=2 not dividing
    S=3, telemetry): once the ramp changed G, `progress` events gave the splits of the new G
    with the first G, and the collector refused them (422: "splits [0, 2] are not rank 0's
    [0, 1]"). They now carry the G (and batch size) their splits follow."""
    loaders = [
        StreamingDataLoader(
            StreamingDataset(_rows(60), num_splits=3, shuffle_seed=1, rank=r, world_size=2),
            global_batch_size=3,
            batch_schedule=[(2, 6)],
            telemetry=collector.api_url,
            run_id="ramp-shared-splits",
        )
        for r in range(2)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error", TelemetryWarning)
        _read(loaders, 4)  # steps 2 and 3 of G = 6: rank 0 reads splits 0 and 1
        assert loaders[0].splits == range(0, 2)
        for dl in loaders:
            dl.close()  # the last `progress` event: the position at G = 6
    clients = _clients(loaders)
    assert not [c.dropped for c in clients if c.dropped]
    url = f"{collector.api_url}/api/runs/ramp-shared-splits"
    sent = sum(c.sent for c in clients)
    wait_until(lambda: get_json(url)["events"] == sent, 30, f"the {sent} events stored")
    progress = get_json(url + "/progress")
    assert progress["global_step"] == 4 and progress["owner"] == [0, 0, 1]  # G = 6's splits
