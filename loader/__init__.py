"""elastic-loader: exactly-once, elastic, checkpoint-anywhere data loading for PyTorch.

    from loader import StreamingDataset, StreamingDataLoader
    from loader import MixedDataset  # several datasets at set proportions

Exports load lazily, so `import loader.layout` (the dashboard does) costs no torch import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loader import checkpoint
    from loader.batching import rampup_schedule
    from loader.dataloader import StreamingDataLoader
    from loader.dataset import StreamingDataset
    from loader.layout import check_world_size, owned_splits, supported_world_sizes
    from loader.mixture.dataset import CombinedStreamingDataset, MixedDataset
    from loader.mixture.weights import linear_ramp
    from loader.packed_batch import derive_packed_fields
    from loader.plan import PlanSpec
    from loader.sources.base import PinnedVersionGoneError, SourceUnreachableError
    from loader.telemetry.reporter import close_loaders
    from loader.tools.rows import RunPosition, StepRows, rows_at_step
    from loader.trainers.torchtitan import TitanDataLoader
    from loader.workers.watchdog import DataWaitTimeout

_EXPORTS = {
    "CombinedStreamingDataset": "loader.mixture.dataset",
    "MixedDataset": "loader.mixture.dataset",
    "DataWaitTimeout": "loader.workers.watchdog",
    "PinnedVersionGoneError": "loader.sources.base",
    "PlanSpec": "loader.plan",
    "RunPosition": "loader.tools.rows",
    "StepRows": "loader.tools.rows",
    "SourceUnreachableError": "loader.sources.base",
    "StreamingDataLoader": "loader.dataloader",
    "StreamingDataset": "loader.dataset",
    "TitanDataLoader": "loader.trainers.torchtitan",
    "check_world_size": "loader.layout",
    "close_loaders": "loader.telemetry.reporter",
    "derive_packed_fields": "loader.packed_batch",
    "linear_ramp": "loader.mixture.weights",
    "owned_splits": "loader.layout",
    "rampup_schedule": "loader.batching",
    "rows_at_step": "loader.tools.rows",
    "supported_world_sizes": "loader.layout",
}

__all__ = [
    "CombinedStreamingDataset",
    "DataWaitTimeout",
    "MixedDataset",
    "PinnedVersionGoneError",
    "PlanSpec",
    "RunPosition",
    "SourceUnreachableError",
    "StepRows",
    "StreamingDataLoader",
    "StreamingDataset",
    "TitanDataLoader",
    "check_world_size",
    "checkpoint",
    "close_loaders",
    "derive_packed_fields",
    "linear_ramp",
    "owned_splits",
    "rampup_schedule",
    "rows_at_step",
    "supported_world_sizes",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "checkpoint":
        return importlib.import_module("loader.checkpoint")
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'loader' has no attribute {name!r}")
