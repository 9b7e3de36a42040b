"""Optimizers and learning-rate schedules: dyngrad's own (nn/optim.h; fused single-launch steps on the GPU).

``SGD(model.parameters(), lr=0.1, momentum=0.9)``; parameter groups as in PyTorch:
``Adam([{"params": a, "lr": 1e-3}, {"params": b}], lr=1e-4)``. ``opt.param_groups`` are live dicts (writing
``g["lr"]`` or ``g["weight_decay"]`` changes the optimizer); ``state_dict()``/``load_state_dict()`` go through the
C++ optimizer state (the entries a checkpoint holds). Schedules: StepLR, CosineAnnealingLR (per epoch) and
WarmupCosineLR (per optimizer step), with ``step()``, ``get_last_lr()``, ``last_epoch`` and state dicts.
"""
from __future__ import annotations

from . import _core
from ._args import check_ints, check_numbers
from ._core import LRScheduler, Optimizer, clip_grad_norm_, clip_grad_value_

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "LRScheduler", "StepLR", "CosineAnnealingLR", "WarmupCosineLR",
           "clip_grad_norm_", "clip_grad_value_", "lr_scheduler"]

# The settings each optimizer's groups have (ParamGroup of nn/optim.h), under PyTorch's keys.
_SETTINGS = {"SGD": ("lr", "momentum", "nesterov", "weight_decay"),
             "Adam": ("lr", "betas", "eps", "weight_decay"), "AdamW": ("lr", "betas", "eps", "weight_decay")}


class _ParamGroup(dict):
    """One of ``optimizer.param_groups``: reads are the optimizer's live settings, writes change them (checked by
    the C++ optimizer: ValueError for an invalid value, nothing changed)."""

    def __init__(self, optimizer, index: int):
        super().__init__()
        self._optimizer, self._index = optimizer, index
        dict.__setitem__(self, "params", optimizer._py_groups[index])
        for key, value in _core._optimizer_settings(optimizer, index).items():
            dict.__setitem__(self, key, value)

    def __getitem__(self, key):
        if key != "params" and key in _SETTINGS[self._optimizer.name]:
            dict.__setitem__(self, key, _core._optimizer_settings(self._optimizer, self._index)[key])
        return dict.__getitem__(self, key)

    def __setitem__(self, key, value):
        name = self._optimizer.name
        if key == "params":
            raise _core.ValueError(f"{name}: param_groups[{self._index}]['params'] cannot be replaced "
                                   "(the groups are fixed at construction)")
        if key not in _SETTINGS[name]:
            raise _core.ValueError(f"{name}: param_groups[{self._index}] has no setting '{key}' "
                                   f"({', '.join(_SETTINGS[name])})")
        if key == "betas":
            beta1, beta2 = value
            _core._optimizer_set_setting(self._optimizer, self._index, "beta1", float(beta1))
            _core._optimizer_set_setting(self._optimizer, self._index, "beta2", float(beta2))
        elif key == "nesterov":
            _core._optimizer_set_setting(self._optimizer, self._index, key, 1.0 if value else 0.0)
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name}: param_groups[{self._index}]['{key}'] must be a number, "
                                f"got {type(value).__name__}")
            _core._optimizer_set_setting(self._optimizer, self._index, key, float(value))
        dict.__setitem__(self, key, _core._optimizer_settings(self._optimizer, self._index)[key])

    def update(self, *args, **kwargs):
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key, default=None):
        return self[key] if key in self else default


def _py_groups(params, who):
    """The Python tensors of each group, as passed (the C++ optimizer keeps the groups in this order)."""
    if isinstance(params, _core.Tensor):
        raise TypeError(f"{who}: params must be an iterable of tensors or of dicts, got a single Tensor")
    items = list(params)
    if items and isinstance(items[0], dict):
        groups = []
        for g in items:
            if not isinstance(g, dict):
                raise TypeError(f"{who}: a mix of parameter groups (dicts) and tensors")
            g = dict(g)
            g["params"] = [g["params"]] if isinstance(g.get("params"), _core.Tensor) else list(g.get("params", []))
            groups.append(g)
        return groups, [g["params"] for g in groups]
    return items, [items]


