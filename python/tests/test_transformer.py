"""The transformer layers (nn/transformer.h through dyngrad.nn) and F.scaled_dot_product_attention, against a
NumPy float64 reference written from the layers' documented formulas."""
import dataclasses
import math

import numpy as np
import pytest

import dyngrad as dg
from dyngrad import nn
import dyngrad.functional as F
from conftest import numeric_grad

_erf = np.vectorize(math.erf)


def np_softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_sdpa(q, k, v, causal=False, scale=None, keep=None):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        t, n = s.shape[-2:]
        s = np.where(np.tril(np.ones((t, n), bool)), s, -np.inf)
    if keep is not None:
        s = np.where(np.broadcast_to(keep, s.shape) != 0, s, -np.inf)
    return np_softmax(s) @ v


def np_linear(x, p, prefix):
    y = x @ p[prefix + "weight"].T
    return y + p[prefix + "bias"] if prefix + "bias" in p else y


def np_mha(x, p, prefix, heads, causal=True):
    b, t, e = x.shape
    d = e // heads
    qkv = np_linear(x, p, prefix + "qkv.").reshape(b, t, 3, heads, d).transpose(2, 0, 3, 1, 4)
    y = np_sdpa(qkv[0], qkv[1], qkv[2], causal).transpose(0, 2, 1, 3).reshape(b, t, e)
    return np_linear(y, p, prefix + "proj.")


def np_layer_norm(x, p, prefix, eps=1e-5):
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * p[prefix + "weight"] + p[prefix + "bias"]


def np_gelu(m, approximate="none"):
    if approximate == "tanh":  # GPT-2's: 0.5·m·(1 + tanh(√(2/π)·(m + 0.044715·m³)))
        return 0.5 * m * (1 + np.tanh(math.sqrt(2 / math.pi) * (m + 0.044715 * m ** 3)))
    return 0.5 * m * (1 + _erf(m / math.sqrt(2)))


def np_block(x, p, prefix, heads, gelu="none"):
    h = x + np_mha(np_layer_norm(x, p, prefix + "ln1."), p, prefix + "attn.", heads)
    m = np_gelu(np_linear(np_layer_norm(h, p, prefix + "ln2."), p, prefix + "mlp.fc."), gelu)
    return h + np_linear(m, p, prefix + "mlp.proj.")


def np_gpt(tokens, p, layers, heads, gelu="none", vocab=None):
    """Tied (no lm_head.weight): the head is token_embedding.weight. vocab: the logits' columns (the real
    vocabulary) when the table has padded rows."""
    t = tokens.shape[1]
    x = p["token_embedding.weight"][tokens] + p["position_embedding.weight"][:t]
    for i in range(layers):
        x = np_block(x, p, f"blocks.{i}.", heads, gelu)
    head = p["lm_head.weight"] if "lm_head.weight" in p else p["token_embedding.weight"]
    logits = np_layer_norm(x, p, "ln_f.") @ head.T
    return logits if vocab is None else logits[..., :vocab]


def params64(model):
    return {n: t.detach().numpy().astype(np.float64) for n, t in model.state_dict().items()}


def test_gpt_matches_numpy_and_names_the_cpp_parameters(rng):
    dg.manual_seed(int(rng.integers(1 << 30)))
    model = nn.GPT(vocab_size=11, context=8, layers=2, heads=2, width=8).double()
    names = [n for n, _ in model.named_parameters()]
    assert names == [n for n, _ in model._cpp.named_parameters()]  # the C++ GPT's names, in its order
    assert "blocks.1.attn.qkv.weight" in names and "lm_head.weight" in names and "lm_head.bias" not in names
    assert isinstance(model.blocks[0].attn.qkv, nn.Linear) and len(model.parameters()) == len(names)
    tokens = dg.tensor(rng.integers(0, 11, (3, 6)))
    logits = model(tokens)
    assert logits.shape == (3, 6, 11)
    np.testing.assert_allclose(logits.numpy(), np_gpt(tokens.numpy(), params64(model), 2, 2), rtol=1e-10, atol=1e-12)


