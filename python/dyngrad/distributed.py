"""Data-parallel training across processes, as ``torch.distributed``: dyngrad's C++ process group
(distributed/process_group.h), DistributedDataParallel (distributed/ddp.h, ``dyngrad.nn.parallel``) and the ZeRO optimizer,
stages 1 to 3 (distributed/zero.h: ``ZeroOptimizer``, ``ZeroUnit``).

    import dyngrad as dg
    import dyngrad.distributed as dist
    dist.init_process_group()                  # mpirun -np 2 python train.py   (or torchrun, GPU tensors)
    rank, world = dist.get_rank(), dist.get_world_size()
    model = dg.nn.parallel.DistributedDataParallel(Net())
    loss = F.cross_entropy(model(x), y); loss.backward()      # gradients averaged across the ranks
    dist.all_reduce(t, op=dist.ReduceOp.AVG); dist.broadcast(t, src=0); dist.barrier()
    dist.destroy_process_group()

The launch is read from the environment as ``ProcessGroup::init`` reads it: mpirun's (OMPI_COMM_WORLD_* / PMI
variables: MPI, CPU and CUDA tensors), torchrun's (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: a TCP rendezvous
for NCCL, CUDA tensors only) or none (a group of one). docs/python.md, "Distributed training", lists the
differences from torch.distributed.
"""
from __future__ import annotations

import datetime as _datetime
import os as _os

from . import _core

__all__ = [
    "is_available", "is_initialized", "init_process_group", "destroy_process_group", "get_rank", "get_world_size",
    "get_local_rank", "get_backend", "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
    "reduce_scatter_tensor", "barrier", "ReduceOp", "ProcessGroup", "DistributedUnavailable",
    "DistributedError", "group", "ZeroOptimizer", "ZeroUnit", "gpt_units", "bf16_compress_hook", "fp16_compress_hook",
]

_dist = _core._dist
DistributedError = _core.DistributedError


class DistributedUnavailable(_core.DistributedError):
    """dyngrad was built without its distributed layer (no MPI where the library was built)."""


def is_available() -> bool:
    """True when this dyngrad has its distributed layer (the library's dist component, MPI)."""
    return bool(_dist.available)


def _qualified(who: str) -> str:
    return who if who.startswith("dyngrad.") else f"dyngrad.distributed.{who}"


def _require_layer(who: str):
    if not _dist.available:
        raise DistributedUnavailable(f"{_qualified(who)}(): {_dist.unavailable_reason}")


if _dist.available:
    class ReduceOp:
        """The reductions of the C++ group: SUM (f32, f64, int64) and AVG (f32, f64)."""
        SUM = _dist.ReduceOp.SUM
        AVG = _dist.ReduceOp.AVG

    ProcessGroup = _dist.ProcessGroup
else:
    class ReduceOp:  # the names exist so that code reading them imports; every call raises
        SUM = "sum"
        AVG = "avg"

    class ProcessGroup:
        """Unavailable in this build: constructing it raises DistributedUnavailable."""

        def __init__(self, *args, **kwargs):
            _require_layer("ProcessGroup")

        @staticmethod
        def init(*args, **kwargs):
            _require_layer("ProcessGroup.init")


class group:  # torch.distributed.group.WORLD
    WORLD = None


_default = None  # the default group (a _core._dist.ProcessGroup) between init and destroy
_backend = None


def is_initialized() -> bool:
    return _default is not None


def _seconds(timeout, who: str) -> float:
    if timeout is None:
        return 0.0  # the C++ default: DYNGRAD_DIST_TIMEOUT, else 600 s
    if isinstance(timeout, _datetime.timedelta):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"dyngrad.distributed.{who}(): argument 'timeout' must be a datetime.timedelta or a number of "
                        f"seconds, not {type(timeout).__name__}")
    if not timeout > 0:
        raise _core.ValueError(f"dyngrad.distributed.{who}(): timeout={timeout!r} must be a positive number of seconds")
    return float(timeout)


