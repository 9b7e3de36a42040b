"""DataLoader(num_workers=N): a Python data set's samples are fetched and collated in worker processes.

Nothing here measures time (the machine is shared): the checks are that the batches are exactly those of
num_workers=0, in sampler order; that the samples really came from other processes (their pids); errors,
worker_init_fn, get_worker_info, persistent workers, and that the workers stop on break and close().
The data sets are module-level classes: worker processes are started by forkserver/spawn and unpickle them.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import dyngrad as dg
from dyngrad.data import DataLoader, Dataset, get_worker_info


def burn(i: int) -> list:
    """Pure-Python CPU work (holds the GIL): a few values of a small recurrence seeded by i."""
    a, b = i + 1, 7
    for _ in range(20000):
        a, b = (a * 1103515245 + b) % 2147483647, (b * 16807 + a) % 2147483647
    return [a / 2147483647.0, b / 2147483647.0, float(i)]


class Burner(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": np.array(burn(i)), "label": i, "pid": os.getpid()}


class Failing(Burner):
    def __getitem__(self, i):
        if i == 7:
            raise KeyError(f"no sample numbered {i}")
        return super().__getitem__(i)


class WhoAmI(Dataset):
    """Sample i: (i, the worker's id as get_worker_info() has it, the value worker_init_fn set)."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        info = get_worker_info()
        return i, -1 if info is None else info.id, MARK.get("value", -1)


MARK = {}


def init_worker(worker_id):
    MARK["value"] = 100 + worker_id


def failing_init(worker_id):
    raise RuntimeError("cannot open the shard")


def epoch(loader):
    return [{k: v.numpy().copy() for k, v in batch.items()} for batch in loader]


@pytest.mark.parametrize("context", [None, "spawn"])  # None: forkserver here (spawn where there is none)
def test_two_workers_give_the_batches_of_none_in_sampler_order(context):
    dataset = Burner(22)
    reference = epoch(DataLoader(dataset, batch_size=3, shuffle=True, seed=5, num_workers=0))
    loader = DataLoader(dataset, batch_size=3, shuffle=True, seed=5, num_workers=2, multiprocessing_context=context)
    batches = epoch(loader)
    assert len(batches) == len(reference) == 8
    for k, (got, want) in enumerate(zip(batches, reference)):
        np.testing.assert_array_equal(got["label"], want["label"], err_msg=f"batch {k}")
        np.testing.assert_array_equal(got["x"], want["x"], err_msg=f"batch {k}")
        assert got["x"].dtype == want["x"].dtype == np.float64 and got["label"].dtype == np.int64
        # The values are the data set's, computed here independently.
        np.testing.assert_array_equal(got["x"], np.array([burn(int(i)) for i in got["label"]]))
    # Sampler order: the epoch permutation, whichever worker finished first.
    order = [int(i) for b in batches for i in b["label"]]
    assert sorted(order) == list(range(22)) and order != list(range(22))
    # Batch k came from worker k mod 2: two processes, neither of them this one.
    pids = [set(b["pid"].tolist()) for b in batches]
    assert all(len(p) == 1 for p in pids)
    workers = {next(iter(p)) for p in pids}
    assert len(workers) == 2 and os.getpid() not in workers
    assert all(pids[k] == pids[k % 2] for k in range(len(pids)))
    assert loader._fetch.pool is None  # not persistent: the workers ended with the epoch


def test_an_error_in_a_worker_names_the_index_and_keeps_the_traceback():
    loader = DataLoader(Failing(12), batch_size=4, shuffle=False, num_workers=2)
    seen = []
    with pytest.raises(KeyError) as info:
        for batch in loader:
            seen.append(batch["label"].numpy().tolist())
    text = str(info.value)
    assert "DataLoader worker process 1" in text and "sample 7 (batch 1)" in text
    assert "no sample numbered 7" in text and "in __getitem__" in text and "raise KeyError" in text
    assert seen == [[0, 1, 2, 3]]
    assert loader._fetch.pool is None
    # The loader is usable again: the next epoch starts fresh workers (and fails at the same sample).
    with pytest.raises(KeyError, match="sample 7"):
        list(loader)


def test_worker_init_fn_and_get_worker_info():
    batches = list(DataLoader(WhoAmI(), batch_size=3, shuffle=False, num_workers=2, worker_init_fn=init_worker))
    for k, (index, worker, value) in enumerate(batches):
        assert index.numpy().tolist() == [3 * k, 3 * k + 1, 3 * k + 2]
        assert worker.numpy().tolist() == [k % 2] * 3 and value.numpy().tolist() == [100 + k % 2] * 3
    assert get_worker_info() is None and "value" not in MARK  # the main process is untouched
    with pytest.raises(RuntimeError, match=r"worker_init_fn\(0\) failed: cannot open the shard"):
        list(DataLoader(WhoAmI(), batch_size=3, shuffle=False, num_workers=2, worker_init_fn=failing_init))


def test_persistent_workers_live_across_epochs_until_close():
    loader = DataLoader(Burner(8), batch_size=2, shuffle=True, seed=1, num_workers=2, persistent_workers=True)
    first, second = epoch(loader), epoch(loader)
    pids = {int(b["pid"][0]) for b in first + second}
    assert len(pids) == 2  # the same two processes served both epochs
    reference = DataLoader(Burner(8), batch_size=2, shuffle=True, seed=1)
    for got, want in zip(first + second, epoch(reference) + epoch(reference)):
        np.testing.assert_array_equal(got["label"], want["label"])
    processes = loader._fetch.pool._workers
    loader.close()
    assert loader._fetch.pool is None and not any(p.is_alive() for p in processes)


def test_break_stops_the_workers_and_the_next_epoch_starts_clean():
    loader = DataLoader(Burner(40), batch_size=2, shuffle=False, num_workers=2, prefetch_factor=4)
    for batch in loader:
        pool = loader._fetch.pool
        processes = list(pool._workers)
        break
    assert loader._fetch.pool is None and not any(p.is_alive() for p in processes)
    labels = [int(i) for b in epoch(loader) for i in b["label"]]
    assert labels == list(range(40))


def test_tensors_and_16_bit_dtypes_cross_the_process_boundary():
    class_data = TensorSamples()
    for got, want in zip(list(DataLoader(class_data, batch_size=2, shuffle=False, num_workers=2,
                                         collate_fn=stack_fields)),
                         list(DataLoader(class_data, batch_size=2, shuffle=False, collate_fn=stack_fields))):
        assert got[1].dtype == want[1].dtype == dg.bfloat16
        np.testing.assert_array_equal(got[0].numpy(), want[0].numpy())
        np.testing.assert_array_equal(got[1].float().numpy(), want[1].float().numpy())


def stack_fields(samples):
    """A collate_fn (module level: pickled to the workers) that stacks tensors of any dtype, bfloat16 included."""
    return tuple(dg.stack([s[k] for s in samples]) for k in range(len(samples[0])))


class TensorSamples(Dataset):
    """Holds dyngrad tensors (pickled to the workers as copies) and yields bfloat16 ones."""

    def __init__(self):
        self.data = dg.arange(12, dtype=dg.float32).reshape(6, 2) / 3

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return self.data[i], self.data[i].bfloat16()


@pytest.mark.parametrize("kwargs, error, match", [
    ({"num_workers": -1}, dg.ValueError, ">= 0"),
    ({"num_workers": 1.5}, TypeError, "num_workers"),
    ({"persistent_workers": True}, dg.ValueError, "num_workers > 0"),
    ({"prefetch_factor": 2}, dg.ValueError, "num_workers > 0"),
    ({"num_workers": 1, "prefetch_factor": 0}, dg.ValueError, "prefetch_factor"),
    ({"num_workers": 1, "timeout": -1}, dg.ValueError, "timeout"),
    ({"num_workers": 1, "worker_init_fn": 3}, TypeError, "worker_init_fn"),
])
def test_bad_worker_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        DataLoader(Burner(4), batch_size=2, **kwargs)


def test_a_dropped_loader_stops_its_persistent_workers():
    import gc
    loader = DataLoader(Burner(8), batch_size=2, shuffle=False, num_workers=2, persistent_workers=True)
    it = iter(loader)
    next(it)
    processes = list(loader._fetch.pool._workers)
    del it, loader
    gc.collect()
    assert not any(p.is_alive() for p in processes)


class Dying(Burner):
    def __getitem__(self, i):
        if i == 5:
            os._exit(3)  # a crash in native code looks the same to the main process
        return super().__getitem__(i)


class Stuck(Burner):
    def __getitem__(self, i):
        if i == 0:  # batch 0: the timeout covers the worker's start too, whatever it costs on a loaded machine
            import time
            time.sleep(600)
        return super().__getitem__(i)


def test_a_dead_worker_or_a_timeout_is_an_error_not_a_hang():
    with pytest.raises(RuntimeError, match=r"worker process 0 \(pid \d+\) exited unexpectedly with exit code 3"):
        list(DataLoader(Dying(8), batch_size=2, shuffle=False, num_workers=2))
    loader = DataLoader(Stuck(8), batch_size=2, shuffle=False, num_workers=2, timeout=1)
    with pytest.raises(RuntimeError, match=r"timed out after 1.0 s waiting for batch 0 from worker process 0"):
        list(loader)
    assert loader._fetch.pool is None  # the stuck worker was stopped


def test_a_data_set_that_cannot_be_pickled_is_a_type_error_saying_so():
    class Local(Burner):  # defined in a function: pickle cannot name it
        pass

    loader = DataLoader(Local(4), batch_size=2, shuffle=False, num_workers=2)
    with pytest.raises(TypeError, match="sent to the worker processes by pickle"):
        list(loader)
    assert loader._fetch.pool is None
    assert [int(i) for b in DataLoader(Local(4), batch_size=2, shuffle=False) for i in b["label"]] == [0, 1, 2, 3]
