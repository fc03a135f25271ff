"""Genomic language model pretraining: a 12-layer decoder (width 768, 12 heads, 85M parameters in the
blocks) with ALiBi attention biases instead of position embeddings (so that it extrapolates to longer
contigs at inference), trained in plain PyTorch on one GPU on 1,024-token windows of 6-mer tokenized
DNA (4,101 tokens: the 4,096 6-mers and 5 specials); bf16 autocast, fused AdamW, cosine schedule,
clipping; batches of 16 windows. The token windows are cut from a tokenized genome held on the GPU
(generated here).

Attention is ``F.scaled_dot_product_attention(q, k, v, attn_mask=bias)`` with the ALiBi bias (head
slope x relative distance, -inf above the diagonal), the way the paper's reference code adds it to the
scores. Each attention module builds that bias in its ``forward`` with the helper copied from an ALiBi
blog post: ``torch.arange`` without a device, so the 12 x 1,024 x 1,024 bias (the distances, the slope
product, the causal ``masked_fill``, the bf16 cast: four passes over 12.6M elements) is computed on the
CPU, then ``.to(q.device)``: a pageable 25 MB host-to-device copy, which waits for the GPU to finish
the layers queued before it. Twelve times per forward.

``--cached-bias`` builds the bias once on the GPU at model construction (a non-persistent buffer for
the maximum context) and slices it in ``forward``.

Prints ``step <n> samples/s <x>`` about once a second (samples are 1,024-token windows).
"""

from __future__ import annotations

import math
import time

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
    ap.add_argument("--vocab", type=int, default=4101)
    ap.add_argument("--genome", type=int, default=200_000_000, help="tokens of the tokenized genome")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--cached-bias", action="store_true",
                    help="build the ALiBi bias once on the device instead of on the CPU in every attention call")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.batch, args.ctx, args.layers, args.width, args.heads, args.genome = 4, 64, 2, 64, 4, 200_000
    return args


def get_slopes(n_heads: int) -> list[float]:
    """ALiBi head slopes: a geometric sequence starting at 2^(-8/n) (n a power of 2, else interleaved)."""
    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]

    if math.log2(n_heads).is_integer():
        return power_of_2(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return power_of_2(closest) + get_slopes(2 * closest)[0::2][:n_heads - closest]


def alibi_bias(n_heads: int, seq_len: int) -> torch.Tensor:
    """[heads, seq, seq] additive attention bias: -slope * distance to the key, -inf for future keys."""
    slopes = torch.tensor(get_slopes(n_heads))
    context = torch.arange(seq_len)[:, None]
    memory = torch.arange(seq_len)[None, :]
    relative = memory - context  # <= 0 for the keys a query may see
    bias = slopes[:, None, None] * relative[None]
    causal = torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool), diagonal=1)
    return bias.masked_fill(causal, float("-inf"))


class ALiBiAttention(nn.Module):
    def __init__(self, width: int, heads: int, ctx: int, cached: bool) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.cached = cached
        if cached:
            self.register_buffer("bias", alibi_bias(heads, ctx), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        if self.cached:
            bias = self.bias[:, :t, :t].to(q.dtype)
        else:
            bias = alibi_bias(self.heads, t).to(q.device, q.dtype)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias[None])
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, ctx: int, cached: bool) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = ALiBiAttention(width, heads, ctx, cached)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GenomeLM(nn.Module):
    def __init__(self, vocab: int, ctx: int, width: int, layers: int, heads: int, cached: bool) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, heads, ctx, cached) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "mlp.2.weight"))
                                else 0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.reshape(-1))


def tokenized_genome(tokens: int, vocab: int, device: torch.device, g: torch.Generator) -> torch.Tensor:
    """Overlapping-free 6-mer tokens of a synthetic genome with repeats (ids 5..4100), int16 on the device."""
    ids = torch.randint(5, vocab, (tokens,), generator=g, device=device, dtype=torch.int16)
    repeat = torch.randint(5, vocab, (4096,), generator=g, device=device, dtype=torch.int16)
    starts = torch.randint(0, tokens - 4096, (tokens // 65536,), generator=g, device=device)
    for s in starts[:64].tolist():  # a few long repeats (transposons)
        ids[s:s + 4096] = repeat
    return ids


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True

    g = torch.Generator(device=device).manual_seed(0)
    genome = tokenized_genome(args.genome, args.vocab, device, g)
    model = GenomeLM(args.vocab, args.ctx, args.width, args.layers, args.heads, args.cached_bias).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95), fused=cuda)
    warmup, total = 1_000, 100_000
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup else
        0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (s - warmup) / (total - warmup)))))
    log(f"genome LM {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, batch {args.batch} x "
        f"{args.ctx} tokens, ALiBi bias {'cached on the device' if args.cached_bias else 'built on the CPU per call'}")

    offsets = torch.arange(args.ctx + 1, device=device)
    progress = Progress(args.batch)
    model.train()
    step, seen, t_last, n_last = 0, 0, time.perf_counter(), 0
    while True:
        start = torch.randint(0, args.genome - args.ctx - 1, (args.batch, 1), generator=g, device=device)
        w = genome[start + offsets].long()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = model(w[:, :-1], w[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
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
