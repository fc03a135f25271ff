"""Pre-training a ~1.4B-parameter GPT (width 2560, 16 layers, 20 heads of 128, context 2048,
tied embeddings) in plain PyTorch on one GPU.

The corpus is a pre-tokenized uint16 token file, memory-mapped and cut into 2,049-token windows;
a DataLoader with 4 workers and pinned memory serves shuffled windows. bf16 autocast, fused
AdamW, ``F.scaled_dot_product_attention`` (flash attention), gradient clipping at 1.0, a cosine
schedule, 4 sequences per step; the loss is read once per progress line.

Changes people suggest when they see it, each behind a flag so it can be measured:
``--workers 8`` (more DataLoader workers), ``--batch 8`` (twice the sequences per step: the GPU
memory is far from full), ``--compile`` (``torch.compile`` on the model).

Prints ``step <n> samples/s <x>`` about once a second.
"""

from __future__ import annotations

import math
import os
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from common import Progress, log, parser, watchdog


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--width", type=int, default=2560)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=20)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--data", default="", help="uint16 token file (default: a synthetic one in the temp dir)")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: train forever)")
    args = ap.parse_args(argv)
    if args.tiny or args.device == "cpu":
        args.context, args.width, args.layers, args.heads = 64, 64, 2, 4  # batch and workers as given
    return args


VOCAB = 50304


def token_file(path: str, n_tokens: int) -> str:
    """The pre-tokenized corpus (uint16). Without one, write a synthetic one once."""
    if path:
        return path
    path = os.path.join(tempfile.gettempdir(), f"gpt-corpus-{n_tokens}.u16")
    if not os.path.exists(path) or os.path.getsize(path) != 2 * n_tokens:
        rng = np.random.default_rng(0)
        tmp = path + f".{os.getpid()}"
        rng.integers(0, VOCAB, size=n_tokens, dtype=np.uint16).tofile(tmp)
        os.replace(tmp, path)
    return path


class TokenWindows(torch.utils.data.Dataset):
    def __init__(self, path: str, context: int) -> None:
        self.path, self.context = path, context
        self.n = os.path.getsize(path) // 2 // (context + 1)
        self.tokens = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.tokens is None:  # opened in each worker
            self.tokens = np.memmap(self.path, dtype=np.uint16, mode="r")
        s = i * (self.context + 1)
        w = torch.from_numpy(self.tokens[s:s + self.context + 1].astype(np.int64))
        return w[:-1], w[1:]


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.out = nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, d: int, layers: int, heads: int, context: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, d)
        self.wpe = nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)
        self.head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "out.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, VOCAB), targets.view(-1))


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    path = token_file(args.data, 64 * 2**20 if cuda else 2**18)
    data = TokenWindows(path, args.context)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True,
                                         num_workers=args.workers, pin_memory=cuda,
                                         persistent_workers=args.workers > 0, prefetch_factor=4 if args.workers else None)
    model = GPT(args.width, args.layers, args.heads, args.context).to(device)
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=cuda)
    warmup, total = 2000, 200_000
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total)))))
    step_model = torch.compile(model) if args.compile else model
    log(f"GPT {n_params:.0f}M parameters, {args.batch} x {args.context} tokens per step, {args.workers} workers"
        f"{', torch.compile' if args.compile else ''}")

    progress = Progress(args.batch)
    model.train()
    step, seen, n_last, t_last = 0, 0, 0, time.perf_counter()
    while True:
        for x, y in loader:
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                loss = step_model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            progress.step(samples=x.shape[0])
            step += 1
            seen += x.shape[0]
            now = time.perf_counter()
            if now - t_last >= 1.0 or step == args.steps:
                loss_val = loss.item()
                now = time.perf_counter()
                log(f"step {step} samples/s {(seen - n_last) / (now - t_last):.2f} loss {loss_val:.4f}")
                n_last, t_last = seen, now
            if args.steps and step >= args.steps:
                return 0


if __name__ == "__main__":
    raise SystemExit(main())
