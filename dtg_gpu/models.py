r"""Seed models of method step 1: LeNet-5, CIFAR-form VGG, ResNet-18/34, CIFAR ResNet-20/32
and a small MobileNet-style depthwise-separable net.

Every constructor takes `num_classes`, `in_channels` and `dropout` (the rate swept
with the learning rate), so one registry builds any run's model from its `run.json`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from dtg_gpu.core.validation import is_int

__all__ = [
    "LeNet5",
    "VGG",
    "CifarResNet",
    "resnet18",
    "resnet34",
    "resnet20",
    "resnet32",
    "MobileNetS",
    "vgg11",
    "vgg13",
    "vgg16",
    "vgg19",
    "MODELS",
    "build_model",
]


class LeNet5(nn.Module):
    """LeNet-5 for 32×32 inputs (MNIST/digits are resized): conv 6, conv 16, fc 120-84-classes."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, dropout: float = 0.0):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2)
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(16 * 5 * 5, 120),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


_VGG_CFG: dict[int, list[int | str]] = {
    11: [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    13: [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    16: [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
    19: [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"],
}


class VGG(nn.Module):
    """VGG in the CIFAR form: 32×32 input, 3×3 convs, 1×1 map after five pools, dropout
    in a 512-512-classes classifier. `width` scales every channel count (narrow VGGs)."""

    def __init__(
        self,
        depth: int = 11,
        num_classes: int = 10,
        in_channels: int = 3,
        dropout: float = 0.0,
        batch_norm: bool = False,
        width: float = 1.0,
    ):
        super().__init__()
        if depth not in _VGG_CFG:
            raise ValueError(f"VGG depth must be one of {sorted(_VGG_CFG)}, got {depth!r}")
        layers: list[nn.Module] = []
        c = in_channels
        for v in _VGG_CFG[depth]:
            if v == "M":
                layers.append(nn.MaxPool2d(2))
                continue
            out = max(1, int(round(int(v) * width)))
            layers.append(nn.Conv2d(c, out, 3, padding=1))
            if batch_norm:
                layers.append(nn.BatchNorm2d(out))
            layers.append(nn.ReLU(inplace=True))
            c = out
        hidden = max(1, int(round(512 * width)))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(c, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )
        for m in self.features:  # torchvision's VGG init: without batch norm the default
            if isinstance(m, nn.Conv2d):  # init vanishes through 8+ layers and nothing trains
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def vgg11(**kw) -> VGG:
    return VGG(11, **kw)


def vgg13(**kw) -> VGG:
    return VGG(13, **kw)


def vgg16(**kw) -> VGG:
    return VGG(16, **kw)


def vgg19(**kw) -> VGG:
    return VGG(19, **kw)


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) of He et al. for CIFAR: 16/32/64 channels, 1×1 projection shortcuts."""

    def __init__(
        self, depth: int = 20, num_classes: int = 10, in_channels: int = 3, dropout: float = 0.0, width: int = 16
    ):
        super().__init__()
        if (depth - 2) % 6:
            raise ValueError(f"CIFAR ResNet depth must be 6n+2, got {depth!r}")
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(in_channels, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        blocks, c = [], width
        for stage, cout in enumerate([width, 2 * width, 4 * width]):
            for i in range(n):
                blocks.append(_BasicBlock(c, cout, 2 if (stage and i == 0) else 1))
                c = cout
        self.layers = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(c, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.pool(self.layers(x)).flatten(1)
        return self.fc(self.dropout(x))


def resnet20(**kw) -> CifarResNet:
    return CifarResNet(20, **kw)


def resnet32(**kw) -> CifarResNet:
    return CifarResNet(32, **kw)


class _SeparableBlock(nn.Module):
    """Depthwise 3×3 conv + BN + ReLU, then pointwise 1×1 conv + BN + ReLU (MobileNet v1)."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.dw = nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False)
        self.bn1 = nn.BatchNorm2d(cin)
        self.pw = nn.Conv2d(cin, cout, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn2(self.pw(torch.relu(self.bn1(self.dw(x))))))


class MobileNetS(nn.Module):
    """A small MobileNet (v1) for 32×32 inputs: a 3×3 stem, five depthwise-separable blocks
    (`width`, 2·, 2·, 4·, 4·, 8·`width` channels, three of stride 2), global average
    pooling, dropout and one linear layer."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, dropout: float = 0.0, width: int = 8):
        super().__init__()
        if not is_int(width) or width < 1:
            raise ValueError(f"MobileNetS width must be a positive integer, got {width!r}")
        self.stem = nn.Conv2d(in_channels, width, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        plan = [(width, 2 * width, 2), (2 * width, 2 * width, 1), (2 * width, 4 * width, 2)]
        plan += [(4 * width, 4 * width, 1), (4 * width, 8 * width, 2)]
        self.blocks = nn.Sequential(*(_SeparableBlock(a, b, s) for a, b, s in plan))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(8 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.blocks(torch.relu(self.bn(self.stem(x))))).flatten(1)
        return self.fc(self.dropout(x))


def _torchvision_resnet(
    builder: Callable, num_classes: int = 10, in_channels: int = 3, dropout: float = 0.0
) -> nn.Module:
    """torchvision's ResNet with the stem adapted to 32×32 (3×3 conv, no max-pool)."""
    net = builder(num_classes=num_classes)
    net.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
    net.maxpool = nn.Identity()
    if dropout:
        net.fc = nn.Sequential(nn.Dropout(dropout), net.fc)
    return net


def resnet18(**kw) -> nn.Module:
    from torchvision.models import resnet18 as tv

    return _torchvision_resnet(tv, **kw)


def resnet34(**kw) -> nn.Module:
    from torchvision.models import resnet34 as tv

    return _torchvision_resnet(tv, **kw)


MODELS: dict[str, Callable[..., nn.Module]] = {
    "lenet5": LeNet5,
    "vgg11": vgg11,
    "vgg13": vgg13,
    "vgg16": vgg16,
    "vgg19": vgg19,
    "resnet18": resnet18,
    "resnet34": resnet34,
    "resnet20": resnet20,
    "resnet32": resnet32,
    "mobilenets": MobileNetS,
}


def build_model(name: str, **kwargs) -> nn.Module:
    """Build a registered model by name (`"lenet5"`, `"vgg16"`, `"resnet20"`,
    `"mobilenet-s"`, ...).

    Raises
    ------
    ValueError
        Unknown name or keyword.
    """
    key = name.lower().replace("-", "").replace("_", "")
    if key not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    try:
        return MODELS[key](**kwargs)
    except TypeError as exc:
        raise ValueError(f"model {name!r}: {exc}") from None
