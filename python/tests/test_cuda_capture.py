"""dyngrad.cuda: captured training steps (cuda::CapturedStep) and the device queries.

On a build without CUDA, or a machine without a device, a step constructs (the C++ class checks only its
options there) and its run raises DeviceError; the GPU test compares a captured training loop with the same loop
run eagerly and skips without a device.
"""
import numpy as np
import pytest

import dyngrad as dg
import dyngrad.functional as F


def test_the_names_and_the_device_queries():
    assert dg.cuda.CapturedStep is dg.CapturedStep
    assert dg.cuda.is_available() == dg.cuda_is_available()
    assert dg.cuda.is_compiled() == dg.cuda_compiled()
    assert dg.cuda.device_count() == dg.cuda_device_count()


def test_without_a_device_run_is_a_device_error():
    if dg.cuda.is_available():
        pytest.skip("a CUDA device is present: test_captured_training_equals_eager covers the run")
    step = dg.cuda.CapturedStep(lambda x: (x * 2.0).sum())
    with pytest.raises(dg.DeviceError, match="CapturedStep::run"):
        step(dg.ones(3))
    with pytest.raises(dg.DeviceError):
        step.run(dg.ones(3))
    assert step.variants == 0 and step.last_graph_counts()["kernels"] == 0
    if not dg.cuda.is_compiled():
        with pytest.raises(dg.DeviceError):
            dg.cuda.synchronize()


def test_arguments_are_checked_in_every_build():
    with pytest.raises(TypeError, match="argument 'step'"):
        dg.cuda.CapturedStep(3)
    with pytest.raises(TypeError, match="argument 'guard_state'"):
        dg.cuda.CapturedStep(lambda x: x, guard_state=5)
    with pytest.raises(dg.ValueError, match="guard_replays = 2 needs guard_state"):
        dg.cuda.CapturedStep(lambda x: x, guard_replays=2)
    step = dg.cuda.CapturedStep(lambda x: x)
    with pytest.raises(TypeError, match=r"run\(\): argument 1 must be a dyngrad Tensor"):
        step.run(dg.ones(2), np.ones(2))

    @dg.cuda.captured_step
    def decorated(x):
        return x

    @dg.cuda.captured_step(guard_replays=1, guard_state=lambda: {})
    def guarded(x):
        return x

    assert isinstance(decorated, dg.cuda.CapturedStep) and isinstance(guarded, dg.cuda.CapturedStep)


def test_captured_training_equals_eager(cuda):
    """20 SGD steps of an MLP: captured (warm-up, capture, replays) and eager from the same weights and batches
    end at the same weights; the captured graph holds kernels; a second input shape is a second variant."""
    rng = np.random.default_rng()
    dg.manual_seed(int(rng.integers(1 << 30)))
    eager = dg.models.MLP((32, 64, 10)).to(cuda)
    captured = dg.models.MLP((32, 64, 10)).to(cuda)
    captured.load_state_dict(eager.state_dict())

    def make_step(model):
        opt = dg.optim.SGD(model.parameters(), lr=0.05)

        def step(x, y):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()
        return step

    eager_step, graph_step = make_step(eager), dg.cuda.CapturedStep(make_step(captured))
    batches = [(dg.tensor(rng.standard_normal((16, 32)).astype(np.float32), device=cuda),
                dg.tensor(rng.integers(0, 10, 16), device=cuda)) for _ in range(20)]
    for x, y in batches:
        a = eager_step(x, y)
        b = graph_step(x, y)
        np.testing.assert_allclose(b.cpu().numpy(), a.cpu().numpy(), rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(eager.named_parameters(), captured.parameters()):
        np.testing.assert_allclose(q.cpu().numpy(), p.cpu().numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    assert graph_step.variants == 1 and graph_step.last_graph_counts()["kernels"] > 0
    x8 = dg.tensor(rng.standard_normal((8, 32)).astype(np.float32), device=cuda)
    y8 = dg.tensor(rng.integers(0, 10, 8), device=cuda)
    for _ in range(3):
        graph_step(x8, y8)
    assert graph_step.variants == 2
    dg.cuda.synchronize(cuda)


def test_memory_functions_check_their_arguments_and_need_cuda():
    # The argument checks come first in every build; without CUDA the queries are DeviceErrors.
    for bad in (1.5, -0.1, "half", True):
        with pytest.raises(dg.ValueError, match="fraction must be a number from 0 to 1"):
            dg.cuda.set_per_process_memory_fraction(bad)
    for bad in (-1, 2.5, True):
        with pytest.raises(dg.ValueError, match="limit_bytes must be an int"):
            dg.cuda.set_memory_limit(bad)
    if dg.cuda.is_compiled():
        pytest.skip("a CUDA build: test_memory_functions_on_the_gpu covers the queries")
    for query in (dg.cuda.memory_allocated, dg.cuda.max_memory_allocated, dg.cuda.memory_reserved,
                  dg.cuda.reset_peak_memory_stats, dg.cuda.memory_limit):
        with pytest.raises(dg.DeviceError):
            query()
    with pytest.raises(dg.DeviceError):
        dg.cuda.set_memory_limit(1 << 20)


def test_memory_functions_on_the_gpu(cuda):
    before = dg.cuda.memory_allocated()
    dg.cuda.reset_peak_memory_stats()
    x = dg.ones((1 << 20,), device="cuda")  # 4 MiB of float32
    assert dg.cuda.memory_allocated() - before >= 4 << 20
    assert dg.cuda.max_memory_allocated() >= dg.cuda.memory_allocated()
    assert dg.cuda.memory_reserved() >= dg.cuda.memory_allocated()
    try:
        dg.cuda.set_memory_limit(dg.cuda.memory_allocated() + (1 << 20))
        with pytest.raises(dg.OutOfMemory, match="limit"):
            dg.ones((1 << 20,), device="cuda")
        dg.cuda.set_per_process_memory_fraction(1.0)
        assert dg.cuda.memory_limit() > 100 << 20
        y = dg.ones((1 << 20,), device="cuda")  # fits now
        assert y.shape == x.shape or tuple(y.shape) == tuple(x.shape)
    finally:
        dg.cuda.set_memory_limit(0)
    assert dg.cuda.memory_limit() == 0
