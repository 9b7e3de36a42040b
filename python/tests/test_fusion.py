"""dyngrad.fusion (python/dyngrad/fusion.py, python/src/fusion.cpp): the fusion compiler's switch, counters and log.
Every build: the switch and its context manager, the argument checks, the dicts' keys and types, the counters of a
fresh thread, and that CPU graphs with fusion on plan nothing and keep their gradients bit for bit. On a GPU: eager
SGD steps of a small MLP with fusion on are planned, run generated kernels and end where the same steps without
fusion end; a step whose graph differs from its plan is let go with a "graph_differs" entry in the log.
test_cpp_parity.py checks the keys and the log's kinds against the C++ headers."""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import dyngrad as dg
import dyngrad.functional as F

COUNTERS = ["plans", "groups_compiled", "groups_dropped", "captures", "last_groups", "last_launches_saved",
            "groups_from_cache", "backward_chains_compiled", "backward_chains_dropped", "backward_chains_run",
            "eager_graphs_fused", "plans_let_go"]
TIMES = ["prepare_ms", "nvrtc_ms"]


@pytest.fixture(autouse=True)
def restore_switch():
    before = dg.fusion.mode()
    yield
    if dg.fusion.mode() != before:
        dg.fusion.set_mode(before)


def test_captured_steps_fuse_by_default():
    code = "import dyngrad as dg; print(dg.fusion.mode(), dg.fusion.is_enabled(), dg.fusion.settings()['eager'])"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DYNGRAD_")}
    out = subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "captured True False", out


def test_set_mode_round_trip_and_its_errors():
    for name in ("off", "all", "captured", "off"):
        dg.fusion.set_mode(name)
        assert dg.fusion.mode() == name
        assert dg.fusion.is_enabled() is (name != "off")
        assert dg.fusion.settings()["eager"] is (name == "all")
    with pytest.raises(ValueError, match=r"fusion\.set_mode: mode must be 'off', 'captured' or 'all', got 'on'"):
        dg.fusion.set_mode("on")
    with pytest.raises(TypeError, match=r"fusion\.set_mode: mode must be a str, got bool"):
        dg.fusion.set_mode(True)
    assert dg.fusion.mode() == "off"  # a refused call changes nothing
    assert dg.fusion.MODES == ("off", "captured", "all")


def test_set_enabled_round_trip():
    for flag in (True, False, True):
        dg.fusion.set_enabled(flag)
        assert dg.fusion.is_enabled() is flag
        assert dg.fusion.settings()["enabled"] is flag
        assert dg.fusion.mode() == ("all" if flag else "off")


def test_enabled_restores_the_switch():
    dg.fusion.set_enabled(False)
    with dg.fusion.enabled():
        assert dg.fusion.is_enabled()
        with dg.fusion.enabled(False):
            assert not dg.fusion.is_enabled()
        assert dg.fusion.is_enabled()
    assert not dg.fusion.is_enabled()
    dg.fusion.set_mode("captured")
    with dg.fusion.enabled(False):
        assert dg.fusion.mode() == "off"
    assert dg.fusion.mode() == "captured"  # the mode it found, not set_enabled(True)'s "all"
    dg.fusion.set_enabled(False)
    with pytest.raises(KeyError):
        with dg.fusion.enabled(True):
            raise KeyError("inside")
    assert not dg.fusion.is_enabled()

    seen = []

    @dg.fusion.enabled()
    def depth(n):  # entered again while active: each call restores what it found
        seen.append(dg.fusion.is_enabled())
        if n:
            dg.fusion.set_enabled(False)
            depth(n - 1)
            seen.append(dg.fusion.is_enabled())

    depth(1)
    assert seen == [True, True, False] and not dg.fusion.is_enabled()


