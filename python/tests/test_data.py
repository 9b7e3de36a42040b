"""dyngrad.data.DataLoader over Python data sets (the Dataset protocol) through the C++ loader."""
import gc
import threading
import time

import numpy as np
import pytest

import dyngrad as dg
from dyngrad.data import DataLoader, Dataset, TensorDataset, default_collate


class Squares(Dataset):
    """Sample i: (features (3,) float32 = i, i+1, i+2; label i; {"square": float i*i})."""

    def __init__(self, n):
        self.n = n
        self.calls = 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.calls += 1
        return np.arange(i, i + 3, dtype=np.float32), i, {"square": float(i * i)}


def indices_of(loader):
    return [int(v) for batch in loader for v in batch[1].numpy()]


@pytest.mark.parametrize("prefetch", [0, 2])
def test_batches_collate_fields_and_keep_structure(prefetch):
    loader = DataLoader(Squares(10), batch_size=4, shuffle=False, prefetch=prefetch)
    batches = list(loader)
    assert len(loader) == 3 and [b[1].shape for b in batches] == [(4,), (4,), (2,)]
    features, labels, extra = batches[0]
    assert isinstance(batches[0], tuple) and isinstance(extra, dict)
    assert features.shape == (4, 3) and features.dtype == dg.float32
    assert labels.dtype == dg.int64 and extra["square"].dtype == dg.float32
    np.testing.assert_array_equal(features.numpy(), np.arange(4)[:, None] + np.arange(3)[None, :])
    np.testing.assert_array_equal(extra["square"].numpy(), np.arange(4) ** 2)
    assert indices_of(loader) == list(range(10))


def test_shuffle_is_seeded_and_matches_the_tensor_loader():
    n = 23
    a = indices_of(DataLoader(Squares(n), batch_size=5, shuffle=True, seed=11))
    b = indices_of(DataLoader(Squares(n), batch_size=5, shuffle=True, seed=11))
    c = indices_of(DataLoader(Squares(n), batch_size=5, shuffle=True, seed=12))
    assert a == b and sorted(a) == list(range(n)) and a != c and a != list(range(n))
    reference = DataLoader(TensorDataset(dg.arange(n, dtype=dg.int64), dg.arange(n, dtype=dg.int64)), batch_size=5,
                           shuffle=True, seed=11)
    assert a == [int(v) for batch in reference for v in batch[1].numpy()]


def test_each_epoch_has_its_own_order_and_set_epoch_replays_one():
    loader = DataLoader(Squares(16), batch_size=4, shuffle=True, seed=3)
    first, second = indices_of(loader), indices_of(loader)
    assert first != second and sorted(first) == sorted(second) == list(range(16))
    loader.set_epoch(0)
    assert indices_of(loader) == first


def test_drop_last_and_shards():
    loader = DataLoader(Squares(10), batch_size=4, shuffle=False, drop_last=True)
    assert len(loader) == 2 and indices_of(loader) == list(range(8))
    shards = [indices_of(DataLoader(Squares(11), batch_size=3, shuffle=True, seed=5, num_shards=3, shard=s))
              for s in range(3)]
    assert sorted(sum(shards, [])) == list(range(11)) and all(shards)


def test_collate_fn_and_tensors_in_samples():
    class Pairs:
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return dg.full((2, 2), float(i)), np.int64(i)

    def collate(samples):
        return {"sum": np.stack([s[0].numpy().sum() for s in samples]).astype(np.float64),
                "ids": [int(s[1]) for s in samples]}

    batches = list(DataLoader(Pairs(), batch_size=4, shuffle=False, collate_fn=collate))
    assert batches[0]["sum"].dtype == dg.float64
    np.testing.assert_array_equal(batches[0]["sum"].numpy(), [0, 4, 8, 12])
    np.testing.assert_array_equal(batches[1]["ids"].numpy(), [4, 5])
    plain = list(DataLoader(Pairs(), batch_size=3, shuffle=False))
    assert plain[0][0].shape == (3, 2, 2) and plain[1][1].numpy().tolist() == [3, 4, 5]


def test_default_collate_directly():
    batch = default_collate([(1.5, [1, 2]), (2.5, [3, 4])])
    assert batch[0].dtype == dg.float32 and batch[1][0].numpy().tolist() == [1, 3]


def test_an_error_in_getitem_reaches_the_caller_unchanged():
    class Broken(Squares):
        def __getitem__(self, i):
            if i == 5:
                raise KeyError("sample 5 is missing")
            return super().__getitem__(i)

    for prefetch in (0, 2):
        with pytest.raises(KeyError, match="sample 5 is missing"):
            list(DataLoader(Broken(8), batch_size=2, shuffle=False, prefetch=prefetch))


BAD = [
    (dg.ShapeError, lambda: [np.zeros(2), np.zeros(3)]),
    (TypeError, lambda: ["a", "b"]),
    (dg.DTypeError, lambda: [np.array(["x"]), np.array(["y"])]),
    (dg.ValueError, lambda: [(1, 2), (1,)]),
    (dg.ValueError, lambda: [{"a": 1}, {"b": 1}]),
]


@pytest.mark.parametrize("error,samples", BAD)
def test_bad_samples_raise_typed_errors(error, samples):
    items = samples()

    class Bad:
        def __len__(self):
            return len(items)

        def __getitem__(self, i):
            return items[i]

    with pytest.raises(error):
        list(DataLoader(Bad(), batch_size=2, shuffle=False))


def test_not_a_dataset_or_bad_options():
    with pytest.raises(TypeError):
        DataLoader(object())
    with pytest.raises(TypeError):
        DataLoader(Squares(3), collate_fn=3)
    with pytest.raises(dg.ValueError):
        DataLoader(Squares(3), batch_size=0)
    with pytest.raises(dg.DeviceError):
        DataLoader(Squares(3), device="tpu")


def test_dropping_a_loader_mid_epoch_stops_its_worker():
    """The worker waits for the GIL inside __getitem__ while the loader is dropped: no deadlock, no crash."""
    started = threading.active_count()

    class Slow(Squares):
        def __getitem__(self, i):
            time.sleep(0.002)
            return super().__getitem__(i)

    for _ in range(5):
        loader = DataLoader(Slow(200), batch_size=4, prefetch=3)
        it = iter(loader)
        next(it)
        del it, loader
        gc.collect()
    closed = DataLoader(Squares(4), batch_size=2)
    closed.close()
    with pytest.raises(dg.ValueError):
        list(closed)
    assert threading.active_count() == started


def test_a_training_loop_over_a_python_dataset():
    rng = np.random.default_rng(0)
    w_true = rng.standard_normal(4).astype(np.float32)

    class Regression:
        def __init__(self):
            self.x = rng.standard_normal((256, 4)).astype(np.float32)

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return self.x[i], np.float32(self.x[i] @ w_true)

    dg.manual_seed(0)
    model = dg.nn.Linear(4, 1)
    optimizer = dg.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(5):
        for x, y in DataLoader(Regression(), batch_size=32, shuffle=True, seed=1):
            loss = dg.functional.mse_loss(model(x).reshape(-1), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    assert losses[-1] < 0.01 * losses[0]


def test_batches_reach_the_gpu(cuda):
    loader = DataLoader(Squares(9), batch_size=4, shuffle=False, device=cuda, pin_memory=True)
    batches = list(loader)
    assert all(str(b[0].device) == cuda for b in batches)
    np.testing.assert_array_equal(batches[2][1].cpu().numpy(), [8])
