#!/usr/bin/env python3
"""Independent references for every op-table case: PyTorch in float64 (torch only; no dyngrad code).

Reads the cases written by dyngrad-export-cases (one <op>.safetensors per op-table row: inputs "<k>.x<i>",
output weight "<k>.w", metadata "op", "cases" = JSON [{label, grad, attrs}], "count", "<k>.label") and
writes OUT/<op>.safetensors with the same tensors and metadata ("reference" added) plus, per case k,
    "<k>.y"        the op's output computed by PyTorch,
    "<k>.g<i>"     dL/d input i for every input whose "grad" is true, L = sum(w * y) (torch.autograd.grad),
    "<k>.after<i>" batch_norm only: the running statistics (inputs 3, 4) after the forward,
and, for rows with a differentiable backward (metadata "second_order": "true", directions "<k>.v<i>" exported),
    "<k>.h<i>"     dS/d input i, S = sum_j <dL/dx_j, v_j> with dL/dx_j from torch.autograd.grad(create_graph=True):
                   PyTorch's double backward (zeros where S does not depend on input i).
tests/verification/test_golden.cpp runs dyngrad on the stored inputs and compares with these; tests/verification/test_golden_second_order.cpp
compares the "<k>.h<i>" (and skips, saying so, while no golden holds any).

Reproduce (from the repository root; torch and safetensors installed):
    cmake --build build-cpu --target dyngrad-export-cases
    build-cpu/tools/dyngrad-export-cases /tmp/dyngrad-cases
    python tools/make_goldens.py /tmp/dyngrad-cases tests/goldens
The goldens hold their inputs, so they can also be recomputed from themselves (same result, bit for bit):
    python tools/make_goldens.py tests/goldens tests/goldens

An op's reference is the PyTorch expression its op-table row states (metadata "torch", e.g. "torch.sqrt(x)"),
evaluated with x (or a, b) bound to its inputs and its attributes bound by their field names in graph/op_def.h's
field table (the exported cases carry every attribute their op reads); so a new pointwise row needs nothing here.
Where an expression is prose or needs more than that (defaults for empty axes, dtype names, weights sliced from a
flat buffer, dyngrad's dropout mask) the op is mapped by hand below (REFERENCES), which takes precedence. An op with
neither is an error that quotes its row's expression.
"""
import json
import pathlib
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from safetensors import safe_open

torch.set_default_dtype(torch.float64)


def unary(fn):
    return lambda xs, a: fn(xs[0], a)


def binary(fn):
    return lambda xs, a: fn(xs[0], xs[1])


def reduce_axes(fn):
    def apply(xs, a):
        x = xs[0]
        dims = a["axes"] if a["axes"] else list(range(x.dim()))
        if x.dim() == 0:
            return fn(x)
        return fn(x, dim=dims, keepdim=a["keepdim"])
    return apply


def maybe_relu(y, a):
    if a["activation"] == "relu":
        return torch.relu(y)
    if a["activation"] != "none":
        raise SystemExit(f"make_goldens: unknown activation {a['activation']!r}")
    return y


def linear(xs, a):
    return maybe_relu(F.linear(xs[0], xs[1], xs[2]), a)


def conv2d(xs, a):
    bias = xs[2] if len(xs) > 2 else None
    y = F.conv2d(xs[0], xs[1], bias, stride=a["stride"], padding=a["padding"], dilation=a["dilation"],
                 groups=a["groups"])
    return maybe_relu(y, a)


def max_pool2d(xs, a):
    return F.max_pool2d(xs[0], a["kernel"], a["stride"], a["padding"], ceil_mode=False)


def avg_pool2d(xs, a):
    # dyngrad's average pooling divides every window by kh·kw, padding included (PyTorch's default).
    return F.avg_pool2d(xs[0], a["kernel"], a["stride"], a["padding"], ceil_mode=False, count_include_pad=True)


def layer_norm(xs, a):
    weight = xs[1] if len(xs) > 1 else None
    bias = xs[2] if len(xs) > 2 else None
    return F.layer_norm(xs[0], a["shape"], weight, bias, eps=a["eps"])


def rms_norm(xs, a):
    return F.rms_norm(xs[0], a["shape"], xs[1] if len(xs) > 1 else None, eps=a["eps"])


def batch_norm(xs, a):
    # Inputs 3 and 4 are the running mean and variance: updated in training, used in eval, never differentiated.
    x, gamma, beta, running_mean, running_var = xs
    return F.batch_norm(x, running_mean, running_var, gamma, beta, training=a["training"], momentum=a["momentum"],
                        eps=a["eps"])


