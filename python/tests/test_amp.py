"""Mixed precision from Python: bf16/f16 dtypes and casts, dg.autocast (AutocastGuard), dg.amp.GradScaler
(nn/optim.h), against NumPy roundings and PyTorch's loss-scaling rules written out."""
import numpy as np
import pytest

import dyngrad as dg
from dyngrad import nn
import dyngrad.functional as F


def to_bf16(a):
    """float32 -> bfloat16 (round to nearest even), returned as float32."""
    bits = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def test_reduced_dtypes_and_tensor_casts(rng):
    a = rng.standard_normal((3, 5)).astype(np.float32) * 100
    x = dg.tensor(a)
    assert dg.half is dg.float16 and str(dg.bfloat16) and x.half().dtype == dg.float16
    np.testing.assert_array_equal(x.half().float().numpy(), a.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(x.bfloat16().float().numpy(), to_bf16(a))
    assert x.bfloat16().dtype == dg.bfloat16 and x.to(dg.float16).dtype == dg.float16 and x.to("bfloat16").dtype == dg.bfloat16
    t = dg.tensor(a.astype(np.float64), dtype=dg.bfloat16)  # float32-exact data: one rounding
    assert t.dtype == dg.bfloat16
    np.testing.assert_array_equal(t.float().numpy(), to_bf16(a))
    with pytest.raises(dg.DTypeError):
        dg.tensor([1.0], dtype="bfloat17")


def test_tensor_casts_are_differentiable(rng):
    a = rng.standard_normal(6)
    x = dg.tensor(a, requires_grad=True)
    h = x.half()
    assert h.dtype == dg.float16 and h.requires_grad and not h.is_leaf
    (h.float() * h.bfloat16().float()).sum().backward()
    # d/dh of h·bf16(h) with h = f16(x): each cast's gradient is converted back to its input's dtype (as
    # PyTorch's), so the path through bf16 gives bf16(h) and the other bf16(h) too: 2·bf16(f16(x)), exact.
    expected = 2 * to_bf16(a.astype(np.float16).astype(np.float32)).astype(np.float64)
    assert x.grad.dtype == dg.float64
    np.testing.assert_array_equal(x.grad.numpy(), expected)
    assert dg.ones(2, dtype=dg.int64).float().dtype == dg.float32 and dg.ones(2).double().dtype == dg.float64


def test_module_casts_keep_parameter_identity(rng):
    dg.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm2d(3))
    weight = model[0].weight
    opt = dg.optim.SGD(model.parameters(), lr=0.1)
    assert model.bfloat16() is model
    assert weight.dtype == dg.bfloat16 and model[1].running_mean.dtype == dg.bfloat16
    assert opt.param_groups[0]["params"][0] is weight
    model.half()
    assert all(p.dtype == dg.float16 for p in model.parameters())
    model.float()
    assert all(t.dtype == dg.float32 for t in model.state_dict().values())
    model.double()
    assert weight.dtype == dg.float64


def test_autocast_runs_products_in_bf16_and_the_loss_in_f32(rng):
    dg.manual_seed(int(rng.integers(1 << 30)))
    layer = nn.Linear(8, 5)
    x = dg.tensor(rng.standard_normal((4, 8)).astype(np.float32))
    labels = dg.tensor(rng.integers(0, 5, 4))
    assert dg.amp.get_autocast_dtype() is None
    with dg.autocast("cpu", dtype=dg.bfloat16):
        assert dg.amp.get_autocast_dtype() == dg.bfloat16 and dg.amp.is_autocast_enabled()
        y = layer(x)
        loss = F.cross_entropy(y, labels)
        with dg.autocast("cpu", enabled=False):
            assert layer(x).dtype == dg.float32
        assert layer(x).dtype == dg.bfloat16
    assert dg.amp.get_autocast_dtype() is None
    assert y.dtype == dg.bfloat16 and loss.dtype == dg.float32
    w, b = layer.weight.detach().numpy(), layer.bias.detach().numpy()
    # Inputs rounded to bf16, f32 products, the output rounded once to bf16.
    ref = to_bf16(to_bf16(x.numpy()) @ to_bf16(w).T + to_bf16(b))
    np.testing.assert_allclose(y.float().numpy(), ref, rtol=2 ** -7, atol=1e-6)
    loss.backward()
    assert layer.weight.grad.dtype == dg.float32 and layer.bias.grad.dtype == dg.float32
    assert layer(x).dtype == dg.float32


