"""Transformer layers (dyngrad.nn.MultiheadAttention, TransformerBlock, PositionalEmbedding, GPT): the C++ layers
of nn/transformer.h, so a Python model starts from the same weights (nanoGPT's initialisation, from the
generator ``dyngrad.manual_seed`` sets), has the same parameter names and computes exactly what its C++ twin
computes (the forward is the C++ layer's ``operator()``, recorded into the implicit graph).

Each layer's parameters are Module attributes (``qkv``/``proj`` Linears, ``ln1``/``ln2`` LayerNorms, ...) that
share their state with the C++ layer: optimizers, ``load_state_dict``, ``.to()``/``.half()`` act on both. Assigning
a *new* Parameter object to one of them (``attn.qkv.weight = Parameter(...)``) is not seen by the C++ forward:
write into it (``copy_``, ``load_state_dict``) instead.
"""
from __future__ import annotations

import dataclasses as _dataclasses

from . import _core
from . import nn as _nn
from ._args import check_bools, check_ints, check_numbers

__all__ = ["MultiheadAttention", "TransformerBlock", "PositionalEmbedding", "GPT", "GPTConfig", "gpt2_small",
           "padded_vocabulary"]


def _linear(params: dict, prefix: str) -> "_nn.Linear":
    """A Linear holding the C++ layer's parameters `prefix`weight / `prefix`bias (no new initialisation)."""
    weight = params[prefix + "weight"]
    layer = _nn.Linear.__new__(_nn.Linear)
    _nn.Module.__init__(layer)
    layer.weight = _nn.Parameter(weight)
    bias = params.get(prefix + "bias")
    layer.bias = None if bias is None else _nn.Parameter(bias)
    layer.out_features, layer.in_features = weight.shape
    layer.activation = None
    return layer


def _layer_norm(params: dict, prefix: str, width: int) -> "_nn.LayerNorm":
    layer = _nn.LayerNorm.__new__(_nn.LayerNorm)
    _nn.Module.__init__(layer)
    layer.weight = _nn.Parameter(params[prefix + "weight"])
    bias = params.get(prefix + "bias")
    layer.bias = None if bias is None else _nn.Parameter(bias)
    layer.normalized_shape, layer.eps = (width,), 1e-5
    return layer


def _check_attention(who, embed_dim, num_heads, dropout, bias, is_causal, seed, residual_init_std):
    check_ints(who, embed_dim=embed_dim, num_heads=num_heads, seed=seed)
    check_numbers(who, dropout=dropout, residual_init_std=residual_init_std)
    check_bools(who, bias=bias, is_causal=is_causal)


def _check_gelu(who, gelu):
    """gelu as F.gelu's ``approximate``: "none" (exact, erf) or "tanh" (GPT-2's)."""
    if not isinstance(gelu, str):
        raise TypeError(f"{who}: gelu must be a str ('none' or 'tanh'), got {type(gelu).__name__} {gelu!r}")
    if gelu not in ("none", "tanh"):
        raise _core.ValueError(f"{who}: gelu={gelu!r}: expected 'none' or 'tanh' (F.gelu's approximate)")


class _Bound(_nn.Module):
    """A Module whose forward is a C++ layer's (held in ``_cpp``, not a registered child)."""

    def _bind(self, cpp):
        object.__setattr__(self, "_cpp", cpp)
        return dict(cpp.named_parameters())

    def _sync_modes(self):
        # Each bound submodule's own train/eval mode, parents first (C++ train() reaches every child, so a child
        # set apart, e.g. one block in eval, is set again after its parent), as torch's per-module modes.
        for module in self.modules():
            if isinstance(module, _Bound):
                module._cpp.train(module.training)

    def forward(self, x):
        self._sync_modes()
        return self._cpp.forward(x, self.training)


