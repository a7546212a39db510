"""Models by name: any torchvision classifier for the cluster, two small ones for a laptop.

>>> import torch
>>> m = build_model("mnist1d_cnn", num_classes=10, input_shape=(1, 40))
>>> tuple(m(torch.zeros(2, 1, 40)).shape)
(2, 10)
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..core.errors import GuideError

CUSTOM = ("small_resnet", "mnist1d_cnn", "mnist1d_mlp", "linear")
MODEL_CHOICES_HELP = ("a torchvision classifier (e.g. resnet50), small_resnet (2-D, CPU-sized), mnist1d_cnn or "
                      "mnist1d_mlp (1-D), linear (any input; a step costs almost nothing)")


class _Block(nn.Module):
    """A ResNet basic block: two 3x3 convolutions and a shortcut."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.shortcut = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


def small_resnet(num_classes: int, channels: int = 3) -> nn.Module:
    """ResNet in miniature (16/32/64 channels): the same building blocks as ResNet-50's
    family, small enough to train in seconds on a CPU at 32x32 pixels."""
    return nn.Sequential(
        nn.Conv2d(channels, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
        _Block(16, 16, 1), _Block(16, 32, 2), _Block(32, 64, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes))


def mnist1d_cnn(num_classes: int, length: int = 40) -> nn.Module:
    """Three 1-D convolutions of 32 channels with BatchNorm; why this size: the book's methods
    page, "Methods: the laptop scale" (``book/methods.md``)."""
    def conv(cin, stride):
        return [nn.Conv1d(cin, 32, 5, stride, 2, bias=False), nn.BatchNorm1d(32), nn.ReLU(inplace=True)]

    out_len = ((length + 1) // 2 + 1) // 2
    return nn.Sequential(*conv(1, 1), *conv(32, 2), *conv(32, 2), nn.Flatten(), nn.Linear(32 * out_len, num_classes))


def mnist1d_mlp(num_classes: int, length: int = 40, hidden: int = 64) -> nn.Module:
    """Two hidden layers and no BatchNorm: its gradient over a batch is exactly the mean of its
    samples' gradients, so accumulating the gradients of micro-batches equals one big batch
    (up to float rounding). With BatchNorm it cannot: each micro-batch is normalised by its
    own mean and variance. The tests and the book use it to show that equality."""
    return nn.Sequential(nn.Flatten(), nn.Linear(length, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, num_classes))


def build_model(name: str, *, num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    """The model called ``name`` for inputs of ``input_shape`` (without the batch dimension)."""
    one_d = len(input_shape) == 2
    if name == "linear":  # one matrix: what is left of a step is the loop's own work (benchmarks)
        return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))
    if name in ("mnist1d_cnn", "mnist1d_mlp"):
        if not one_d or input_shape[0] != 1:
            raise GuideError(f"model {name} takes 1-D signals, but the data has shape {tuple(input_shape)}; "
                             "use --data mnist1d, or an image model such as small_resnet for image data")
        return (mnist1d_cnn if name == "mnist1d_cnn" else mnist1d_mlp)(num_classes, input_shape[1])
    if name == "small_resnet":
        if one_d:
            raise GuideError("model small_resnet takes images, but the data is 1-D (mnist1d); "
                             "use --model mnist1d_cnn with --data mnist1d")
        return small_resnet(num_classes, input_shape[0])
    import torchvision

    if name not in torchvision.models.list_models(module=torchvision.models):
        raise GuideError(f"unknown model {name!r}: use {', '.join(CUSTOM)}, or any torchvision "
                         "classification model, e.g. resnet50")
    if one_d:
        raise GuideError(f"torchvision model {name} takes RGB images, but the data is 1-D {tuple(input_shape)} "
                         "(mnist1d); use --model mnist1d_cnn with --data mnist1d")
    if input_shape[0] != 3:
        raise GuideError(f"torchvision model {name} takes RGB images, but the data has {input_shape[0]} channel(s) "
                         f"{tuple(input_shape)}; use --model small_resnet, which takes any channel count")
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)
