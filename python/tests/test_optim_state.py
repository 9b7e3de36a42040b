"""Optimizer param_groups and state dicts, and every schedule of nn/optim.h, against PyTorch's update rules and
closed forms written out in NumPy."""
import math

import numpy as np
import pytest

import dyngrad as dg


def _problem(rng, n=4):
    p0 = rng.standard_normal(n)
    x = rng.standard_normal(n)
    p = dg.nn.Parameter(dg.tensor(p0))
    return p0, x, p


def _grad_step(opt, p, x):
    opt.zero_grad()
    (p * p * dg.tensor(x)).sum().backward()  # grad = 2·p·x
    opt.step()


def test_sgd_param_group_edits_take_effect(rng):
    p0, x, p = _problem(rng)
    opt = dg.optim.SGD([p], lr=0.1, momentum=0.9)
    group = opt.param_groups[0]
    assert group["params"][0] is p and group["lr"] == 0.1 and group["momentum"] == 0.9
    _grad_step(opt, p, x)
    ref, buf = p0.copy(), None
    g = 2 * ref * x
    buf = g
    ref = ref - 0.1 * buf
    group["lr"], group["momentum"], group["weight_decay"] = 0.05, 0.5, 0.01
    assert opt.param_groups[0]["lr"] == 0.05 and opt.lr == 0.05 and group["weight_decay"] == 0.01
    _grad_step(opt, p, x)
    g = 2 * ref * x + 0.01 * ref
    buf = 0.5 * buf + g
    ref = ref - 0.05 * buf
    np.testing.assert_allclose(p.detach().numpy(), ref, rtol=1e-12)
    with pytest.raises(dg.ValueError):
        group["lr"] = -1.0
    assert opt.param_groups[0]["lr"] == 0.05
    with pytest.raises(dg.ValueError, match="betas"):
        group["betas"] = (0.9, 0.99)
    with pytest.raises(dg.ValueError, match="params"):
        group["params"] = []
    with pytest.raises(dg.ValueError, match="fixed groups"):
        opt.add_param_group({"params": []})


def test_adam_groups_betas_eps_and_state(rng):
    p0, x, p = _problem(rng)
    q0, _, q = _problem(rng)
    opt = dg.optim.Adam([{"params": [p]}, {"params": q, "lr": 0.01}], lr=0.1)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.01]
    opt.param_groups[0].update(betas=(0.8, 0.99), eps=1e-6)
    assert opt.param_groups[0]["betas"] == (0.8, 0.99)
    ref, m, v = p0.copy(), 0.0, 0.0
    for t in (1, 2, 3):
        _grad_step(opt, p, x)
        g = 2 * ref * x
        m = 0.8 * m + 0.2 * g
        v = 0.99 * v + 0.01 * g * g
        ref = ref - 0.1 / (1 - 0.8 ** t) * m / (np.sqrt(v) / math.sqrt(1 - 0.99 ** t) + 1e-6)
    np.testing.assert_allclose(p.detach().numpy(), ref, rtol=1e-10)
    state = opt.state
    assert set(state) == {p} and state[p]["step"] == 3  # q had no gradient: never updated
    np.testing.assert_allclose(state[p]["exp_avg"].numpy(), m, rtol=1e-10)
    with pytest.raises(dg.ValueError, match="momentum"):
        opt.param_groups[1]["momentum"] = 0.9


def test_state_dict_resumes_bit_for_bit(rng):
    p0, x, p = _problem(rng)
    opt = dg.optim.AdamW([p], lr=0.05, weight_decay=0.1)
    for _ in range(3):
        _grad_step(opt, p, x)
    saved_p = p.detach().numpy().copy()
    sd = opt.state_dict()
    assert sd["param_groups"][0]["params"] == [0] and sd["state"][0]["step"] == 3
    for _ in range(2):
        _grad_step(opt, p, x)
    expected = p.detach().numpy().copy()

    q = dg.nn.Parameter(dg.tensor(saved_p))
    resumed = dg.optim.AdamW([q], lr=0.5)
    resumed.load_state_dict(sd)
    assert resumed.param_groups[0]["lr"] == 0.05 and resumed.param_groups[0]["weight_decay"] == 0.1
    for _ in range(2):
        _grad_step(resumed, q, x)
    np.testing.assert_array_equal(q.detach().numpy(), expected)

    sd["param_groups"][0]["lr"] = 0.125  # an edited state dict: its settings take effect
    resumed.load_state_dict(sd)
    assert resumed.param_groups[0]["lr"] == 0.125
    with pytest.raises(dg.ValueError):
        dg.optim.SGD([q], lr=0.1).load_state_dict(sd)  # another optimizer type: refused, nothing changed
    with pytest.raises(dg.ValueError, match="dyngrad optimizer"):
        resumed.load_state_dict({"state": {}, "param_groups": []})


def _run_schedule(sched, opt, steps):
    lrs = []
    for _ in range(steps):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return lrs


@pytest.mark.parametrize("kind", ["StepLR", "CosineAnnealingLR", "WarmupCosineLR"])
def test_schedules_follow_their_closed_forms(rng, kind):
    base = float(rng.uniform(0.01, 1.0))
    p = dg.nn.Parameter(dg.ones(2))
    opt = dg.optim.SGD([p], lr=base)
    if kind == "StepLR":
        sched = dg.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        formula = lambda e: base * 0.5 ** (e // 3)  # noqa: E731
    elif kind == "CosineAnnealingLR":
        sched = dg.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=7, eta_min=0.001)
        formula = lambda e: 0.001 + (base - 0.001) * (1 + math.cos(math.pi * e / 7)) / 2  # noqa: E731
    else:
        sched = dg.optim.lr_scheduler.WarmupCosineLR(opt, warmup_steps=3, total_steps=10, min_lr=1e-4)

        def formula(e):
            if e < 3:
                return base * (e + 1) / 4
            if e < 10:
                return 1e-4 + (base - 1e-4) * (1 + math.cos(math.pi * (e - 3) / 7)) / 2
            return 1e-4
    lrs = _run_schedule(sched, opt, 12)
    np.testing.assert_allclose(lrs, [formula(e) for e in range(12)], rtol=1e-12)
    assert sched.last_epoch == 12 and sched.base_lrs == [base]
    assert sched.lr_at(5) == pytest.approx(formula(5), rel=1e-12)
    assert opt.param_groups[0]["lr"] == pytest.approx(formula(12), rel=1e-12)

    state = sched.state_dict()
    assert state["last_epoch"] == 12
    opt2 = dg.optim.SGD([dg.nn.Parameter(dg.ones(2))], lr=base)
    again = type(sched)(opt2, *({"StepLR": (3, 0.5), "CosineAnnealingLR": (7, 0.001),
                                 "WarmupCosineLR": (3, 10, 1e-4)}[kind]))
    again.load_state_dict(state)
    assert again.last_epoch == 12
    again.step()
    sched.step()
    assert again.get_last_lr() == sched.get_last_lr()


def test_schedule_arguments():
    opt = dg.optim.SGD([dg.nn.Parameter(dg.ones(1))], lr=0.1)
    with pytest.raises(dg.ValueError, match="last_epoch"):
        dg.optim.StepLR(opt, 2, last_epoch=4)
    with pytest.raises(dg.ValueError):
        dg.optim.WarmupCosineLR(opt, warmup_steps=5, total_steps=5)
    assert dg.optim.lr_scheduler.WarmupCosineLR is dg.optim.WarmupCosineLR
    with pytest.raises(dg.ValueError, match="dampening"):
        dg.optim.SGD([dg.nn.Parameter(dg.ones(1))], lr=0.1, dampening=0.1)
