"""GPU tests: skipped visibly without a device; scripts/gpu-python.sh runs them on the lent GPU."""
import numpy as np
import pytest

import dyngrad as dg
import dyngrad.functional as F

pytestmark = pytest.mark.usefixtures("cuda")


def test_cuda_training_step_matches_cpu(rng):
    dg.manual_seed(2)
    cpu_model = dg.models.make_model("lenet5")
    gpu_model = dg.models.make_model("lenet5")
    gpu_model.load_state_dict(cpu_model.state_dict())
    gpu_model.to("cuda")
    x = rng.standard_normal((8, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, 8)
    for model, device in ((cpu_model, "cpu"), (gpu_model, "cuda")):
        F.cross_entropy(model(dg.tensor(x, device=device)), dg.tensor(y, device=device)).backward()
    for (name, p), (_, q) in zip(cpu_model.named_parameters(), gpu_model.named_parameters()):
        np.testing.assert_allclose(q.grad.cpu().numpy(), p.grad.numpy(), rtol=2e-3, atol=2e-4, err_msg=name)


def test_cuda_verify_replays_on_cpu(rng):
    dg.manual_seed(4)
    model = dg.models.make_model("simplecnn").to("cuda")
    x = dg.tensor(rng.standard_normal((4, 1, 28, 28)).astype(np.float32), device="cuda")
    y = dg.tensor(rng.integers(0, 10, 4), device="cuda")
    report = dg.verify(F.cross_entropy(model(x), y), tolerance=1e-3)
    assert report.passed, report.summary()


def test_captured_step_replays(rng):
    dg.manual_seed(5)
    model = dg.models.MLP((784, 64, 10)).to("cuda")
    opt = dg.optim.SGD(model.parameters(), lr=0.05)

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    captured = dg.CapturedStep(step)
    x = dg.tensor(rng.standard_normal((32, 1, 28, 28)).astype(np.float32), device="cuda")
    y = dg.tensor(rng.integers(0, 10, 32), device="cuda")
    losses = [captured.run(x, y).item() for _ in range(20)]
    assert captured.variants == 1 and losses[-1] < losses[0]


def test_custom_op_on_gpu_through_dlpack(torch, rng):
    double = dg.custom_op("py_double_gpu", 1, lambda x: 2 * x, lambda g, x: 2 * g,
                          cuda_forward=lambda x: torch.from_dlpack(x) * 2,
                          cuda_backward=lambda g, x: torch.from_dlpack(g) * 2)
    x = dg.tensor(rng.standard_normal(1000).astype(np.float32), device="cuda", requires_grad=True)
    y = double(x)
    y.sum().backward()
    np.testing.assert_allclose(y.cpu().numpy(), 2 * x.cpu().numpy(), rtol=1e-6)
    np.testing.assert_allclose(x.grad.cpu().numpy(), np.full(1000, 2.0))
    x2 = dg.tensor(rng.standard_normal(64).astype(np.float32), device="cuda", requires_grad=True)
    assert dg.verify(double(x2 * 1.5).sum()).passed


def test_device_mismatch_is_a_device_error():
    with pytest.raises(dg.DeviceError):
        dg.ones(3, device="cuda") + dg.ones(3)
    with pytest.raises(dg.DeviceError):
        dg.ones(3, device="cuda").numpy()
    np.testing.assert_array_equal(np.asarray(dg.ones(3, device="cuda")), np.ones(3, dtype=np.float32))


def test_masks_inplace_and_printing_on_gpu(rng):
    # issue 29 on a device: the mask's count is read on the host (a sync), in-place writes stay on the device
    x = rng.standard_normal((3, 4))
    t = dg.tensor(x, device="cuda", requires_grad=True)
    picked = t[t > 0]
    np.testing.assert_array_equal(picked.cpu().numpy(), x[x > 0])
    picked.sum().backward()
    np.testing.assert_array_equal(t.grad.cpu().numpy(), (x > 0).astype(float))
    u = dg.tensor(x, device="cuda")
    u[u < 0] = 0.0
    u += 1
    u.mul_(dg.tensor(np.full(4, 2.0), device="cuda"))
    np.testing.assert_allclose(u.cpu().numpy(), (np.maximum(x, 0) + 1) * 2, rtol=1e-12)
    assert u.device == "cuda:0"
    assert repr(dg.tensor([1.0, 2.0], device="cuda")) == "tensor([1., 2.], device='cuda:0')"

    def step(a):
        return a[a > 0].sum().detach()  # a data-dependent count cannot be captured

    captured, a = dg.CapturedStep(step), dg.tensor(x.astype(np.float32), device="cuda")
    captured.run(a)  # the first run of a shape is the eager warm-up: allowed
    with pytest.raises(dg.GraphError, match="captured CUDA step"):
        captured.run(a)  # the second captures it
