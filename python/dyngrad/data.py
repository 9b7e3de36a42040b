"""Data loading: dyngrad's C++ loaders (nn/dataset.h), so batches are prepared off the Python thread.

- ``DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True, device="cuda")``: any tensors sharing a first
  dimension; a worker thread prefetches batches (pinned buffers and copies on dyngrad's stream for a GPU).
- ``MnistLoader``/``load_mnist``: the IDX files of (Fashion-)MNIST (Debian's dataset-fashion-mnist by default);
  ``resident=True`` keeps a split on the GPU.
"""
from __future__ import annotations

from . import _core
from ._core import BatchLoader, load_mnist, Tensor

__all__ = ["TensorDataset", "DataLoader", "BatchLoader", "load_mnist", "DEFAULT_MNIST_DIRECTORY"]

DEFAULT_MNIST_DIRECTORY = "/usr/share/datasets/fashion-mnist"


class TensorDataset:
    """Tensors sharing their first dimension; sample i is (t[i] for t in tensors)."""

    def __init__(self, *tensors: Tensor):
        if not tensors:
            raise _core.ValueError("TensorDataset: needs at least one tensor")
        for t in tensors:
            if not isinstance(t, Tensor):
                raise TypeError(f"TensorDataset: expected dyngrad tensors, got {type(t).__name__}")
        self.tensors = tensors

    def __len__(self):
        return self.tensors[0].shape[0] if self.tensors[0].shape else 0

    def __getitem__(self, i):
        return tuple(t[i] for t in self.tensors)


class DataLoader:
    """Batches of a TensorDataset in epoch order (epoch_permutation(size, seed, epoch) when shuffled).

    Each ``iter()`` starts the next epoch (or ``set_epoch(e)`` first, as with a DistributedSampler).
    """

    def __init__(self, dataset, batch_size=64, shuffle=True, seed=0, drop_last=False, device=None, prefetch=2,
                 num_shards=1, shard=0):
        if not isinstance(dataset, TensorDataset):
            raise TypeError("DataLoader: expects a dyngrad.data.TensorDataset (a Python dataset: iterate it yourself)")
        self.dataset = dataset
        self._loader = _core._DataLoader(list(dataset.tensors), batch_size, shuffle, seed, drop_last, num_shards, shard,
                                         prefetch, device)
        self._epoch = 0
        self._next_epoch = None

    def set_epoch(self, epoch: int):
        self._next_epoch = epoch

    def __len__(self):
        return len(self._loader)

    def __iter__(self):
        epoch = self._epoch if self._next_epoch is None else self._next_epoch
        self._next_epoch = None
        self._epoch = epoch + 1
        self._loader.start_epoch(epoch)
        while True:
            batch = self._loader.next()
            if batch is None:
                return
            yield batch