def init_process_group(backend: str | None = None, init_method: str | None = None, timeout=None, world_size: int = -1,
                       rank: int = -1, store=None, group_name: str = "", pg_options=None, device_id=None):
    """Creates the default group from the launch environment (``ProcessGroup::init``).

    backend: None or "mpi:nccl" (CPU tensors through MPI, CUDA tensors through NCCL where both exist), "mpi" (no
    NCCL communicator), "nccl" (as None; CUDA tensors through NCCL). "gloo" is refused: dyngrad reduces CPU
    tensors through MPI (launch with mpirun). init_method: None or "env://" (the launcher's variables).
    world_size/rank: -1, or the launch's own values (checked). timeout: a timedelta or seconds (default
    DYNGRAD_DIST_TIMEOUT, else 600 s). device_id: the CUDA device of this rank (an int, "cuda:N" or a dg.device;
    default local rank modulo the device count).
    """
    global _default, _backend
    _require_layer("init_process_group")
    if _default is not None:
        raise _core.ValueError("dyngrad.distributed.init_process_group(): the default process group is already "
                               "initialised (call destroy_process_group() first)")
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"dyngrad.distributed.init_process_group(): argument 'backend' must be a str or None, not "
                        f"{type(backend).__name__}")
    name = (backend or "mpi:nccl").lower()
    if name not in ("mpi", "nccl", "mpi:nccl", "cpu:mpi,cuda:nccl"):
        raise _core.ValueError(f"dyngrad.distributed.init_process_group(): backend={backend!r} is not available: "
                               "dyngrad reduces CPU tensors through MPI (launch with mpirun) and CUDA tensors through "
                               "NCCL; pass None, 'mpi', 'nccl' or 'mpi:nccl'")
    if init_method not in (None, "env://"):
        raise _core.ValueError(f"dyngrad.distributed.init_process_group(): init_method={init_method!r}: only the "
                               "launcher's environment ('env://', mpirun's or torchrun's variables) is supported")
    if store is not None or pg_options is not None:
        raise _core.ValueError("dyngrad.distributed.init_process_group(): store and pg_options are not supported "
                               "(the rendezvous is mpirun's, or dyngrad's own TCP rendezvous under torchrun)")
    device = -1
    if device_id is not None:
        if isinstance(device_id, bool):
            raise TypeError("dyngrad.distributed.init_process_group(): argument 'device_id' must be an int, a str or "
                            "a dg.device, not bool")
        if isinstance(device_id, int):
            device = device_id
        else:
            d = device_id if isinstance(device_id, _core.device) else _core.device(str(device_id))
            if d.type != "cuda":
                raise _core.ValueError(f"dyngrad.distributed.init_process_group(): device_id={device_id!r} is not a "
                                       "CUDA device")
            device = d.index
    seconds = _seconds(timeout, "init_process_group")
    pg = _dist.ProcessGroup.init(timeout=seconds, device=device, use_nccl=(name != "mpi"))
    for arg, value, actual in (("world_size", world_size, pg.world_size), ("rank", rank, pg.rank)):
        if value != -1 and value != actual:
            raise _core.ValueError(f"dyngrad.distributed.init_process_group(): {arg}={value} but the launch says "
                                   f"{actual} ({pg.describe()})")
    _default, _backend = pg, name
    return None


def destroy_process_group(group=None) -> None:
    """Drops the default group (its communicators are freed; MPI itself is finalised at exit)."""
    global _default, _backend
    _require_layer("destroy_process_group")
    _default, _backend = None, None


def _group(who: str, group=None):
    _require_layer(who)
    if group is not None and group is not _default:
        raise _core.ValueError(f"{_qualified(who)}(): only the default group is supported (group=None)")
    if _default is None:
        raise _core.ValueError(f"{_qualified(who)}(): the default process group is not initialised (call "
                               "dyngrad.distributed.init_process_group() first)")
    return _default


def get_rank(group=None) -> int:
    return _group("get_rank", group).rank


def get_world_size(group=None) -> int:
    return _group("get_world_size", group).world_size


def get_local_rank() -> int:
    """This process's rank on its host (mpirun's local rank, torchrun's LOCAL_RANK)."""
    return _group("get_local_rank").local_rank


def get_backend(group=None) -> str:
    _group("get_backend", group)
    return _backend


def default_group():
    """The default group object (its device, has_mpi, has_nccl, timeout and describe())."""
    return _group("default_group")


class _Completed:
    """What async_op=True returns: the collectives of the C++ group complete before they return."""

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def _tensor(t, who: str, arg: str = "tensor"):
    if not isinstance(t, _core.Tensor):
        raise TypeError(f"dyngrad.distributed.{who}(): argument '{arg}' must be a dyngrad Tensor, not {type(t).__name__}")
    return t