class _OptimizerAPI:
    """What torch.optim.Optimizer has beyond step/zero_grad, over the C++ optimizer's state."""

    @property
    def param_groups(self):
        return [_ParamGroup(self, g) for g in range(self.group_count)]

    @property
    def state(self):
        """{parameter: {"step": n, "exp_avg": ..., ...}} for the parameters updated at least once (read-only)."""
        out = {}
        i = 0
        for params in self._py_groups:
            for p in params:
                entry = _core._optimizer_state(self, i)
                if entry["step"] > 0:
                    out[p] = entry
                i += 1
        return out

    def state_dict(self) -> dict:
        """{"state": {index: {"step", moments...}}, "param_groups": [{settings..., "params": [indices]}],
        "dyngrad": (tensors, metadata) of the C++ save_state}; tensors are copies (a snapshot)."""
        tensors, metadata = _core._optimizer_save_state(self)
        groups, index = [], 0
        for g, params in enumerate(self._py_groups):
            group = dict(_core._optimizer_settings(self, g))
            group["params"] = list(range(index, index + len(params)))
            index += len(params)
            groups.append(group)
        state = {}
        for i in range(index):
            entry = _core._optimizer_state(self, i)
            if entry["step"] > 0:
                state[i] = {k: (v.clone() if isinstance(v, _core.Tensor) else v) for k, v in entry.items()}
        return {"state": state, "param_groups": groups,
                "dyngrad": ({k: v.clone() for k, v in tensors.items()}, dict(metadata))}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores a state_dict() of a dyngrad optimizer of the same type and group sizes (checked first: nothing
        changes on error), then the settings of its "param_groups" (edits made to them take effect)."""
        if not isinstance(state_dict, dict) or "dyngrad" not in state_dict:
            raise _core.ValueError(f"{self.name}.load_state_dict: expects a state_dict() of a dyngrad optimizer "
                                   "(PyTorch's state dicts are not read)")
        tensors, metadata = state_dict["dyngrad"]
        _core._optimizer_load_state(self, dict(tensors), dict(metadata))
        for g, group in enumerate(state_dict.get("param_groups", [])[:self.group_count]):
            live = _ParamGroup(self, g)
            for key in _SETTINGS[self.name]:
                if key in group and group[key] != live[key]:
                    live[key] = group[key]

    def zero_grad(self, set_to_none: bool = True):
        """Drops every gradient (torch's default, set_to_none=True); zero-filled gradients are not supported."""
        if not set_to_none:
            raise _core.ValueError(f"{self.name}.zero_grad(set_to_none=False): dyngrad drops gradients (the next "
                                   "backward starts from zero); call zero_grad()")
        for params in self._py_groups:
            for p in params:
                p.grad = None

    def add_param_group(self, param_group):
        raise _core.ValueError(f"{self.name}.add_param_group: dyngrad optimizers have fixed groups; pass every "
                               "group to the constructor")


def _api(cls):
    for name, member in vars(_OptimizerAPI).items():
        if not name.startswith("__"):
            setattr(cls, name, member)
    return cls


@_api
class SGD(_core.SGD):
    """torch.optim.SGD (dampening 0; nesterov needs momentum > 0)."""

    def __init__(self, params, lr=0.01, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
        if dampening != 0:
            raise _core.ValueError("SGD: dampening is not supported (dyngrad's SGD has dampening 0, torch's default)")
        params, self._py_groups = _py_groups(params, "SGD")
        super().__init__(params, lr, momentum, nesterov, weight_decay)


@_api
class Adam(_core.Adam):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        params, self._py_groups = _py_groups(params, "Adam")
        super().__init__(params, lr, tuple(betas), eps, weight_decay)


@_api
class AdamW(_core.AdamW):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        params, self._py_groups = _py_groups(params, "AdamW")
        super().__init__(params, lr, tuple(betas), eps, weight_decay)


class _ScheduleAPI:
    @property
    def last_epoch(self) -> int:
        """How many times step() ran (torch's last_epoch after construction is 0 too)."""
        return self.epoch

    @property
    def base_lrs(self):
        return list(_core._schedule_base_lrs(self))

    def lr_at(self, epoch: int, group: int = 0) -> float:
        """The schedule's closed form: the lr of `group` after `epoch` steps."""
        return _core._schedule_lr_at(self, epoch, group)

    def state_dict(self) -> dict:
        tensors, metadata = _core._schedule_save_state(self)
        return {"last_epoch": self.epoch, "base_lrs": self.base_lrs,
                "dyngrad": ({k: v.clone() for k, v in tensors.items()}, dict(metadata))}

    def load_state_dict(self, state_dict: dict) -> None:
        if not isinstance(state_dict, dict) or "dyngrad" not in state_dict:
            raise _core.ValueError(f"{_core._schedule_name(self)}.load_state_dict: expects a state_dict() of a "
                                   "dyngrad schedule")
        tensors, metadata = state_dict["dyngrad"]
        _core._schedule_load_state(self, dict(tensors), dict(metadata))


def _schedule(cls):
    for name, member in vars(_ScheduleAPI).items():
        if not name.startswith("__"):
            setattr(cls, name, member)
    return cls


def _check_schedule(who, ints, numbers, last_epoch=-1):
    """A schedule constructor's arguments: `ints` must be ints and `numbers` real numbers (TypeError naming them),
    and last_epoch is torch's default -1 (resuming is load_state_dict's job)."""
    if last_epoch != -1:
        raise _core.ValueError(f"{who}: last_epoch={last_epoch} is not supported (resume with load_state_dict)")
    check_ints(who, **ints)
    check_numbers(who, **numbers)


@_schedule
class StepLR(_core.StepLR):
    """lr = base · gamma^floor(epoch / step_size)."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        _check_schedule("StepLR", {"step_size": step_size}, {"gamma": gamma}, last_epoch)
        super().__init__(optimizer, step_size, gamma)


@_schedule
class CosineAnnealingLR(_core.CosineAnnealingLR):
    """lr = eta_min + (base − eta_min) · (1 + cos(π · epoch / T_max)) / 2 (torch's closed form)."""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):  # noqa: N803  (torch's name)
        _check_schedule("CosineAnnealingLR", {"T_max": T_max}, {"eta_min": eta_min}, last_epoch)
        super().__init__(optimizer, T_max, eta_min)


@_schedule
class WarmupCosineLR(_core.WarmupCosineLR):
    """Per optimizer step (call step() after every optimizer.step()): a linear warm-up over ``warmup_steps``
    (lr = base · (epoch + 1) / (warmup_steps + 1)), then a half cosine down to ``min_lr`` at ``total_steps``
    and min_lr after. The constructor sets the first step's lr. (PyTorch spells it as
    SequentialLR(LinearLR, CosineAnnealingLR), whose warm-up starts at another factor.)"""

    def __init__(self, optimizer, warmup_steps, total_steps, min_lr=0.0):
        _check_schedule("WarmupCosineLR", {"warmup_steps": warmup_steps, "total_steps": total_steps},
                        {"min_lr": min_lr})
        super().__init__(optimizer, warmup_steps, total_steps, min_lr)


lr_scheduler = __import__("types").SimpleNamespace(StepLR=StepLR, CosineAnnealingLR=CosineAnnealingLR,
                                                   WarmupCosineLR=WarmupCosineLR, LRScheduler=LRScheduler)
