"""dyngrad.nn.parallel: DistributedDataParallel over the C++ dist::DistributedDataParallel (distributed/ddp.h).

    model = dg.nn.parallel.DistributedDataParallel(Net())    # after dg.distributed.init_process_group()
    loss = F.mse_loss(model(x), y)
    loss.backward()                                          # gradients averaged across ranks during the backward
    opt.step(); opt.zero_grad()
    with model.no_sync():                                    # gradient accumulation: no communication
        model(x1).sum().backward()

The C++ DDP checks that every rank has the same parameter names, shapes and dtypes, broadcasts rank 0's
parameters and buffers, buckets the gradients and all-reduces each bucket as soon as the engine reports its
last gradient final (BackwardOptions::on_parameter_ready). Python's graph is implicit, so the forward marks the
graph its outputs were recorded in, and that graph's ``loss.backward()`` runs the DDP backward (python/src/
distributed.cpp). docs/python.md, "Distributed training", lists the differences from torch's DDP.
"""
from __future__ import annotations

import contextlib

from . import _core
from . import distributed as _dist
from .nn import Module

__all__ = ["DistributedDataParallel"]


def _tensors_in(value, out):
    if isinstance(value, _core.Tensor):
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _tensors_in(v, out)
    elif isinstance(value, (tuple, list)):
        for v in value:
            _tensors_in(v, out)
    return out


class DistributedDataParallel(Module):
    """Wraps ``module`` (a dyngrad.nn.Module) for data-parallel training over the default process group.

    Keywords as torch's: ``device_ids``/``output_device`` (None or this rank's one device, checked),
    ``broadcast_buffers`` (rank 0's buffers to every rank before each training-mode forward), ``bucket_cap_mb``,
    ``gradient_as_bucket_view`` (each gradient a view into its all-reduced bucket: no copy back; the next
    synchronised backward rewrites it), ``find_unused_parameters``/``static_graph`` (accepted: unused parameters
    are always handled, see docs), and dyngrad's ``first_bucket_cap_mb``, ``overlap`` and ``compression``
    (dyngrad.bfloat16 or dyngrad.float16: the gradients averaged in that dtype, as ``register_comm_hook`` with
    dyngrad.distributed.bf16_compress_hook / fp16_compress_hook, torch's default hooks of those names).
    """

    def __init__(self, module, device_ids=None, output_device=None, dim: int = 0, broadcast_buffers: bool = True,
                 init_sync: bool = True, process_group=None, bucket_cap_mb: float | None = None,
                 find_unused_parameters: bool = False, check_reduction: bool = False,
                 gradient_as_bucket_view: bool = False, static_graph: bool = False, *,
                 first_bucket_cap_mb: float = 1.0, overlap: bool = True, compression=None):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel(): argument 'module' must be a dyngrad.nn.Module, not "
                            f"{type(module).__name__}")
        pg = _dist._group("dyngrad.nn.parallel.DistributedDataParallel", process_group)
        if dim != 0:
            raise _core.ValueError(f"DistributedDataParallel(): dim={dim}: the batch is split along dimension 0 only")
        if not init_sync:
            raise _core.ValueError("DistributedDataParallel(): init_sync=False is not supported (the C++ DDP checks "
                                   "the ranks' models and broadcasts rank 0's weights at construction)")
        for name, ids in (("device_ids", device_ids), ("output_device", output_device)):
            if ids is None:
                continue
            listed = ids if isinstance(ids, (list, tuple)) else [ids]
            devices = [f"cuda:{d}" if isinstance(d, int) else str(d) for d in listed]
            if len(devices) != 1 or devices[0] not in (str(pg.device), str(pg.device).replace(":0", "")):
                raise _core.ValueError(f"DistributedDataParallel(): {name}={ids!r}: one device per process, this "
                                       f"rank's ({pg.describe()}: {pg.device}); move the model there and pass None")
        cap = 25.0 if bucket_cap_mb is None else float(bucket_cap_mb)
        self.module = module
        object.__setattr__(self, "broadcast_buffers", bool(broadcast_buffers))
        object.__setattr__(self, "_require_backward_grad_sync", True)
        object.__setattr__(self, "_group", pg)
        object.__setattr__(self, "_ddp", _core._dist.DistributedDataParallel(
            pg, list(module.named_parameters()), list(module.named_buffers()), cap, float(first_bucket_cap_mb),
            bool(overlap), bool(gradient_as_bucket_view), compression))

    def forward(self, *inputs, **kwargs):
        if self.broadcast_buffers and self.training and self._group.world_size > 1:
            for buf in self.module.buffers():
                self._group.broadcast(buf, 0)
        outputs = self.module(*inputs, **kwargs)
        if _core.is_grad_enabled():
            self._ddp.prepare_backward(_tensors_in(outputs, []), self._require_backward_grad_sync)
        return outputs

    @contextlib.contextmanager
    def no_sync(self):
        """Forward passes inside record backwards that only accumulate gradients locally; the first backward of a
        forward outside averages the accumulated sum (as torch's: what counts is where the forward ran)."""
        previous = self._require_backward_grad_sync
        object.__setattr__(self, "_require_backward_grad_sync", False)
        try:
            yield
        finally:
            object.__setattr__(self, "_require_backward_grad_sync", previous)

    def register_comm_hook(self, state, hook):
        """torch's DDP communication hook, for the hooks dyngrad runs inside its C++ buckets:
        dyngrad.distributed.bf16_compress_hook and fp16_compress_hook (torch's default_hooks of those names: each
        bucket averaged in 16 bits; ``state`` must be None or this DDP's process group). Any other callable is a
        TypeError: dyngrad's buckets are reduced in C++, where a Python hook does not run."""
        dtype = {_dist.bf16_compress_hook: _core.bfloat16, _dist.fp16_compress_hook: _core.float16}.get(hook)
        if dtype is None:
            raise TypeError(f"DistributedDataParallel.register_comm_hook(): hook {hook!r} is not one dyngrad runs; "
                            f"dyngrad.distributed.bf16_compress_hook and fp16_compress_hook are (the buckets are "
                            f"reduced in C++, where a Python hook does not run)")
        if state is not None and state is not self._group:
            raise _core.ValueError("DistributedDataParallel.register_comm_hook(): state must be None or this DDP's "
                                   "process group")
        self._ddp.set_compression(dtype)

    @property
    def process_group(self):
        return self._group

    def buckets(self) -> list:
        """The gradient buckets' parameter names, bucket by bucket, in launch order."""
        return self._ddp.buckets()

    def ddp_stats(self) -> dict:
        """The C++ DDPStats of the last synchronised backward (readiness and launch order, unused parameters)."""
        return self._ddp.stats
