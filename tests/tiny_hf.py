"""The smallest Hugging Face model that computes: a 2-layer MLP as a PreTrainedModel whose
loss is a function of every column of the batch (no hub download: the network is closed)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import PretrainedConfig, PreTrainedModel


class TinyConfig(PretrainedConfig):
    model_type = "tiny-mlp"

    def __init__(self, width: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.width = width  # input features: the batch's columns, flattened side by side


class TinyMLP(PreTrainedModel):
    config_class = TinyConfig

    def __init__(self, config: TinyConfig) -> None:
        super().__init__(config)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(config.width, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)
        )
        self.post_init()

    def forward(self, **columns: torch.Tensor) -> dict[str, torch.Tensor]:
        x = torch.cat([c.to(torch.float32).reshape(len(c), -1) for c in columns.values()], 1)
        return {"loss": (self.net(x / 100) ** 2).mean()}


def tiny_model(width: int) -> TinyMLP:
    return TinyMLP(TinyConfig(width=width))
