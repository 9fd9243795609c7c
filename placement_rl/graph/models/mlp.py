"""``mlp``: a multi-layer perceptron classifier with a cross-entropy loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from placement_rl.graph.models._common import check_positive, seeded

DEFAULTS = dict(batch_size=64, in_features=784, hidden=1024, layers=16, num_classes=10, seed=0)


class MLP(nn.Module):
    """``layers`` hidden Linear+ReLU layers, then a classifier. forward(x, y) -> loss.

    Shapes: x [B, in_features] float32, y [B] int64 class ids; returns a scalar.
    """

    def __init__(self, *, in_features: int, hidden: int, layers: int, num_classes: int) -> None:
        super().__init__()
        dims = [in_features] + [hidden] * layers
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Linear(dims[-1], num_classes)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for layer in self.hidden:
            x = F.relu(layer(x))
        return F.cross_entropy(self.head(x), y)


def build(*, batch_size: int, in_features: int, hidden: int, layers: int, num_classes: int,
          seed: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    check_positive("mlp", batch_size=batch_size, in_features=in_features, hidden=hidden,
                   layers=layers, num_classes=num_classes)
    with seeded(seed) as gen:
        model = MLP(in_features=in_features, hidden=hidden, layers=layers, num_classes=num_classes)
        x = torch.randn(batch_size, in_features, generator=gen)
        y = torch.randint(0, num_classes, (batch_size,), generator=gen)
    return model, (x, y)