def test_gpt_trains_and_the_cpp_forward_sees_the_updates(rng):
    dg.manual_seed(int(rng.integers(1 << 30)))
    model = nn.GPT(vocab_size=7, context=6, layers=1, heads=2, width=8)
    opt = dg.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = dg.tensor(rng.integers(0, 7, (4, 6)))
    targets = dg.tensor(rng.integers(0, 7, (4 * 6,)))
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = F.cross_entropy(model(tokens).reshape(24, 7), targets)
        loss.backward()
        losses.append(loss.item())
        assert all(p.grad is not None for p in model.parameters())
        opt.step()
    assert losses[-1] < losses[0]
    with dg.no_grad():
        out = model(tokens)
    assert not out.requires_grad
    ref = np_gpt(tokens.numpy(), params64(model), 1, 2)  # the stepped weights, read through state_dict
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-5)


def test_load_state_dict_reaches_the_cpp_layer(rng):
    dg.manual_seed(1)
    a = nn.TransformerBlock(8, 2).double()
    dg.manual_seed(2)
    b = nn.TransformerBlock(8, 2).double()
    x = dg.tensor(rng.standard_normal((2, 5, 8)))
    assert not np.allclose(a(x).numpy(), b(x).numpy())
    b.load_state_dict(a.state_dict())
    np.testing.assert_array_equal(a(x).numpy(), b(x).numpy())
    np.testing.assert_allclose(b(x).numpy(), np_block(x.numpy(), params64(b), "", 2), rtol=1e-10, atol=1e-12)


def test_attention_input_gradient_matches_finite_differences(rng):
    dg.manual_seed(int(rng.integers(1 << 30)))
    mha = nn.MultiheadAttention(embed_dim=4, num_heads=2).double()
    p = params64(mha)
    x0 = rng.standard_normal((1, 3, 4))
    r = rng.standard_normal((1, 3, 4))
    x = dg.tensor(x0, requires_grad=True)
    (mha(x) * dg.tensor(r)).sum().backward()
    numeric = numeric_grad(lambda a: (np_mha(a, p, "", 2) * r).sum(), x0)
    np.testing.assert_allclose(x.grad.numpy(), numeric, rtol=1e-6, atol=1e-8)
    w = mha.qkv.weight.grad
    assert w is not None and w.shape == (12, 4)


def test_attention_dropout_only_in_training(rng):
    dg.manual_seed(3)
    mha = nn.MultiheadAttention(8, 2, dropout=0.5, seed=7).double()
    x = dg.tensor(rng.standard_normal((2, 4, 8)))
    reference = np_mha(x.numpy(), params64(mha), "", 2)
    mha.eval()
    np.testing.assert_allclose(mha(x).numpy(), reference, rtol=1e-10, atol=1e-12)
    mha.train()
    assert not np.allclose(mha(x).numpy(), reference)
    # A submodule's own mode is kept inside a training parent: with the MLP branch zeroed (its dropout drops
    # zeros), a block whose attention is in eval is deterministic and equals the reference.
    block = nn.TransformerBlock(8, 2, dropout=0.5).double()
    with dg.no_grad():  # parameters take in-place writes under no_grad only, as in PyTorch
        block.mlp.proj.weight.fill_(0.0)
        block.mlp.proj.bias.fill_(0.0)
    block.attn.eval()
    assert block.training and not block.attn.training
    np.testing.assert_allclose(block(x).numpy(), np_block(x.numpy(), params64(block), "", 2), rtol=1e-10, atol=1e-12)
    block.attn.train()
    assert not np.allclose(block(x).numpy(), np_block(x.numpy(), params64(block), "", 2))