@pytest.mark.parametrize("value", [1, 0, "yes", None, 1.0, np.bool_(True)])
def test_wrong_argument_types_raise_type_error(value):
    dg.fusion.set_enabled(False)
    with pytest.raises(TypeError, match=r"fusion\.set_enabled: enabled must be a bool"):
        dg.fusion.set_enabled(value)
    with pytest.raises(TypeError, match=r"fusion\.enabled: flag must be a bool"):
        dg.fusion.enabled(value)
    if not isinstance(value, np.bool_):  # the binding itself converts no int, str, float or None either
        with pytest.raises(TypeError):
            dg._core.set_fusion_enabled(value)
    assert not dg.fusion.is_enabled()


def test_settings_keys_and_types():
    settings = dg.fusion.settings()
    assert list(settings) == ["mode", "enabled", "eager", "print", "check"]
    assert settings["mode"] in dg.fusion.MODES
    assert all(type(v) is bool for k, v in settings.items() if k != "mode")


def test_settings_read_the_environment():
    """DYNGRAD_PRINT_FUSIONS and DYNGRAD_CHECK_FUSIONS have no setter: a process started with them sees them."""
    code = "import dyngrad as dg; s = dg.fusion.settings(); print(s['mode'], s['enabled'], s['print'], s['check'])"
    for env, expected in (({"DYNGRAD_FUSION": "1", "DYNGRAD_PRINT_FUSIONS": "1"}, "all True True False"),
                          ({"DYNGRAD_FUSION": "0", "DYNGRAD_CHECK_FUSIONS": "1"}, "off False False True"),
                          ({"DYNGRAD_FUSION": "captured"}, "captured True False False"),
                          ({"DYNGRAD_CHECK_FUSIONS": "1"}, "captured True False True")):
        clean = {k: v for k, v in os.environ.items() if not k.startswith("DYNGRAD_")}
        out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                             check=True).stdout
        assert out.strip().splitlines()[-1] == expected, out


def test_stats_has_every_field_with_its_type():
    stats = dg.fusion.stats()
    assert sorted(stats) == sorted(COUNTERS + TIMES)
    for key in COUNTERS:
        assert type(stats[key]) is int and stats[key] >= 0, key
    for key in TIMES:
        assert type(stats[key]) is float and stats[key] >= 0.0, key


def _fresh_thread_stats():
    box = []
    thread = threading.Thread(target=lambda: box.append(dg.fusion.stats()))
    thread.start()
    thread.join()
    return box[0]


def test_a_fresh_thread_counts_from_zero():
    assert _fresh_thread_stats() == {**{k: 0 for k in COUNTERS}, **{k: 0.0 for k in TIMES}}


def test_log_starts_empty_after_clear_log():
    dg.fusion.clear_log()
    assert dg.fusion.log() == []
    assert dg.fusion.LOG_KINDS == ("compile_fallback", "cache_unwritable", "cache_read_failed", "check_mismatch",
                                   "graph_differs")


def _mlp_steps(device, fused, scales=(2.0, 2.0, 2.0, 2.0), batch=64):
    """Eager SGD steps of relu(x @ w + b), then tanh(h * scale + 1).mean(): the bias add, relu, the scalar multiply
    and add and tanh are one group of pointwise ops. Returns the losses, the gradients of each step and the final
    parameters, as NumPy arrays."""
    rng = np.random.default_rng(7)
    x = dg.tensor(rng.standard_normal((batch, 16)).astype(np.float32), device=device)
    w = dg.tensor((0.3 * rng.standard_normal((16, 32))).astype(np.float32), device=device, requires_grad=True)
    b = dg.tensor((0.1 * rng.standard_normal(32)).astype(np.float32), device=device, requires_grad=True)
    opt = dg.optim.SGD([w, b], lr=0.1)
    losses, grads = [], []
    with dg.fusion.enabled(fused):
        for scale in scales:
            h = F.relu(x @ w + b)
            loss = (h * scale + 1).tanh().mean()
            opt.zero_grad()
            loss.backward()
            losses.append(loss.item())
            grads.append((w.grad.cpu().numpy().copy(), b.grad.cpu().numpy().copy()))
            opt.step()
    return losses, grads, [w.detach().cpu().numpy(), b.detach().cpu().numpy()]