def _train_under_autocast(seed, keep, steps=3):
    """AdamW steps of a two-layer model under bf16 autocast, with or without kept parameter copies."""
    dg.amp.set_autocast_parameter_copies(keep)
    try:
        dg.manual_seed(seed)
        model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
        opt = dg.optim.AdamW(model.parameters(), lr=0.01)
        gen = np.random.default_rng(seed)
        x = dg.tensor(gen.standard_normal((5, 6)).astype(np.float32))
        y = dg.tensor(gen.standard_normal((5, 3)).astype(np.float32))
        losses, copies_used = [], 0
        for _ in range(steps):
            opt.zero_grad()
            with dg.autocast("cpu", dtype=dg.bfloat16):
                loss = F.mse_loss(model(x).float(), y)
                copies_used += dg._core._autocast_cache_stats()["copies_used"]
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, [p.detach().numpy().copy() for p in model.parameters()], copies_used
    finally:
        dg.amp.set_autocast_parameter_copies(True)


def test_kept_parameter_copies_train_the_same_bits(rng):
    # A deliberate difference from PyTorch (docs/mixed_precision.md): the optimizer rewrites each parameter's bf16
    # cast and the next forward reuses it; the results are those of casting afresh, bit for bit.
    seed = int(rng.integers(1 << 30))
    assert dg.amp.autocast_parameter_copies()
    fresh_losses, fresh, fresh_used = _train_under_autocast(seed, False)
    kept_losses, kept, kept_used = _train_under_autocast(seed, True)
    assert fresh_used == 0 and kept_used == 2 * 4  # steps 2 and 3 take the four parameters' copies
    assert kept_losses == fresh_losses
    for a, b in zip(kept, fresh):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError):
        dg.amp.set_autocast_parameter_copies(1)


def test_batched_gradient_casts_give_the_same_gradients(rng):
    # The parameters' bf16 gradients converted back to float32 together at the end of backward: the same bits as
    # each cast's own backward, and every .grad complete when backward returns.
    seed = int(rng.integers(1 << 30))
    assert dg.amp.batched_gradient_casts()

    def grads(batch):
        dg.amp.set_batched_gradient_casts(batch)
        try:
            dg.manual_seed(seed)
            model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
            x = dg.tensor(rng_of(seed).standard_normal((5, 6)).astype(np.float32))
            before = dg._core._batched_gradient_cast_stats()["casts"]
            with dg.autocast("cpu", dtype=dg.bfloat16):
                out = model(x).float()
                loss = (out * out).sum()
            loss.backward()
            batched = dg._core._batched_gradient_cast_stats()["casts"] - before
            return [p.grad.numpy().copy() for p in model.parameters()], batched
        finally:
            dg.amp.set_batched_gradient_casts(True)

    single, none_batched = grads(False)
    batched, four = grads(True)
    assert none_batched == 0 and four == 4
    for a, b in zip(batched, single):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError):
        dg.amp.set_batched_gradient_casts("yes")


def rng_of(seed):
    return np.random.default_rng(seed)


def test_autocast_arguments_and_decorator():
    with dg.autocast("cuda"):  # PyTorch's default for cuda: float16
        assert dg.amp.get_autocast_dtype() == dg.float16

    @dg.autocast("cpu")
    def inside():
        return dg.amp.get_autocast_dtype()

    assert inside() == dg.bfloat16 and dg.amp.get_autocast_dtype() is None
    with pytest.raises(dg.DTypeError):
        dg.autocast("cpu", dtype=dg.float64)
    with pytest.raises(dg.ValueError):
        dg.autocast("tpu")


def _sgd_problem(rng):
    w0 = rng.standard_normal(3).astype(np.float32)
    x = rng.standard_normal(3).astype(np.float32)
    w = dg.nn.Parameter(dg.tensor(w0))
    return w0, x, w, dg.optim.SGD([w], lr=0.1)


