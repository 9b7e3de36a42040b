"""dyngrad.distributed and dyngrad.nn.parallel: a group of one in this process, two ranks under mpirun (CPU
tensors through MPI; dist_worker.py is each rank), and torchrun's variables (a CPU build refuses them with
DeviceError: the torchrun rendezvous carries only NCCL's id, CUDA tensors).

The two-rank checks compare with this process's own computation: sums of the inputs it drew, and the mean of
each rank's single-process gradient (a plain model, no DDP) for the DDP step.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import dyngrad as dg
import dyngrad.distributed as dist
from dyngrad import nn
from dyngrad.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).parent))
import dist_worker  # noqa: E402  (the ZeRO-3 units the ranks train; the reference builds the same)

WORKER = Path(__file__).with_name("dist_worker.py")
needs_layer = pytest.mark.skipif(not dist.is_available(), reason="dyngrad was built without its distributed layer "
                                 "(no MPI where the library was built)")
LAUNCH_VARIABLES = ("OMPI_", "PMI_", "PMIX_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                    "TORCHELASTIC_", "DYNGRAD_RENDEZVOUS_PORT")


@pytest.fixture
def fresh_rng():
    seed = np.random.SeedSequence().entropy
    return np.random.default_rng(seed), seed


@pytest.fixture
def group():
    dist.init_process_group()
    yield
    dist.destroy_process_group()


def clean_environment(**extra):
    """The environment without an enclosing launch's variables. OpenMPI's settings (OMPI_MCA_*) stay: a machine
    without ssh sets plm_rsh_agent there, and mpirun refuses to start without it."""
    env = {k: v for k, v in os.environ.items()
           if k.startswith("OMPI_MCA_") or not k.startswith(LAUNCH_VARIABLES)}
    env.update(extra)
    return env


def run_bounded(command, env, timeout):
    """Runs a launch in its own session; on timeout the whole process group is killed (no rank lingers)."""
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, cwd=tempfile.gettempdir())
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{command[0]} did not finish within {timeout} s:\n{output[-4000:]}")
    return proc.returncode, output


def mpirun_two(mode, inputs, tmp_path):
    return mpirun_ranks(mode, inputs, tmp_path, 2)


def mpirun_ranks(mode, inputs, tmp_path, world):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not installed (apt-get install openmpi-bin)")
    np.savez(tmp_path / "in.npz", **inputs)
    # OpenMPI's session directory in a private, short path: concurrent launches on this machine do not race on it.
    session = tempfile.mkdtemp(prefix="dgmpi")
    env = clean_environment(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                            OMPI_MCA_btl_vader_single_copy_mechanism="none", DYNGRAD_DIST_TIMEOUT="60",
                            OMPI_MCA_orte_tmpdir_base=session)
    try:
        code, output = run_bounded([mpirun, "-np", str(world), "--oversubscribe", sys.executable, str(WORKER), mode,
                                    str(tmp_path / "in.npz"), str(tmp_path)], env, timeout=300)
    finally:
        shutil.rmtree(session, ignore_errors=True)
    assert code == 0, output[-4000:]
    ranks = []
    for r in range(world):
        notes = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert "failure" not in notes, f"rank {r}:\n{notes['failure']}"
        arrays = {k.replace("__", "/"): v for k, v in np.load(tmp_path / f"rank{r}.npz").items()}
        ranks.append((arrays, notes))
    return ranks


# ---- a group of one, in this process ----

@needs_layer
def test_before_init_and_after_destroy():
    assert not dist.is_initialized()
    with pytest.raises(dg.ValueError, match=r"get_rank\(\): the default process group is not initialised"):
        dist.get_rank()
    with pytest.raises(dg.ValueError, match="not initialised"):
        dist.all_reduce(dg.zeros(2))
    with pytest.raises(dg.ValueError, match="not initialised"):
        DistributedDataParallel(nn.Linear(2, 2))


@needs_layer
def test_group_of_one(group):
    assert dist.is_initialized() and dist.get_rank() == 0 and dist.get_world_size() == 1
    assert dist.get_backend() == "mpi:nccl" and dist.get_local_rank() == 0
    t = dg.tensor([1.5, -2.0])
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    dist.broadcast(t, src=0)
    dist.barrier()
    np.testing.assert_array_equal(t.numpy(), [1.5, -2.0])
    with pytest.raises(dg.ValueError, match="already initialised"):
        dist.init_process_group()
    with pytest.raises(dg.GraphError, match="recorded op"):
        dist.all_reduce(dg.tensor([1.0], requires_grad=True) * 3.0)
    with pytest.raises(dg.IndexError):
        dist.broadcast(t, src=1)
    with pytest.raises(TypeError, match="argument 'tensor'"):
        dist.all_reduce(np.zeros(2))


@needs_layer
@pytest.mark.parametrize("bad, error, match", [
    ({"backend": "gloo"}, dg.ValueError, "through MPI"),
    ({"init_method": "tcp://127.0.0.1:1"}, dg.ValueError, "env://"),
    ({"timeout": -1}, dg.ValueError, "positive"),
    ({"timeout": "60"}, TypeError, "argument 'timeout'"),
    ({"world_size": 4}, dg.ValueError, "world_size=4"),
])
def test_init_arguments(bad, error, match):
    with pytest.raises(error, match=match):
        dist.init_process_group(**bad)
    assert not dist.is_initialized()


def test_without_the_layer_every_call_says_why(monkeypatch):
    """A build without dyngrad::dist: is_available() is False and the API raises DistributedUnavailable (a
    DistributedError) with the reason the extension was built with."""
    stub = type("Stub", (), {"available": False, "unavailable_reason": "built without MPI (test)"})
    monkeypatch.setattr(dist, "_dist", stub)
    assert not dist.is_available()
    for call in (dist.init_process_group, dist.get_rank, lambda: dist.all_reduce(dg.zeros(1)), dist.barrier,
                 lambda: DistributedDataParallel(nn.Linear(2, 2))):
        with pytest.raises(dist.DistributedUnavailable, match="built without MPI"):
            call()
    assert issubclass(dist.DistributedUnavailable, dg.DistributedError)


@needs_layer
def test_ddp_of_one_is_the_plain_gradient(group, fresh_rng):
    rng, seed = fresh_rng
    x = rng.standard_normal((5, 3))
    dg.manual_seed(7)
    plain = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    dg.manual_seed(7)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double())
    (plain(dg.tensor(x)) ** 2).mean().backward()
    (model(dg.tensor(x)) ** 2).mean().backward()
    assert model.ddp_stats()["synchronised_calls"] == 1
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        assert name.startswith("module.")
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12, err_msg=f"seed {seed}")
    with model.no_sync():
        out = model(dg.tensor(x))
    out.sum().backward()  # recorded under no_sync: accumulates without a sync, as torch's
    assert model.ddp_stats()["backward_calls"] == 2 and model.ddp_stats()["synchronised_calls"] == 1
    # Two forwards before one backward: one averaged backward over both (each parameter reported once).
    for m in (plain, model):
        m.zero_grad()
        (m(dg.tensor(x)).sum() + (m(dg.tensor(x[:2])) ** 2).sum()).backward()
    assert model.ddp_stats()["synchronised_calls"] == 2
    for p, q in zip(model.parameters(), plain.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12, err_msg=f"seed {seed}")
    y = model(dg.tensor(x))
    with pytest.raises(dg.ValueError, match="scalar loss"):
        y.backward(dg.ones_like(y))
    with pytest.raises(TypeError, match="argument 'module'"):
        DistributedDataParallel(lambda x: x)
    with pytest.raises(dg.ValueError, match="device_ids"):
        DistributedDataParallel(nn.Linear(2, 2), device_ids=[3])


def test_ddp_gradient_as_bucket_view(group, fresh_rng):
    rng, seed = fresh_rng
    xs = [rng.standard_normal((5, 3)) for _ in range(2)]
    dg.manual_seed(7)
    plain = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    for views in (False, True):
        dg.manual_seed(7)
        model = DistributedDataParallel(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double(),
                                        gradient_as_bucket_view=views)
        held = None
        for x in xs:
            for m in (plain, model):
                m.zero_grad()
                (m(dg.tensor(x)) ** 2).mean().backward()
            for p, q in zip(model.parameters(), plain.parameters()):
                np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12, err_msg=f"seed {seed}")
            if held is None:
                held, held_then = model.module[0].weight.grad, model.module[0].weight.grad.numpy().copy()
        # The first step's gradient, held past the second backward: rewritten in its bucket only with views.
        assert np.array_equal(held.numpy(), held_then) == (not views)


def test_ddp_compression_in_a_group_of_one(group, fresh_rng):
    # A group of one sends nothing, so compression rounds nothing: the plain gradient. Bad dtypes are refused.
    rng, seed = fresh_rng
    x = rng.standard_normal((5, 3))
    dg.manual_seed(7)
    plain = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    dg.manual_seed(7)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)), compression=dg.float16)
    for m in (plain, model):
        (m(dg.tensor(x, dtype=dg.float32)) ** 2).mean().backward()
    for p, q in zip(model.parameters(), plain.parameters()):
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy(), err_msg=f"seed {seed}")
    model.register_comm_hook(None, dist.bf16_compress_hook)
    with pytest.raises(TypeError, match="not one dyngrad runs"):
        model.register_comm_hook(None, lambda state, bucket: bucket)
    with pytest.raises(TypeError, match="not called directly"):
        dist.fp16_compress_hook(None, None)
    with pytest.raises(dg.ValueError, match="not a 16-bit dtype"):
        DistributedDataParallel(nn.Linear(3, 4), compression=dg.float32)
    with pytest.raises(dg.DTypeError, match="is for float32 gradients"):
        DistributedDataParallel(nn.Linear(3, 4).double(), compression=dg.bfloat16)


# ---- two ranks under mpirun ----

@needs_layer
def test_mpirun_collectives(tmp_path, fresh_rng):
    rng, seed = fresh_rng
    inputs = {"f32": rng.standard_normal((2, 3, 4)).astype(np.float32), "f64": rng.standard_normal((2, 5)),
              "i64": rng.integers(-1000, 1000, (2, 6)), "scatter": rng.standard_normal((2, 8))}
    ranks = mpirun_two("collectives", inputs, tmp_path)
    for r, (out, notes) in enumerate(ranks):
        msg = f"rank {r}, seed {seed}"
        assert notes["world"] == 2 and notes["async_completed"], msg
        np.testing.assert_allclose(out["sum_f32"], inputs["f32"].sum(0), rtol=1e-6, err_msg=msg)
        np.testing.assert_allclose(out["avg_f64"], inputs["f64"].mean(0), rtol=1e-14, err_msg=msg)
        np.testing.assert_array_equal(out["sum_i64"], inputs["i64"].sum(0), err_msg=msg)
        np.testing.assert_array_equal(out["broadcast_from_1"], inputs["f32"][1], err_msg=msg)
        np.testing.assert_array_equal(out["all_gather"], inputs["f64"], err_msg=msg)
        np.testing.assert_array_equal(out["all_gather_into"], inputs["f64"], err_msg=msg)
        np.testing.assert_allclose(out["reduce_scatter"], inputs["scatter"].sum(0)[4 * r:4 * r + 4], rtol=1e-14,
                                   err_msg=msg)
        np.testing.assert_array_equal(out["after_errors"], [1.0], err_msg=msg)
        assert notes["history"].startswith("GraphError") and "detach" in notes["history"], msg
        assert notes["bad_root"].startswith("IndexError") and notes["bad_op"].startswith("ValueError"), msg
        assert notes["int64_avg"].startswith("DTypeError") and "already initialised" in notes["twice"], msg


class Net(nn.Module):
    """dist_worker.Net with rank 0's buffer (scale 1): the single-process reference."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(self.fc1(x).tanh())


