"""One rank of tests/test_distributed.py's launches (not a test module itself):

    mpirun -np 2 python dist_worker.py collectives IN.npz OUT_DIR
    mpirun -np 2 python dist_worker.py ddp IN.npz OUT_DIR      (zero: dist.ZeroOptimizer stages 1 and 2)
    mpirun -np W python dist_worker.py zero3 IN.npz OUT_DIR    (ZeRO stage 3 on W ranks)
    RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p python dist_worker.py torchrun - OUT_DIR

Each rank reads its inputs from IN.npz (drawn by the test) and writes what it saw to OUT_DIR/rank<r>.npz (arrays)
and OUT_DIR/rank<r>.json (checks and error messages); the test compares them with its own computation.
"""
import json
import sys
import traceback

import numpy as np

import dyngrad as dg
import dyngrad.distributed as dist
from dyngrad import nn
from dyngrad.nn.parallel import DistributedDataParallel


def expect_error(kind, fn):
    """The class name and message of the error fn raises (it must raise a `kind`)."""
    try:
        fn()
    except kind as e:
        return f"{type(e).__name__}: {e}"
    raise AssertionError(f"expected {kind.__name__}")


def collectives(inputs, rank, world):
    out, notes = {}, {}
    t = dg.tensor(inputs["f32"][rank])
    dist.all_reduce(t)  # SUM by default
    out["sum_f32"] = t.numpy().copy()
    t = dg.tensor(inputs["f64"][rank])
    work = dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True)
    notes["async_completed"] = work.wait() and work.is_completed()
    out["avg_f64"] = t.numpy().copy()
    t = dg.tensor(inputs["i64"][rank])
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    out["sum_i64"] = t.numpy().copy()
    t = dg.tensor(inputs["f32"][rank])
    dist.broadcast(t, src=1)
    out["broadcast_from_1"] = t.numpy().copy()
    gathered = [dg.zeros(*inputs["f64"].shape[1:], dtype=dg.float64) for _ in range(world)]
    dist.all_gather(gathered, dg.tensor(inputs["f64"][rank]))
    out["all_gather"] = np.stack([g.numpy() for g in gathered])
    into = dg.zeros(world, *inputs["f64"].shape[1:], dtype=dg.float64)
    dist.all_gather_into_tensor(into, dg.tensor(inputs["f64"][rank]))
    out["all_gather_into"] = into.numpy().copy()
    scattered = dg.zeros(inputs["scatter"].shape[1] // world, dtype=dg.float64)
    dist.reduce_scatter_tensor(scattered, dg.tensor(inputs["scatter"][rank]), op=dist.ReduceOp.SUM)
    out["reduce_scatter"] = scattered.numpy().copy()
    dist.barrier()
    # Bad arguments are refused on each rank before anything is sent: the group stays usable after them.
    history = dg.tensor([1.0, 2.0], requires_grad=True) * 2.0
    notes["history"] = expect_error(dg.GraphError, lambda: dist.all_reduce(history))
    notes["bad_root"] = expect_error(dg.IndexError, lambda: dist.broadcast(dg.zeros(2), src=world + 3))
    notes["bad_op"] = expect_error(dg.ValueError, lambda: dist.all_reduce(dg.zeros(2), op="max"))
    notes["int64_avg"] = expect_error(dg.DTypeError, lambda: dist.all_reduce(dg.tensor([1, 2]), op=dist.ReduceOp.AVG))
    notes["twice"] = expect_error(dg.ValueError, dist.init_process_group)
    t = dg.tensor([float(rank)])
    dist.all_reduce(t)
    out["after_errors"] = t.numpy().copy()
    return out, notes


class Net(nn.Module):
    def __init__(self, rank):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 3)
        self.register_buffer("scale", dg.full((3,), float(rank + 1), dtype=dg.float64))

    def forward(self, x):
        return self.fc2(self.fc1(x).tanh()) * self.scale


def grads(model):
    return {name: p.grad.numpy().copy() for name, p in model.named_parameters()}


