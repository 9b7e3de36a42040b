"""Data loading: dyngrad's C++ loaders (nn/dataset.h), so batches are prepared off the Python thread.

- ``DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True, device="cuda")``: any tensors sharing a first
  dimension; a worker thread prefetches batches (pinned buffers and copies on dyngrad's stream for a GPU).
- ``DataLoader(dataset)`` for any Python data set (the ``Dataset`` protocol: ``__len__`` and ``__getitem__(i)``
  returning an array, tensor or number, or a tuple/list/dict of them): the same C++ loader orders, shuffles,
  shards and prefetches; its worker thread calls ``__getitem__`` and the collate step (``default_collate`` or
  ``collate_fn``) with the GIL held, and copies the batch to the device through pinned memory.
- ``MnistLoader``/``load_mnist``: the IDX files of (Fashion-)MNIST (Debian's dataset-fashion-mnist by default);
  ``resident=True`` keeps a split on the GPU.
"""
from __future__ import annotations

import atexit
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from . import _core, _workers
from ._core import BatchLoader, load_mnist, Tensor
# llm.c's token files (nn/token_file.h): the C++ reader itself, windows identical to char_gpt --model gpt2's.
from ._core import TokenVocabulary, TokenWindows, read_token_file, write_token_file  # noqa: F401
from ._workers import get_worker_info, WorkerInfo

__all__ = ["Dataset", "TensorDataset", "DataLoader", "default_collate", "BatchLoader", "load_mnist",
           "DEFAULT_MNIST_DIRECTORY", "get_worker_info", "WorkerInfo",
           "TokenWindows", "TokenVocabulary", "read_token_file", "write_token_file"]

DEFAULT_MNIST_DIRECTORY = "/usr/share/datasets/fashion-mnist"


class Dataset:
    """The data set protocol DataLoader reads (a base class is optional: any object with both methods works).

    ``__getitem__(i)`` for 0 <= i < len(self) returns one sample: a NumPy array, a dyngrad Tensor, a Python or
    NumPy number, or a tuple/list/dict of those (nested), the same structure for every i.
    """

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, index: int):
        raise NotImplementedError


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


def _leaf_array(value, where):
    if isinstance(value, Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, (bool, int)) and not isinstance(value, np.generic):
        return np.asarray(value, dtype=np.int64)
    if isinstance(value, float):
        return np.asarray(value, dtype=np.float32)  # Python floats are float32, as in dyngrad.tensor()
    if isinstance(value, (np.ndarray, np.generic)) or hasattr(value, "__array__"):
        array = np.asarray(value)
        if array.dtype.kind not in "fiub":
            raise _core.DTypeError(f"default_collate: {where} has NumPy dtype {array.dtype} "
                                   "(dyngrad has float32, float64 and int64)")
        return array
    raise TypeError(f"default_collate: {where} is a {type(value).__name__}; samples hold arrays, tensors, numbers "
                    "and tuples, lists or dicts of them (pass collate_fn for anything else)")


def default_collate(samples: Sequence[Any]) -> Any:
    """Stacks a list of samples field by field along a new first dimension: arrays and tensors of shape S give
    a (B, *S) tensor, numbers a (B,) tensor (ints int64, floats float32; NumPy arrays keep float32/float64,
    other integers and bools become int64); tuples, lists and dicts keep their structure."""
    if not samples:
        raise _core.ValueError("default_collate: no samples")
    return _collate(list(samples), "sample field")


def _collate(samples, where):
    first = samples[0]
    if isinstance(first, dict):
        for i, s in enumerate(samples):
            if not isinstance(s, dict) or s.keys() != first.keys():
                raise _core.ValueError(f"default_collate: sample {i} at {where} has keys "
                                       f"{sorted(s) if isinstance(s, dict) else type(s).__name__}, sample 0 {sorted(first)}")
        return {k: _collate([s[k] for s in samples], f"{where}[{k!r}]") for k in first}
    if isinstance(first, (tuple, list)):
        for i, s in enumerate(samples):
            if not isinstance(s, (tuple, list)) or len(s) != len(first):
                raise _core.ValueError(f"default_collate: sample {i} at {where} has "
                                       f"{len(s) if isinstance(s, (tuple, list)) else type(s).__name__} fields, "
                                       f"sample 0 {len(first)}")
        fields = [_collate([s[k] for s in samples], f"{where}[{k}]") for k in range(len(first))]
        return tuple(fields) if isinstance(first, tuple) else fields
    arrays = [_leaf_array(s, where) for s in samples]
    for i, a in enumerate(arrays):
        if a.shape != arrays[0].shape:
            raise _core.ShapeError(f"default_collate: sample {i} at {where} has shape {a.shape}, "
                                   f"sample 0 {arrays[0].shape}")
    from . import tensor
    return tensor(np.stack(arrays))


