"""DataLoader worker processes (``DataLoader(..., num_workers=N)``): a Python data set's ``__getitem__`` and
collate run in N processes, so Python-heavy samples do not hold the training process's GIL.

How it fits the C++ loader (nn/dataset.h, which keeps the order, shuffling, sharding and device copies): the
loader asks for batch k's samples through data._Fetch(indices), in batch order, on the caller's thread (its own
prefetch thread is off with workers: the workers prefetch). The pool knows the epoch's order (the loader's
order()), so it sends batch k, k+1, ... ahead to worker k mod N (up to prefetch_factor * N batches in flight, as
PyTorch's), and the fetch waits for batch k's result: batches come in sampler order whichever worker finishes
first. A worker returns the collated batch as NumPy arrays (pickled
through a multiprocessing queue) and the main process makes them tensors. Errors are re-raised in the main
process with the worker's traceback and the index of the sample that failed.

Start method: "forkserver" where the platform has it, else "spawn" (``multiprocessing_context`` overrides). Not
"fork" by default, as PyTorch on Linux has: the parent runs threads (the C++ loader's prefetch thread, the CPU
kernels' pool) whose locks a forked child would inherit held. So the data set and collate_fn are pickled to the
workers (dyngrad tensors pickle as copies of their data), and a script needs ``if __name__ == "__main__":``.
"""
from __future__ import annotations

import os
import pickle
import queue
import random
import threading
import time
import traceback
from typing import Any, NamedTuple

import numpy as np

from . import _core

_POLL_SECONDS = 0.1  # how often a waiting fetch checks for cancellation and dead workers


class WorkerInfo(NamedTuple):
    """What get_worker_info() returns inside a worker process (None in the main process)."""
    id: int
    num_workers: int
    seed: int
    dataset: Any


_worker_info: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    return _worker_info


# ---- dyngrad tensors cross process boundaries as copies of their data (a data set holding tensors) ----
def _rebuild_tensor(array, dtype_name, requires_grad):
    from . import tensor
    t = tensor(array)
    if dtype_name in ("bfloat16", "float16"):
        t = t.to(getattr(_core, dtype_name))
    if requires_grad:
        t.requires_grad = True
    return t


def _reduce_tensor(t):
    name = str(t.dtype).split(".")[-1]
    data = t.detach().cpu()
    if name in ("bfloat16", "float16"):
        data = data.float()
    return _rebuild_tensor, (np.array(data.numpy()), name, bool(t.requires_grad and t.is_leaf))


_core.Tensor.__reduce__ = _reduce_tensor


# ---- the worker process ----
class _Failure:
    """A worker's exception, picklable whatever the exception object is."""

    def __init__(self, exc: BaseException, worker: int, index):
        self.type_name = type(exc).__name__
        try:
            self.type = pickle.loads(pickle.dumps(type(exc)))
        except Exception:  # a class pickle cannot name (local to a function)
            self.type = None
        self.message = str(exc)
        self.traceback = traceback.format_exc()
        self.worker = worker
        self.index = index

    def exception(self, batch: int) -> BaseException:
        where = f"sample {self.index} (batch {batch})" if self.index is not None else f"batch {batch} (collate)"
        text = (f"Caught {self.type_name} in DataLoader worker process {self.worker} while fetching {where}: "
                f"{self.message}\nOriginal traceback in the worker:\n{self.traceback}")
        if self.type is not None:
            try:
                return self.type(text)
            except Exception:
                pass
        return RuntimeError(text)


def _to_arrays(leaves):
    out = []
    for t in leaves:
        name = str(t.dtype).split(".")[-1]
        if name in ("bfloat16", "float16"):  # NumPy has no bfloat16: float32 on the way, the dtype restored after
            out.append((np.array(t.float().numpy()), name))
        else:
            out.append((np.array(t.numpy()), None))
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else (the pid was reused)
        return False
    return True


def _worker_loop(dataset, collate, worker_id, num_workers, seed, init_fn, index_queue, result_queue, parent_pid):
    global _worker_info
    start_ppid = os.getppid()  # the main process under fork/spawn, the forkserver under forkserver
    from . import data, manual_seed
    _worker_info = WorkerInfo(worker_id, num_workers, seed, dataset)
    random.seed(seed)
    manual_seed(seed)
    try:
        if init_fn is not None:
            init_fn(worker_id)
    except Exception as e:  # every batch sent to this worker reports it
        init_failure = _Failure(e, worker_id, None)
        init_failure.message = f"worker_init_fn({worker_id}) failed: {init_failure.message}"
    else:
        init_failure = None
    while True:
        try:
            task = index_queue.get(timeout=1.0)
        except queue.Empty:
            if not _alive(parent_pid) or os.getppid() != start_ppid:  # the main process (or forkserver) is gone
                break
            continue
        if task is None:
            break
        generation, batch, indices = task
        if init_failure is not None:
            result_queue.put((generation, batch, False, init_failure))
            continue
        index = None
        try:
            samples = []
            for index in indices:
                samples.append(dataset[index])
            index = None
            leaves = []
            spec = data._flatten((collate or data.default_collate)(samples), leaves)
            result = (spec, _to_arrays(leaves))
            ok = True
        except Exception as e:
            result, ok = _Failure(e, worker_id, index), False
        del samples
        result_queue.put((generation, batch, ok, result))
    # Results nobody will read must not keep this process from exiting (its queue's feeder thread would wait
    # for the pipe to drain).
    result_queue.cancel_join_thread()


