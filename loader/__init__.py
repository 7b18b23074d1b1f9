"""elastic-loader: exactly-once, elastic, checkpoint-anywhere data loading for PyTorch.

from loader import StreamingDataset, StreamingDataLoader
"""

from loader import checkpoint
from loader.dataloader import StreamingDataLoader
from loader.dataset import StreamingDataset
from loader.plan import PlanSpec, check_world_size, owned_splits, supported_world_sizes

__all__ = [
    "PlanSpec",
    "StreamingDataLoader",
    "StreamingDataset",
    "check_world_size",
    "checkpoint",
    "owned_splits",
    "supported_world_sizes",
]
__version__ = "0.1.0"