def _assert_same_steps(a, b, exact_losses=True):
    """Gradients and parameters bit for bit. The losses too, except where a fused kernel computed the mean (a GPU
    group ends in it): its row sum adds in its own order, so they agree to rounding (the gradients do not read it)."""
    losses_a, grads_a, params_a = a
    losses_b, grads_b, params_b = b
    if exact_losses:
        assert losses_a == losses_b
    else:
        assert np.allclose(losses_a, losses_b, rtol=1e-6, atol=0), (losses_a, losses_b)
    for step, (ga, gb) in enumerate(zip(grads_a, grads_b)):
        for name, x, y in zip(("w", "b"), ga, gb):
            assert np.array_equal(x, y), f"step {step}: d{name} differs by {np.abs(x - y).max()}"
    for x, y in zip(params_a, params_b):
        assert np.array_equal(x, y)


def test_cpu_graphs_plan_nothing_and_keep_their_gradients():
    """Fusion plans CUDA graphs only: CPU steps with it on count nothing, log nothing and compute what they compute
    without it, bit for bit (three steps: the third would be the first fused one on a GPU)."""
    before, log_before = dg.fusion.stats(), dg.fusion.log()
    off = _mlp_steps("cpu", False, scales=(2.0, 2.0, 2.0))
    on = _mlp_steps("cpu", True, scales=(2.0, 2.0, 2.0))
    assert dg.fusion.stats() == before
    assert dg.fusion.log() == log_before
    _assert_same_steps(on, off)


def _delta(after, before):
    return {k: after[k] - before[k] for k in after}


def test_gpu_eager_steps_fuse_and_equal_unfused_steps(cuda):
    off = _mlp_steps(cuda, False)
    before = dg.fusion.stats()
    on = _mlp_steps(cuda, True)
    d = _delta(dg.fusion.stats(), before)
    assert d["plans"] >= 1 and d["groups_compiled"] >= 1 and d["groups_dropped"] == 0, d
    assert d["backward_chains_compiled"] >= 1 and d["backward_chains_run"] >= 1, d
    # The signature came to a backward in steps 1 and 2: steps 3 and 4 run the generated forward (as C++'s
    # tests/fusion/test_gpu_fusion.cpp counts its eager steps).
    assert d["eager_graphs_fused"] == 2 and d["plans_let_go"] == 0, d
    assert d["prepare_ms"] > 0.0, d
    _assert_same_steps(on, off, exact_losses=False)
    # The counters are this thread's: a new thread has seen none of it.
    assert _fresh_thread_stats()["plans"] == 0


def test_gpu_graph_that_differs_from_its_plan_is_logged(cuda):
    """Steps 1-3 make and use a plan; step 4's scalar differs after two members were recorded against it, so the
    plan is let go there (a "graph_differs" entry) and the step equals the unfused one; step 5 fuses again."""
    scales = (2.0, 2.0, 2.0, 3.0, 2.0)
    off = _mlp_steps(cuda, False, scales=scales, batch=48)
    dg.fusion.clear_log()
    before = dg.fusion.stats()
    on = _mlp_steps(cuda, True, scales=scales, batch=48)
    d = _delta(dg.fusion.stats(), before)
    entries = dg.fusion.log()
    assert all(set(e) == {"kind", "kernel", "reason"} and e["kind"] in dg.fusion.LOG_KINDS for e in entries), entries
    differs = [e for e in entries if e["kind"] == "graph_differs"]
    assert d["plans_let_go"] == 1 and len(differs) == 1, (d, entries)
    assert differs[0]["kernel"] == "" and "differs from the one its fusion plan was made from" in differs[0]["reason"]
    assert d["eager_graphs_fused"] == 2, d  # steps 3 and 5
    _assert_same_steps(on, off, exact_losses=False)
    dg.fusion.clear_log()
    assert dg.fusion.log() == []
