"""Long-context continued pretraining of a code model: a 1.4B-parameter decoder (16 pre-LayerNorm
blocks, width 2,560, 20 heads of 128, GELU MLP 4x, learned positions, tied 50,304-token embeddings, no
biases or dropout) trained in plain PyTorch on one GPU at 4,096-token context: bf16 autocast,
``F.scaled_dot_product_attention(is_causal=True)`` (flash attention), ``nn.LayerNorm``, fused AdamW,
gradient clipping, micro-batches of 4 sequences and 4 accumulation steps (64k tokens per optimizer
step), a cosine schedule; ~62 GB of GPU memory.

The tokens come from a shard of uint16 ids on local disk (written to a temp dir here), memory-mapped;
2 DataLoader workers cut random 4,097-token windows from it, pinned and copied asynchronously. The loss
is read once a second.

This one is healthy: each micro-batch is ~136 TFLOP of large bf16 matmuls and ~19 TFLOP of causal
flash attention, which the GPU spends ~80 % of its time on.

Prints ``step <n> samples/s <x>`` about once a second (samples are sequences).
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
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--width", type=int, default=2560)
    ap.add_argument("--heads", type=int, default=20)
    ap.add_argument("--vocab", type=int, default=50_304)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1.5e-4)
    ap.add_argument("--compile", action="store_true", help="wrap the model in torch.compile")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.micro_batch, args.accum, args.ctx, args.layers = 2, 2, 64, 2
        args.width, args.heads, args.vocab, args.workers = 64, 4, 512, 1
    return args


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width, bias=False)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        self.ln_2 = nn.LayerNorm(width, bias=False)
        self.fc = nn.Linear(width, 4 * width, bias=False)
        self.fc_proj = nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln_1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class CodeLM(nn.Module):
    def __init__(self, vocab: int, ctx: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(ctx, width)
        self.blocks = nn.ModuleList([Block(width, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width, bias=False)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.view(-1))


def write_shard(path: str, tokens: int, vocab: int, seed: int = 0) -> None:
    """A tokenized code shard stand-in: Zipf-distributed ids with recurring snippets, uint16 on disk."""
    rng = np.random.default_rng(seed)
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint16, shape=(tokens,))
    snippets = rng.integers(0, vocab, (1024, 32), dtype=np.uint16)
    chunk = 1 << 24
    for start in range(0, tokens, chunk):
        n = min(chunk, tokens - start)
        ids = np.minimum((1 - rng.random(n, dtype=np.float32)) ** -1.25, vocab - 1).astype(np.uint16)  # Zipf-like
        at = rng.integers(0, n - 32, n // 128)
        ids[at[:, None] + np.arange(32)] = snippets[rng.integers(0, 1024, len(at))]
        out[start:start + n] = ids
    out.flush()
    del out


class Windows(torch.utils.data.IterableDataset):
    """Random (ctx + 1)-token windows of the memory-mapped shard, a different stream per worker."""

    def __init__(self, path: str, ctx: int) -> None:
        self.path, self.ctx = path, ctx

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        rng = np.random.default_rng(1234 + (info.id if info else 0))
        data = np.load(self.path, mmap_mode="r")
        while True:
            i = int(rng.integers(0, len(data) - self.ctx - 1))
            w = torch.from_numpy(data[i:i + self.ctx + 1].astype(np.int64))
            yield w[:-1], w[1:]


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True

    shard = os.path.join(tempfile.mkdtemp(prefix="code-shard-"), "train_000.npy")
    t0 = time.perf_counter()
    write_shard(shard, 100_000_000 if cuda else 300_000, args.vocab)
    log(f"shard written in {time.perf_counter() - t0:.1f}s: {shard}")
    loader = torch.utils.data.DataLoader(Windows(shard, args.ctx), batch_size=args.micro_batch,
                                         num_workers=args.workers, pin_memory=cuda,
                                         persistent_workers=args.workers > 0,
                                         prefetch_factor=4 if args.workers else None)

    model = CodeLM(args.vocab, args.ctx, args.width, args.layers, args.heads).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=cuda)
    warmup, total = 200, 20_000
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup else
        0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (s - warmup) / (total - warmup)))))
    train_model = torch.compile(model) if args.compile else model
    n_params = sum(p.numel() for p in model.parameters()) / 1e9
    log(f"code LM: {n_params:.2f}B parameters, micro-batch {args.micro_batch} x {args.ctx} tokens, "
        f"accumulation {args.accum}, workers {args.workers}")

    progress = Progress(args.micro_batch)
    model.train()
    micro, step, seen, t_last, n_last = 0, 0, 0, time.perf_counter(), 0
    for x, y in loader:
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = train_model(x, y)
        (loss / args.accum).backward()
        micro += 1
        if micro % args.accum == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
        progress.step(samples=x.shape[0])
        seen += x.shape[0]
        now = time.perf_counter()
        if now - t_last >= 1.0:
            loss_val = loss.item()
            now = time.perf_counter()
            log(f"step {step} micro {micro} samples/s {(seen - n_last) / (now - t_last):.2f} loss {loss_val:.4f}")
            t_last, n_last = now, seen
            if not math.isfinite(loss_val):
                raise RuntimeError("loss is not finite")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
