"""A mixture's dataset names: given as dict keys, or taken from each table's name, and held to
what the dashboard can show and telemetry can carry (refused when the mixture is built, never
at the collector mid-run)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath

from loader import wire
from loader.dataset import StreamingDataset


def named_datasets(
    datasets: Sequence[StreamingDataset] | Mapping[str, StreamingDataset],
) -> tuple[tuple[str, ...], tuple[StreamingDataset, ...]]:
    if isinstance(datasets, Mapping):
        names, items = tuple(str(n) for n in datasets), tuple(datasets.values())
    elif isinstance(datasets, Sequence) and not isinstance(datasets, str | bytes):
        items = tuple(datasets)
        names = tuple(str(k) for k in range(len(items)))
        if all(isinstance(ds, StreamingDataset) for ds in items):
            names = tuple(default_name(ds, k) for k, ds in enumerate(items))
        if len(set(names)) < len(names):
            names = tuple(str(k) for k in range(len(items)))
    else:
        raise TypeError(
            f"datasets must be a list or a dict of StreamingDatasets, got {type(datasets).__name__}"
        )
    if not items:
        raise ValueError("datasets is empty: a mixture needs at least one StreamingDataset")
    check_names(names)
    for name, ds in zip(names, items, strict=True):
        if not isinstance(ds, StreamingDataset):
            raise TypeError(
                f"datasets[{name!r}] is a {type(ds).__name__}, expected a StreamingDataset"
            )
    return names, items


def check_names(names: tuple[str, ...]) -> None:
    """Names that the dashboard can show and telemetry can carry, or a ValueError now (never
    a refusal at the collector, mid-run)."""
    if len(names) > wire.MAX_MIXTURE_DATASETS:
        raise ValueError(
            f"datasets has {len(names):,} entries; a mixture holds at most "
            f"{wire.MAX_MIXTURE_DATASETS:,}: merge small datasets into one table"
        )
    for name in names:
        ok = wire.NAME.fullmatch(name) is not None
        if ok:
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                ok = False
        if not ok:
            raise ValueError(
                f"datasets name {name[:300]!r} is refused: a dataset's name is 1-"
                f"{wire.MAX_NAME_CHARS} characters of valid Unicode without control "
                "characters (e.g. 'web-en'); give the datasets as a dict of such names"
            )


def default_name(ds: StreamingDataset, index: int) -> str:
    spec = ds.source.spec
    if spec.table:
        return spec.table
    stem = PurePosixPath(spec.uri.rstrip("/")).stem
    return stem or str(index)