class MultiheadAttention(_Bound):
    """Multi-head self-attention (nn/transformer.h): x (B,T,E) -> (B,T,E); one fused QKV projection ``qkv``
    (3E, E), ``scaled_dot_product_attention`` over ``num_heads`` heads (causal by default), then ``proj`` (E, E).

    Differs from torch.nn.MultiheadAttention: self-attention only (``forward(x)``, not (query, key, value)),
    batch first, returns the output alone (no attention weights), parameters ``qkv.*``/``proj.*`` (torch:
    ``in_proj_weight``/``out_proj``), and ``dropout`` also drops the output projection (GPT-2's residual dropout).
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 is_causal: bool = True, seed: int = 0, residual_init_std: float = 0.02, *, _cpp=None):
        _check_attention("MultiheadAttention", embed_dim, num_heads, dropout, bias, is_causal, seed, residual_init_std)
        super().__init__()
        params = self._bind(_cpp if _cpp is not None else _core._MultiheadAttention(
            embed_dim, num_heads, is_causal, dropout, seed, bias, residual_init_std))
        self.qkv = _linear(params, "qkv.")
        self.proj = _linear(params, "proj.")
        self.embed_dim, self.num_heads = self.proj.out_features, num_heads
        self.dropout, self.is_causal = dropout, is_causal

    def extra_repr(self):
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, is_causal={self.is_causal}"


class _MLP(_nn.Module):
    """The block's MLP branch, for its parameter names (mlp.fc, mlp.proj); the block's forward runs it."""

    def __init__(self, fc, proj, gelu="none"):
        super().__init__()
        self.fc, self.proj, self.gelu = fc, proj, gelu

    def forward(self, h):
        return self.proj(_nn.F.gelu(self.fc(h), approximate=self.gelu))


class TransformerBlock(_Bound):
    """The pre-LayerNorm block of GPT-2: ``x = x + attn(ln1(x)); x = x + mlp(ln2(x))``, mlp = proj(gelu(fc)) with
    width 4E; x (B,T,E) -> (B,T,E). Parameters ``ln1.*``, ``attn.qkv.*``, ``attn.proj.*``, ``ln2.*``, ``mlp.fc.*``,
    ``mlp.proj.*``. (torch.nn.TransformerEncoderLayer is post-norm by default with other names; this is nanoGPT's
    Block.) ``checkpoint=True``: activation checkpointing (dyngrad.utils.checkpoint): the block keeps none of its
    intermediate values and replays them in the backward, with the same gradients. ``gelu``: the MLP's GELU as
    F.gelu's ``approximate``, "none" (exact, the default) or "tanh" (GPT-2's). ``reduced_residual``: under
    autocast, an x already in the autocast dtype stays in it through the residual adds and the LayerNorms (their
    statistics in float32), as llm.c trains GPT-2 (C++ TransformerOptions::reduced_residual); off: PyTorch's
    autocast recipe (LayerNorm in float32, a cast into every Linear). Without autocast it changes nothing.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 is_causal: bool = True, seed: int = 0, residual_init_std: float = 0.02, *, checkpoint: bool = False,
                 gelu: str = "none", reduced_residual: bool = False, _cpp=None):
        _check_attention("TransformerBlock", embed_dim, num_heads, dropout, bias, is_causal, seed, residual_init_std)
        check_bools("TransformerBlock", checkpoint=checkpoint, reduced_residual=reduced_residual)
        _check_gelu("TransformerBlock", gelu)
        super().__init__()
        cpp = _cpp if _cpp is not None else _core._TransformerBlock(
            embed_dim, num_heads, is_causal, dropout, seed, bias, residual_init_std, gelu, reduced_residual)
        if _cpp is None:
            cpp.checkpoint = checkpoint
        params = self._bind(cpp)
        self.ln1 = _layer_norm(params, "ln1.", embed_dim)
        self.attn = MultiheadAttention(embed_dim, num_heads, dropout, bias, is_causal, _cpp=cpp.attn())
        self.ln2 = _layer_norm(params, "ln2.", embed_dim)
        self.mlp = _MLP(_linear(params, "mlp.fc."), _linear(params, "mlp.proj."), gelu)
        self.embed_dim, self.num_heads, self.gelu = embed_dim, num_heads, gelu
        self.reduced_residual = reduced_residual


class PositionalEmbedding(_Bound):
    """Learned absolute positions: x (B,T,E) -> x + weight[:T]; weight (max_positions, E) ~ normal(0, 0.02).
    ShapeError when T exceeds max_positions. (PyTorch has no such layer: it is nn.Embedding over arange(T),
    added to x.)"""

    def __init__(self, max_positions: int, embed_dim: int, *, _cpp=None):
        check_ints("PositionalEmbedding", max_positions=max_positions, embed_dim=embed_dim)
        super().__init__()
        params = self._bind(_cpp if _cpp is not None else _core._PositionalEmbedding(max_positions, embed_dim))
        self.weight = _nn.Parameter(params["weight"])
        self.max_positions, self.embed_dim = max_positions, embed_dim