def single_process_gradient(params, x, y):
    """This rank's gradient without DDP: a plain model holding `params`, its own forward and backward."""
    model = Net().double()
    model.load_state_dict({k.removeprefix("module."): dg.tensor(v) for k, v in params.items()})
    ((model(dg.tensor(x)) - dg.tensor(y)) ** 2).mean().backward()
    return {f"module.{k}": p.grad.numpy() for k, p in model.named_parameters()}


@needs_layer
def test_mpirun_ddp_averages_the_ranks_gradients(tmp_path, fresh_rng):
    rng, seed = fresh_rng
    inputs = {k: rng.standard_normal((2, 6, 4 if k.startswith("x") else 3)) for k in ("x1", "y1", "xa", "ya", "xb", "yb")}
    (out0, notes0), (out1, notes1) = mpirun_two("ddp", inputs, tmp_path)
    names = [k.removeprefix("init/") for k in out0 if k.startswith("init/")]
    assert names == ["module.fc1.weight", "module.fc1.bias", "module.fc2.weight", "module.fc2.bias"]
    msg = f"seed {seed}"
    # Construction: rank 0's weights and buffers everywhere (rank 1 drew other weights and scale 2).
    for n in names:
        np.testing.assert_array_equal(out1[f"init/{n}"], out0[f"init/{n}"], err_msg=msg)
    np.testing.assert_array_equal(out1["buffer/scale"], np.ones(3), err_msg=msg)
    init = {n: out0[f"init/{n}"] for n in names}

    # Step 1: the averaged gradient is the mean of each rank's single-process gradient, on both ranks.
    g = [single_process_gradient(init, inputs["x1"][r], inputs["y1"][r]) for r in range(2)]
    for out in (out0, out1):
        for n in names:
            np.testing.assert_allclose(out[f"step1/{n}"], (g[0][n] + g[1][n]) / 2, rtol=1e-12, atol=1e-15,
                                       err_msg=f"{n}, {msg}")
            np.testing.assert_allclose(out[f"after_step/{n}"], init[n] - 0.1 * (g[0][n] + g[1][n]) / 2, rtol=1e-12,
                                       atol=1e-15, err_msg=f"{n}, {msg}")
    assert notes0["stats1"]["synchronised_calls"] == 1 and notes0["stats1"]["unused_parameters"] == 0
    assert sorted(sum(notes0["buckets"], [])) == sorted(names)

    # Step 2: under no_sync() each rank keeps its own gradient; the next backward averages the accumulated sums.
    stepped = {n: out0[f"after_step/{n}"] for n in names}
    ga = [single_process_gradient(stepped, inputs["xa"][r], inputs["ya"][r]) for r in range(2)]
    gb = [single_process_gradient(stepped, inputs["xb"][r], inputs["yb"][r]) for r in range(2)]
    for r, out in enumerate((out0, out1)):
        for n in names:
            np.testing.assert_allclose(out[f"local/{n}"], ga[r][n], rtol=1e-12, atol=1e-15, err_msg=f"{n}, {msg}")
            expected = (ga[0][n] + gb[0][n] + ga[1][n] + gb[1][n]) / 2
            np.testing.assert_allclose(out[f"step2/{n}"], expected, rtol=1e-12, atol=1e-15, err_msg=f"{n}, {msg}")
    for r, out in enumerate((out0, out1)):
        np.testing.assert_array_equal(out["buffer/after_train_forward"], np.full(3, 10.0))
        np.testing.assert_array_equal(out["buffer/after_eval_forward"], np.full(3, 20.0 + r))
    for notes in (notes0, notes1):
        assert notes["calls"] == [3, 2]
        assert notes["gradient"].startswith("ValueError") and "scalar loss" in notes["gradient"]

    # register_comm_hook(None, bf16_compress_hook): the float32 model's averaged gradient is a bfloat16 value, the
    # same on both ranks, within two bfloat16 roundings (2^-8 each) of the exact mean.
    bf16_names = [k.removeprefix("bf16/") for k in out0 if k.startswith("bf16/")]
    assert bf16_names == ["module.0.weight", "module.0.bias", "module.2.weight", "module.2.bias"]
    w1, b1, w2, b2 = (out0[f"bf16_init/{n}"].astype(np.float64) for n in bf16_names)
    exact = {n: 0.0 for n in bf16_names}
    for r in range(2):
        x, y = inputs["x1"][r].astype(np.float32).astype(np.float64), inputs["y1"][r].astype(np.float32).astype(np.float64)
        h = np.tanh(x @ w1.T + b1)
        d = 2 * (h @ w2.T + b2 - y) / y.size
        dh = (d @ w2) * (1 - h ** 2)
        for n, g in zip(bf16_names, (dh.T @ x, dh.sum(0), d.T @ h, d.sum(0))):
            exact[n] = exact[n] + g / 2
    for n in bf16_names:
        got = out0[f"bf16/{n}"]
        np.testing.assert_array_equal(out1[f"bf16/{n}"], got, err_msg=f"{n}, {msg}")
        as_bf16 = dg.tensor(got.astype(np.float64), dtype=dg.bfloat16).float().numpy()
        np.testing.assert_array_equal(as_bf16, got, err_msg=f"{n} is not a bfloat16 value, {msg}")
        assert np.linalg.norm(got - exact[n]) <= 2e-2 * np.linalg.norm(exact[n]), f"{n}, {msg}"
    for notes in (notes0, notes1):
        assert notes["other_hook"].startswith("TypeError") and "not one dyngrad runs" in notes["other_hook"]