def test_positional_embedding(rng):
    dg.manual_seed(int(rng.integers(1 << 30)))
    pos = nn.PositionalEmbedding(max_positions=6, embed_dim=3)
    assert [n for n, _ in pos.named_parameters()] == ["weight"] and pos.weight.shape == (6, 3)
    x = dg.tensor(rng.standard_normal((2, 4, 3)).astype(np.float32))
    np.testing.assert_allclose(pos(x).numpy(), x.numpy() + pos.weight.detach().numpy()[:4], rtol=1e-6)
    with pytest.raises(dg.ShapeError, match="exceeds"):
        pos(dg.zeros(1, 7, 3))
    with pytest.raises(dg.ValueError, match="not divisible"):
        nn.MultiheadAttention(6, 4)


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_functional_and_op_match_numpy(rng, causal):
    q, k, v = (rng.standard_normal((2, 3, 5, 4)) for _ in range(3))
    tq, tk, tv = dg.tensor(q), dg.tensor(k), dg.tensor(v)
    np.testing.assert_allclose(F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).numpy(),
                               np_sdpa(q, k, v, causal), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dg.ops.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, scale=0.3).numpy(),
                               np_sdpa(q, k, v, causal, 0.3), rtol=1e-10, atol=1e-12)
    keep = (rng.random((5, 5)) < 0.7).astype(np.int64)
    keep[:, 0] = 1  # every query keeps a key
    got = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=dg.tensor(keep), scale=0.5)
    np.testing.assert_allclose(got.numpy(), np_sdpa(q, k, v, False, 0.5, keep), rtol=1e-10, atol=1e-12)
    three = F.scaled_dot_product_attention(tq[:, 0], tk[:, 0], tv[:, 0], is_causal=causal)  # (B,T,D)
    np.testing.assert_allclose(three.numpy(), np_sdpa(q[:, 0], k[:, 0], v[:, 0], causal), rtol=1e-10, atol=1e-12)


def test_sdpa_dropout_is_seeded(rng):
    q = dg.tensor(rng.standard_normal((1, 2, 6, 4)))
    a = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5, seed=11)
    b = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5, seed=11)
    c = F.scaled_dot_product_attention(q, q, q)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not np.allclose(a.numpy(), c.numpy())
    dg.manual_seed(5)
    d = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    dg.manual_seed(5)
    np.testing.assert_array_equal(d.numpy(), F.scaled_dot_product_attention(q, q, q, dropout_p=0.5).numpy())
    with pytest.raises(TypeError):
        dg.ops.scaled_dot_product_attention(q, q, q, causal=True)  # a keyword the op does not have


@pytest.mark.usefixtures("cuda")
def test_gpt_on_the_gpu_matches_the_cpu(rng):
    dg.manual_seed(4)
    model = nn.GPT(vocab_size=13, context=8, layers=2, heads=2, width=16)
    tokens = dg.tensor(rng.integers(0, 13, (2, 8)))
    on_cpu = model(tokens).detach().numpy()
    model.to("cuda")
    logits = model(tokens.to("cuda"))
    logits.sum().backward()
    assert model.blocks[0].attn.qkv.weight.grad.device.type == "cuda"
    # The GPU's float32 attention runs 3xTF32 tensor-core products (~float32 accuracy), the rest exact float32.
    np.testing.assert_allclose(logits.detach().cpu().numpy(), on_cpu, rtol=1e-3, atol=1e-4)


