#!/usr/bin/env python3
"""The PyTorch twin of samples/char_gpt.cpp: the same character-level GPT, corpus, batches, schedule and CSV.

Same model definition and parameter names (nn/transformer.h), so one safetensors file loads into both; the same
corpus rule (the regular files of --data in byte order of their names, *.dat and *.u8 skipped, 90/10 split,
sorted distinct bytes as the vocabulary), the same validation windows, AdamW (betas 0.9, 0.99, weight decay
on weights and embeddings only) with the same warm-up + cosine lr and the same gradient clipping. float32
with TF32 off (dyngrad's float32 is strict float32).

    # the initial weights (nanoGPT's init) and the batch order both programs train from:
    python3 bench/torch_gpt.py --data DIR --prepare OUT_DIR --steps 300 --batch 64 --context 256 ...
    # a run, eager or compiled, writing char_gpt's CSV (step,train_loss,val_loss,lr,tokens_per_second):
    python3 bench/torch_gpt.py --data DIR --init-weights OUT_DIR/init.safetensors \\
        --batch-order OUT_DIR/batch_order.txt --steps 300 --csv torch.csv [--compile] --device cuda

scripts/run-gpt-compare.sh runs both programs and compares them.

--model gpt2 is char_gpt's --model gpt2: GPT-2 small as llm.c builds it (12 layers, 12 heads, width 768, context
1024, the vocabulary padded to a multiple of 64, the LM head tied to the token embedding, tanh GELU, AdamW beta2
0.95), shrunk by --layers/--heads/--width/--context, on token files in llm.c's format (--train-tokens,
--val-tokens, --vocab; samples/tokens.cpp writes them). scripts/run-gpt2-bench.sh runs it against char_gpt and
llm.c. The last line of a CUDA run is `peak_memory_bytes=N` (torch.cuda.max_memory_allocated).
"""
import argparse
import contextlib
import math
import os
import random
import struct
import sys
import time

# The safetensors format in plain Python (the GPU machine's PyTorch may come without the safetensors package).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import read_safetensors, write_safetensors  # noqa: E402


def read_corpus(directory):
    """(vocabulary bytes, train tokens, validation tokens, file count), as samples/char_gpt.cpp's Corpus."""
    import torch

    root = os.fsencode(directory)
    names = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if os.path.islink(path) or not os.path.isfile(path) or name.endswith((b".dat", b".u8")):
            continue
        names.append(path)
    text = b"".join(open(path, "rb").read() for path in names)
    vocabulary = sorted(set(text))
    lookup = torch.full((256,), -1, dtype=torch.long)
    for i, byte in enumerate(vocabulary):
        lookup[byte] = i
    tokens = lookup[torch.frombuffer(bytearray(text), dtype=torch.uint8).long()]
    split = len(text) * 9 // 10
    return bytes(vocabulary), tokens[:split], tokens[split:], len(names)


TOKEN_FILE_MAGIC, TOKEN_FILE_VERSION, TOKEN_FILE_HEADER_INTS = 20240520, 1, 256  # llm.c's (nn/token_file.h)


def read_token_header(path):
    """The token count of a token file in llm.c's format; ValueError naming the file for a bad header or size."""
    header_bytes = 4 * TOKEN_FILE_HEADER_INTS
    size = os.path.getsize(path)
    if size < header_bytes:
        raise ValueError(f"token file '{path}' is truncated: {size} bytes, shorter than the {header_bytes}-byte header")
    with open(path, "rb") as f:
        magic, version, count = struct.unpack("<3i", f.read(12))
    if magic != TOKEN_FILE_MAGIC:
        raise ValueError(f"token file '{path}': bad magic {magic} (expected {TOKEN_FILE_MAGIC})")
    if version != TOKEN_FILE_VERSION:
        raise ValueError(f"token file '{path}': unsupported version {version} (expected {TOKEN_FILE_VERSION})")
    if count < 1 or size != header_bytes + 2 * count:
        raise ValueError(f"token file '{path}': {size} bytes, the header's {count} tokens make {header_bytes + 2 * count}")
    return count


def read_tokens(path, vocab_size):
    """The tokens of a token file as an int64 tensor; ValueError naming the file and a token >= vocab_size."""
    import torch

    count = read_token_header(path)
    with open(path, "rb") as f:
        f.seek(4 * TOKEN_FILE_HEADER_INTS)
        raw = bytearray(f.read(2 * count))
    tokens = torch.frombuffer(raw, dtype=torch.int16).long() & 0xFFFF  # little-endian uint16
    if int(tokens.max()) >= vocab_size:
        position = int((tokens >= vocab_size).nonzero()[0])
        raise ValueError(f"token file '{path}': token id {int(tokens[position])} at position {position} is outside "
                         f"the vocabulary of {vocab_size}")
    return tokens


