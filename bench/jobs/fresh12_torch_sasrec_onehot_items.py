"""Next-item recommendation for an online grocery shop: a SASRec-style self-attentive sequential
recommender (Kang & McAuley, 2018) in plain PyTorch on one GPU: the last 200 items of each user's
history, 4 causal Transformer blocks of width 512 (8 heads, SDPA flash attention), item scores as dot
products with the item table, SASRec's binary cross-entropy on the next item against one sampled
negative per position; bf16 autocast, fused AdamW; batches of 256 users over a 40,000-item catalogue.

The interaction histories (left-padded with item 0) and the per-position negatives live on the GPU
(generated here).

The model was ported from the team's Keras prototype, where the item input was
``Dense(hidden, use_bias=False)`` over ``tf.one_hot(items, num_items)``: here
``self.item_in = nn.Linear(num_items, hidden, bias=False)`` applied to
``F.one_hot(seq, num_items).float()``. Mathematically that is an embedding lookup, but the GPU
materialises a 51,200 x 40,000 one-hot matrix every step: 16 GB of int64 from ``F.one_hot``, 8 GB
after ``.float()``, 4 GB more for autocast's bf16 copy (kept for the backward), then a dense
51,200 x 40,000 x 512 matmul forward and another for the weight gradient, ~60 GB of memory traffic and
~4 TFLOP to pick 51,200 rows of a table.

``--embedding`` uses ``nn.Embedding(num_items, hidden, padding_idx=0)`` for the item input (a gather
forward, an index-sorted row accumulation backward), with the same scoring and loss.

Prints ``step <n> samples/s <x>`` about once a second (samples are user histories).
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
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seq", type=int, default=200)
    ap.add_argument("--items", type=int, default=40_000)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--users", type=int, default=200_000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--embedding", action="store_true",
                    help="item input through nn.Embedding instead of nn.Linear over one-hot vectors")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.batch, args.seq, args.items, args.hidden, args.blocks, args.heads, args.users = 16, 32, 2000, 64, 2, 4, 2000
    return args


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, dropout: float = 0.2) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.ffn = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, hidden))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.2 if self.training else 0.0)
        x = x + self.drop(self.out(y.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.ffn(self.ln2(x)))


class SASRec(nn.Module):
    def __init__(self, items: int, seq: int, hidden: int, blocks: int, heads: int, embedding: bool) -> None:
        super().__init__()
        self.items = items
        self.embedding = embedding
        if embedding:
            self.item_emb = nn.Embedding(items, hidden, padding_idx=0)
        else:  # the Keras port: Dense(hidden, use_bias=False) over one-hot item vectors
            self.item_in = nn.Linear(items, hidden, bias=False)
        self.pos_emb = nn.Embedding(seq, hidden)
        self.drop = nn.Dropout(0.2)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(blocks))
        self.ln = nn.LayerNorm(hidden)
        nn.init.normal_(self.item_table, std=hidden ** -0.5)

    @property
    def item_table(self) -> torch.Tensor:
        """The item vectors, one row per item (shared by the input and the scoring)."""
        return self.item_emb.weight if self.embedding else self.item_in.weight.t()

    def encode(self, seq: torch.Tensor) -> torch.Tensor:
        if self.embedding:
            x = self.item_emb(seq)
        else:
            x = self.item_in(F.one_hot(seq, self.items).float())
        x = x * math.sqrt(x.shape[-1]) + self.pos_emb(torch.arange(seq.shape[1], device=seq.device))
        x = self.drop(x) * (seq != 0).unsqueeze(-1)
        for block in self.blocks:
            x = block(x)
        return self.ln(x)

    def forward(self, seq: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
        h = self.encode(seq)
        table = self.item_table
        pos_logit = (h * F.embedding(pos, table)).sum(-1)
        neg_logit = (h * F.embedding(neg, table)).sum(-1)
        mask = (pos != 0).float()
        loss = (F.binary_cross_entropy_with_logits(pos_logit.float(), torch.ones_like(mask), reduction="none")
                + F.binary_cross_entropy_with_logits(neg_logit.float(), torch.zeros_like(mask), reduction="none"))
        return (loss * mask).sum() / mask.sum()


def make_histories(users: int, seq: int, items: int, device: torch.device, g: torch.Generator) -> torch.Tensor:
    """Purchase histories, seq + 1 items each (popularity-skewed ids, 1..items-1), left-padded with 0."""
    u = torch.rand(users, seq + 1, device=device, generator=g)
    ids = (u.pow(3) * (items - 1)).long() + 1  # popular items have small ids
    lengths = torch.randint(seq // 4, seq + 2, (users, 1), device=device, generator=g)
    keep = torch.arange(seq + 1, device=device).flip(0)[None] < lengths
    return ids * keep


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True

    g = torch.Generator(device=device).manual_seed(0)
    hist = make_histories(args.users, args.seq, args.items, device, g)
    model = SASRec(args.items, args.seq, args.hidden, args.blocks, args.heads, args.embedding).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.0, fused=cuda)
    log(f"SASRec {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, {args.items} items, batch "
        f"{args.batch} x {args.seq}, item input {'nn.Embedding' if args.embedding else 'nn.Linear over one-hot'}")

    progress = Progress(args.batch)
    model.train()
    step, seen, t_last, n_last = 0, 0, time.perf_counter(), 0
    while True:
        order = torch.randperm(args.users, device=device, generator=g)
        for s in range(0, args.users - args.batch + 1, args.batch):
            h = hist[order[s:s + args.batch]]
            seq, pos = h[:, :-1], h[:, 1:]
            neg = torch.randint(1, args.items, pos.shape, device=device, generator=g) * (pos != 0)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                loss = model(seq, pos, neg)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
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