def test_tanh_gelu_block_and_gpt_match_numpy(rng):
    dg.manual_seed(int(rng.integers(1 << 30)))
    block = nn.TransformerBlock(8, 2, gelu="tanh").double()
    # Unit-scale MLP weights (nanoGPT's 0.02 keeps GELU's inputs near 0, where the two forms nearly agree).
    block.load_state_dict({**block.state_dict(), "mlp.fc.weight": dg.tensor(rng.standard_normal((32, 8)))})
    x = dg.tensor(rng.standard_normal((2, 5, 8)))
    got = block(x).numpy()
    np.testing.assert_allclose(got, np_block(x.numpy(), params64(block), "", 2, "tanh"), rtol=1e-10, atol=1e-12)
    # The approximation is what runs: the exact GELU's block differs far above the tolerance.
    assert np.abs(got - np_block(x.numpy(), params64(block), "", 2, "none")).max() > 1e-5
    assert block.gelu == "tanh" and block.mlp.gelu == "tanh"
    h = dg.tensor(rng.standard_normal((2, 5, 8)))
    np.testing.assert_allclose(block.mlp(h).numpy(), np_linear(np_gelu(np_linear(h.numpy(), params64(block), "mlp.fc."),
                               "tanh"), params64(block), "mlp.proj."), rtol=1e-10, atol=1e-12)
    model = nn.GPT(vocab_size=11, context=8, layers=2, heads=2, width=8, gelu="tanh").double()
    model.load_state_dict({**model.state_dict(), **{f"blocks.{i}.mlp.fc.weight": dg.tensor(rng.standard_normal((32, 8)))
                                                     for i in range(2)}})
    tokens = dg.tensor(rng.integers(0, 11, (3, 6)))
    logits = model(tokens).numpy()
    np.testing.assert_allclose(logits, np_gpt(tokens.numpy(), params64(model), 2, 2, "tanh"), rtol=1e-10, atol=1e-12)
    assert np.abs(logits - np_gpt(tokens.numpy(), params64(model), 2, 2, "none")).max() > 1e-6


