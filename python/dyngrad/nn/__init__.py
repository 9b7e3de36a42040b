"""Modules: subclass Module, assign Parameters, layers and buffers as attributes, write forward().

Assigning registers (``self.fc = Linear(...)`` registers the layer and its parameters, by dotted name,
as torch.nn does). The layers take their initial weights from dyngrad's C++ layers (nn/layers.h: PyTorch's
default initialisation, from the generator ``dyngrad.manual_seed`` sets), and their forward is one op of
the table, so a Python model computes exactly what its C++ twin does.
"""

from __future__ import annotations

import types as _types

from .. import _core, functional as F
from .module import Parameter, Module
from .layers import Linear, Conv2d, Embedding, Dropout, ReLU, Sigmoid, Tanh, SiLU, GELU, LeakyReLU, Identity, Flatten, MaxPool2d, AvgPool2d
from .normalization import BatchNorm2d, BatchNorm1d, LayerNorm, RMSNorm
from .rnn import RNNBase, LSTM, GRU, RNN
from .containers import Sequential, ModuleList
from .loss import CrossEntropyLoss, MSELoss

__all__ = [
    "Parameter", "Module", "Linear", "Conv2d", "BatchNorm2d", "BatchNorm1d", "LayerNorm", "RMSNorm", "Embedding",
    "Dropout", "ReLU", "Sigmoid", "Tanh", "GELU", "SiLU", "LeakyReLU", "Flatten", "MaxPool2d", "AvgPool2d",
    "Identity", "Sequential", "ModuleList", "CrossEntropyLoss", "MSELoss", "RNNBase", "LSTM", "GRU", "RNN",
    "MultiheadAttention", "TransformerBlock", "PositionalEmbedding", "GPT", "GPTConfig", "gpt2_small",
    "padded_vocabulary", "functional",
]
functional = F

# The transformer layers are nn/transformer.h's C++ layers (dyngrad/transformer.py); imported last, they
# subclass Module.
from ..transformer import (GPT, GPTConfig, MultiheadAttention, PositionalEmbedding, TransformerBlock,  # noqa: E402
                           gpt2_small, padded_vocabulary)


# torch.nn.utils' gradient clipping (the same functions as dyngrad.optim's), for code that spells them
# torch.nn.utils.clip_grad_norm_(...).
utils = _types.SimpleNamespace(clip_grad_norm_=_core.clip_grad_norm_, clip_grad_value_=_core.clip_grad_value_)
