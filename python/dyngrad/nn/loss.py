"""Loss modules over dyngrad.functional's losses."""
from __future__ import annotations

from .. import functional as F
from .module import Module


class CrossEntropyLoss(Module):
    def __init__(self, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
        super().__init__()
        self.weight, self.ignore_index, self.reduction, self.label_smoothing = weight, ignore_index, reduction, label_smoothing

    def forward(self, logits, target):
        return F.cross_entropy(logits, target, self.weight, self.ignore_index, self.reduction, self.label_smoothing)


class MSELoss(Module):
    def forward(self, prediction, target):
        return F.mse_loss(prediction, target)