def test_tied_embeddings_share_one_parameter(rng):
    """As C++: no lm_head (one tensor, one name); the logits use token_embedding.weight, whose gradient is the
    untied model's embedding gradient plus its head gradient when both hold the same weights."""
    seed = int(rng.integers(1 << 30))
    dg.manual_seed(seed)
    tied = nn.GPT(vocab_size=11, context=8, layers=1, heads=2, width=8, tie_embeddings=True).double()
    dg.manual_seed(seed)
    untied = nn.GPT(vocab_size=11, context=8, layers=1, heads=2, width=8).double()
    names = [n for n, _ in tied.named_parameters()]
    assert names == [n for n, _ in tied._cpp.named_parameters()]  # the C++ GPT's names, in its order
    assert "lm_head.weight" not in names and "lm_head.weight" not in tied.state_dict() and tied.lm_head is None
    assert names == [n for n, _ in untied.named_parameters() if n != "lm_head.weight"]
    assert len(tied.parameters()) == len(untied.parameters()) - 1
    untied.load_state_dict({**tied.state_dict(), "lm_head.weight": tied.token_embedding.weight.detach()})
    tokens = dg.tensor(rng.integers(0, 11, (3, 6)))
    targets = dg.tensor(rng.integers(0, 11, (18,)))
    logits = tied(tokens)
    np.testing.assert_allclose(logits.numpy(), np_gpt(tokens.numpy(), params64(tied), 1, 2), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(logits.numpy(), untied(tokens).numpy(), rtol=1e-12, atol=1e-14)
    F.cross_entropy(logits.reshape(18, 11), targets).backward()
    F.cross_entropy(untied(tokens).reshape(18, 11), targets).backward()
    np.testing.assert_allclose(tied.token_embedding.weight.grad.numpy(),
                               untied.token_embedding.weight.grad.numpy() + untied.lm_head.weight.grad.numpy(),
                               rtol=1e-10, atol=1e-12)
    # One parameter: an optimizer step moves the head with the embedding.
    opt = dg.optim.SGD(tied.parameters(), lr=0.5)
    opt.step()
    np.testing.assert_allclose(tied(tokens).numpy(), np_gpt(tokens.numpy(), params64(tied), 1, 2), rtol=1e-10,
                               atol=1e-12)


@pytest.mark.parametrize("tie", [False, True])
def test_padded_vocabulary_keeps_the_real_vocabulary_in_the_logits(rng, tie):
    dg.manual_seed(int(rng.integers(1 << 30)))
    model = nn.GPT(vocab_size=11, context=8, layers=1, heads=2, width=8, padded_vocab_size=nn.padded_vocabulary(11),
                   tie_embeddings=tie).double()
    assert model.token_embedding.weight.shape == (64, 8)
    if not tie:
        assert model.lm_head.weight.shape == (64, 8)
    tokens = dg.tensor(rng.integers(0, 11, (2, 7)))
    logits = model(tokens)
    assert logits.shape == (2, 7, 11)  # C++ cuts the padded columns off: the logits of the real vocabulary
    np.testing.assert_allclose(logits.numpy(), np_gpt(tokens.numpy(), params64(model), 1, 2, vocab=11), rtol=1e-10,
                               atol=1e-12)
    F.cross_entropy(logits.reshape(14, 11), dg.tensor(rng.integers(0, 11, (14,)))).backward()
    grad = model.token_embedding.weight.grad.numpy()
    assert np.all(grad[11:] == 0) and np.abs(grad[:11]).max() > 0  # the padding rows get no gradient
    with pytest.raises(dg.ValueError, match="padded_vocab_size 8 is below vocab_size 11"):
        nn.GPT(vocab_size=11, context=8, layers=1, heads=2, width=8, padded_vocab_size=8)


def test_gpt_config_and_gpt2_small():
    config = nn.gpt2_small()
    assert isinstance(config, nn.GPTConfig)
    assert (config.vocab_size, config.context, config.layers, config.heads, config.width) == (50257, 1024, 12, 12, 768)
    assert config.padded_vocab_size == nn.padded_vocabulary(50257) == 50304 and config.embedding_rows() == 50304
    assert config.tie_embeddings and config.gelu == "tanh" and config.bias and config.dropout == 0.0
    assert nn.padded_vocabulary(64) == 64 and nn.padded_vocabulary(65) == 128
    with pytest.raises(dg.ValueError, match="positive"):
        nn.padded_vocabulary(0)
    small = nn.GPTConfig(vocab_size=11, context=8, layers=1, heads=2, width=8, padded_vocab_size=16,
                         tie_embeddings=True, gelu="tanh")
    model = nn.GPT(small)
    assert model.config == small and model.token_embedding.weight.shape == (16, 8) and model.lm_head is None
    assert all(b.gelu == "tanh" for b in model.blocks)
    with pytest.raises(TypeError, match="GPTConfig"):
        nn.GPT(small, layers=2)


def test_reduced_residual_gpt_keeps_the_loss_and_changes_nothing_without_autocast(rng):
    """GPTConfig.reduced_residual (C++ GPTConfig::reduced_residual): the same weights give the same logits without
    autocast, and under bf16 autocast a loss within bf16's precision of the float32 one; the setting is kept."""
    config = nn.GPTConfig(vocab_size=13, context=8, layers=2, heads=2, width=16)
    standard = nn.GPT(config)
    reduced = nn.GPT(dataclasses.replace(config, reduced_residual=True))
    assert reduced.config.reduced_residual and all(b.reduced_residual for b in reduced.blocks)
    with dg.no_grad():
        for p in standard.parameters():
            p.copy_(dg.tensor(rng.normal(0, 0.2, p.shape).astype(np.float32)))
        for mine, theirs in zip(reduced.parameters(), standard.parameters()):
            mine.copy_(theirs)
    tokens = dg.tensor(rng.integers(0, 13, (2, 7)).astype(np.int64))
    targets = dg.tensor(rng.integers(0, 13, (2, 7)).astype(np.int64))
    np.testing.assert_array_equal(reduced(tokens).numpy(), standard(tokens).numpy())
    f32 = standard.loss(tokens, targets).item()
    with dg.autocast("cpu", dtype=dg.bfloat16):
        bf16 = reduced.loss(tokens, targets).item()
    assert bf16 == pytest.approx(f32, rel=2e-2)


@pytest.mark.parametrize("make, error, argument", [
    (lambda: nn.GPT(5, reduced_residual=1), TypeError, "reduced_residual"),
    (lambda: nn.GPT(5, context=4, layers=1, heads=1, width=4, gelu=1), TypeError, "gelu"),
    (lambda: nn.GPT(5, context=4, layers=1, heads=1, width=4, gelu="erf"), dg.ValueError, "gelu"),
    (lambda: nn.TransformerBlock(8, 2, gelu="exact"), dg.ValueError, "gelu"),
    (lambda: nn.GPT(5, tie_embeddings=1), TypeError, "tie_embeddings"),
    (lambda: nn.GPT(5, padded_vocab_size="64"), TypeError, "padded_vocab_size"),
    (lambda: nn.padded_vocabulary(6.0), TypeError, "vocab"),
])
def test_new_gpt_settings_name_a_bad_argument(make, error, argument):
    with pytest.raises(error, match=argument):
        make()


@pytest.mark.parametrize("make, argument", [
    (lambda: nn.GPT("5"), "vocab_size"),
    (lambda: nn.GPT(5, dropout="0.1"), "dropout"),
    (lambda: nn.MultiheadAttention(8, 2.0), "num_heads"),
    (lambda: nn.TransformerBlock(8, 2, bias=1), "bias"),
    (lambda: nn.PositionalEmbedding(4.0, 2), "max_positions"),
    (lambda: dg.optim.WarmupCosineLR(dg.optim.SGD([dg.nn.Parameter(dg.ones(1))]), 1.5, 3), "warmup_steps"),
    (lambda: dg.amp.GradScaler(init_scale="big"), "init_scale"),
    (lambda: dg.randint(0, "9", (2,)), "high"),
    (lambda: dg.linspace(0, 1, 2.5), "steps"),
])
def test_constructors_name_a_wrong_argument_type(make, argument):
    with pytest.raises(TypeError, match=argument):
        make()


def _grads(model):
    return {n: p.grad.numpy().copy() for n, p in model.named_parameters()}


@pytest.mark.parametrize("tie, padded", [(False, False), (True, True), (False, True)])
@pytest.mark.parametrize("reduction, label_smoothing, ignore_index", [
    ("mean", 0.0, -100), ("sum", 0.1, -100), ("none", 0.0, 3), ("mean", 0.2, 5)])
@pytest.mark.parametrize("flat_targets", [False, True])
def test_gpt_loss_equals_cross_entropy_of_the_logits(rng, tie, padded, reduction, label_smoothing, ignore_index,
                                                     flat_targets):
    """GPT.loss (C++ GPT::loss, the fused linear_cross_entropy head) against F.cross_entropy of model(tokens)
    reshaped to (B*T, V): the same loss and the same gradient of every parameter, with ignored targets."""
    dg.manual_seed(int(rng.integers(1 << 30)))
    vocab, batch, steps = 13, 3, 5
    model = nn.GPT(vocab_size=vocab, context=8, layers=1, heads=2, width=8, tie_embeddings=tie,
                   padded_vocab_size=nn.padded_vocabulary(vocab) if padded else 0).double()
    tokens = dg.tensor(rng.integers(0, vocab, (batch, steps)))
    labels = rng.integers(0, vocab, (batch, steps))
    labels[rng.random((batch, steps)) < 0.25] = ignore_index  # some targets ignored, the others random
    labels[0, 0] = (ignore_index + 1) % vocab  # at least one counted target
    targets = dg.tensor(labels.reshape(-1) if flat_targets else labels)
    options = dict(ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing)
    # Per-token losses get a random upstream gradient; a mean or sum loss is the root itself. Each loss is
    # back-propagated before the other is computed (a backward releases the implicit graph it ran on).
    upstream = dg.tensor(rng.standard_normal(batch * steps)).double() if reduction == "none" else None
    fused = model.loss(tokens, targets, **options)
    (fused if upstream is None else (fused * upstream).sum()).backward()
    got = _grads(model)
    model.zero_grad()
    reference = F.cross_entropy(model(tokens).reshape(-1, vocab), targets.reshape(-1), **options)
    (reference if upstream is None else (reference * upstream).sum()).backward()
    want = _grads(model)
    assert fused.shape == reference.shape == (() if reduction != "none" else (batch * steps,))
    np.testing.assert_allclose(fused.numpy(), reference.numpy(), rtol=1e-10, atol=1e-12)
    assert got.keys() == want.keys() and len(got) == len(model.parameters())
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-9, atol=1e-12, err_msg=name)
    assert max(np.abs(g).max() for g in want.values()) > 0