@needs_layer
def test_mpirun_zero_optimizer_steps_as_adamw_on_the_whole_batch(tmp_path, fresh_rng):
    """dist.ZeroOptimizer (stages 1 and 2): two steps on two ranks end where a single-process AdamW over both
    ranks' batches (equal sizes, a mean loss: the mean of the ranks' gradients) ends."""
    rng, seed = fresh_rng
    inputs = {k: rng.standard_normal((2, 6, 4 if k.startswith("x") else 3)) for k in ("x1", "y1", "xa", "ya")}
    (out0, notes0), (out1, _) = mpirun_two("zero", inputs, tmp_path)
    for stage in (1, 2):
        names = [k.split("/", 2)[2] for k in out0 if k.startswith(f"zero{stage}/init/")]
        assert names == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
        model = Net().double()
        model.load_state_dict({n: dg.tensor(out0[f"zero{stage}/init/{n}"]) for n in names})
        opt = dg.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
        for x, y in (("x1", "y1"), ("xa", "ya")):
            xs, ys = inputs[x].reshape(12, 4), inputs[y].reshape(12, 3)
            ((model(dg.tensor(xs)) - dg.tensor(ys)) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
        for n, p in model.named_parameters():
            for out in (out0, out1):
                np.testing.assert_array_equal(out[f"zero{stage}/init/{n}"], out0[f"zero{stage}/init/{n}"])
                np.testing.assert_allclose(out[f"zero{stage}/after/{n}"], p.numpy(), rtol=1e-10, atol=1e-12,
                                           err_msg=f"stage {stage}, {n}, seed {seed}")
        assert notes0[f"zero{stage}_memory"]["stage"] == stage and notes0[f"zero{stage}_memory"]["world"] == 2


# ---- ZeRO stage 3 ----

def test_gpt_units_compose_to_the_gpt_and_refuse_dropout_and_tied_embeddings():
    """dist.gpt_units (C++ dist::gpt_units): the units applied in turn give model(tokens) exactly, every parameter is in
    exactly one unit; dropout and tied embeddings are ValueErrors naming the reason."""
    model = nn.GPT(61, context=8, layers=2, heads=2, width=16, seed=int(np.random.default_rng().integers(1 << 30)))
    units = dist.gpt_units(model)
    assert [u.name for u in units] == ["embed", "block0", "block1", "head"]
    tokens = dg.tensor(np.random.default_rng().integers(0, 61, size=(3, 8)), dtype=dg.int64)
    x = tokens
    for unit in units:
        x = unit.forward(x)
    np.testing.assert_array_equal(x.numpy(), model(tokens).numpy())
    held = sorted(id(p) for u in units for p in u.module.parameters())
    assert held == sorted(id(p) for p in model.parameters())
    with pytest.raises(dg.ValueError, match="dropout"):
        dist.gpt_units(nn.GPT(61, context=8, layers=1, heads=2, width=16, dropout=0.1))
    with pytest.raises(dg.ValueError, match="token embedding"):
        dist.gpt_units(nn.GPT(61, context=8, layers=1, heads=2, width=16, tie_embeddings=True))
    with pytest.raises(dg.ValueError, match="reduced_residual"):
        dist.gpt_units(nn.GPT(61, context=8, layers=1, heads=2, width=16, reduced_residual=True))
    with pytest.raises(TypeError, match="model"):
        dist.gpt_units(model.blocks[0])


def units_module(units):
    """The units' modules under their names: dist::ZeroOptimizer::module()'s layout (the reference model)."""
    container = nn.Module()
    for unit in units:
        container.add_module(unit.name, unit.module)
    return container


def run_units(units, x):
    for unit in units:
        x = unit.forward(x)
    return x


def zero3_reference(model, init, inputs, clip):
    """Single-process AdamW over the whole batch (every rank's rows) from rank 0's weights, through the same units:
    the steps of dist_worker.zero3 (the third accumulates two micro-batches). Returns (parameters, norms)."""
    units = dist._zero_units(dist_worker.ZERO3_MODELS[model]())
    container = units_module(units)
    assert list(init) == [n for n, _ in container.named_parameters()]
    container.load_state_dict({n: dg.tensor(v) for n, v in init.items()})
    opt = dg.optim.AdamW(container.parameters(), **dist_worker.ZERO3_ADAM)
    norms = []
    for micro in (["x1"], ["x2"], ["xa", "xb"]):
        for x in micro:
            xs, ys = inputs[f"{model}_{x}"], inputs[f"{model}_y{x[1:]}"]
            whole_x, whole_y = xs.reshape(-1, *xs.shape[2:]), ys.reshape(-1, *ys.shape[2:])
            ((run_units(units, dg.tensor(whole_x)) - dg.tensor(whole_y)) ** 2).mean().backward()
        if clip:
            norms.append(nn.utils.clip_grad_norm_(container.parameters(), 0.5).item())
        opt.step()
        opt.zero_grad()
    return {n: p.numpy() for n, p in container.named_parameters()}, norms


@needs_layer
@pytest.mark.parametrize("world", [2, 3])
def test_mpirun_zero3_steps_as_adamw_on_the_whole_batch(tmp_path, fresh_rng, world):
    """dist.ZeroOptimizer stage 3 on 2 and 3 ranks (3 divides no unit's size: every flat is padded): an MLP of
    Python units and a tiny transformer around the C++-bound TransformerBlock end, after three steps (the last
    accumulating two micro-batches, the transformer's clipped), where single-process AdamW over the whole batch
    ends; the parameters are freed between uses; memory() matches the ZeRO-3 formulas; a checkpoint resumes
    exactly."""
    rng, seed = fresh_rng
    inputs = {}
    for k in ("x1", "y1", "x2", "y2", "xa", "ya", "xb", "yb"):
        inputs[f"mlp_{k}"] = rng.standard_normal((world, 4, 4 if k[0] == "x" else 3))
        inputs[f"transformer_{k}"] = rng.standard_normal((world, 2, 5, 6 if k[0] == "x" else 1))
    ranks = mpirun_ranks("zero3", inputs, tmp_path, world)
    out0 = ranks[0][0]
    for model in dist_worker.ZERO3_MODELS:
        msg = f"{model}, world {world}, seed {seed}"
        init = {k.split("/", 2)[2]: v for k, v in out0.items() if k.startswith(f"{model}/init/")}
        want, norms = zero3_reference(model, init, inputs, clip=model == "transformer")
        # The units' sizes: one flat per unit (all f64), each padded to a multiple of the world size.
        sizes = {}
        for name, v in init.items():
            sizes[name.split(".")[0]] = sizes.get(name.split(".")[0], 0) + v.size
        shards = sum(-(-n // world) for n in sizes.values())
        for r, (out, notes) in enumerate(ranks):
            assert notes[f"{model}/stage"] == 3, msg
            assert notes[f"{model}/freed_at_rest"] and notes[f"{model}/freed_after_backward"], msg
            assert notes[f"{model}/step_count"] == 3 and notes[f"{model}/resumed_step_count"] == 3, msg
            assert notes[f"{model}/resumed_equal"] and notes[f"{model}/resumed_step_equal"], msg
            np.testing.assert_allclose(notes[f"{model}/norms"], norms, rtol=1e-10, err_msg=msg)
            for name in init:
                np.testing.assert_array_equal(out[f"{model}/init/{name}"], init[name], err_msg=f"{name}, {msg}")
                np.testing.assert_allclose(out[f"{model}/after/{name}"], want[name], rtol=1e-10, atol=1e-12,
                                           err_msg=f"rank {r}, {name}, {msg}")
            m = notes[f"{model}/memory"]
            assert m["stage"] == 3 and m["world"] == world, msg
            assert m["parameters"] == sum(sizes.values()) and m["padded"] == shards * world, msg
            assert m["parameter_bytes"] == m["formula_parameter_bytes"] == shards * 8, msg
            assert m["gradient_bytes"] == m["formula_gradient_bytes"] == shards * 8, msg
            assert m["optimizer_bytes"] == m["formula_optimizer_bytes"] == 2 * shards * 8, msg
            # Prefetch is on by default (world > 1): a unit and its neighbour gathered at once, at most.
            unit_bytes = [-(-n // world) * world * 8 for n in sizes.values()]
            pairs = [a + b for a, b in zip(unit_bytes, unit_bytes[1:])] or unit_bytes
            assert m["formula_gathered_bytes"] == max(pairs), msg
            assert m["gathered_peak_bytes"] == m["formula_gathered_bytes"], msg
            assert m["ddp_bytes"] == 4 * sum(sizes.values()) * 8, msg


@needs_layer
def test_zero3_in_a_group_of_one_is_adamw(group, fresh_rng):
    rng, seed = fresh_rng
    dg.manual_seed(int(rng.integers(1 << 30)))
    opt = dist.ZeroOptimizer(dist_worker.zero3_mlp(), lr=0.02, weight_decay=0.05)
    init = {n: t.numpy().copy() for n, t in opt.full_parameters().items()}
    assert list(init) == ["fc0.weight", "fc0.bias", "body.0.weight", "body.0.bias", "head.weight", "head.bias"]
    assert [n for n, _ in opt.module.named_parameters()] == list(init)
    units = dist._zero_units(dist_worker.zero3_mlp())
    reference = units_module(units)
    reference.load_state_dict({n: dg.tensor(v) for n, v in init.items()})
    adam = dg.optim.AdamW(reference.parameters(), lr=0.02, weight_decay=0.05)
    for _ in range(3):
        x, y = dg.tensor(rng.standard_normal((5, 4))), dg.tensor(rng.standard_normal((5, 3)))
        out = opt(x)
        assert out.shape == (5, 3) and out.requires_grad
        ((out - y) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
        ((run_units(units, x) - y) ** 2).mean().backward()
        adam.step()
        adam.zero_grad()
    for name, t in opt.full_parameters().items():
        np.testing.assert_allclose(t.numpy(), reference.state_dict()[name].numpy(), rtol=1e-12, atol=1e-14,
                                   err_msg=f"{name}, seed {seed}")
    # Under dg.no_grad() the units run without recording (evaluation), parameters still freed after.
    with dg.no_grad():
        y = opt(dg.tensor(rng.standard_normal((2, 4))))
    assert not y.requires_grad and y.shape == (2, 3)
    assert all(p.numel() == 0 for p in opt.module.parameters())


@needs_layer
def test_zero3_under_bf16_autocast_is_the_same_autocast_on_one_process(group, fresh_rng):
    """Kept (the default), the unit's casts of its gathered parameters are freed and recomputed for the backward; with
    recompute the unit's backward recomputes under the forward's autocast dtype (as C++: recomputed in float32 the
    unit's output would not even match its gradient's dtype). One step with eps = 1e3 makes AdamW's update ~ lr·g/eps,
    linear in the gradient, so the updates compare within bf16 rounding."""
    rng, seed = fresh_rng
    dg.manual_seed(int(rng.integers(1 << 30)))
    units = [("fc0", nn.Linear(12, 32)), ("fc1", nn.Linear(32, 7))]
    opt = dist.ZeroOptimizer(units, lr=1.0, eps=1e3, weight_decay=0.0)
    before = {n: t.numpy().copy() for n, t in opt.full_parameters().items()}
    reference = units_module(dist._zero_units([("fc0", nn.Linear(12, 32)), ("fc1", nn.Linear(32, 7))]))
    reference.load_state_dict({n: dg.tensor(v) for n, v in before.items()})
    adam = dg.optim.AdamW(reference.parameters(), lr=1.0, eps=1e3, weight_decay=0.0)
    x = dg.tensor(rng.standard_normal((16, 12)).astype(np.float32))
    y = dg.tensor(rng.integers(0, 7, (16,)))
    with dg.autocast("cpu", dtype=dg.bfloat16):
        out = opt(x)
        assert out.dtype == dg.bfloat16
        loss = dg.nn.functional.cross_entropy(out, y)
    loss.backward()
    opt.step()
    with dg.autocast("cpu", dtype=dg.bfloat16):
        loss = dg.nn.functional.cross_entropy(reference.fc1(reference.fc0(x)), y)
    loss.backward()
    adam.step()
    for name, t in opt.full_parameters().items():
        got = t.numpy() - before[name]
        want = reference.state_dict()[name].numpy() - before[name]
        assert np.abs(want).max() > 0, name
        assert np.linalg.norm(got - want) <= 3e-2 * np.linalg.norm(want), f"{name}, seed {seed}"


@needs_layer
def test_zero3_kept_by_default_and_recompute_on_request(group, fresh_rng):
    """recompute=False (the default) keeps each unit's recorded forward, its gathered memory released until the
    backward; recompute=True re-runs it there. Both are the same training; a stochastic unit needs the kept way."""
    rng, seed = fresh_rng
    x, y = dg.tensor(rng.standard_normal((5, 4))), dg.tensor(rng.standard_normal((5, 3)))
    results = []
    for recompute in (False, True):
        dg.manual_seed(int(seed % (1 << 30)))
        opt = dist.ZeroOptimizer([("fc0", nn.Linear(4, 8).double()), ("fc1", nn.Linear(8, 3).double())],
                                 recompute=recompute)
        out = opt(x)
        memory = opt.memory()
        assert memory["gathered_bytes"] == 0 and memory["kept_parameter_bytes"] == 0
        assert memory["released_bytes"] == (0 if recompute else memory["padded"] * 8)
        ((out - y) ** 2).mean().backward()
        assert opt.memory()["released_bytes"] == 0
        opt.step()
        results.append({n: t.numpy().copy() for n, t in opt.full_parameters().items()})
    for name in results[0]:
        np.testing.assert_allclose(results[0][name], results[1][name], rtol=1e-13, atol=1e-15,
                                   err_msg=f"{name}, seed {seed}")
    with pytest.raises(TypeError, match="argument 'recompute'"):
        dist.ZeroOptimizer([("a", nn.Linear(4, 3))], recompute=1)
    with pytest.raises(dg.ValueError, match="recompute=True .* is for stage=3"):
        dist.ZeroOptimizer(nn.Linear(4, 3), stage=2, recompute=True)
    with pytest.raises(dg.ValueError, match="unit 'a' is stochastic"):
        dist.ZeroOptimizer([dist.ZeroUnit("a", nn.Linear(4, 3), stochastic=True)], recompute=True)
    with pytest.raises(TypeError, match="argument 'stochastic'"):
        dist.ZeroUnit("a", nn.Linear(4, 3), stochastic="yes")


def test_zero3_prefetch_in_a_group_of_one(group, fresh_rng):
    """prefetch=True (and the default, None) in a group of one prefetches nothing (nothing is sent): the same training
    bit for bit. Two ranks' prefetch is checked by the C++ tests (test_dist_zero3 [prefetch] under mpirun) and by the
    default in test_mpirun_zero3_steps_as_adamw_on_the_whole_batch."""
    rng, seed = fresh_rng
    x, y = dg.tensor(rng.standard_normal((5, 4))), dg.tensor(rng.standard_normal((5, 3)))
    results = []
    for prefetch in (False, None, True):
        dg.manual_seed(int(seed % (1 << 30)))
        opt = dist.ZeroOptimizer([("fc0", nn.Linear(4, 8).double()), ("fc1", nn.Linear(8, 3).double())],
                                 prefetch=prefetch)
        ((opt(x) - y) ** 2).mean().backward()
        opt.step()
        results.append({n: t.numpy().copy() for n, t in opt.full_parameters().items()})
    for name in results[0]:
        np.testing.assert_array_equal(results[0][name], results[1][name], err_msg=f"{name}, seed {seed}")
    with pytest.raises(TypeError, match="argument 'prefetch'"):
        dist.ZeroOptimizer([("a", nn.Linear(4, 3))], prefetch=1)
    with pytest.raises(dg.ValueError, match="prefetch=True is for stage=3"):
        dist.ZeroOptimizer([("a", nn.Linear(4, 3))], recompute=True, prefetch=True)
    with pytest.raises(dg.ValueError, match="prefetch=True is for stage=3"):
        dist.ZeroOptimizer(nn.Linear(4, 3), stage=2, prefetch=True)
    # The default applies prefetch where it can: recompute and stage 2 take it without complaint.
    dist.ZeroOptimizer([("a", nn.Linear(4, 3))], recompute=True)
    dist.ZeroOptimizer(nn.Linear(4, 3), stage=2, prefetch=None)


@needs_layer
def test_zero3_bad_inputs_are_typed_errors(group):
    dg.manual_seed(3)
    layer = nn.Linear(4, 3).double()
    units = [("a", nn.Linear(4, 3).double())]
    with pytest.raises(TypeError, match="argument 'stage'"):
        dist.ZeroOptimizer(units, stage="3")
    with pytest.raises(TypeError, match="argument 'stage'"):
        dist.ZeroOptimizer(layer, stage=True)
    with pytest.raises(dg.ValueError, match=r"stage=4: ZeRO has stage 1 .* 3"):
        dist.ZeroOptimizer(units, stage=4)
    with pytest.raises(dg.ValueError, match="stage=3 shards the parameters unit by unit"):
        dist.ZeroOptimizer(layer, stage=3)
    with pytest.raises(dg.ValueError, match="stage=2 takes the whole model"):
        dist.ZeroOptimizer(units, stage=2)
    with pytest.raises(TypeError, match="argument 'module'"):
        dist.ZeroOptimizer("model")
    with pytest.raises(TypeError, match=r"module\[1\] must be a ZeroUnit"):
        dist.ZeroOptimizer([("a", nn.Linear(4, 3)), nn.Linear(3, 2)])
    with pytest.raises(TypeError, match="argument 'module'"):
        dist.ZeroUnit("a", lambda x: x)
    with pytest.raises(dg.ValueError, match="used twice"):
        dist.ZeroOptimizer([("a", nn.Linear(4, 3)), ("a", nn.Linear(3, 2))])
    with pytest.raises(dg.ValueError, match="has a dot"):
        dist.ZeroOptimizer([("a.b", nn.Linear(4, 3))])
    with pytest.raises(dg.ValueError, match="earlier unit"):
        dist.ZeroOptimizer([("a", layer), ("b", layer)])
    with pytest.raises(dg.ValueError, match="no units"):
        dist.ZeroOptimizer([])
    with pytest.raises(dg.ValueError, match=r"forward\(\): stage 2 runs the model itself"):
        dist.ZeroOptimizer(nn.Linear(4, 3))(dg.ones(2, 4))

    x = dg.tensor(np.random.default_rng(1).standard_normal((2, 4)))
    returns_numpy = dist.ZeroOptimizer([dist.ZeroUnit("a", nn.Linear(4, 3).double(), lambda t: t.numpy())])
    with pytest.raises(dg.ValueError, match="unit 'a': its forward must return a dyngrad Tensor, got numpy.ndarray"):
        returns_numpy(x)
    wrong = nn.Linear(5, 3).double()
    mismatch = dist.ZeroOptimizer([("a", nn.Linear(4, 3).double()), ("b", wrong)])
    with pytest.raises(dg.ShapeError, match="unit 'b': its forward raised ShapeError"):
        mismatch(x)
    raises = dist.ZeroOptimizer([dist.ZeroUnit("a", nn.Linear(4, 3).double(), lambda t: int("x"))])
    with pytest.raises(dg.ValueError, match="unit 'a': its forward raised ValueError: invalid literal"):
        raises(x)
    outside = dg.tensor(np.array([1.0]), requires_grad=True) * 2.0
    leaks = dist.ZeroOptimizer([dist.ZeroUnit("a", nn.Linear(4, 3).double(), lambda t: t + outside)])
    with pytest.raises(dg.GraphError, match="recorded outside this ZeRO-3 unit"):
        leaks(x).sum().backward()
    with pytest.raises(TypeError, match="argument 'x'"):
        mismatch(np.ones((2, 4)))

    # A tensor the unit's forward kept outlives the unit's graph: reading it is a typed error, not a crash.
    kept = []
    fc = nn.Linear(4, 3).double()
    keeps = dist.ZeroOptimizer([dist.ZeroUnit("a", fc, lambda t: kept.append(fc(t)) or kept[-1])])
    keeps(x).sum().backward()
    keeps.step()
    with pytest.raises(dg.GraphError):
        kept[-1].numpy()
    with pytest.raises(dg.GraphError):
        (kept[-1] * 2.0).sum().backward()


# ---- torchrun's variables ----

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_layer
def test_torchrun_launch_on_the_cpu_is_refused(tmp_path):
    """ProcessGroup::from_env reduces CUDA tensors only (its TCP rendezvous carries NCCL's id): on a CPU build or a
    machine without devices both ranks get DeviceError saying to launch with mpirun, before any rendezvous."""
    if dg.cuda_is_available():
        pytest.skip("a CUDA device is present: torchrun launches rendezvous over NCCL there (the GPU machine's "
                    "tests cover it)")
    port = free_port()
    procs = []
    for rank in range(2):
        env = clean_environment(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                                MASTER_PORT=str(port), DYNGRAD_DIST_TIMEOUT="30")
        procs.append(subprocess.Popen([sys.executable, str(WORKER), "torchrun", "-", str(tmp_path)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      cwd=tempfile.gettempdir()))
    for p in procs:
        try:
            output, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a torchrun-style rank did not finish within 120 s")
        assert p.returncode == 0, output
    for rank in range(2):
        notes = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert notes.get("error") == "DeviceError" and notes["is_dg_error"], notes
        assert f"rank {rank}/2 launched by torchrun" in notes["message"], notes
        assert "launch with mpirun for CPU tensors" in notes["message"], notes