@_dataclasses.dataclass
class GPTConfig:
    """nn/transformer.h's GPTConfig: the settings of a GPT (``GPT(config)`` or ``GPT(**dataclasses.asdict(config))``).

    padded_vocab_size: rows of the token embedding (and LM head), vocab_size rounded up as llm.c does
    (``padded_vocabulary(vocab_size)``); 0: vocab_size. The logits of the extra rows are cut off (logits keep
    vocab_size columns) and their embedding rows get no gradient. tie_embeddings: the LM head is
    token_embedding.weight (one parameter, one name: no lm_head.weight). gelu: the MLP's GELU, "none" or "tanh".
    reduced_residual: under autocast the residual stream and the LayerNorms in the autocast dtype, as llm.c
    (``char_gpt --reduced-residual``; TransformerBlock's ``reduced_residual``).
    """

    vocab_size: int = 0
    context: int = 256
    layers: int = 6
    heads: int = 6
    width: int = 384
    dropout: float = 0.0
    seed: int = 0
    bias: bool = True
    padded_vocab_size: int = 0
    tie_embeddings: bool = False
    gelu: str = "none"
    checkpoint: bool = False
    reduced_residual: bool = False

    def embedding_rows(self) -> int:
        return self.padded_vocab_size if self.padded_vocab_size > 0 else self.vocab_size


def gpt2_small() -> GPTConfig:
    """GPT-2 small as llm.c's ``-e d12`` builds it (nn/transformer.h's gpt2_small()): 12 layers, 12 heads, width
    768, context 1024, vocabulary 50257 padded to 50304, tied embeddings, tanh GELU, biases, no dropout."""
    return GPTConfig(**_core._gpt2_small())


def padded_vocabulary(vocab: int) -> int:
    """vocab rounded up to a multiple of 64 (llm.c's padded vocabulary); ValueError unless vocab > 0."""
    check_ints("padded_vocabulary", vocab=vocab)
    return _core._padded_vocabulary(vocab)


