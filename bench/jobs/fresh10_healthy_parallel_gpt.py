"""Continued pretraining of a 1.7B-parameter GPT (GPT-J-style parallel blocks: width 2,560, 20 layers, 20
heads of 128, MLP 10,240, learned positions, tied 50,304-token embeddings, no biases, no dropout) in plain
PyTorch on one GPU: bf16 autocast over fp32 master weights, flash attention through
``F.scaled_dot_product_attention(is_causal=True)``, fused AdamW, micro-batches of 4 x 2,048 tokens with
8 accumulation steps (65k tokens per optimizer step), gradient clipping.

The corpus is a pre-tokenized uint16 shard on local disk (written at start-up here, with a Zipf-like
token distribution); two DataLoader workers cut random 2,049-token windows out of the memory map.

Nothing here is wrong: the step is dominated by large bf16 matmuls (8,192 rows by widths 2,560 / 7,680 /
10,240 / 50,304) and flash attention; the loader only slices a memory map; the only host
synchronization is the once-a-second loss read. The flags exist to try the usual suggestions:
``--workers N``, ``--micro-batch N`` and ``--compile``.

Prints ``step <n> samples/s <x>`` about once a second (a step is one micro-batch).
"""

from __future__ import annotations

import math
import os
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from common import Progress, log, parser, watchdog


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--accum", type=int, default=8)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--width", type=int, default=2560)
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--heads", type=int, default=20)
    ap.add_argument("--vocab", type=int, default=50_304)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1.5e-4)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.context, args.width, args.layers, args.heads, args.vocab = 64, 64, 2, 4, 512
        args.accum, args.workers = 2, min(args.workers, 1)
    return args


class ParallelBlock(nn.Module):
    """x + attn(ln(x)) + mlp(ln(x)), as in GPT-J / PaLM."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln = nn.LayerNorm(width, bias=False)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        self.fc1 = nn.Linear(width, 4 * width, bias=False)
        self.fc2 = nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.ln(x)
        q, k, v = self.qkv(h).view(b, t, 3, self.heads, c // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        a = self.proj(a.transpose(1, 2).reshape(b, t, c))
        m = self.fc2(F.gelu(self.fc1(h), approximate="tanh"))
        return x + a + m


class GPT(nn.Module):
    def __init__(self, args) -> None:
        super().__init__()
        self.wte = nn.Embedding(args.vocab, args.width)
        self.wpe = nn.Embedding(args.context, args.width)
        self.blocks = nn.ModuleList([ParallelBlock(args.width, args.heads) for _ in range(args.layers)])
        self.ln_f = nn.LayerNorm(args.width, bias=False)
        self.head = nn.Linear(args.width, args.vocab, bias=False)
        self.head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * args.layers) if name.endswith(("proj.weight", "fc2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


class Shard(torch.utils.data.Dataset):
    def __init__(self, path: str, context: int, length: int) -> None:
        self.path, self.context, self.length = path, context, length
        self.tokens = None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        if self.tokens is None:  # opened lazily, once per worker
            self.tokens = np.memmap(self.path, dtype=np.uint16, mode="r")
        s = np.random.randint(0, len(self.tokens) - self.context - 1)
        w = torch.from_numpy(self.tokens[s:s + self.context + 1].astype(np.int64))
        return w[:-1], w[1:]


def write_shard(path: str, n_tokens: int, vocab: int) -> None:
    rng = np.random.default_rng(0)
    ranks = rng.zipf(1.2, n_tokens) % vocab
    ranks.astype(np.uint16).tofile(path)


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True

    n_tokens = 100_000_000 if cuda else 1_000_000
    shard = os.path.join(tempfile.gettempdir(), f"gpt-shard-v{args.vocab}", f"train_{n_tokens}.bin")
    if not os.path.exists(shard) or os.path.getsize(shard) != 2 * n_tokens:
        os.makedirs(os.path.dirname(shard), exist_ok=True)
        write_shard(shard + f".{os.getpid()}", n_tokens, args.vocab)
        os.replace(shard + f".{os.getpid()}", shard)
    data = Shard(shard, args.context, 10**9)
    loader = torch.utils.data.DataLoader(data, batch_size=args.micro_batch, num_workers=args.workers,
                                         pin_memory=cuda, persistent_workers=args.workers > 0,
                                         prefetch_factor=4 if args.workers else None)

    model = GPT(args).to(device)
    n_params = sum(p.numel() for p in model.parameters()) / 1e9
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95), fused=cuda)
    train_model = model
    if args.compile:  # (the CPU smoke test skips inductor's C++ code generation)
        train_model = torch.compile(model) if cuda else torch.compile(model, backend="aot_eager")
    log(f"GPT: {n_params:.2f}B parameters, micro-batch {args.micro_batch} x {args.context} tokens, "
        f"accumulation {args.accum}, workers {args.workers}, compile {args.compile}")

    progress = Progress(args.micro_batch)
    step, seen, t_last, n_last = 0, 0, time.perf_counter(), 0
    for x, y in loader:
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = train_model(x, y)
        (loss / args.accum).backward()
        step += 1
        if step % args.accum == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        progress.step(samples=x.shape[0])
        seen += x.shape[0]
        now = time.perf_counter()
        if now - t_last >= 1.0:
            loss_val = loss.item()
            now = time.perf_counter()
            log(f"step {step} samples/s {(seen - n_last) / (now - t_last):.2f} loss {loss_val:.4f}")
            t_last, n_last = now, seen
            if not math.isfinite(loss_val):
                raise RuntimeError("loss is not finite")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