# Dropout's keep mask is dyngrad's own convention (ops/dropout_mask.h documents it: element i keeps when the
# top 53 bits of SplitMix64's (i+1)-th output for `seed`, as a uniform in [0, 1), are >= p), written here
# again from that description with Python integers; the scaling by 1/(1 - p) is PyTorch's.
MASK64 = (1 << 64) - 1
SPLITMIX_GAMMA = 0x9E3779B97F4A7C15


def splitmix64_uniform(seed, index):
    z = (seed + (index + 1) * SPLITMIX_GAMMA) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    z ^= z >> 31
    return (z >> 11) * 2.0 ** -53


def dropout(xs, a):
    x, p = xs[0], a["scalar"]
    if not a["training"] or p == 0:
        return F.dropout(x, p, training=False)
    # The seed-tensor form: the int64 input's bits are the seed.
    seed = int(xs[1].item()) & MASK64 if len(xs) > 1 else int(a["seed"])
    keep = torch.tensor([splitmix64_uniform(seed, i) >= p for i in range(x.numel())]).reshape(x.shape)
    return x * keep.to(x.dtype) / (1 - p)


def scaled_dot_product_attention(xs, a):
    """q (B,H,T,D), k, v (B,H,S,D)[, keep mask of 0/1 broadcastable to (B,H,T,S)]. dyngrad's mask is a float keep
    mask (1 = take part), PyTorch's bool attn_mask the same with True; PyTorch refuses attn_mask with is_causal, so
    a causal case with a mask passes their conjunction. Dropout cases: the same math written out, with dyngrad's
    counter-based keep mask over the flat (b,h,t,s) index (ops/attention.h). PyTorch's math backend: its CPU flash
    kernel (the default) has no double backward, the math one is differentiable twice."""
    q, k, v = xs[:3]
    keep = (xs[3] != 0) if len(xs) > 3 else None
    causal = a["is_causal"]
    scale = a["attention_scale"]
    p = a["scalar"]
    T, S = q.shape[-2], k.shape[-2]
    if causal and keep is not None:
        keep = keep & torch.ones(T, S, dtype=torch.bool).tril()
        causal = False
    if p == 0:
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=causal, scale=scale)
    allowed = torch.ones(T, S, dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    if keep is not None:
        allowed = allowed & keep
    allowed = allowed.expand(q.shape[0], q.shape[1], T, S)
    scores = (q @ k.transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    probs = torch.where(allowed.any(dim=-1, keepdim=True), probs, torch.zeros_like(probs))  # no key: 0, as dyngrad
    seed = int(a["seed"])
    kept = torch.tensor([splitmix64_uniform(seed, i) >= p for i in range(probs.numel())]).reshape(probs.shape)
    return (probs * kept.to(probs.dtype) / (1 - p)) @ v


def qkv_attention(xs, a):
    """qkv (B,T,3·H·D): q, k, v of every head in its last axis ((3, H, D)), the heads' outputs merged (B,T,H·D)."""
    qkv = xs[0]
    B, T, width = qkv.shape
    H = a["num_heads"]
    D = width // (3 * H)
    q, k, v = qkv.view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
    y = scaled_dot_product_attention([q, k, v], a)
    return y.transpose(1, 2).reshape(B, T, H * D)


def reduction(a):
    return a["reduction"]


def class_loss(fn, **extra):
    """cross_entropy / nll_loss: (input (N,C), labels (N)[, class weights (C)])."""
    def apply(xs, a):
        weight = xs[2] if len(xs) > 2 else None
        return fn(xs[0], xs[1], weight=weight, ignore_index=a["ignore_index"], reduction=reduction(a),
                  **{k: a[v] for k, v in extra.items()})
    return apply


def bce_with_logits(xs, a):
    weight = xs[2] if len(xs) > 2 else None
    pos_weight = xs[3] if len(xs) > 3 else None
    return F.binary_cross_entropy_with_logits(xs[0], xs[1], weight=weight, pos_weight=pos_weight,
                                              reduction=reduction(a))


RNN_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def rnn(xs, a):
    """torch.nn.LSTM / GRU / RNN with its weights taken from dyngrad's flat cuDNN-ordered weight (ops/rnn.h):
    the matrices W_ih (G·H, in_l), W_hh (G·H, H) of every pseudo-layer p = l·D + d in turn, then the biases
    b_ih, b_hh (G·H) of every pseudo-layer in turn; gates in PyTorch's order. Output: the flattened
    [output (T,N,D·H) | h_n (L·D,N,H) | c_n (lstm)]."""
    mode, hidden, layers, bidir = a["rnn_mode"], a["hidden_size"], a["num_layers"], a["bidirectional"]
    x, flat = xs[0], xs[1]
    steps, batch, inputs = x.shape
    directions = 2 if bidir else 1
    if mode == "lstm":
        module = torch.nn.LSTM(inputs, hidden, layers, bidirectional=bidir)
    elif mode == "gru":
        module = torch.nn.GRU(inputs, hidden, layers, bidirectional=bidir)
    elif mode in ("rnn_tanh", "rnn_relu"):
        module = torch.nn.RNN(inputs, hidden, layers, nonlinearity=mode[4:], bidirectional=bidir)
    else:
        raise SystemExit(f"make_goldens: unknown rnn mode {mode!r}")
    rows = RNN_GATES[mode] * hidden
    params, offset = {}, 0

    def take(name, shape):
        nonlocal offset
        count = 1
        for s in shape:
            count *= s
        params[name] = flat[offset:offset + count].reshape(shape)
        offset += count

    pseudo = [(l, d) for l in range(layers) for d in range(directions)]
    suffix = lambda l, d: f"_l{l}" + ("_reverse" if d else "")
    for l, d in pseudo:
        take("weight_ih" + suffix(l, d), (rows, inputs if l == 0 else directions * hidden))
        take("weight_hh" + suffix(l, d), (rows, hidden))
    for l, d in pseudo:
        take("bias_ih" + suffix(l, d), (rows,))
        take("bias_hh" + suffix(l, d), (rows,))
    if offset != flat.numel():
        raise SystemExit(f"make_goldens: rnn weight has {flat.numel()} elements, the layout needs {offset}")
    if set(params) != {name for name, _ in module.named_parameters()}:
        raise SystemExit("make_goldens: rnn weight names do not match torch's")
    state_shape = (layers * directions, batch, hidden)
    h0 = xs[2] if len(xs) > 2 else torch.zeros(state_shape)
    if mode == "lstm":
        c0 = xs[3] if len(xs) > 3 else torch.zeros(state_shape)
        output, (h_n, c_n) = torch.func.functional_call(module, params, (x, (h0, c0)))
        return torch.cat([output.reshape(-1), h_n.reshape(-1), c_n.reshape(-1)])
    output, h_n = torch.func.functional_call(module, params, (x, h0))
    return torch.cat([output.reshape(-1), h_n.reshape(-1)])


def embedding(xs, a):
    # dyngrad's inputs are (weight, indices); padding_idx -1 means none.
    padding = a["padding_idx"]
    padding = padding if padding >= 0 else None
    return F.embedding(xs[1], xs[0], padding_idx=padding)


def topk_indices(xs, a):
    # dyngrad's topk always returns sorted values; the cases hold no ties (PyTorch leaves their order open).
    return torch.topk(xs[0], a["length"], dim=a["axis"], largest=a.get("descending", False), sorted=True).indices


# multinomial: dyngrad's own counter-based draws (ops/sampling_math.h documents them: sample s of row r takes the
# uniform u of index r·num_samples + s of dropout's SplitMix64 stream above and the first category whose running
# sum of weights, in float64 from the left, exceeds u·total; without replacement a drawn weight becomes 0 and the
# next sample sums the rest again), written here again from that description. PyTorch's generator draws other
# samples; tests/ops/test_sampling.cpp checks the distribution.
def multinomial(xs, a):
    probs, n, seed = xs[0], a["length"], int(a["seed"]) & MASK64
    rows = probs.reshape(-1, probs.shape[-1]).tolist()
    out = []
    for r, weights in enumerate(rows):
        remaining, drawn = list(weights), []
        for s in range(n):
            total = 0.0
            for w in remaining:
                total += w
            target = splitmix64_uniform(seed, r * n + s) * total
            acc, chosen = 0.0, None
            for i, w in enumerate(remaining):
                if w == 0:
                    continue
                chosen = i  # the last category with weight, if rounding ever left acc <= target
                acc += w
                if acc > target:
                    break
            drawn.append(chosen)
            if not a.get("replacement", False):
                remaining[chosen] = 0.0
        out.append(drawn)
    return torch.tensor(out, dtype=torch.int64).reshape(tuple(probs.shape[:-1]) + (n,))


REFERENCES = {
    # comparisons: dyngrad returns 1/0 in the inputs' dtype where PyTorch returns bool
    "cast": unary(lambda x, a: x.to(getattr(torch, a["dtype"]))),
    "linear": linear,
    "sum": reduce_axes(torch.sum),
    "mean": reduce_axes(torch.mean),
    "logsumexp": reduce_axes(torch.logsumexp),
    "max": unary(lambda x, a: torch.max(x, dim=a["axis"], keepdim=a["keepdim"]).values),
    "argmax": unary(lambda x, a: torch.argmax(x, dim=a["axis"], keepdim=a["keepdim"])),
    "argmin": unary(lambda x, a: torch.argmin(x, dim=a["axis"], keepdim=a["keepdim"])),
    "cross_entropy": class_loss(F.cross_entropy, label_smoothing="label_smoothing"),
    # x (N,E), weight (V_padded,E), labels (N): the rows from `length` on are padding, outside the softmax
    "linear_cross_entropy": lambda xs, a: F.cross_entropy(
        F.linear(xs[0], xs[1][:a["length"]]), xs[2], ignore_index=a["ignore_index"], reduction=reduction(a),
        label_smoothing=a["label_smoothing"]),
    "mse_loss": binary(lambda prediction, target: F.mse_loss(prediction, target, reduction="mean")),
    "nll_loss": class_loss(F.nll_loss),
    "binary_cross_entropy_with_logits": bce_with_logits,
    "l1_loss": lambda xs, a: F.l1_loss(xs[0], xs[1], reduction=reduction(a)),
    "smooth_l1_loss": lambda xs, a: F.smooth_l1_loss(xs[0], xs[1], reduction=reduction(a), beta=a["scalar"]),
    "conv2d": conv2d,
    "max_pool2d": max_pool2d,
    "avg_pool2d": avg_pool2d,
    "batch_norm": batch_norm,
    "dropout": dropout,
    "layer_norm": layer_norm,
    "rms_norm": rms_norm,
    "concat": lambda xs, a: torch.cat(xs, dim=a["axis"]),
    "rnn": rnn,
    "scaled_dot_product_attention": scaled_dot_product_attention,
    "qkv_attention": qkv_attention,
    "gelu_mlp": lambda xs, a: F.linear(F.gelu(F.linear(xs[0], xs[1], xs[2]), approximate=a["gelu_approximation"]),
                                       xs[3], xs[4]),
    "embedding": embedding,
    "gather": lambda xs, a: torch.gather(xs[0], a["axis"], xs[1]),
    "index_select": lambda xs, a: torch.index_select(xs[0], a["axis"], xs[1]),
    "scatter_add": lambda xs, a: torch.scatter_add(xs[0], a["axis"], xs[1], xs[2]),
    # dyngrad's conditions and masks are float 0/1 tensors; PyTorch's are bool.
    "where": lambda xs, a: torch.where(xs[0] != 0, xs[1], xs[2]),
    "masked_fill": lambda xs, a: xs[0].masked_fill(xs[1] != 0, a["scalar"]),
    # dyngrad's sort is stable; the cases hold no ties.
    "argsort": unary(lambda x, a: torch.argsort(x, dim=a["axis"], descending=a.get("descending", False), stable=True)),
    "topk_indices": topk_indices,
    "multinomial": multinomial,
}


# Goldens exported before the field table (tests/goldens/ until they are regenerated) wrote these attributes only
# where a case set them, and gelu's under another name; files from today's dyngrad-export-cases carry every
# attribute their op reads, so neither applies to them.
LEGACY_DEFAULTS = {"clamp_min": None, "clamp_max": None, "gelu_approximation": "none", "padding_idx": -1,
                   "reduction": "mean", "ignore_index": -100, "label_smoothing": 0.0, "is_causal": False,
                   "attention_scale": None, "dtype": "float32"}
LEGACY_NAMES = {"gelu_approximate": "gelu_approximation"}


def case_attrs(case):
    attrs = dict(LEGACY_DEFAULTS)
    attrs.update({LEGACY_NAMES.get(name, name): value for name, value in case["attrs"].items()})
    return attrs


def row_expression_reference(op, expression):
    """The row's PyTorch expression as a reference: x / a, b bound to the inputs, attributes by their names."""
    try:
        code = compile(expression, f"<op-table row {op}>", "eval")
    except SyntaxError:
        return None

    def apply(xs, a):
        names = {"torch": torch, "x": xs[0], "a": xs[0], **a}
        if len(xs) > 1:
            names["b"] = xs[1]
        return eval(code, {"torch": torch}, names)
    return apply


def golden_for(path):
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata()
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    op = metadata.get("op")
    torch_expression = metadata.get("torch") or ""
    reference = REFERENCES.get(op) or row_expression_reference(op, torch_expression)
    if reference is None:
        raise SystemExit(f"make_goldens: {path}: op {op!r} has no PyTorch reference: its op-table row's expression "
                         f"({torch_expression or 'not stated'}) does not evaluate; map it in {__file__}")
    cases = json.loads(metadata["cases"])
    out = {}
    for k, case in enumerate(cases):
        grad = case["grad"]
        xs = []
        for i, wants_grad in enumerate(grad):
            x = tensors[f"{k}.x{i}"].clone()
            if wants_grad:
                if not x.is_floating_point():
                    raise SystemExit(f"make_goldens: {op} / {case['label']}: input {i} is not float")
                x.requires_grad_(True)
            xs.append(x)
            out[f"{k}.x{i}"] = tensors[f"{k}.x{i}"]
        w = tensors[f"{k}.w"]
        out[f"{k}.w"] = w
        y = reference(xs, case_attrs(case))
        if y.shape != w.shape:
            raise SystemExit(f"make_goldens: {op} / {case['label']}: output {tuple(y.shape)}, w {tuple(w.shape)}")
        out[f"{k}.y"] = y.detach().clone()
        checked = [i for i, wants_grad in enumerate(grad) if wants_grad]
        directions = {i: tensors[f"{k}.v{i}"] for i in checked if f"{k}.v{i}" in tensors}
        second_order = metadata.get("second_order") == "true" and checked and len(directions) == len(checked)
        if checked:
            loss = (w * y).sum()
            grads = torch.autograd.grad(loss, [xs[i] for i in checked], create_graph=bool(second_order))
            for i, g in zip(checked, grads):
                out[f"{k}.g{i}"] = g.detach().clone()
        if second_order:
            for i, v in directions.items():
                out[f"{k}.v{i}"] = v
            s = sum((g * directions[i]).sum() for i, g in zip(checked, grads))
            try:
                if s.requires_grad:
                    hs = torch.autograd.grad(s, [xs[i] for i in checked], allow_unused=True)
                else:  # no first-order gradient depends on an input: a linear op
                    hs = [None] * len(checked)
            except RuntimeError as e:  # PyTorch has no double backward here: the case gets no "<k>.h<i>"
                print(f"make_goldens: {op} / {case['label']}: no PyTorch double backward ({e})", file=sys.stderr)
                hs = []
            for i, h in zip(checked, hs):
                out[f"{k}.h{i}"] = (torch.zeros_like(xs[i]) if h is None else h).detach().clone()
        if op == "batch_norm":
            out[f"{k}.after3"] = xs[3].detach().clone()
            out[f"{k}.after4"] = xs[4].detach().clone()
    return op, len(cases), out, {**metadata, "reference": f"torch {torch.__version__} float64"}


SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.int64: "I64"}


def save_sorted(tensors, path, metadata):
    """Writes a safetensors file with its keys in sorted order, so the same goldens give the same bytes
    (safetensors.torch.save_file orders the metadata by hash). Read back with safe_open to check it."""
    header, blobs, offset = {"__metadata__": dict(sorted(metadata.items()))}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        blob = t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))
    with safe_open(str(path), framework="pt") as f:
        if f.metadata() != metadata or any(not torch.equal(f.get_tensor(n), tensors[n]) for n in tensors):
            raise SystemExit(f"make_goldens: {path} does not read back as written")


def main(argv):
    if len(argv) != 3:
        raise SystemExit("usage: make_goldens.py CASES_DIR OUT_DIR")
    source, target = pathlib.Path(argv[1]), pathlib.Path(argv[2])
    files = sorted(source.glob("*.safetensors"))
    if not files:
        raise SystemExit(f"make_goldens: no .safetensors files in {source}")
    target.mkdir(parents=True, exist_ok=True)
    results = [golden_for(path) for path in files]  # everything computed before anything is written
    for op, _, tensors, metadata in results:
        save_sorted(tensors, target / f"{op}.safetensors", metadata)
    print(f"{len(results)} ops, {sum(r[1] for r in results)} cases -> {target}")


if __name__ == "__main__":
    main(sys.argv)