# ---- the main process's side ----
class _Cancelled(Exception):
    """The epoch this fetch belonged to was abandoned (break, a new epoch, close())."""


class WorkerPool:
    def __init__(self, dataset, collate, num_workers: int, batch_size: int, worker_init_fn, context, timeout: float,
                 prefetch_factor: int, seed: int):
        import multiprocessing as mp
        if context is None:
            context = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        ctx = mp.get_context(context) if isinstance(context, str) else context
        self.num_workers = num_workers
        self.batch_size = batch_size
        self.timeout = timeout
        self.ahead = prefetch_factor * num_workers
        self._lock = threading.Lock()
        self._generation = 0
        self._closed = False
        self._order = None
        self._next_batch = 0
        self._sent = 0
        self._results = {}
        self._result_queue = ctx.Queue()
        self._index_queues = []
        self._workers = []
        for w in range(num_workers):
            q = ctx.Queue()
            p = ctx.Process(target=_worker_loop, daemon=True, name=f"dyngrad DataLoader worker {w}",
                            args=(dataset, collate, w, num_workers, seed + w, worker_init_fn, q, self._result_queue,
                                  os.getpid()))
            self._index_queues.append(q)
            try:
                p.start()  # forkserver and spawn pickle the data set, collate_fn and worker_init_fn here
            except (pickle.PicklingError, TypeError, AttributeError) as e:
                self.shutdown()
                raise TypeError(f"DataLoader(num_workers={num_workers}): the data set, collate_fn and worker_init_fn "
                                f"are sent to the worker processes by pickle ({ctx.get_start_method()} start method), "
                                f"which failed: {e}. Define them at module level (not in a function, no lambdas), "
                                "or pass multiprocessing_context='fork'") from e
            self._workers.append(p)

    def begin_epoch(self):
        """Abandons the current epoch's batches (a fetch waiting for one raises _Cancelled); the next fetch starts
        a new epoch from batch 0."""
        with self._lock:
            self._generation += 1
            self._order = None
            self._next_batch = 0
            self._sent = 0
            self._results.clear()

    def set_order(self, order):
        """The epoch's sample order (the C++ loader's order(), known once it started the epoch): batches are
        sent ahead from it. Until then each fetch sends only its own batch."""
        with self._lock:
            self._order = list(order)

    def _send(self, k, indices):
        self._index_queues[k % self.num_workers].put((self._generation, k, list(indices)))
        self._sent = k + 1

    def fetch(self, indices):
        """Batch ``indices`` (the loader's next batch, in order): (spec, arrays) from its worker."""
        with self._lock:
            if self._closed:
                raise _Cancelled()
            generation = self._generation
            k = self._next_batch
            self._next_batch += 1
            if self._order is not None:
                if list(indices) != self._order[k * self.batch_size:(k + 1) * self.batch_size]:
                    raise _core.Error(f"DataLoader: batch {k}'s indices differ from the epoch's order (internal "
                                      "error)")
                n = (len(self._order) + self.batch_size - 1) // self.batch_size
                while self._sent < min(k + 1 + self.ahead, n):
                    j = self._sent
                    self._send(j, self._order[j * self.batch_size:(j + 1) * self.batch_size])
            elif k == self._sent:
                self._send(k, indices)
            worker = k % self.num_workers
        start = time.monotonic()
        while True:
            with self._lock:
                if self._generation != generation or self._closed:
                    raise _Cancelled()
                if k in self._results:
                    ok, result = self._results.pop(k)
                    break
            try:
                got_generation, batch, ok, result = self._result_queue.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                self._check_alive(k, worker, start)
                continue
            with self._lock:
                if got_generation == self._generation:
                    self._results[batch] = (ok, result)
        if not ok:
            raise result.exception(k)
        return result

    def _check_alive(self, k, worker, start):
        # Any dead worker ends the wait, not only the one owing batch k: a worker that dies while its queue feeder
        # holds the shared result queue's lock leaves the others blocked on that lock for good, so batch k would
        # never come either (a CI run hung so: after worker 0's os._exit the live worker sat in SemLock.acquire).
        for i, dead in enumerate(self._workers):
            if not dead.is_alive():
                raise RuntimeError(f"DataLoader worker process {i} (pid {dead.pid}) exited unexpectedly with exit "
                                   f"code {dead.exitcode} while batch {k} was pending")
        p = self._workers[worker]
        if self.timeout > 0 and time.monotonic() - start > self.timeout:
            raise RuntimeError(f"DataLoader timed out after {self.timeout} s waiting for batch {k} from worker "
                               f"process {worker} (pid {p.pid})")

    def shutdown(self):
        """Stops the workers (a waiting fetch raises _Cancelled); safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._generation += 1
        for q in self._index_queues:
            try:
                q.put(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 5.0
        for p in self._workers:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():  # busy in a long __getitem__, or stuck: stopped by signal
                p.terminate()
                p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join()
        for q in self._index_queues + [self._result_queue]:
            q.cancel_join_thread()  # a feeder thread with unread items must not block exit
            q.close()


def to_leaves(result):
    """A worker's (spec, arrays) as the spec and CPU tensors."""
    spec, arrays = result
    leaves = []
    for array, dtype_name in arrays:
        t = _core._from_numpy_copy(np.ascontiguousarray(array), None)
        leaves.append(t.to(getattr(_core, dtype_name)) if dtype_name else t)
    return spec, leaves