def _flatten(batch, leaves):
    """The batch's tensors in order, and its structure with each tensor's position in their place."""
    if isinstance(batch, dict):
        return {k: _flatten(v, leaves) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)) and not all(isinstance(v, (int, float, np.number)) for v in batch):
        parts = [_flatten(v, leaves) for v in batch]
        return tuple(parts) if isinstance(batch, tuple) else parts
    if not isinstance(batch, Tensor):  # an array, a number or a list of numbers: one tensor
        from . import tensor
        batch = tensor(batch)
    leaves.append(batch if batch.device.type == "cpu" else batch.cpu())
    return len(leaves) - 1


def _unflatten(spec, leaves):
    if isinstance(spec, dict):
        return {k: _unflatten(v, leaves) for k, v in spec.items()}
    if isinstance(spec, tuple):
        return tuple(_unflatten(v, leaves) for v in spec)
    if isinstance(spec, list):
        return [_unflatten(v, leaves) for v in spec]
    return leaves[spec]


class _Fetch:
    """The collate step the C++ loader calls for a Python data set (on its prefetch thread, with the GIL): the
    batch's samples, collated, as CPU tensors, fetched here or by a worker process (``pool``). It holds no
    reference to its DataLoader, so that a dropped loader is freed at once (a bound method would make a cycle
    through the C++ loader, which the garbage collector cannot see) and its workers stop with it."""

    def __init__(self, dataset, collate_fn):
        self.dataset, self.collate_fn, self.spec, self.pool = dataset, collate_fn, None, None

    def __call__(self, indices):
        if self.pool is not None:  # from a worker process, which collated it
            spec, leaves = _workers.to_leaves(self.pool.fetch(indices))
        else:
            batch = (self.collate_fn or default_collate)([self.dataset[i] for i in indices])
            leaves = []
            spec = _flatten(batch, leaves)
        if self.spec is None:
            self.spec = spec
        elif spec != self.spec:
            raise _core.ValueError(f"DataLoader: a batch's structure {spec!r} differs from the first batch's "
                                   f"{self.spec!r} (samples must share one structure)")
        return leaves


_open_loaders = weakref.WeakSet()


@atexit.register
def _close_open_loaders():
    # A worker thread must not be left calling into Python while the interpreter shuts down.
    for loader in list(_open_loaders):
        loader.close()


