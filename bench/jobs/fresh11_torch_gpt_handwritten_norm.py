"""Small GPT pretraining: a GPT-2-small-sized decoder (12 layers, width 768, 12 heads, 1,024-token
context, 50,304-token vocabulary, tied embeddings, 124M parameters) trained in plain PyTorch on one GPU
with bf16 autocast, ``F.scaled_dot_product_attention(is_causal=True)``, fused AdamW, a cosine schedule
and gradient clipping; batches of 16 random 1,024-token windows sliced from a pre-tokenized corpus held
in memory (generated here).

The model code goes back to the lab's first transformer, written from the Annotated Transformer and
BERT-pytorch: a hand-written ``LayerNorm`` module (mean and unbiased std over the last dimension, eps
added to the std, then scale and shift) and a ``GELU`` module computing the tanh approximation
``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))`` from tensor operations. Attention was
later switched to SDPA, the norms and the activation were kept. Each of them is a chain of 6 to 9
separate elementwise and reduction kernels over full activations (in fp32 under autocast) forward, and
about twice as many backward, each reading and writing the whole tensor: the 25 LayerNorms and the 12
GELUs over the 3,072-wide MLP activations move ~145 GB more per step than fused kernels would, about
50 ms of memory traffic on top of a ~48 ms step (~26 ms of it matmuls and flash attention).

``--fused-ops`` builds the same model with ``nn.LayerNorm`` and ``nn.GELU(approximate="tanh")``: one
fused kernel forward and one or two backward for each.

Prints ``step <n> samples/s <x>`` about once a second.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from common import Progress, log, parser, watchdog


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50_304)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--fused-ops", action="store_true",
                    help="nn.LayerNorm and nn.GELU(approximate='tanh') instead of the hand-written modules")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.batch, args.ctx, args.layers, args.width, args.heads, args.vocab = 4, 64, 2, 64, 4, 512
    return args


class LayerNorm(nn.Module):
    """Construct a layernorm module (see the Annotated Transformer)."""

    def __init__(self, features: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(features))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2


class GELU(nn.Module):
    """Paper Section 3.4, last paragraph notice that BERT used the GELU instead of RELU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))


def norm(width: int, fused: bool) -> nn.Module:
    return nn.LayerNorm(width) if fused else LayerNorm(width)


class Block(nn.Module):
    def __init__(self, width: int, heads: int, fused: bool) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = norm(width, fused)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln_2 = norm(width, fused)
        self.fc = nn.Linear(width, 4 * width)
        self.act = nn.GELU(approximate="tanh") if fused else GELU()
        self.fc_proj = nn.Linear(4 * width, width)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln_1(x))
        return x + self.fc_proj(self.act(self.fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, ctx: int, width: int, layers: int, heads: int, fused: bool) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(ctx, width)
        self.blocks = nn.ModuleList([Block(width, heads, fused) for _ in range(layers)])
        self.ln_f = norm(width, fused)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.view(-1))


def make_corpus(tokens: int, vocab: int, seed: int = 0) -> np.ndarray:
    """A tokenized corpus stand-in: Zipf-distributed token ids with recurring phrases, uint16."""
    rng = np.random.default_rng(seed)
    ids = np.minimum((1 - rng.random(tokens, dtype=np.float32)) ** -1.25, vocab - 1).astype(np.uint16)  # Zipf-like
    phrases = rng.integers(0, vocab, (512, 16), dtype=np.uint16)
    starts = rng.integers(0, tokens - 16, tokens // 64)
    ids[starts[:, None] + np.arange(16)] = phrases[rng.integers(0, 512, len(starts))]
    return ids


def get_batch(data: np.ndarray, batch: int, ctx: int, device: torch.device):
    ix = torch.randint(len(data) - ctx - 1, (batch,))
    x = torch.stack([torch.from_numpy(data[i:i + ctx].astype(np.int64)) for i in ix.tolist()])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + ctx].astype(np.int64)) for i in ix.tolist()])
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x, y


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(1337)
    torch.backends.cuda.matmul.allow_tf32 = True

    data = make_corpus(50_000_000 if cuda else 200_000, args.vocab)
    model = GPT(args.vocab, args.ctx, args.width, args.layers, args.heads, args.fused_ops).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95), fused=cuda)
    warmup, total = 700, 60_000
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup else
        0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (s - warmup) / (total - warmup)))))
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    log(f"GPT: {n_params:.0f}M parameters, batch {args.batch} x {args.ctx} tokens, "
        f"{'nn.LayerNorm + fused GELU' if args.fused_ops else 'hand-written LayerNorm and GELU'}")

    progress = Progress(args.batch)
    model.train()
    step, seen, t_last, n_last = 0, 0, time.perf_counter(), 0
    x, y = get_batch(data, args.batch, args.ctx, device)
    while True:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = model(x, y)
        x, y = get_batch(data, args.batch, args.ctx, device)  # prefetch the next batch while the GPU works
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        progress.step()
        step += 1
        seen += args.batch
        now = time.perf_counter()
        if now - t_last >= 1.0:
            loss_val = loss.item()
            now = time.perf_counter()
            log(f"step {step} samples/s {(seen - n_last) / (now - t_last):.1f} loss {loss_val:.4f}")
            t_last, n_last = now, seen
            if not math.isfinite(loss_val):
                raise RuntimeError("loss is not finite")


if __name__ == "__main__":
    raise SystemExit(main())
