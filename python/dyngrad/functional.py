"""PyTorch-shaped functions over the op table (``import dyngrad.functional as F``).

Each is one call of an op of dyngrad.ops with its attributes spelled as PyTorch spells them.
"""
from __future__ import annotations

from . import _core, _returns, ops

_apply = _core.apply
_T = ops.TABLE


def _i(name):
    return _T[name][0]


_RELU, _SIGMOID, _TANH, _EXP, _LOG = _i("relu"), _i("sigmoid"), _i("tanh"), _i("exp"), _i("log")


def relu(x):
    return _apply(_RELU, [x], {})


def sigmoid(x):
    return _apply(_SIGMOID, [x], {})


def tanh(x):
    return _apply(_TANH, [x], {})


def exp(x):
    return _apply(_EXP, [x], {})


def log(x):
    return _apply(_LOG, [x], {})


def sqrt(x):
    return ops.sqrt(x)


def abs(x):  # noqa: A001
    return ops.abs(x)


def sin(x):
    return ops.sin(x)


def cos(x):
    return ops.cos(x)


def leaky_relu(x, negative_slope=0.01):
    return ops.leaky_relu(x, scalar=negative_slope)


def elu(x, alpha=1.0):
    return ops.elu(x, scalar=alpha)


def gelu(x, approximate="none"):
    return ops.gelu(x, approximate=approximate)


def silu(x):
    return ops.silu(x)


def softplus(x):
    return ops.softplus(x)


def logsigmoid(x):
    return ops.log_sigmoid(x)


def clamp(x, min=None, max=None):  # noqa: A002
    return ops.clamp(x, min=min, max=max)


def pow(x, exponent):  # noqa: A001
    return ops.pow(x, scalar=exponent)


def minimum(a, b):
    return ops.minimum(a, b)


def maximum(a, b):
    return ops.maximum(a, b)


def matmul(a, b):
    return ops.matmul(a, b)


def linear(x, weight, bias=None, activation=None):
    """y = x·weightᵀ + bias over x (*, in) (activation='relu' fuses a ReLU into the same node)."""
    shape = list(x.shape)
    if len(shape) != 2 and shape and len(weight.shape) == 2:
        # As ops/linalg's linear(): the leading dims become the rows of the 2-D op and come back afterwards. The
        # 2-D op's checks run first, so a refused call records no reshape.
        rows = 1
        for d in shape[:-1]:
            rows *= d
        if bias is None:  # matmul(rows, weightᵀ): a (in, out) view of the weight stands in for its transpose
            _core.check_call(_i("matmul"), [x, weight], [[rows, shape[-1]], [weight.shape[1], weight.shape[0]]], {})
        else:
            _core.check_call(_i("linear"), [x, weight, bias], [[rows, shape[-1]], None, None],
                             {} if activation is None else {"activation": activation})
        y = linear(x.reshape(rows, shape[-1]), weight, bias, activation)
        return y.reshape(shape[:-1] + [weight.shape[0]])
    if bias is None:  # as ops/linalg's linear(): the composite matmul(x, weightᵀ), no Linear node
        y = ops.matmul(x, ops.transpose(weight, axes=[-2, -1]))
        return relu(y) if activation == "relu" else y
    return _apply(_i("linear"), [x, weight, bias], {} if activation is None else {"activation": activation})


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, activation=None):
    inputs = [x, weight] if bias is None else [x, weight, bias]
    attrs = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    if activation is not None:
        attrs["activation"] = activation
    return _apply(_i("conv2d"), inputs, attrs)


def max_pool2d(x, kernel_size, stride=None, padding=0):
    """stride None: the row's rule (ops/pool.cpp) makes it the kernel size, as in C++."""
    return ops.max_pool2d(x, kernel=kernel_size, stride=stride, padding=padding)


def avg_pool2d(x, kernel_size, stride=None, padding=0):
    """stride None: the kernel size (the row's rule), as max_pool2d."""
    return ops.avg_pool2d(x, kernel=kernel_size, stride=stride, padding=padding)