def ddp(inputs, rank, world):
    out, notes = {}, {}
    dg.manual_seed(100 + rank)  # every rank starts from other weights: DDP broadcasts rank 0's
    model = DistributedDataParallel(Net(rank).double())
    for name, p in model.named_parameters():
        out[f"init/{name}"] = p.numpy().copy()
    out["buffer/scale"] = model.module.scale.numpy().copy()
    notes["buckets"] = model.buckets()
    opt = dg.optim.SGD(model.parameters(), lr=0.1)

    def loss_of(x, y):
        return ((model(dg.tensor(x)) - dg.tensor(y)) ** 2).mean()

    # Step 1: one averaged backward, then an SGD step from the averaged gradient.
    loss_of(inputs["x1"][rank], inputs["y1"][rank]).backward()
    for name, g in grads(model).items():
        out[f"step1/{name}"] = g
    notes["stats1"] = model.ddp_stats()
    opt.step()
    opt.zero_grad()
    for name, p in model.named_parameters():
        out[f"after_step/{name}"] = p.numpy().copy()

    # Step 2: gradient accumulation, the first backward under no_sync() (local), the second averaging the sum.
    with model.no_sync():
        loss_of(inputs["xa"][rank], inputs["ya"][rank]).backward()
    for name, g in grads(model).items():
        out[f"local/{name}"] = g
    loss_of(inputs["xb"][rank], inputs["yb"][rank]).backward()
    for name, g in grads(model).items():
        out[f"step2/{name}"] = g
    stats = model.ddp_stats()
    notes["calls"] = [stats["backward_calls"], stats["synchronised_calls"]]

    # backward(gradient) on a DDP output is refused on every rank before any communication.
    y = model(dg.tensor(inputs["x1"][rank]))
    notes["gradient"] = expect_error(dg.ValueError, lambda: y.backward(dg.ones_like(y)))

    # broadcast_buffers: rank 0's buffers reach every rank before each training-mode forward, not in eval mode.
    model.module.scale.fill_(float(10 + rank))
    model(dg.tensor(inputs["x1"][rank]))
    out["buffer/after_train_forward"] = model.module.scale.numpy().copy()
    model.eval()
    model.module.scale.fill_(float(20 + rank))
    with dg.no_grad():
        model(dg.tensor(inputs["x1"][rank]))
    out["buffer/after_eval_forward"] = model.module.scale.numpy().copy()

    # torch's bf16_compress_hook through register_comm_hook: a float32 model's buckets averaged in bfloat16.
    dg.manual_seed(300)
    compressed = DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)))
    compressed.register_comm_hook(None, dist.bf16_compress_hook)
    for name, p in compressed.named_parameters():
        out[f"bf16_init/{name}"] = p.numpy().copy()
    ((compressed(dg.tensor(inputs["x1"][rank], dtype=dg.float32)) - dg.tensor(inputs["y1"][rank], dtype=dg.float32))
     ** 2).mean().backward()
    for name, g in grads(compressed).items():
        out[f"bf16/{name}"] = g
    notes["other_hook"] = expect_error(TypeError, lambda: compressed.register_comm_hook(None, lambda s, b: b))
    return out, notes


