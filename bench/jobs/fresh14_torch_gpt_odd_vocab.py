"""Pre-training a GPT-2-small-sized decoder (124M parameters: 12 layers, 768 wide, 12 heads, 1,024-token
context) on a web-and-code mix tokenised with the GPT-2 BPE, in the nanoGPT manner: one GPU, bf16
autocast, flash attention through ``scaled_dot_product_attention``, token embedding tied to the LM
head, fused AdamW with a warmup-cosine schedule, clipping at 1.0, batches of 32 sequences.

The training tokens are one flat uint16 array (generated here with a Zipf-like distribution; the real
job memory-maps ``train.bin``); ``get_batch`` cuts 32 random 1,025-token windows, pins them and copies
them asynchronously. The loss is read about once a second.

The vocabulary is the tokenizer's: ``--vocab 50257``. ``--pad-vocab`` rounds the embedding / LM-head
rows up to a multiple of 64 (50,304; the extra rows are never a target) as nanoGPT does.

Prints ``step <n> samples/s <x>`` about once a second (samples are 1,024-token sequences).
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
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--block", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257, help="the tokenizer's vocabulary")
    ap.add_argument("--pad-vocab", action="store_true",
                    help="round the embedding and LM-head rows up to a multiple of 64")
    ap.add_argument("--tokens", type=int, default=100_000_000, help="training tokens held in host memory")
    ap.add_argument("--lr", type=float, default=6e-4)
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.batch, args.block, args.layers, args.width, args.heads = 4, 64, 2, 64, 4
        args.vocab, args.tokens = 1001, 200_000
    return args


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab: int, block: int, layers: int, width: int, heads: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(block, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("attn.proj.weight") or name.endswith("out.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def make_tokens(n: int, vocab: int) -> np.ndarray:
    """A Zipf-like token stream standing in for the memory-mapped train.bin."""
    rng = np.random.default_rng(0)
    ranks = np.minimum(rng.pareto(1.1, size=n) * 40, vocab - 1).astype(np.int64)
    perm = rng.permutation(vocab)
    return perm[ranks].astype(np.uint16)


def get_batch(data: np.ndarray, batch: int, block: int, device: torch.device):
    ix = np.random.randint(0, len(data) - block - 1, size=batch)
    x = torch.stack([torch.from_numpy(data[i:i + block].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block].astype(np.int64)) for i in ix])
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x, y


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True

    model_vocab = (args.vocab + 63) // 64 * 64 if args.pad_vocab else args.vocab
    data = make_tokens(args.tokens, args.vocab)
    model = GPT(model_vocab, args.block, args.layers, args.width, args.heads).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"GPT {n_params / 1e6:.1f}M parameters, vocab {model_vocab} (tokenizer {args.vocab}), "
        f"batch {args.batch} x {args.block}")

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=cuda)
    warmup, total = 2_000, 600_000

    def lr_at(step: int) -> float:
        if step < warmup:
            return args.lr * (step + 1) / warmup
        return 0.1 * args.lr + 0.45 * args.lr * (1 + math.cos(math.pi * min(1.0, (step - warmup) / (total - warmup))))

    progress = Progress(args.batch)
    step, t_last, n_last = 0, time.perf_counter(), 0
    x, y = get_batch(data, args.batch, args.block, device)
    while True:
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = model(x, y)
        x, y = get_batch(data, args.batch, args.block, device)  # prefetch the next batch while the GPU works
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        progress.step()
        now = time.perf_counter()
        if now - t_last >= 1.0:
            loss_val = loss.item()
            now = time.perf_counter()
            log(f"step {step} samples/s {(step - n_last) * args.batch / (now - t_last):.1f} loss {loss_val:.4f} "
                f"lr {lr_at(step):.2e}")
            t_last, n_last = now, step
            if not math.isfinite(loss_val):
                raise RuntimeError("loss is not finite")


if __name__ == "__main__":
    raise SystemExit(main())
