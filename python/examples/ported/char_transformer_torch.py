"""A character-level transformer language model written as a PyTorch user writes it (issue 29, item 3).

This is the PyTorch program; `python port.py char_transformer` runs it on dyngrad with only its import lines
rewritten (docs/python.md, "Ported PyTorch scripts"; python/tests/test_ported_scripts.py checks the rewrite and
runs both). A nanoGPT-style model: token and position embeddings, pre-LayerNorm blocks with a hand-written causal
self-attention over F.scaled_dot_product_attention(is_causal=True), AdamW with weight decay on the matrices only,
a linear warm-up then cosine learning rate set per step, gradient clipping, bf16 autocast on the CPU, and sampling
with temperature and top-k. Text: the fortunes corpus (/usr/share/games/fortunes), else the repository's README.md.

    python char_transformer_torch.py --quick       # a few dozen steps of a small model (CPU)
    python char_transformer_torch.py --steps 2000 --n-layer 4 --n-embd 128
    python port.py char_transformer --quick        # the same on dyngrad
"""
import argparse
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

FORTUNES = "/usr/share/games/fortunes"


def load_text(path, max_chars):
    """The text of ``path`` (a file, or every plain file of a directory in name order), at most max_chars."""
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if "." not in n)
        files = [os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n))]
    else:
        files = [path]
    text = ""
    for name in files:
        with open(name, encoding="utf-8", errors="replace") as f:
            text += f.read()
        if len(text) >= max_chars:
            break
    return text[:max_chars]


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head
        self.dropout = dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd),
                                 nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharLM(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, dropout):
        super().__init__()
        self.block_size = block_size
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*[Block(n_embd, n_head, dropout) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets=None):
        B, T = idx.size()
        pos = torch.arange(T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        logits = self.head(self.ln_f(self.blocks(x)))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        for _ in range(max_new_tokens):
            idx_cond = idx[:, -self.block_size:]
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits = logits.masked_fill(logits < v[:, -1:], float("-inf"))
            probs = F.softmax(logits, dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


def get_lr(step, args):
    """Linear warm-up, then a half cosine down to lr / 10 at the last step (nanoGPT's schedule)."""
    min_lr = args.lr / 10
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    ratio = (step - args.warmup) / max(1, args.steps - args.warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (args.lr - min_lr)


def main(argv=None):
    parser = argparse.ArgumentParser(description="character-level transformer LM")
    readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "README.md")
    parser.add_argument("--text", default=FORTUNES if os.path.isdir(FORTUNES) else readme)
    parser.add_argument("--max-chars", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--eval-iters", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="a small model for a few dozen steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.max_chars, args.steps, args.warmup, args.eval_iters = 100_000, 40, 8, 4
        args.batch_size, args.block_size, args.n_layer, args.n_embd = 16, 32, 2, 64

    torch.manual_seed(args.seed)
    text = load_text(args.text, args.max_chars)
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    n = int(0.9 * len(data))
    train_data, val_data = data[:n], data[n:]

    def get_batch(split):
        d = train_data if split == "train" else val_data
        ix = torch.randint(len(d) - args.block_size - 1, (args.batch_size,))
        x = torch.stack([d[i:i + args.block_size] for i in ix.tolist()])
        y = torch.stack([d[i + 1:i + 1 + args.block_size] for i in ix.tolist()])
        return x, y

    model = CharLM(len(chars), args.block_size, args.n_layer, args.n_head, args.n_embd, args.dropout)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.99))

    @torch.no_grad()
    def estimate_loss():
        model.eval()
        losses = {}
        for split in ("train", "val"):
            total = 0.0
            for _ in range(args.eval_iters):
                x, y = get_batch(split)
                with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                    _, loss = model(x, y)
                total += loss.item()
            losses[split] = total / args.eval_iters
        model.train()
        return losses

    losses = []
    model.train()
    for step in range(args.steps):
        lr = get_lr(step, args)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = get_batch("train")
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            logits, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4f}, lr {lr:.2e}, grad norm {float(norm):.3f}")

    estimate = estimate_loss()
    print(f"train loss {estimate['train']:.4f}, val loss {estimate['val']:.4f}")
    context = torch.tensor([[stoi["\n"] if "\n" in stoi else 0]], dtype=torch.long)
    out = model.generate(context, max_new_tokens=200, temperature=0.8, top_k=10)[0].tolist()
    sample = "".join(chars[i] for i in out[1:])
    print(sample)
    return {"losses": losses, "estimate": estimate, "sample": sample, "vocab": chars}


if __name__ == "__main__":
    main()
