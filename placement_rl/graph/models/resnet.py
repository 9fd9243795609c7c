"""``resnet18`` / ``resnet50``: torchvision-layout ResNets (BasicBlock / Bottleneck, BatchNorm)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from placement_rl.graph.models._common import check_positive, seeded

DEFAULTS = dict(batch_size=32, image_size=224, num_classes=1000, width=64, seed=0)
LAYOUTS = {"resnet18": ("basic", (2, 2, 2, 2)), "resnet50": ("bottleneck", (3, 4, 6, 3))}


def _conv_bn(cin: int, cout: int, k: int, stride: int) -> tuple[nn.Conv2d, nn.BatchNorm2d]:
    return nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False), nn.BatchNorm2d(cout)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(cin, planes, 3, stride)
        self.conv2, self.bn2 = _conv_bn(planes, planes, 3, 1)
        self.downsample = _downsample(cin, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        idt = x if self.downsample is None else self.downsample(x)
        return F.relu(out + idt)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(cin, planes, 1, 1)
        self.conv2, self.bn2 = _conv_bn(planes, planes, 3, stride)
        self.conv3, self.bn3 = _conv_bn(planes, planes * self.expansion, 1, 1)
        self.downsample = _downsample(cin, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        idt = x if self.downsample is None else self.downsample(x)
        return F.relu(out + idt)


def _downsample(cin: int, cout: int, stride: int) -> nn.Sequential | None:
    if stride == 1 and cin == cout:
        return None
    return nn.Sequential(*_conv_bn(cin, cout, 1, stride))


class ResNet(nn.Module):
    """Stem (7x7/2 conv, BN, ReLU, 3x3/2 max-pool), four stages, global pool, classifier.

    forward(x [B, 3, H, W] float32, y [B] int64) -> scalar cross-entropy loss.
    """

    def __init__(self, *, block: str, depths: tuple[int, ...], num_classes: int, width: int) -> None:
        super().__init__()
        blk = BasicBlock if block == "basic" else Bottleneck
        self.conv1, self.bn1 = _conv_bn(3, width, 7, 2)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        cin = width
        for i, depth in enumerate(depths):
            planes = width * 2**i
            blocks = []
            for j in range(depth):
                blocks.append(blk(cin, planes, 2 if (j == 0 and i > 0) else 1))
                cin = planes * blk.expansion
            self.add_module(f"layer{i + 1}", nn.Sequential(*blocks))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        logits = self.fc(torch.flatten(self.avgpool(x), 1))
        return F.cross_entropy(logits, y)


def build(variant: str, *, batch_size: int, image_size: int, num_classes: int, width: int,
          seed: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    check_positive(variant, batch_size=batch_size, image_size=image_size, num_classes=num_classes,
                   width=width)
    block, depths = LAYOUTS[variant]
    with seeded(seed) as gen:
        model = ResNet(block=block, depths=depths, num_classes=num_classes, width=width)
        x = torch.randn(batch_size, 3, image_size, image_size, generator=gen)
        y = torch.randint(0, num_classes, (batch_size,), generator=gen)
    return model, (x, y)