class DataLoader:
    """Batches of a data set in epoch order (epoch_permutation(size, seed, epoch) when shuffled).

    ``dataset``: a TensorDataset (gathered in C++) or any Python data set (``Dataset`` protocol). ``collate_fn``
    makes a batch from a list of samples (default: ``default_collate``). ``device``: batches are copied there
    (for a GPU through pinned staging buffers, asynchronously on dyngrad's stream; ``pin_memory`` is accepted
    for PyTorch compatibility and changes nothing). ``prefetch`` batches are prepared ahead on a worker thread
    (0: on the caller's thread). Each ``iter()`` starts the next epoch (or ``set_epoch(e)`` first, as with a
    DistributedSampler); ``num_shards``/``shard`` give this process its part of every epoch. The defaults are
    PyTorch's: ``batch_size=1``, ``shuffle=False``.
    """

    def __init__(self, dataset, batch_size: int = 1, shuffle: bool = False, seed: int = 0, drop_last: bool = False,
                 device=None, prefetch: int = 2, num_shards: int = 1, shard: int = 0,
                 collate_fn: Callable[[list], Any] | None = None, pin_memory: bool = False,
                 num_workers: int = 0, worker_init_fn=None, persistent_workers: bool = False, timeout: float = 0,
                 multiprocessing_context=None, prefetch_factor: int | None = None):
        self.dataset = dataset
        # Worker processes (_workers.py): only for a Python data set; a TensorDataset without collate_fn is
        # gathered in C++ without the GIL, which processes would only slow down.
        self.num_workers, self.persistent_workers, self.timeout = num_workers, persistent_workers, timeout
        self.worker_init_fn, self.multiprocessing_context = worker_init_fn, multiprocessing_context
        self.prefetch_factor = _check_worker_args(num_workers, worker_init_fn, persistent_workers, timeout,
                                                  prefetch_factor)
        self._batch_size, self._seed = batch_size, seed
        self._fetch = _Fetch(dataset, collate_fn)
        self.collate_fn = collate_fn
        self.pin_memory = pin_memory
        if isinstance(dataset, TensorDataset) and collate_fn is None:
            self._loader = _core._DataLoader(list(dataset.tensors), batch_size, shuffle, seed, drop_last, num_shards,
                                             shard, prefetch, device)
            self._python = False
        else:
            if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
                raise TypeError(f"DataLoader: a data set needs __len__ and __getitem__; got {type(dataset).__name__}")
            if collate_fn is not None and not callable(collate_fn):
                raise TypeError("DataLoader: collate_fn must be callable")
            # With worker processes, they prefetch (prefetch_factor batches each) and the C++ loader fetches on the
            # caller's thread (prefetch 0): no thread of its own races the workers' epoch bookkeeping.
            self._loader = _core._IndexLoader(len(dataset), self._fetch, batch_size, shuffle, seed, drop_last,
                                              num_shards, shard, 0 if num_workers > 0 else prefetch, device)
            self._python = True
            _open_loaders.add(self)
        self._epoch = 0
        self._next_epoch = None


    def set_epoch(self, epoch: int):
        self._next_epoch = epoch

    def close(self):
        """Stops the worker thread and worker processes (also done when the loader is dropped, and at exit)."""
        self._stop_workers()
        self._loader = None

    def _stop_workers(self):
        pool, self._fetch.pool = self._fetch.pool, None
        if pool is not None:
            self._stop_finalizer.detach()
            pool.shutdown()  # first: a prefetch thread waiting on a worker's batch then stops waiting

    def _start_workers(self, epoch):
        if self._fetch.pool is not None:
            self._fetch.pool.begin_epoch()  # persistent workers: the last epoch's batches in flight are dropped
            return
        pool = _workers.WorkerPool(self.dataset, self.collate_fn, self.num_workers, self._batch_size,
                                   self.worker_init_fn, self.multiprocessing_context, float(self.timeout),
                                   self.prefetch_factor, (self._seed * 1000003 + epoch * 10007) % (1 << 62))
        self._stop_finalizer = weakref.finalize(self, pool.shutdown)  # a dropped loader's workers stop with it
        self._fetch.pool = pool

    def __len__(self):
        return len(self._loader)

    def __iter__(self):
        if self._loader is None:
            raise _core.ValueError("DataLoader: iterated after close()")
        epoch = self._epoch if self._next_epoch is None else self._next_epoch
        self._next_epoch = None
        self._epoch = epoch + 1
        workers = self._python and self.num_workers > 0
        if workers:
            self._start_workers(epoch)
        self._loader.start_epoch(epoch)
        if workers:
            self._fetch.pool.set_order(self._loader.order())  # what the workers may fetch ahead
        try:
            while True:
                batch = self._loader.next()
                if batch is None:
                    return
                yield _unflatten(self._fetch.spec, batch) if self._python else batch
        finally:
            # The epoch ended, broke off or failed: non-persistent workers end with it, as PyTorch's.
            if workers and not self.persistent_workers:
                self._stop_workers()


def _check_worker_args(num_workers, worker_init_fn, persistent_workers, timeout, prefetch_factor):
    """DataLoader's worker arguments, checked as PyTorch checks them; returns the prefetch factor."""
    if isinstance(num_workers, bool) or not isinstance(num_workers, int):
        raise TypeError(f"DataLoader(): argument 'num_workers' must be an int, not {type(num_workers).__name__}")
    if num_workers < 0:
        raise _core.ValueError(f"DataLoader(): num_workers={num_workers} must be >= 0 (0: no worker processes)")
    if persistent_workers and num_workers == 0:
        raise _core.ValueError("DataLoader(): persistent_workers=True needs num_workers > 0")
    if prefetch_factor is not None and num_workers == 0:
        raise _core.ValueError("DataLoader(): prefetch_factor is for worker processes (num_workers > 0)")
    if worker_init_fn is not None and not callable(worker_init_fn):
        raise TypeError("DataLoader(): argument 'worker_init_fn' must be callable")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise _core.ValueError(f"DataLoader(): timeout={timeout!r} must be a number of seconds >= 0 (0: no limit)")
    factor = 2 if prefetch_factor is None else prefetch_factor
    if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
        raise _core.ValueError(f"DataLoader(): prefetch_factor={prefetch_factor!r} must be an int >= 1")
    return factor
