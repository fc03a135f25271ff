"""Continued pretraining of a 1.3B-parameter decoder-only language model on a tokenized code corpus,
driven by Hugging Face Accelerate on one GPU (bf16 mixed precision).

The corpus is a flat file of uint16 token ids (as written by the team's tokenization job), read
through ``np.memmap``; DataLoader workers cut random 2,049-token windows out of it. The model is the
team's own GPT block stack (pre-LayerNorm, no biases, no dropout, fused scaled-dot-product attention,
tied embeddings), trained with fused AdamW, cosine schedule and gradient clipping through
``accelerator.clip_grad_norm_``. The loss is read once per progress line.

Nothing here is known to be wrong: this is a healthy control. ``--workers``, ``--batch`` and
``--compile`` are the knobs a false alarm would turn.

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
from accelerate import Accelerator
from torch import nn

from common import Progress, log, parser, watchdog


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--d-model", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: train forever)")
    args = ap.parse_args(argv)
    if args.device == "cpu" or args.tiny:
        args.batch, args.context, args.d_model, args.layers, args.heads = 2, 64, 64, 2, 4
        args.vocab, args.workers = 512, 0
    return args


def write_corpus(n_tokens: int, vocab: int, seed: int = 0) -> str:
    """The tokenization job's output: uint16 ids, Zipf-like frequencies, in one flat file (kept in the
    temp folder and reused by later runs)."""
    path = os.path.join(tempfile.gettempdir(), f"fresh8_code_tokens_{vocab}_{n_tokens}_{seed}.u16")
    if os.path.exists(path) and os.path.getsize(path) == 2 * n_tokens:
        return path
    rng = np.random.default_rng(seed)
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "wb") as f:
        left = n_tokens
        while left > 0:
            n = min(left, 8_000_000)
            ids = np.minimum(rng.zipf(1.2, size=n) - 1, vocab - 1).astype(np.uint16)
            f.write(ids.tobytes())
            left -= n
    os.replace(tmp, path)
    return path


class TokenWindows(torch.utils.data.Dataset):
    def __init__(self, path: str, context: int, n_windows: int) -> None:
        self.path, self.context, self.n_windows = path, context, n_windows
        self.tokens = None  # opened lazily in each worker

    def __len__(self) -> int:
        return self.n_windows

    def __getitem__(self, i: int):
        if self.tokens is None:
            self.tokens = np.memmap(self.path, dtype=np.uint16, mode="r")
        s = np.random.randint(0, len(self.tokens) - self.context - 1)
        window = torch.from_numpy(self.tokens[s:s + self.context + 1].astype(np.int64))
        return window[:-1], window[1:]


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d, bias=False)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d, bias=False)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.fc_out = nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab: int, context: int, d: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, bias=False)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    cuda = args.device == "cuda"
    torch.manual_seed(0)

    accelerator = Accelerator(mixed_precision="bf16" if cuda else "no", cpu=not cuda)
    corpus = write_corpus(64_000_000 if cuda else 200_000, args.vocab)
    data = TokenWindows(corpus, args.context, n_windows=1_000_000)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=False, drop_last=True,
                                         num_workers=args.workers, pin_memory=cuda,
                                         persistent_workers=args.workers > 0)

    model = GPT(args.vocab, args.context, args.d_model, args.layers, args.heads)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=cuda)
    warmup, total = 200, 100_000
    sched = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(s, total) / total))))
    model, optimizer, loader, sched = accelerator.prepare(model, optimizer, loader, sched)
    if args.compile:
        model = torch.compile(model)
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    log(f"GPT {n_params:.0f}M parameters, batch {args.batch} x {args.context} tokens, {args.workers} workers, "
        f"mixed precision {accelerator.mixed_precision}, compile={args.compile}")

    progress = Progress(args.batch, warm_s=8.0 if args.compile else 4.0)
    model.train()
    step, seen, t_last, n_last = 0, 0, time.perf_counter(), 0
    while True:
        for x, y in loader:
            with accelerator.autocast():
                logits = model(x)
                loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1))
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            sched.step()
            optimizer.zero_grad(set_to_none=True)
            progress.step(samples=x.shape[0])
            step += 1
            seen += x.shape[0]
            now = time.perf_counter()
            if now - t_last >= 1.0:
                loss_val = loss.item()
                now = time.perf_counter()
                log(f"step {step} samples/s {(seen - n_last) / (now - t_last):.1f} loss {loss_val:.4f}")
                t_last, n_last = now, seen
                if not math.isfinite(loss_val):
                    raise RuntimeError("loss is not finite")
            if args.steps and step >= args.steps:
                log(f"step {step} samples/s {(seen - n_last) / max(1e-9, time.perf_counter() - t_last):.1f}")
                return 0


if __name__ == "__main__":
    raise SystemExit(main())