def _op(op, who: str):
    if op is ReduceOp.SUM or op is ReduceOp.AVG or op in (ReduceOp.SUM, ReduceOp.AVG):
        return op
    raise _core.ValueError(f"dyngrad.distributed.{who}(): op={op!r}: the C++ group reduces with ReduceOp.SUM and "
                           "ReduceOp.AVG only")


def _done(async_op: bool):
    return _Completed() if async_op else None


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """In place on every rank: tensor becomes the sum (or mean) of every rank's tensor."""
    pg = _group("all_reduce", group)
    pg.all_reduce(_tensor(tensor, "all_reduce"), _op(op, "all_reduce"))
    return _done(async_op)


def broadcast(tensor, src: int = 0, group=None, async_op: bool = False):
    """In place: tensor becomes rank src's tensor on every rank."""
    pg = _group("broadcast", group)
    if isinstance(src, bool) or not isinstance(src, int):
        raise TypeError(f"dyngrad.distributed.broadcast(): argument 'src' must be an int, not {type(src).__name__}")
    pg.broadcast(_tensor(tensor, "broadcast"), src)
    return _done(async_op)


def all_gather(tensor_list: list, tensor, group=None, async_op: bool = False):
    """tensor_list[r] receives rank r's tensor (each entry a tensor of tensor's shape and dtype, written in place)."""
    pg = _group("all_gather", group)
    _tensor(tensor, "all_gather")
    if not isinstance(tensor_list, list) or len(tensor_list) != pg.world_size:
        raise _core.ValueError(f"dyngrad.distributed.all_gather(): tensor_list must be a list of world_size="
                               f"{pg.world_size} tensors")
    for i, t in enumerate(tensor_list):
        _tensor(t, "all_gather", f"tensor_list[{i}]")
        if tuple(t.shape) != tuple(tensor.shape) or t.dtype != tensor.dtype:
            raise _core.ShapeError(f"dyngrad.distributed.all_gather(): tensor_list[{i}] is {tuple(t.shape)} "
                                   f"{t.dtype}, the input {tuple(tensor.shape)} {tensor.dtype}")
    gathered = pg.all_gather(tensor)
    for r, t in enumerate(tensor_list):
        t.copy_(gathered[r])
    return _done(async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op: bool = False):
    """output_tensor (world_size, *input.shape) receives every rank's input, by rank (written in place).

    Differs from torch, whose output may also be (world_size * input.shape[0], ...): reshape that view."""
    pg = _group("all_gather_into_tensor", group)
    pg.all_gather_into(_tensor(output_tensor, "all_gather_into_tensor", "output_tensor"),
                       _tensor(input_tensor, "all_gather_into_tensor", "input_tensor"))
    return _done(async_op)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """input (world_size * k, ...): output (k, ...) becomes this rank's block of the sum (or mean) of every input."""
    pg = _group("reduce_scatter_tensor", group)
    pg.reduce_scatter_into(_tensor(output, "reduce_scatter_tensor", "output"),
                           _tensor(input, "reduce_scatter_tensor", "input"), _op(op, "reduce_scatter_tensor"))
    return _done(async_op)


def barrier(group=None, async_op: bool = False, device_ids=None):
    """Returns on every rank once every rank has entered it (up to the group's timeout: DistributedError)."""
    _group("barrier", group).barrier()
    return _done(async_op)


def bf16_compress_hook(state, bucket):
    """torch.distributed.algorithms.ddp_comm_hooks.default_hooks.bf16_compress_hook for dyngrad: pass it to
    DistributedDataParallel.register_comm_hook, which averages every bucket in bfloat16 inside the C++ DDP
    (DDPOptions::compression). Not meant to be called."""
    raise TypeError("bf16_compress_hook is run by DistributedDataParallel.register_comm_hook, not called directly")


def fp16_compress_hook(state, bucket):
    """torch's fp16_compress_hook for dyngrad: every bucket averaged in float16 (see bf16_compress_hook)."""
    raise TypeError("fp16_compress_hook is run by DistributedDataParallel.register_comm_hook, not called directly")


