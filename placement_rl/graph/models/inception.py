"""``inception``: a GoogLeNet-style (Inception v1 with BatchNorm) multi-branch CNN."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from placement_rl.errors import GraphError
from placement_rl.graph.models._common import check_positive, seeded

DEFAULTS = dict(batch_size=32, image_size=224, num_classes=1000, num_modules=9, seed=0)

# GoogLeNet table: (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj) for modules 3a..5b.
_TABLE = (
    ("3a", (64, 96, 128, 16, 32, 32)), ("3b", (128, 128, 192, 32, 96, 64)),
    ("4a", (192, 96, 208, 16, 48, 64)), ("4b", (160, 112, 224, 24, 64, 64)),
    ("4c", (128, 128, 256, 24, 64, 64)), ("4d", (112, 144, 288, 32, 64, 64)),
    ("4e", (256, 160, 320, 32, 128, 128)), ("5a", (256, 160, 320, 32, 128, 128)),
    ("5b", (384, 192, 384, 48, 128, 128)),
)
_POOL_AFTER = {"3b", "4e"}  # a 3x3/2 max-pool follows these modules


class ConvBN(nn.Sequential):
    """Conv (no bias) + BatchNorm + ReLU."""

    def __init__(self, cin: int, cout: int, k: int, stride: int = 1) -> None:
        super().__init__(nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU())


class InceptionModule(nn.Module):
    """Four parallel branches (1x1 | 1x1->3x3 | 1x1->5x5 | 3x3 pool->1x1) concatenated on channels."""

    def __init__(self, cin: int, c1: int, r3: int, c3: int, r5: int, c5: int, cp: int) -> None:
        super().__init__()
        self.branch1 = ConvBN(cin, c1, 1)
        self.branch2 = nn.Sequential(ConvBN(cin, r3, 1), ConvBN(r3, c3, 3))
        self.branch3 = nn.Sequential(ConvBN(cin, r5, 1), ConvBN(r5, c5, 5))
        self.branch4 = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1), ConvBN(cin, cp, 1))
        self.out_channels = c1 + c3 + c5 + cp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], 1)


class Inception(nn.Module):
    """Stem, ``num_modules`` inception modules (max-pools after 3b and 4e), pool, dropout-free head.

    forward(x [B, 3, H, W] float32, y [B] int64) -> scalar cross-entropy loss.
    """

    def __init__(self, *, num_classes: int, num_modules: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(ConvBN(3, 64, 7, 2), nn.MaxPool2d(3, 2, padding=1), ConvBN(64, 64, 1),
                                  ConvBN(64, 192, 3), nn.MaxPool2d(3, 2, padding=1))
        cin, blocks = 192, []
        for tag, cfg in _TABLE[:num_modules]:
            mod = InceptionModule(cin, *cfg)
            blocks.append((f"inception{tag}", mod))
            cin = mod.out_channels
            if tag in _POOL_AFTER and tag != _TABLE[num_modules - 1][0]:
                blocks.append((f"pool{tag}", nn.MaxPool2d(3, 2, padding=1)))
        self.blocks = nn.Sequential()
        for tag, mod in blocks:
            self.blocks.add_module(tag, mod)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        logits = self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
        return F.cross_entropy(logits, y)


def build(*, batch_size: int, image_size: int, num_classes: int, num_modules: int,
          seed: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    check_positive("inception", batch_size=batch_size, image_size=image_size, num_classes=num_classes)
    if not 1 <= num_modules <= len(_TABLE):
        raise GraphError(f"zoo model 'inception': option num_modules={num_modules} must be in [1, {len(_TABLE)}]")
    if image_size < 32:
        raise GraphError(f"zoo model 'inception': option image_size={image_size} must be >= 32")
    with seeded(seed) as gen:
        model = Inception(num_classes=num_classes, num_modules=num_modules)
        x = torch.randn(batch_size, 3, image_size, image_size, generator=gen)
        y = torch.randint(0, num_classes, (batch_size,), generator=gen)
    return model, (x, y)
