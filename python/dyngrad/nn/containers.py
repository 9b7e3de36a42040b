"""Containers of modules: Sequential and ModuleList."""
from __future__ import annotations

from collections import OrderedDict

from .module import Module


class Sequential(Module):
    """Layers applied in order; Sequential(a, b) names them "0", "1"; Sequential(OrderedDict) by its keys."""

    def __init__(self, *layers):
        super().__init__()
        if len(layers) == 1 and isinstance(layers[0], (dict, OrderedDict)):
            for name, layer in layers[0].items():
                self.add_module(str(name), layer)
        else:
            for i, layer in enumerate(layers):
                self.add_module(str(i), layer)

    def forward(self, x):
        for layer in self._modules.values():
            x = layer(x)
        return x

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class ModuleList(Module):
    __getitem__, __len__, __iter__ = Sequential.__getitem__, Sequential.__len__, Sequential.__iter__

    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module):
        self.add_module(str(len(self._modules)), module)
        return self