class ZeroUnit:
    """One unit of a ZeRO stage-3 model (dist::ZeroUnit, distributed/zero.h): its parameters are gathered, used and freed
    together. ``forward`` (default: ``module`` itself) maps the previous unit's output (or the optimizer's input)
    to this unit's output, one Tensor to one Tensor, and may use only ``module``'s parameters and constants. With
    ``ZeroOptimizer(..., recompute=True)`` it runs twice per step (in the forward, then again in the backward: the
    activations inside a unit are recomputed), so it must compute the same both times; ``stochastic=True`` declares
    a unit that draws fresh randomness (dropout), which recompute=True refuses. ``name`` (no dots) prefixes the
    unit's parameter names in checkpoints and errors ("<name>.<path in module>").
    """

    __slots__ = ("name", "module", "forward", "stochastic")

    def __init__(self, name: str, module, forward=None, stochastic: bool = False):
        from .nn import Module
        if not isinstance(name, str):
            raise TypeError(f"dyngrad.distributed.ZeroUnit(): argument 'name' must be a str, not {type(name).__name__}")
        if not isinstance(module, Module):
            raise TypeError(f"dyngrad.distributed.ZeroUnit(): argument 'module' must be a dyngrad.nn.Module, not "
                            f"{type(module).__name__}")
        if forward is not None and not callable(forward):
            raise TypeError(f"dyngrad.distributed.ZeroUnit(): argument 'forward' must be callable or None, not "
                            f"{type(forward).__name__}")
        if not isinstance(stochastic, bool):
            raise TypeError(f"dyngrad.distributed.ZeroUnit(): argument 'stochastic' must be a bool, not "
                            f"{type(stochastic).__name__}")
        self.name, self.module, self.forward = name, module, module if forward is None else forward
        self.stochastic = stochastic

    def __repr__(self):
        return f"ZeroUnit({self.name!r}, {type(self.module).__name__})"


def gpt_units(model) -> list:
    """Stage 3's units of a ``dyngrad.nn.GPT`` (C++ ``dist::gpt_units``, distributed/zero.h): "embed" (the token and
    position embeddings), "block<i>" per block, "head" (``ln_f`` and ``lm_head``, giving the logits (B, T, embedding
    rows)): ``model(tokens)`` in pieces, for ``ZeroOptimizer(gpt_units(model), stage=3)``. ValueError when the model's
    dropout is not 0 (its dropout after the embeddings is inside the C++ GPT's forward, which no unit here can
    apply; C++ ``dist::gpt_units`` takes dropout), its embeddings are tied (the head's weight would be in two units)
    or it keeps a reduced residual stream (the units run the float32 one).
    """
    from .nn import Module
    from .transformer import GPT
    if not isinstance(model, GPT):
        raise TypeError(f"dyngrad.distributed.gpt_units(): argument 'model' must be a dyngrad.nn.GPT, not "
                        f"{type(model).__name__}")
    config = model._config
    if config.dropout != 0:
        raise _core.ValueError(f"dyngrad.distributed.gpt_units(): the GPT's dropout is {config.dropout}; the dropout "
                               "after its embeddings is inside the C++ GPT's forward, not reachable as a unit here, "
                               "so these units need dropout 0")
    if config.tie_embeddings:
        raise _core.ValueError("dyngrad.distributed.gpt_units(): the GPT's LM head is its token embedding, which two "
                               "units would hold")
    if config.reduced_residual:
        raise _core.ValueError("dyngrad.distributed.gpt_units(): the GPT's reduced_residual is set; the units run the "
                               "float32 residual stream (PyTorch's autocast recipe)")
    embed, head = Module(), Module()
    embed.token_embedding, embed.position_embedding = model.token_embedding, model.position_embedding
    head.ln_f, head.lm_head = model.ln_f, model.lm_head
    units = [ZeroUnit("embed", embed, lambda x: model.position_embedding(model.token_embedding(x)))]
    units += [ZeroUnit(f"block{i}", block) for i, block in enumerate(model.blocks)]
    units.append(ZeroUnit("head", head, lambda x: model.lm_head(model.ln_f(x))))
    return units


def _zero_units(units) -> list:
    out = []
    for i, unit in enumerate(units):
        if isinstance(unit, ZeroUnit):
            out.append(unit)
        elif isinstance(unit, tuple) and len(unit) in (2, 3, 4):
            out.append(ZeroUnit(*unit))
        else:
            raise TypeError(f"dyngrad.distributed.ZeroOptimizer(): module[{i}] must be a ZeroUnit or a (name, module"
                            f"[, forward[, stochastic]]) tuple, not {type(unit).__name__}")
    return out


_STAGES = "1 (optimizer state sharded), 2 (gradients too) or 3 (parameters too)"