def test_gpt_loss_defaults_and_modes(rng):
    """ignore_index=-100, reduction="mean", no smoothing by default (PyTorch's); under no_grad the loss records
    nothing; float32 models agree with the logits path to float32 rounding; the loss trains the model."""
    dg.manual_seed(int(rng.integers(1 << 30)))
    model = nn.GPT(vocab_size=9, context=6, layers=1, heads=2, width=8)
    tokens = dg.tensor(rng.integers(0, 9, (2, 6)))
    labels = rng.integers(0, 9, (2, 6))
    labels[1, 2:4] = -100
    targets = dg.tensor(labels)
    reference = F.cross_entropy(model(tokens).reshape(-1, 9), targets.reshape(-1))
    np.testing.assert_allclose(model.loss(tokens, targets).item(), reference.item(), rtol=1e-5)
    with dg.no_grad():
        assert not model.loss(tokens, targets).requires_grad
    opt = dg.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = model.loss(tokens, targets)
        loss.backward()
        losses.append(loss.item())
        opt.step()
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("call, error, match", [
    (lambda m, t, y: m.loss(t, y.double()), dg.DTypeError, r"GPT.loss: targets must be int64"),
    (lambda m, t, y: m.loss(t.double(), y), dg.DTypeError, r"GPT.loss: tokens must be int64"),
    (lambda m, t, y: m.loss(t.reshape(2, 3, 2), y), dg.ShapeError, r"GPT.loss: tokens \(2, 3, 2\) must be \(B,T\)"),
    (lambda m, t, y: m.loss(t, y.reshape(3, 4)), dg.ShapeError,
     r"GPT.loss: targets \(3, 4\) do not match tokens \(2, 6\)"),
    (lambda m, t, y: m.loss(t, y.reshape(12)[:10]), dg.ShapeError, r"GPT.loss: targets \(10,\)"),
    (lambda m, t, y: m.loss(t, y.numpy()), TypeError, r"GPT.loss: targets must be a dyngrad.Tensor"),
    (lambda m, t, y: m.loss(t, y, reduction="avg"), dg.ValueError, r"GPT.loss\(\): reduction='avg'"),
    (lambda m, t, y: m.loss(t, y, reduction=1), TypeError, r"reduction"),
    (lambda m, t, y: m.loss(t, y, ignore_index=1.5), TypeError, r"GPT.loss: ignore_index must be an int"),
    (lambda m, t, y: m.loss(t, y, label_smoothing="0.1"), TypeError, r"GPT.loss: label_smoothing must be a number"),
    (lambda m, t, y: m.loss(t, dg.tensor(np.full((2, 6), 9))), dg.IndexError, r"9"),
])
def test_gpt_loss_names_bad_arguments(rng, call, error, match):
    dg.manual_seed(int(rng.integers(1 << 30)))
    model = nn.GPT(vocab_size=9, context=6, layers=1, heads=2, width=8)
    tokens = dg.tensor(rng.integers(0, 9, (2, 6)))
    targets = dg.tensor(rng.integers(0, 9, (2, 6)))
    with pytest.raises(error, match=match):
        call(model, tokens, targets)