def batch_norm(x, running_mean, running_var, weight, bias, training=False, momentum=0.1, eps=1e-5):
    return ops.batch_norm(x, weight, bias, running_mean, running_var, training=training, momentum=momentum, eps=eps)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """A bias without a weight is the row's rule (ops/norm.cpp), as in C++: a weight of ones."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    return _apply(_i("layer_norm"), [x, weight, bias], {"shape": shape, "eps": eps})


def rms_norm(x, normalized_shape, weight=None, eps=None):
    """eps None: the row's rule (ops/norm.cpp) takes the machine epsilon of x's dtype, as PyTorch."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    return _apply(_i("rms_norm"), [x, weight], {"shape": shape, "eps": eps})


def dropout(x, p=0.5, training=True, seed=None):
    """As torch's F.dropout; the mask's seed is drawn from manual_seed's generator unless ``seed`` is given (a fixed
    seed gives the same mask at every call)."""
    if not training or p == 0.0:
        return x
    return ops.dropout(x, scalar=p, training=training, seed=_core._draw_seed() if seed is None else seed)


def softmax(x, dim=-1):
    return ops.softmax(x, axis=dim)


def log_softmax(x, dim=-1):
    return ops.log_softmax(x, axis=dim)


def _over_class_rows(name, x, target, weight, reduction, attrs):
    """ops/loss.cpp's over_class_rows: (N,C,d1,...) with target (N,d1,...), or (C) with a 0-d target, as the
    (N,C) op over every position (the class axis moved last); reduction='none' gets the positions' shape back."""
    shape = list(x.shape)
    if len(shape) == 2 or not shape:
        rows, labels, positions = x, target, None
    else:
        positions = [] if len(shape) == 1 else [shape[0]] + shape[2:]
        if list(target.shape) != positions:
            raise _core.ShapeError(f"{name}: labels {tuple(target.shape)} do not match input {tuple(shape)}: expected "
                                   f"{tuple(positions)} (the input's shape without its class axis 1)")
        count = 1
        for d in positions:
            count *= d
        moved = x if len(shape) == 1 else permute(x, [0] + list(range(2, len(shape))) + [1])
        rows, labels = moved.reshape(count, shape[-1] if len(shape) == 1 else shape[1]), target.reshape(count)
    inputs = [rows, labels] if weight is None else [rows, labels, weight]
    out = _apply(_i(name), inputs, attrs)
    return out.reshape(positions) if positions is not None and reduction == "none" else out