class ZeroOptimizer:
    """ZeRO AdamW over the default group (dist::ZeroOptimizer, distributed/zero.h), stages 1, 2 and 3.

    Stages 1 and 2: every rank holds the whole model and runs its part of the batch; AdamW's moments (stage 1) and
    the averaged gradients (stage 2) are split across the ranks, and the updated parameters are all-gathered after
    each step. torch's nearest is ``torch.distributed.optim.ZeroRedundancyOptimizer(params,
    optimizer_class=AdamW)`` (stage 1).

        opt = dist.ZeroOptimizer(model, lr=1e-3, weight_decay=0.01, stage=2)   # not wrapped in DDP
        loss = F.cross_entropy(model(x), y)
        loss.backward(); opt.clip_grad_norm_(1.0); opt.step(); opt.zero_grad()

    Stage 3 shards the parameters too (FSDP-style; torch's ``FullyShardedDataParallel`` / FSDP2's ``fully_shard``
    applied to each block). The model is given as a list of units (``ZeroUnit(name, module[, forward])`` or
    ``(name, module[, forward])`` tuples), run in order by ``opt(x)``; between uses a unit's parameters hold no
    elements. Each unit is one node of the graph: its forward all-gathers the unit's shards, records the unit
    (its activations kept, as FSDP keeps them) and frees the gathered memory; its backward gathers them again into
    that memory, back-propagates, reduce-scatters the unit's gradients into this rank's shards and frees everything.
    ``recompute=True`` keeps no activation inside a unit: its forward runs again in the backward (activation
    checkpointing per unit; the units must then be deterministic). With the kept forward, a unit's computation runs
    beside the all-gather a neighbouring unit needs next, as FSDP's forward and backward prefetch (docs/distributed.md;
    on CUDA a communication stream; two units' parameters resident at once): ``prefetch=None`` (the default) does so
    where it applies, ``prefetch=False`` never, ``prefetch=True`` requires it (stage=3 without recompute).

        units = [dist.ZeroUnit("embed", embed)] + [dist.ZeroUnit(f"block{i}", b) for i, b in enumerate(blocks)]
        opt = dist.ZeroOptimizer(units, lr=1e-3, weight_decay=0.01)      # stage=3 for a list of units
        loss = F.cross_entropy(opt(x), y)                                # every rank runs the same units
        loss.backward(); opt.step(); opt.zero_grad()

    Differs from torch's FSDP: the units are listed explicitly (not found by wrapping submodules), each maps one
    Tensor to one Tensor, the optimizer is built in (AdamW over the shards), and ``full_parameters()`` /
    ``save_checkpoint()`` stand for FSDP's full state dict.

    ``step()`` first averages the gradients across ranks (``reduce_gradients()``, unless called since the last
    step), so the loop is an ordinary one; several backwards before a step accumulate.
    """

    def __init__(self, module, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01,
                 stage: int | None = None, *, recompute: bool = False, prefetch: bool | None = None):
        from .nn import Module
        who = "dyngrad.distributed.ZeroOptimizer()"
        is_units = isinstance(module, (list, tuple))
        if not isinstance(module, Module) and not is_units:
            raise TypeError(f"{who}: argument 'module' must be a dyngrad.nn.Module (stages 1 and 2) or a list of "
                            f"ZeroUnit (stage 3), not {type(module).__name__}")
        if stage is None:
            stage = 3 if is_units else 2
        if isinstance(stage, bool) or not isinstance(stage, int):
            raise TypeError(f"{who}: argument 'stage' must be an int ({_STAGES}), not {type(stage).__name__}")
        if stage not in (1, 2, 3):
            raise _core.ValueError(f"{who}: stage={stage}: ZeRO has stage {_STAGES}")
        if stage == 3 and not is_units:
            raise _core.ValueError(f"{who}: stage=3 shards the parameters unit by unit: pass a list of "
                                   "dyngrad.distributed.ZeroUnit(name, module), not one Module")
        if not isinstance(recompute, bool):
            raise TypeError(f"{who}: argument 'recompute' must be a bool, not {type(recompute).__name__}")
        if prefetch is not None and not isinstance(prefetch, bool):
            raise TypeError(f"{who}: argument 'prefetch' must be a bool or None, not {type(prefetch).__name__}")
        if prefetch is True and (stage != 3 or recompute):
            raise _core.ValueError(f"{who}: prefetch=True is for stage=3 with its kept forward (recompute=False)")
        if recompute and stage != 3:
            raise _core.ValueError(f"{who}: recompute=True (a unit's forward run again in its backward) is for stage=3")
        if stage != 3 and is_units:
            raise _core.ValueError(f"{who}: stage={stage} takes the whole model (a dyngrad.nn.Module); a list of "
                                   "units is for stage=3")
        for name, value in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{who}: argument '{name}' must be a number, not {type(value).__name__}")
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"{who}: argument 'betas' must be a pair of numbers, not {betas!r}")
        pg = _group("ZeroOptimizer")
        beta1, beta2 = betas
        settings = (float(lr), float(beta1), float(beta2), float(eps), float(weight_decay), stage)
        if is_units:
            units = _zero_units(module)
            container = Module()  # the units' modules under their names, as dist::ZeroOptimizer::module()
            for unit in units:
                if unit.name and "." not in unit.name and unit.name not in container._modules:
                    container.add_module(unit.name, unit.module)  # bad names: the C++ check names them
            self._zero = _dist.ZeroOptimizer.from_units(
                pg, [(u.name, list(u.module.named_parameters()), list(u.module.named_buffers()), u.forward,
                      u.stochastic) for u in units], *settings, recompute, prefetch)
            self._units, self._module = units, container
        else:
            self._zero = _dist.ZeroOptimizer(pg, list(module.named_parameters()), list(module.named_buffers()),
                                              *settings)
            self._units, self._module = [], module
        self._reduced = False

    @property
    def stage(self) -> int:
        return self._zero.stage

    @property
    def module(self):
        """The wrapped model: the Module given, or for stage 3 a Module holding the units' modules by name (its
        parameters have no elements between uses; ``full_parameters()`` gathers them)."""
        return self._module

    @property
    def step_count(self) -> int:
        """AdamW steps taken (the shards' step count; restored by load_checkpoint)."""
        return self._zero.step_count

    def forward(self, x):
        """Stage 3: runs the units in order on ``x`` (every rank must run the same units in the same order: each
        gather is a collective). Returns the last unit's output, recorded so that ``loss.backward()`` reaches
        every unit."""
        if self.stage != 3:
            raise _core.ValueError(f"dyngrad.distributed.ZeroOptimizer.forward(): stage {self.stage} runs the model "
                                   "itself (model(x)); forward() runs the units of stage 3")
        _tensor(x, "ZeroOptimizer.forward", "x")
        return self._zero.forward(x)

    __call__ = forward

    def full_parameters(self) -> dict:
        """The full parameters by name (module order). Stage 3: all-gathered from the shards, a collective every
        rank calls (the model itself stays sharded); stages 1 and 2: the model's own parameters."""
        return dict(self._zero.full_parameters())

    def reduce_gradients(self) -> None:
        self._zero.reduce_gradients()
        self._reduced = True

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0):
        """Clips the averaged gradient by its global norm (over every rank's shard); returns the norm."""
        if not self._reduced:
            self.reduce_gradients()
        return self._zero.clip_grad_norm(float(max_norm), float(norm_type))

    def step(self) -> None:
        if not self._reduced:
            self.reduce_gradients()
        self._zero.step()
        self._reduced = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._zero.zero_grad()
        self._reduced = False

    def memory(self) -> dict:
        """Per-rank bytes (ZeroMemory): measured ``parameter_bytes``, ``gradient_bytes``, ``optimizer_bytes`` and
        the ZeRO formulas' ``formula_*``; ``ddp_bytes`` for the same model under DDP; stage 3's
        ``gathered_peak_bytes`` (the most gathered parameters held at once), ``formula_gathered_bytes`` (the
        largest unit's padded buffers), ``gathered_bytes`` (held now) and, over the kept unit forwards awaiting their
        backward, ``kept_parameter_bytes`` (resident gathered buffers and casts: 0 between uses), ``released_bytes``
        (those freed until the backward) and ``kept_activation_bytes``."""
        return self._zero.memory()

    def save_checkpoint(self, folder) -> None:
        """Writes folder/model.safetensors (rank 0, the full model) and folder/zero-rank<r>-of-<W>.safetensors (this
        rank's moments, step counts and settings); returns once every rank's files are complete."""
        self._zero.save_checkpoint(_os.fspath(folder))

    def load_checkpoint(self, folder) -> None:
        """Restores the model, moments, step counts and settings from save_checkpoint's folder, on any world size
        (resharded). Checks first, changes nothing on error."""
        self._zero.load_checkpoint(_os.fspath(folder))
