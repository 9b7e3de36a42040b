"""Optimizers and learning-rate schedules: dyngrad's own (nn/optim.h; fused single-launch steps on the GPU).

``SGD(model.parameters(), lr=0.1, momentum=0.9)``; parameter groups as in PyTorch:
``Adam([{"params": a, "lr": 1e-3}, {"params": b}], lr=1e-4)``.
"""
from ._core import SGD, Adam, AdamW, Optimizer, LRScheduler, StepLR, CosineAnnealingLR, clip_grad_norm_, clip_grad_value_

lr_scheduler = __import__("types").SimpleNamespace(StepLR=StepLR, CosineAnnealingLR=CosineAnnealingLR, LRScheduler=LRScheduler)

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "LRScheduler", "StepLR", "CosineAnnealingLR", "clip_grad_norm_",
           "clip_grad_value_", "lr_scheduler"]