def cross_entropy(logits, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """PyTorch's: logits (N,C) or (N,C,d1,...) with target (N) or (N,d1,...), or (C) with a 0-d target."""
    return _over_class_rows("cross_entropy", logits, target, weight, reduction,
                            {"ignore_index": ignore_index, "reduction": reduction, "label_smoothing": label_smoothing})


def nll_loss(log_probs, target, weight=None, ignore_index=-100, reduction="mean"):
    """PyTorch's: log_probs (N,C) or (N,C,d1,...) with target (N) or (N,d1,...), or (C) with a 0-d target."""
    return _over_class_rows("nll_loss", log_probs, target, weight, reduction,
                            {"ignore_index": ignore_index, "reduction": reduction})


def linear_cross_entropy(x, weight, target, ignore_index=-100, reduction="mean", label_smoothing=0.0, classes=None):
    """cross_entropy(linear(x, weight[:classes]), target, ...) without the logits (ops/linear_cross_entropy.h): x (*,E)
    with target (*); the weight's rows from ``classes`` on (a padded vocabulary) are no classes. None: every row.
    The loss is float32 for bfloat16/float16 x (as F.cross_entropy's under PyTorch's autocast), x's dtype otherwise."""
    shape = list(x.shape)
    rows = 1
    for d in shape[:-1]:
        rows *= d
    if list(target.shape) != shape[:-1]:
        raise _core.ShapeError(f"linear_cross_entropy: labels {tuple(target.shape)} do not match x {tuple(shape)}: "
                               f"expected {tuple(shape[:-1])} (x's shape without its last axis)")
    attrs = {"ignore_index": ignore_index, "reduction": reduction, "label_smoothing": label_smoothing}
    if classes is not None:
        attrs["length"] = classes
    flat = len(shape) == 2
    out = ops.linear_cross_entropy(x if flat else x.reshape(rows, shape[-1]), weight,
                                   target if flat else target.reshape(rows), **attrs)
    return out.reshape(shape[:-1]) if reduction == "none" and not flat else out


def mse_loss(prediction, target):
    return ops.mse_loss(prediction, target)


def l1_loss(prediction, target, reduction="mean"):
    return ops.l1_loss(prediction, target, reduction=reduction)


def smooth_l1_loss(prediction, target, reduction="mean", beta=1.0):
    return ops.smooth_l1_loss(prediction, target, reduction=reduction, scalar=beta)


def binary_cross_entropy_with_logits(logits, target, weight=None, pos_weight=None, reduction="mean"):
    """A pos_weight without a weight is the row's rule (ops/loss.cpp), as in C++: a weight of 1."""
    return ops.binary_cross_entropy_with_logits(logits, target, weight, pos_weight, reduction=reduction)


def sum(x, dim=None, keepdim=False):  # noqa: A001
    return ops.sum(x, axes=_axes(dim), keepdim=keepdim)


def mean(x, dim=None, keepdim=False):
    return ops.mean(x, axes=_axes(dim), keepdim=keepdim)


def max(x, dim=None, keepdim=False):  # noqa: A001
    """As torch.max: max(x) the largest element (0-d), max(x, dim) (values, indices int64), max(x, other)
    the elementwise maximum. The gradient goes to the first maximal element, where the index points."""
    if isinstance(dim, _core.Tensor):
        return maximum(x, dim)
    if dim is None:
        return ops.max(x.reshape(-1), axis=0)
    return _returns.max(ops.max(x, axis=dim, keepdim=keepdim), ops.argmax(x, axis=dim, keepdim=keepdim))


def min(x, dim=None, keepdim=False):  # noqa: A001
    """As torch.min (see max); the values are -max(-x), exactly, as ops/reduce's min()."""
    if isinstance(dim, _core.Tensor):
        return minimum(x, dim)
    if dim is None:
        return -ops.max(-x.reshape(-1), axis=0)
    return _returns.min(-ops.max(-x, axis=dim, keepdim=keepdim), ops.argmin(x, axis=dim, keepdim=keepdim))


def argmax(x, dim=-1, keepdim=False):
    return ops.argmax(x, axis=dim, keepdim=keepdim)


def argmin(x, dim=-1, keepdim=False):
    return ops.argmin(x, axis=dim, keepdim=keepdim)


def reshape(x, *shape):
    return x.reshape(*shape)


def transpose(x, dim0, dim1):
    return ops.transpose(x, axes=[dim0, dim1])


def permute(x, *dims):
    if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
        dims = tuple(dims[0])
    return ops.permute(x, axes=list(dims))


def expand(x, *shape):
    if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
        shape = tuple(shape[0])
    return ops.expand(x, shape=list(shape))


def narrow(x, dim, start, length):
    return ops.narrow(x, axis=dim, start=start, length=length)


def cat(tensors, dim=0):
    return ops.concat(*tensors, axis=dim)


def stack(tensors, dim=0):
    tensors = list(tensors)
    if not tensors:
        raise _core.ValueError("stack: expects at least one tensor")
    return cat([t.unsqueeze(dim) for t in tensors], dim)


def embedding(indices, weight, padding_idx=None):
    return ops.embedding(weight, indices, padding_idx=padding_idx)


def gather(x, dim, index):
    return ops.gather(x, index, axis=dim)


# ---- sorting and sampling (ops/sampling.h) ----

def cumsum(x, dim, *, dtype=None):
    """The running sum along ``dim`` (summed in float64); ``dtype`` converts x first, as in PyTorch."""
    return ops.cumsum(x if dtype is None else x.to(dtype), axis=dim)


def argsort(x, dim=-1, descending=False, stable=False):
    """int64 indices that sort ``x`` along ``dim``. Always stable: ties keep their order (``stable`` is accepted
    for PyTorch's signature); NaN counts as the largest value."""
    return ops.argsort(x, axis=dim, descending=descending)


def sort(x, dim=-1, descending=False, stable=False):
    """(values, indices) as torch.sort; always stable. The values are gather(x, dim, indices): their gradient goes
    back to the positions the indices name."""
    indices = argsort(x, dim, descending)
    return _returns.sort(gather(x, dim, indices), indices)


def topk(x, k, dim=-1, largest=True, sorted=True):  # noqa: A002
    """(values, indices) of the k largest (or smallest) entries along ``dim``, as torch.topk. Always in sorted
    order (``sorted=False`` returns them sorted too, which PyTorch allows); ties go to the lower index."""
    indices = ops.topk_indices(x, axis=dim, k=k, largest=largest)
    return _returns.topk(gather(x, dim, indices), indices)


def multinomial(input, num_samples, replacement=False, *, generator=None):  # noqa: A002
    """int64 draws from the rows of ``input`` ((C) or (N, C) non-negative weights), as torch.multinomial. The
    seed is one draw of ``generator`` (a dyngrad.Generator; None: the default one dyngrad.manual_seed sets); the
    samples are a function of it, the same on the CPU and a GPU. Not PyTorch's random stream: the same seed gives
    other samples than torch. Invalid rows (NaN, inf, negative, zero sum) are a ValueError."""
    if generator is not None and not isinstance(generator, _core.Generator):
        raise TypeError(f"multinomial(): generator must be a dyngrad.Generator or None, got {type(generator).__name__}")
    return ops.multinomial(input, num_samples=num_samples, replacement=replacement,
                           seed=_core._draw_seed(generator))


def index_select(x, dim, index):
    return ops.index_select(x, index, axis=dim)


def scatter_add(base, dim, index, src):
    return ops.scatter_add(base, index, src, axis=dim)


def where(condition, a, b):
    return ops.where(condition, a, b)


def masked_fill(x, mask, value):
    return ops.masked_fill(x, mask, scalar=value)


def _axes(dim):
    if dim is None:
        return []
    if isinstance(dim, int):
        return [dim]
    return list(dim)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, *,
                                 seed=None):
    """PyTorch's F.scaled_dot_product_attention over the ``scaled_dot_product_attention`` op (ops/attention.h).

    query (B,H,T,D) or (B,T,D), key/value (B,H,S,D) or (B,S,D). ``attn_mask`` is a *keep* mask broadcastable to
    (B,H,T,S): 1 where a key takes part (PyTorch's boolean True), 0 where not; int64 masks are converted to the
    query's dtype. PyTorch's additive float masks (0/-inf) must be converted first (``keep = additive == 0``).
    ``dropout_p`` > 0 drops attention probabilities with a seed drawn from ``dyngrad.manual_seed``'s generator
    (or ``seed=``); as in PyTorch it applies whenever given (pass 0.0 in evaluation).
    """
    three_d = len(query.shape) == 3
    if three_d:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if attn_mask is not None and len(attn_mask.shape) == 3:
            attn_mask = attn_mask.unsqueeze(1)
    attrs = {"is_causal": is_causal, "scale": scale}  # None: 1/sqrt(D), the op's default
    if dropout_p:
        attrs["dropout_p"] = dropout_p
        attrs["seed"] = _core._draw_seed() if seed is None else seed
    inputs = [query, key, value]
    if attn_mask is not None:
        if attn_mask.dtype != query.dtype:
            attn_mask = attn_mask.to(query.dtype)
        inputs.append(attn_mask)
    out = _apply(_i("scaled_dot_product_attention"), inputs, attrs)
    return out.squeeze(1) if three_d else out
