"""A GPT language model written by hand in plain PyTorch, nanoGPT style, whose causal
self-attention is the textbook formula spelled out: ``att = (q @ k.transpose(-2, -1)) * scale``,
``att.masked_fill(~causal_mask, -inf)``, ``att.softmax(-1)``, ``att @ v``, at a context of 2,048
tokens. Every layer builds a batch x heads x 2048 x 2048 score matrix, and writes and reads it
several times over in forward and backward (scaled, masked, softmaxed in fp32 under autocast, cast
back), so the step is spent mostly moving attention scores through memory. ``--sdpa`` is the fix:
``F.scaled_dot_product_attention(q, k, v, is_causal=True)``, a fused (flash) attention kernel.

GPT-2 small's shape (12 layers, 12 heads, width 768, vocab 50,304, tied head, 124M parameters),
pre-LayerNorm blocks with a GELU MLP, bf16 autocast, fused AdamW with a cosine schedule; random
token batches on the GPU, no download."""

from __future__ import annotations

import math

import torch
from torch import nn
import torch.nn.functional as F

from common import Progress, log, parser, watchdog


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, context: int, sdpa: bool) -> None:
        super().__init__()
        self.heads, self.sdpa = heads, sdpa
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.register_buffer("mask", torch.tril(torch.ones(context, context, dtype=torch.bool))
                             .view(1, 1, context, context), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(~self.mask[:, :, :t, :t], float("-inf"))
            att = att.softmax(dim=-1)
            y = att @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, context: int, sdpa: bool) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, context, sdpa)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, context: int, layers: int, heads: int, width: int, sdpa: bool) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, context, sdpa) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = idx.size(1)
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--sdpa", action="store_true", help="the fix: F.scaled_dot_product_attention")
    args = p.parse_args()
    watchdog(args.seconds)
    dev = torch.device(args.device)
    if args.tiny:
        vocab, context, layers, heads, width, batch = 512, 64, 2, 2, 64, 4
    else:
        vocab, context, layers, heads, width, batch = 50304, args.context, 12, 12, 768, args.batch
    model = GPT(vocab, context, layers, heads, width, args.sdpa).to(dev)
    decay = [p_ for p_ in model.parameters() if p_.dim() >= 2]
    no_decay = [p_ for p_ in model.parameters() if p_.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), fused=dev.type == "cuda")
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100_000, eta_min=6e-5)
    g = torch.Generator(device=dev).manual_seed(0)
    data = torch.randint(0, vocab, (4 * batch, context + 1), device=dev, generator=g)
    progress = Progress(batch)
    log(f"fresh5_manual_attention: gpt {layers}x{width} context {context} batch {batch} "
        f"attention {'sdpa' if args.sdpa else 'manual'}")
    model.train()
    step = 0
    while True:
        chunk = data[(step % 4) * batch:(step % 4 + 1) * batch]
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = model(chunk[:, :-1], chunk[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step % 200 == 0:
            log(f"step {step} loss {loss.item():.4f}")
        progress.step()


if __name__ == "__main__":
    main()