class GPT(_Bound):
    """A GPT (nanoGPT's): tokens (B,T) int64 -> logits (B,T,vocab_size); token + position embeddings, ``layers``
    TransformerBlocks, final LayerNorm ``ln_f``, an LM head. Parameter names are bench/torch_gpt.py's PyTorch
    twin's (token_embedding.weight, position_embedding.weight, blocks.<i>.*, ln_f.*, lm_head.weight).
    ``checkpoint=True`` checkpoints every block (TransformerBlock's ``checkpoint``). Built from keywords or from a
    GPTConfig (``GPT(gpt2_small())``); the keyword-only ``padded_vocab_size``, ``tie_embeddings``, ``gelu`` and
    ``reduced_residual`` are GPTConfig's: with ``tie_embeddings=True`` the logits are ``h @ token_embedding.weight.T`` and ``lm_head`` is
    None (no lm_head.weight); with a padded vocabulary the embedding has ``padded_vocab_size`` rows and the logits
    still have vocab_size columns.
    """

    def __init__(self, vocab_size, context: int = 256, layers: int = 6, heads: int = 6, width: int = 384,
                 dropout: float = 0.0, seed: int = 0, bias: bool = True, checkpoint: bool = False, *,
                 padded_vocab_size: int = 0, tie_embeddings: bool = False, gelu: str = "none",
                 reduced_residual: bool = False):
        if isinstance(vocab_size, GPTConfig):
            given = (context, layers, heads, width, dropout, seed, bias, checkpoint, padded_vocab_size, tie_embeddings,
                     gelu, reduced_residual)
            if given != (256, 6, 6, 384, 0.0, 0, True, False, 0, False, "none", False):
                raise TypeError("GPT(config): the settings come from the GPTConfig; set them there "
                                "(dataclasses.replace(config, ...)), not as arguments beside it")
            c = vocab_size
            vocab_size, context, layers, heads, width = c.vocab_size, c.context, c.layers, c.heads, c.width
            dropout, seed, bias, checkpoint = c.dropout, c.seed, c.bias, c.checkpoint
            padded_vocab_size, tie_embeddings, gelu = c.padded_vocab_size, c.tie_embeddings, c.gelu
            reduced_residual = c.reduced_residual
        check_ints("GPT", vocab_size=vocab_size, context=context, layers=layers, heads=heads, width=width, seed=seed,
                   padded_vocab_size=padded_vocab_size)
        check_numbers("GPT", dropout=dropout)
        check_bools("GPT", bias=bias, checkpoint=checkpoint, tie_embeddings=tie_embeddings,
                    reduced_residual=reduced_residual)
        _check_gelu("GPT", gelu)
        super().__init__()
        cpp = _core._GPT(vocab_size, context, layers, heads, width, dropout, seed, bias, checkpoint, padded_vocab_size,
                         tie_embeddings, gelu, reduced_residual)
        params = self._bind(cpp)
        embedding = _nn.Embedding.__new__(_nn.Embedding)
        _nn.Module.__init__(embedding)
        embedding.weight = _nn.Parameter(params["token_embedding.weight"])
        embedding.padding_idx = None
        self.token_embedding = embedding
        self.position_embedding = PositionalEmbedding(context, width, _cpp=cpp.position_embedding())
        self.blocks = _nn.ModuleList(TransformerBlock(width, heads, dropout, bias, True, gelu=gelu,
                                                      reduced_residual=reduced_residual, _cpp=cpp.block(i))
                                     for i in range(layers))
        self.ln_f = _layer_norm(params, "ln_f.", width)
        # Tied: the C++ GPT registers no lm_head (its logits use token_embedding.weight); a plain None attribute here.
        self.lm_head = None if tie_embeddings else _linear(params, "lm_head.")
        self.vocab_size, self.context, self.layers, self.heads, self.width = vocab_size, context, layers, heads, width
        object.__setattr__(self, "_config", GPTConfig(vocab_size, context, layers, heads, width, dropout, seed, bias,
                                                      padded_vocab_size, tie_embeddings, gelu, checkpoint,
                                                      reduced_residual))

    def loss(self, tokens, targets, *, ignore_index: int = -100, reduction: str = "mean",
             label_smoothing: float = 0.0):
        """The language-model loss of ``tokens`` (B,T) int64 against ``targets`` (B,T) or (B*T) int64 (C++
        ``GPT::loss``): equal to ``F.cross_entropy(model(tokens).reshape(-1, vocab_size), targets.reshape(-1),
        ignore_index=..., reduction=..., label_smoothing=...)``, computed by ``F.linear_cross_entropy`` on the final
        hidden states, so the (B*T, vocab_size) logits are never materialised and the rows of a padded vocabulary
        take no probability mass. For training, when only the loss is needed; ``model(tokens)`` still gives the
        logits. reduction="none" returns one loss per token, shaped (B*T). Targets equal to ``ignore_index`` add
        nothing (the mean is over the others); any other target outside [0, vocab_size) raises IndexError.
        """
        for name, value in (("tokens", tokens), ("targets", targets)):
            if not isinstance(value, _core.Tensor):
                raise TypeError(f"GPT.loss: {name} must be a dyngrad.Tensor, got {type(value).__name__}")
            if value.dtype != _core.int64:
                raise _core.DTypeError(f"GPT.loss: {name} must be int64 (token ids), got {value.dtype}")
        check_ints("GPT.loss", ignore_index=ignore_index)
        check_numbers("GPT.loss", label_smoothing=label_smoothing)
        shape = tuple(tokens.shape)
        if len(shape) != 2:
            raise _core.ShapeError(f"GPT.loss: tokens {shape} must be (B,T)")
        if tuple(targets.shape) not in (shape, (shape[0] * shape[1],)):
            raise _core.ShapeError(f"GPT.loss: targets {tuple(targets.shape)} do not match tokens {shape}: expected "
                                   f"{shape} or {(shape[0] * shape[1],)}")
        self._sync_modes()
        return self._cpp.loss(tokens, targets, self.training, reduction, ignore_index, label_smoothing)

    @property
    def config(self) -> GPTConfig:
        """The settings this model was built with (a copy: changing it changes nothing)."""
        return _dataclasses.replace(self._config)

    def extra_repr(self):
        return f"vocab_size={self.vocab_size}, context={self.context}, layers={self.layers}, width={self.width}"