def test_grad_scaler_scales_unscales_and_steps(rng):
    w0, x, w, opt = _sgd_problem(rng)
    scaler = dg.amp.GradScaler(init_scale=1024.0, growth_interval=2)
    assert scaler.get_scale() == 1024.0 and scaler.is_enabled()
    loss = (w * dg.tensor(x)).sum()
    scaled = scaler.scale(loss)
    assert scaled.item() == pytest.approx(loss.item() * 1024.0, rel=1e-6)
    scaled.backward()
    np.testing.assert_allclose(w.grad.numpy(), 1024.0 * x, rtol=1e-6)
    scaler.step(opt)
    scaler.update()
    np.testing.assert_allclose(w.detach().numpy(), w0 - 0.1 * x, rtol=1e-6)  # the true gradient
    assert not scaler.last_step_skipped and scaler.get_scale() == 1024.0
    for _ in range(2):  # growth_interval clean steps: the scale doubles
        opt.zero_grad()
        scaler.scale((w * dg.tensor(x)).sum()).backward()
        scaler.unscale_(opt)
        np.testing.assert_allclose(w.grad.numpy(), x, rtol=1e-6)
        scaler.step(opt)
        scaler.update()
    assert scaler.get_scale() == 2048.0


def test_grad_scaler_skips_non_finite_steps_and_backs_off(rng):
    w0, x, w, opt = _sgd_problem(rng)
    scaler = dg.amp.GradScaler(init_scale=256.0)
    x[1] = np.inf
    scaler.scale((w * dg.tensor(x)).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.last_step_skipped and scaler.get_scale() == 128.0
    np.testing.assert_array_equal(w.detach().numpy(), w0)  # the step was skipped whole
    assert opt.state == {}


def test_grad_scaler_state_and_refusals(rng):
    scaler = dg.amp.GradScaler(init_scale=64.0, backoff_factor=0.25)
    w0, x, w, opt = _sgd_problem(rng)
    x[0] = np.nan
    scaler.scale((w * dg.tensor(x)).sum()).backward()
    scaler.step(opt)
    scaler.update()
    state = scaler.state_dict()
    fresh = dg.amp.GradScaler()
    fresh.load_state_dict(state)
    assert fresh.get_scale() == 16.0 and fresh.consecutive_skips == 1
    with pytest.raises(dg.ValueError, match="new_scale"):
        scaler.update(8.0)
    off = dg.amp.GradScaler(enabled=False)
    loss = (w * dg.tensor(np.ones(3, np.float32))).sum()
    assert off.scale(loss).item() == pytest.approx(loss.item()) and not off.is_enabled()
    with pytest.raises(dg.ValueError):
        dg.amp.GradScaler(growth_factor=0.5)


@pytest.mark.usefixtures("cuda")
def test_float16_autocast_and_scaler_on_the_gpu(rng):
    w0 = rng.standard_normal((3, 4)).astype(np.float32)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    w = dg.nn.Parameter(dg.tensor(w0, device="cuda"))
    opt = dg.optim.SGD([w], lr=0.1)
    scaler = dg.amp.GradScaler(init_scale=1024.0)
    with dg.autocast("cuda"):
        y = dg.tensor(x, device="cuda") @ w.T
        assert y.dtype == dg.float16
        loss = (y.float() * y.float()).sum() * 0.01
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert not scaler.last_step_skipped and scaler.get_scale() == 1024.0
    xr, wr = x.astype(np.float16).astype(np.float64), w0.astype(np.float16).astype(np.float64)
    grad = 0.02 * ((xr @ wr.T).T @ xr)  # d/dw of 0.01·Σ(x wᵀ)²
    np.testing.assert_allclose(w.detach().cpu().numpy(), w0 - 0.1 * grad, rtol=1e-2, atol=1e-3)
    bad = x.copy()
    bad[0, 0] = np.inf
    with dg.autocast("cuda"):
        loss = (dg.tensor(bad, device="cuda") @ w.T).float().sum()
    before = w.detach().cpu().numpy()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.last_step_skipped and scaler.get_scale() == 512.0
    np.testing.assert_array_equal(w.detach().cpu().numpy(), before)