def padded_vocabulary(vocab_size):
    """llm.c's padded vocabulary: vocab_size rounded up to a multiple of 64 (nn/transformer.h)."""
    return (vocab_size + 63) // 64 * 64


def build_model(vocab_size, args):
    import torch
    from torch import nn
    import torch.nn.functional as F

    gpt2 = getattr(args, "model", "char") == "gpt2"
    gelu = "tanh" if gpt2 else "none"
    rows = padded_vocabulary(vocab_size) if gpt2 else vocab_size  # the embedding table (and LM head)
    reduced_residual = getattr(args, "reduced_residual", False)

    def norm(ln, x):
        # char_gpt --reduced-residual (nn/transformer.h's TransformerOptions::reduced_residual): an x already in the
        # autocast dtype stays in it, through a LayerNorm with autocast off and its weight and bias rounded to it.
        kind = x.device.type
        if not (reduced_residual and torch.is_autocast_enabled(kind) and x.dtype == torch.get_autocast_dtype(kind)):
            return ln(x)
        with torch.autocast(kind, enabled=False):
            return F.layer_norm(x, ln.normalized_shape, ln.weight.to(x.dtype), ln.bias.to(x.dtype), ln.eps)

    class MultiheadAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(args.width, 3 * args.width)
            self.proj = nn.Linear(args.width, args.width)
            self.residual_dropout = nn.Dropout(args.dropout)

        def forward(self, x):
            B, T, E = x.shape
            H = args.heads
            q, k, v = self.qkv(x).view(B, T, 3, H, E // H).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               dropout_p=args.dropout if self.training else 0.0)
            return self.residual_dropout(self.proj(y.transpose(1, 2).reshape(B, T, E)))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(args.width, 4 * args.width)
            self.proj = nn.Linear(4 * args.width, args.width)
            self.residual_dropout = nn.Dropout(args.dropout)

        def forward(self, x):
            return self.residual_dropout(self.proj(F.gelu(self.fc(x), approximate=gelu)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(args.width)
            self.attn = MultiheadAttention()
            self.ln2 = nn.LayerNorm(args.width)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(norm(self.ln1, x))
            return x + self.mlp(norm(self.ln2, x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.token_embedding = nn.Embedding(rows, args.width)
            self.position_embedding = nn.Embedding(args.context, args.width)
            self.blocks = nn.ModuleList(Block() for _ in range(args.layers))
            self.ln_f = nn.LayerNorm(args.width)
            # GPT-2: the LM head is the token embedding (x @ weight.T), so there is no lm_head.weight.
            self.lm_head = None if gpt2 else nn.Linear(args.width, rows, bias=False)
            self.embedding_dropout = nn.Dropout(args.dropout)
            # nanoGPT's initialisation (nn/transformer.h): normal(0, 0.02), zero biases, residual projections
            # normal(0, 0.02/sqrt(2·layers)).
            for name, p in self.named_parameters():
                if name.endswith("proj.weight"):
                    nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * args.layers))
                elif name.endswith(".bias") and "ln" not in name:
                    nn.init.zeros_(p)
                elif name.endswith(".weight") and "ln" not in name:
                    nn.init.normal_(p, 0.0, 0.02)

        def forward(self, tokens):
            T = tokens.shape[1]
            x = self.token_embedding(tokens) + self.position_embedding.weight[:T]
            x = self.embedding_dropout(x)
            if reduced_residual and torch.is_autocast_enabled(x.device.type) and x.dtype == torch.float32:
                x = x.to(torch.get_autocast_dtype(x.device.type))
            for block in self.blocks:
                x = block(x)
            h = norm(self.ln_f, x)
            logits = h @ self.token_embedding.weight.t() if self.lm_head is None else self.lm_head(h)
            return logits[..., :vocab_size] if rows != vocab_size else logits

    return GPT()


def lr_at(step, args):
    """samples/char_gpt.cpp's WarmupCosineLR (nn/optim.h) at epoch `step`."""
    if step < args.warmup:
        return args.lr * (step + 1) / (args.warmup + 1)
    if step >= args.steps:
        return args.min_lr
    progress = (step - args.warmup) / (args.steps - args.warmup)
    return args.min_lr + (args.lr - args.min_lr) * (1 + math.cos(math.pi * progress)) / 2


def batch(tokens, offsets, context, device):
    import torch

    windows = torch.stack([tokens[o:o + context + 1] for o in offsets])
    return windows[:, :-1].to(device), windows[:, 1:].reshape(-1).to(device)


def validation_loss(model, tokens, args, device, autocast=contextlib.nullcontext):
    import torch
    import torch.nn.functional as F

    windows = args.eval_batches * args.batch
    last = len(tokens) - args.context - 1
    model.eval()
    total = 0.0
    with torch.no_grad():
        for b in range(args.eval_batches):
            offsets = [0 if windows == 1 else k * last // (windows - 1)
                       for k in range(b * args.batch, (b + 1) * args.batch)]
            x, y = batch(tokens, offsets, args.context, device)
            with autocast():
                logits = model(x)
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y).item()
    model.train()
    return total / args.eval_batches


def prepare(args, vocab_size, train):
    import torch

    os.makedirs(args.prepare, exist_ok=True)
    torch.manual_seed(args.seed)
    model = build_model(vocab_size, args)
    write_safetensors(os.path.join(args.prepare, "init.safetensors"), dict(model.state_dict()))
    rng = random.Random(args.seed)
    last = len(train) - args.context - 1
    with open(os.path.join(args.prepare, "batch_order.txt"), "w") as out:
        for _ in range(args.steps):
            out.write(" ".join(str(rng.randint(0, last)) for _ in range(args.batch)) + "\n")
    print(f"torch_gpt.py: wrote {args.prepare}/init.safetensors ({sum(p.numel() for p in model.parameters())} "
          f"parameters) and {args.prepare}/batch_order.txt ({args.steps} batches of {args.batch})")


def train(args, vocab_size, train_tokens, validation_tokens):
    import torch
    import torch.nn.functional as F

    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(args.seed)
    model = build_model(vocab_size, args)
    if args.init_weights:
        state = {}
        for name, (dtype, shape, raw) in read_safetensors(args.init_weights).items():
            if dtype != "F32":
                sys.exit(f"torch_gpt.py: {args.init_weights}: {name} is {dtype}, expected F32")
            state[name] = torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(shape)
        model.load_state_dict(state, strict=True)
    model.to(device)
    decayed = [p for p in model.parameters() if p.dim() >= 2]
    not_decayed = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decayed, "weight_decay": args.weight_decay},
                                   {"params": not_decayed, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, args.beta2), eps=1e-8)
    forward = torch.compile(model, mode=args.compile_mode) if args.compile else model
    autocast_dtype = {"f32": None, "bf16": torch.bfloat16, "f16": torch.float16}[args.precision]
    # char_gpt's GradScaler has PyTorch's defaults (2^16, growth 2 every 2000 clean steps, backoff 0.5).
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "f16")

    def autocast():
        return torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None)
    order = None
    if args.batch_order:
        order = [[int(v) for v in line.split()] for line in open(args.batch_order) if line.strip()]
    rng = random.Random(args.seed)
    last = len(train_tokens) - args.context - 1

    csv = open(args.csv, "w") if args.csv else None
    if csv:
        csv.write("step,train_loss,val_loss,lr,tokens_per_second,loss_scale,skipped_steps\n")
    skipped_steps = 0
    last_scale = scaler.get_scale() if scaler.is_enabled() else 1.0
    mode = (f"torch.compile, mode {args.compile_mode}" if args.compile_mode != "default" else "torch.compile") \
        if args.compile else "eager"
    print(f"torch_gpt.py ({mode}, torch {torch.__version__}, {device}): vocabulary {vocab_size}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters", flush=True)
    model.train()
    for step in range(args.steps):
        profiled = args.profile_step == step + 1 and device.type == "cuda"
        if profiled:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
        started = time.perf_counter()
        lr = lr_at(step, args)
        for group in optimizer.param_groups:
            group["lr"] = lr
        offsets = order[step] if order else [rng.randint(0, last) for _ in range(args.batch)]
        x, y = batch(train_tokens, offsets, args.context, device)
        if args.compile and args.compile_mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # a new iteration: the last step's graph outputs may be reused
        with autocast():
            logits = forward(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if args.clip > 0:
            scaler.unscale_(optimizer)  # clipping sees true gradients
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        scaler.step(optimizer)
        scaler.update()
        value = loss.item()  # waits for the step, as char_gpt's loss.item()
        if profiled:
            torch.cuda.cudart().cudaProfilerStop()
        scale = scaler.get_scale() if scaler.is_enabled() else 1.0  # read after the step's own sync
        if scale < last_scale:
            skipped_steps += 1  # the scale backs off exactly when the step was skipped
        last_scale = scale
        seconds = time.perf_counter() - started
        done = step + 1
        val = ""
        if done % args.eval_every == 0 or done == args.steps:
            val = f"{validation_loss(forward, validation_tokens, args, device, autocast):.6f}"
            print(f"step {done}: train loss {value:.4f}, validation loss {val}", flush=True)
        if csv:
            csv.write(f"{done},{value:.6f},{val},{lr:.8g},{args.batch * args.context / seconds:.1f},{scale:.8g},"
                      f"{skipped_steps}\n")
            csv.flush()
    if device.type == "cuda":
        print(f"peak_memory_bytes={torch.cuda.max_memory_allocated(device)}", flush=True)


# The settings whose defaults depend on --model (char_gpt's): character model, GPT-2 small.
MODEL_DEFAULTS = {
    "char": {"layers": 6, "heads": 6, "width": 384, "context": 256, "lr": 1e-3, "min_lr": 1e-4, "dropout": 0.2,
             "beta2": 0.99},
    "gpt2": {"layers": 12, "heads": 12, "width": 768, "context": 1024, "lr": 6e-4, "min_lr": 6e-5, "dropout": 0.0,
             "beta2": 0.95},
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODEL_DEFAULTS), default="char")
    parser.add_argument("--data", default=None, help="the text corpus (default /usr/share/games/fortunes)")
    parser.add_argument("--train-tokens", help="a token file in llm.c's format (with --val-tokens) instead of --data")
    parser.add_argument("--val-tokens")
    parser.add_argument("--vocab", type=int, help="the token files' vocabulary (default 50257 with gpt2, else 256)")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--width", type=int)
    parser.add_argument("--context", type=int)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--lr", type=float)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--min-lr", type=float)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--dropout", type=float)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--eval-batches", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--csv", help="write the curve here (char_gpt's columns)")
    parser.add_argument("--init-weights", help="initial parameters (safetensors)")
    parser.add_argument("--batch-order", help="line k: step k's window offsets")
    parser.add_argument("--compile", action="store_true", help="train through torch.compile")
    parser.add_argument("--compile-mode", choices=["default", "reduce-overhead", "max-autotune-no-cudagraphs"],
                        default="default", help="torch.compile's mode (reduce-overhead: CUDA graphs)")
    parser.add_argument("--precision", choices=["f32", "bf16", "f16"], default="f32",
                        help="the forward under torch.autocast into that dtype (f16 with a GradScaler), as char_gpt")
    parser.add_argument("--reduced-residual", action="store_true",
                        help="with --precision bf16|f16: the residual stream and LayerNorms in that dtype, as char_gpt")
    parser.add_argument("--profile-step", type=int, metavar="N",
                        help="(cuda) step N alone between cudaProfilerStart/Stop, for ncu --profile-from-start off")
    parser.add_argument("--prepare", metavar="DIR", help="write DIR/init.safetensors and DIR/batch_order.txt, then stop")
    args = parser.parse_args(argv)
    for name, value in MODEL_DEFAULTS[args.model].items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    if args.width % args.heads:
        parser.error(f"--width {args.width} is not divisible by --heads {args.heads}")
    if not 0 <= args.warmup < args.steps:
        parser.error(f"--warmup {args.warmup} must be in [0, --steps {args.steps})")
    if (args.train_tokens is None) != (args.val_tokens is None):
        parser.error("--train-tokens and --val-tokens go together")
    if args.train_tokens and args.data:
        parser.error("--data and --train-tokens exclude each other")
    if args.vocab is not None and not args.train_tokens:
        parser.error("--vocab is for token files (the corpus makes its own)")
    if args.train_tokens and args.vocab is None:
        args.vocab = 50257 if args.model == "gpt2" else 256
    args.data = args.data or "/usr/share/games/fortunes"
    return args


def main():
    args = parse_args()
    if args.train_tokens:
        vocab_size = args.vocab
        train_tokens, validation_tokens = (read_tokens(path, vocab_size) for path in (args.train_tokens, args.val_tokens))
        source = f"{args.train_tokens} and {args.val_tokens}"
    else:
        vocabulary, train_tokens, validation_tokens, files = read_corpus(args.data)
        vocab_size = len(vocabulary)
        source = f"'{args.data}' ({files} files)"
    for split in (train_tokens, validation_tokens):
        if len(split) < args.context + 2:
            sys.exit(f"torch_gpt.py: {source} is too short for --context {args.context}")
    if args.prepare:
        prepare(args, vocab_size, train_tokens)
    else:
        train(args, vocab_size, train_tokens, validation_tokens)


if __name__ == "__main__":
    main()