def zero(inputs, rank, world):
    """Two AdamW steps of dist.ZeroOptimizer, stage 1 and stage 2, each from rank 0's weights."""
    out, notes = {}, {}
    for stage in (1, 2):
        dg.manual_seed(100 + rank)
        model = Net(0).double()
        opt = dist.ZeroOptimizer(model, lr=0.01, weight_decay=0.1, stage=stage)
        for name, p in model.named_parameters():
            out[f"zero{stage}/init/{name}"] = p.numpy().copy()
        for x, y in (("x1", "y1"), ("xa", "ya")):
            ((model(dg.tensor(inputs[x][rank])) - dg.tensor(inputs[y][rank])) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
        for name, p in model.named_parameters():
            out[f"zero{stage}/after/{name}"] = p.numpy().copy()
        notes[f"zero{stage}_memory"] = opt.memory()
    return out, notes


# ---- ZeRO stage 3: the units of two models (the test builds the same units for its single-process reference) ----

def zero3_mlp():
    """Three units of 40, 72 and 27 f64 elements (3 ranks divide none: every flat is padded); one with a Python
    forward of its own, one a Sequential run as itself, one given as a (name, module) tuple."""
    fc0 = nn.Linear(4, 8).double()
    body = nn.Sequential(nn.Linear(8, 8), nn.Tanh()).double()
    head = nn.Linear(8, 3).double()
    return [dist.ZeroUnit("fc0", fc0, lambda x: fc0(x).tanh()), dist.ZeroUnit("body", body), ("head", head)]


def zero3_transformer():
    """(B, T, 6) -> a Linear to E = 8, the C++-bound TransformerBlock (2 heads, causal), a Linear to 1 feature."""
    return [("embed", nn.Linear(6, 8).double()), ("block", nn.TransformerBlock(8, 2).double()),
            ("head", nn.Linear(8, 1).double())]


ZERO3_MODELS = {"mlp": zero3_mlp, "transformer": zero3_transformer}
ZERO3_ADAM = {"lr": 0.02, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.05}


def zero3(inputs, rank, world):
    """Per model: three ZeRO-3 steps (the third accumulating two micro-batches; the transformer clips at 0.5), each
    from rank 0's weights; then a checkpoint saved, loaded into an optimizer of other weights, and one more step
    of both."""
    out, notes = {}, {}
    for model in ZERO3_MODELS:
        clip = model == "transformer"
        dg.manual_seed(100 + rank)  # every rank draws other weights: the optimizer broadcasts rank 0's
        opt = dist.ZeroOptimizer(ZERO3_MODELS[model](), **ZERO3_ADAM)
        notes[f"{model}/stage"] = opt.stage
        for name, t in opt.full_parameters().items():
            out[f"{model}/init/{name}"] = t.numpy().copy()
        notes[f"{model}/freed_at_rest"] = all(p.numel() == 0 for p in opt.module.parameters())

        def backward(x, y):
            loss = ((opt(dg.tensor(inputs[f"{model}_{x}"][rank])) - dg.tensor(inputs[f"{model}_{y}"][rank])) ** 2).mean()
            loss.backward()
            # Only the shards' gradients are kept: the model's parameters are freed, without gradients.
            freed = all(p.numel() == 0 and p.grad is None for p in opt.module.parameters())
            notes[f"{model}/freed_after_backward"] = notes.get(f"{model}/freed_after_backward", True) and freed

        norms = []
        for micro in (["x1"], ["x2"], ["xa", "xb"]):
            for x in micro:
                backward(x, "y" + x[1:])
            if clip:
                norms.append(opt.clip_grad_norm_(0.5).item())
            opt.step()
            notes[f"{model}/memory"] = opt.memory()  # the last step's: gradient shards still held
            opt.zero_grad()
        notes[f"{model}/norms"] = norms
        notes[f"{model}/step_count"] = opt.step_count
        full = opt.full_parameters()
        for name, t in full.items():
            out[f"{model}/after/{name}"] = t.numpy().copy()

        folder = f"{OUT_DIR}/ckpt_{model}"
        opt.save_checkpoint(folder)
        dg.manual_seed(999)
        resumed = dist.ZeroOptimizer(ZERO3_MODELS[model](), **ZERO3_ADAM)
        resumed.load_checkpoint(folder)
        notes[f"{model}/resumed_step_count"] = resumed.step_count
        notes[f"{model}/resumed_equal"] = all(np.array_equal(t.numpy(), full[n].numpy())
                                              for n, t in resumed.full_parameters().items())
        for o in (opt, resumed):
            ((o(dg.tensor(inputs[f"{model}_x1"][rank])) - dg.tensor(inputs[f"{model}_y1"][rank])) ** 2).mean().backward()
            o.step()
        a, b = opt.full_parameters(), resumed.full_parameters()
        notes[f"{model}/resumed_step_equal"] = all(np.array_equal(a[n].numpy(), b[n].numpy()) for n in a)
    return out, notes


OUT_DIR = "."


def main():
    global OUT_DIR
    mode, in_path, out_dir = sys.argv[1:4]
    OUT_DIR = out_dir
    notes, out = {}, {}
    if mode == "torchrun":
        rank = int(__import__("os").environ["RANK"])
        try:
            dist.init_process_group()
            notes["result"] = f"initialised: {dist.default_group().describe()}"
        except Exception as e:
            notes["error"] = type(e).__name__
            notes["message"] = str(e)
            notes["is_dg_error"] = isinstance(e, dg.Error)
    else:
        dist.init_process_group(timeout=60)
        rank, world = dist.get_rank(), dist.get_world_size()
        notes["world"] = world
        try:
            inputs = dict(np.load(in_path))
            out, more = {"collectives": collectives, "ddp": ddp, "zero": zero, "zero3": zero3}[mode](inputs, rank, world)
            notes.update(more)
        except Exception:
            notes["failure"] = traceback.format_exc()
        dist.destroy_process_group()
    np.savez(f"{out_dir}/rank{rank}.npz", **{k.replace("/", "__"): v for k, v in out.items()})
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(notes, f)


if __name__ == "__main__":
    main()
