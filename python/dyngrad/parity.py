"""Parity with PyTorch: run a dyngrad model and its PyTorch twin on the same batch and compare every
parameter gradient (the check none of the frameworks ships).

    report = dyngrad.parity.compare(dg_model, torch_model, (images, labels))
    assert report.max_grad_rel_err < 1e-4, report

The batch goes to PyTorch through DLPack (no copy); the weights are copied dyngrad → PyTorch by name
(dyngrad's state_dict names are torch.nn's for the twins torch_twin() builds).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import _core, functional as F, nn
from ._core import Tensor


@dataclass
class ParityReport:
    loss_dyngrad: float
    loss_torch: float
    grads: dict = field(default_factory=dict)  # name -> (max_abs_err, rel_err)

    @property
    def max_grad_rel_err(self) -> float:
        return max((r for _, r in self.grads.values()), default=0.0)

    def __str__(self):
        lines = [f"loss dyngrad {self.loss_dyngrad:.8g} torch {self.loss_torch:.8g}"]
        for name, (a, r) in self.grads.items():
            lines.append(f"  {name:24s} max_abs {a:.3e} rel {r:.3e}")
        return "\n".join(lines)


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised where torch is missing
        raise ImportError("dyngrad.parity needs PyTorch") from e
    return torch


def torch_twin(dg_model: nn.Module):
    """A torch.nn.Sequential with the same layers and names as a dyngrad Sequential (fused ReLUs become a
    torch.nn.ReLU at the index dyngrad skips)."""
    torch = _torch()
    tnn = torch.nn
    layers = {}
    for name, layer in dg_model._modules.items():
        index = int(name)
        if isinstance(layer, nn.Conv2d):
            layers[index] = tnn.Conv2d(layer.in_channels, layer.out_channels, layer.kernel_size, layer.stride,
                                       layer.padding, layer.dilation, layer.groups, bias=layer.bias is not None)
        elif isinstance(layer, nn.Linear):
            layers[index] = tnn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None)
        elif isinstance(layer, nn.MaxPool2d) and type(layer) is nn.MaxPool2d:
            layers[index] = tnn.MaxPool2d(layer.kernel_size, layer.stride, layer.padding)
        elif isinstance(layer, nn.AvgPool2d):
            layers[index] = tnn.AvgPool2d(layer.kernel_size, layer.stride, layer.padding)
        elif isinstance(layer, nn.Flatten):
            layers[index] = tnn.Flatten(layer.start_dim, layer.end_dim)
        elif isinstance(layer, nn.ReLU):
            layers[index] = tnn.ReLU()
        else:
            raise TypeError(f"torch_twin: no twin for {type(layer).__name__}")
        if getattr(layer, "activation", None) == "relu":
            layers[index + 1] = tnn.ReLU()
    seq = tnn.Sequential()
    for index in sorted(layers):
        seq.add_module(str(index), layers[index])
    return seq


def copy_weights(dg_model: nn.Module, torch_model) -> None:
    torch = _torch()
    own = dg_model.state_dict()
    with torch.no_grad():
        for name, p in torch_model.state_dict().items():
            if name not in own:
                raise _core.ValueError(f"parity: PyTorch entry '{name}' has no dyngrad counterpart")
            src = torch.from_dlpack(own[name].detach()).to(p.device, p.dtype)
            p.copy_(src.reshape(p.shape))


def _tf32_off(torch):
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    return saved


def _tf32_restore(torch, saved):
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def compare(dg_model: nn.Module, torch_model, batch, loss: str = "cross_entropy", copy: bool = True) -> ParityReport:
    """Copies the weights (unless copy=False), runs forward + loss + backward in both, compares gradients."""
    torch = _torch()
    x, y = batch
    if copy:
        copy_weights(dg_model, torch_model)
    dg_model.zero_grad()
    torch_model.zero_grad()
    out = dg_model(x)
    dg_loss = F.cross_entropy(out, y) if loss == "cross_entropy" else F.mse_loss(out, y)
    dg_loss.backward()
    tx = torch.from_dlpack(x.detach())
    ty = torch.from_dlpack(y.detach())
    # PyTorch computes float32 convolutions in TF32 by default (cudnn.allow_tf32): ~1e-2 relative gradient
    # differences on the GPU that are PyTorch's rounding, not a defect. dyngrad is exact float32 unless asked.
    saved = _tf32_off(torch)
    try:
        tout = torch_model(tx)
        t_loss = (torch.nn.functional.cross_entropy(tout, ty) if loss == "cross_entropy"
                  else torch.nn.functional.mse_loss(tout, ty))
        t_loss.backward()
    finally:
        _tf32_restore(torch, saved)
    report = ParityReport(float(dg_loss.item()), float(t_loss.item()))
    t_params = dict(torch_model.named_parameters())
    for name, p in dg_model.named_parameters():
        if name not in t_params:
            raise _core.ValueError(f"parity: dyngrad parameter '{name}' has no PyTorch counterpart")
        g = np.asarray(p.grad.cpu().numpy(), dtype=np.float64)
        tg = t_params[name].grad.detach().cpu().double().numpy().reshape(g.shape)
        diff = np.abs(g - tg)
        report.grads[name] = (float(diff.max(initial=0.0)),
                              float(np.linalg.norm(g - tg) / max(np.linalg.norm(tg), 1e-30)))
    return report
