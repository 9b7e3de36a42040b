"""Normalisation layers: BatchNorm2d (BatchNorm1d), LayerNorm, RMSNorm."""
from __future__ import annotations

from .. import _core
from .. import functional as F
from .module import Module, Parameter, _param
from ._arguments import _float, _int, _ints


class BatchNorm2d(Module):
    def __init__(self, num_features, eps=1e-5, momentum=0.1):
        super().__init__()
        num_features = _int("BatchNorm", "num_features", num_features)
        eps, momentum = _float("BatchNorm", "eps", eps), _float("BatchNorm", "momentum", momentum)
        w, b, mean, var = _core._batch_norm_init(num_features)
        self.weight, self.bias = Parameter(w), Parameter(b)
        self.register_buffer("running_mean", mean)
        self.register_buffer("running_var", var)
        self.eps, self.momentum = eps, momentum

    def forward(self, x):
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.training,
                            self.momentum, self.eps)


BatchNorm1d = BatchNorm2d


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__()
        shape = _ints("LayerNorm", "normalized_shape", normalized_shape)
        eps = _float("LayerNorm", "eps", eps)
        w, b = _core._layer_norm_init(shape, elementwise_affine, bias)
        self.weight, self.bias = _param(w), _param(b)
        self.normalized_shape, self.eps = tuple(shape), eps

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(Module):
    def __init__(self, normalized_shape, eps=None, elementwise_affine=True):
        super().__init__()
        shape = _ints("RMSNorm", "normalized_shape", normalized_shape)
        eps = None if eps is None else _float("RMSNorm", "eps", eps)
        self.weight = _param(_core._rms_norm_init(shape, elementwise_affine))
        self.normalized_shape, self.eps = tuple(shape), eps

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)
