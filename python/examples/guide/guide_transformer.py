import os
import tempfile

import dyngrad as dg
import dyngrad.nn as nn
import dyngrad.nn.functional as F

dg.manual_seed(0)
text = "the quick brown fox jumps over the lazy dog. " * 40
vocab = sorted(set(text))
data = dg.tensor([vocab.index(c) for c in text])  # int64 token ids
B, T, steps = 8, 16, 60


def make_training(seed):
    dg.manual_seed(seed)
    model = nn.GPT(vocab_size=len(vocab), context=T, layers=2, heads=2, width=32, dropout=0.0)
    optimizer = dg.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    scheduler = dg.optim.lr_scheduler.WarmupCosineLR(optimizer, warmup_steps=10, total_steps=steps, min_lr=3e-4)
    return model, optimizer, scheduler


def get_batch():
    starts = dg.randint(0, len(text) - T - 1, (B,)).tolist()
    return (dg.stack([data[s:s + T] for s in starts]), dg.stack([data[s + 1:s + 1 + T] for s in starts]))


model, optimizer, scheduler = make_training(seed=0)
losses = []
model.train()
for step in range(steps):
    x, y = get_batch()
    with dg.autocast("cpu", dtype=dg.bfloat16):  # products and attention in bf16, the loss in f32
        # F.cross_entropy(model(x).view(-1, V), y.view(-1)) without the (B*T, V) logits (C++ GPT::loss)
        loss = model.loss(x, y)
    optimizer.zero_grad()
    loss.backward()
    dg.optim.clip_grad_norm_(model.parameters(), 1.0)  # also torch's spelling: nn.utils.clip_grad_norm_
    optimizer.step()
    scheduler.step()  # per step: warm-up, then a half cosine down to min_lr
    losses.append(loss.item())
print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, lr {scheduler.get_last_lr()[0]:.2e}")
assert sum(losses[-5:]) / 5 < 0.7 * losses[0], losses

# The attention op itself: q, k, v (B, heads, T, head_dim); causal: position 0 sees only itself.
q, k, v = dg.randn(2, 2, T, 16), dg.randn(2, 2, T, 16), dg.randn(2, 2, T, 16)
out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
assert (out[:, :, 0] - v[:, :, 0]).abs().max().item() < 1e-5

# Checkpoint: model, optimizer moments and schedule position; restored into a model of other initial weights.
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "gpt.safetensors")
    dg.save_checkpoint(path, model, optimizer, scheduler)
    restored, restored_optimizer, restored_scheduler = make_training(seed=1)
    dg.load_checkpoint(path, restored, restored_optimizer, restored_scheduler)
assert restored_scheduler.last_epoch == steps


@dg.no_grad()
def generate(model, idx, new_tokens, temperature=0.8, top_k=5):
    """Sampling with a temperature and top-k, as nanoGPT's generate()."""
    for _ in range(new_tokens):
        logits = model(idx[:, -T:])[:, -1, :] / temperature
        top, _ = dg.topk(logits, top_k)
        logits = logits.masked_fill(logits < top[:, -1:], float("-inf"))
        idx = dg.cat((idx, dg.multinomial(F.softmax(logits, dim=-1), num_samples=1)), dim=1)
    return idx


model.eval()
restored.eval()
start = data[:4].unsqueeze(0)
dg.manual_seed(2)
sample = generate(model, start, 40)[0].tolist()
dg.manual_seed(2)
assert generate(restored, start, 40)[0].tolist() == sample  # same weights, same seed: the same text
print("".join(vocab[i] for i in sample))
