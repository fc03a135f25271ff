"""Credit-default model on tabular data: an FT-Transformer (one token per feature plus [CLS], six
pre-LayerNorm Transformer blocks of width 256) trained in plain PyTorch on one GPU, bf16 autocast.

The training table (2.5M loan applications: 48 numeric features and 16 categorical ones, already
standardized / integer-coded) is small enough to live in GPU memory, so there is no DataLoader: each
step gathers its rows from the GPU tensors by index. Batches must be reproducible across restarts
(a resumed run has to see exactly the batches the original run would have seen), so each step seeds
a CPU generator with ``seed + step`` and takes the first ``batch`` entries of
``torch.randperm(n_rows, generator=g)``: a fresh random batch, without repeats, that depends only on
the step number.

``--epoch-permutation`` draws one permutation of the rows per epoch, on the GPU, from a generator
seeded with ``seed + epoch``, and slices consecutive batches out of it (equally reproducible: the
batch of step ``s`` is slice ``s % steps_per_epoch`` of epoch ``s // steps_per_epoch``'s permutation).

Prints ``step <n> samples/s <x>`` about once a second.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from torch import nn

from common import Progress, log, parser, watchdog

N_NUM, N_CAT = 48, 16


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--rows", type=int, default=2_500_000)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: train forever)")
    ap.add_argument("--epoch-permutation", action="store_true",
                    help="one GPU permutation per epoch, sliced into batches, instead of a CPU randperm per step")
    args = ap.parse_args(argv)
    if args.device == "cpu" or args.tiny:
        args.rows, args.batch, args.d_model, args.layers, args.heads = 200_000, 64, 32, 2, 4
    return args


def make_table(n: int, device: torch.device, seed: int = 0):
    """The preprocessed loan table: standardized numeric columns, integer-coded categorical columns
    (cardinalities between 3 and 1,000) and the default label, which depends on both."""
    g = torch.Generator().manual_seed(seed)
    cards = torch.randint(3, 1000, (N_CAT,), generator=g)
    num = torch.randn(n, N_NUM, generator=g)
    cat = (torch.rand(n, N_CAT, generator=g) * cards).long()
    w = torch.randn(N_NUM, generator=g) / math.sqrt(N_NUM)
    logit = num @ w + 0.5 * torch.sin(cat[:, :4].float()).sum(1) - 1.5
    y = (torch.rand(n, generator=g) < torch.sigmoid(logit)).float()
    return num.to(device), cat.to(device), y.to(device), cards.tolist()


class FTTransformer(nn.Module):
    def __init__(self, cards: list[int], d: int, layers: int, heads: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.num_weight = nn.Parameter(torch.randn(N_NUM, d) / math.sqrt(d))
        self.num_bias = nn.Parameter(torch.zeros(N_NUM, d))
        self.register_buffer("cat_offsets", torch.tensor([0] + cards[:-1]).cumsum(0), persistent=False)
        self.cat_emb = nn.Embedding(sum(cards), d)
        self.cls = nn.Parameter(torch.randn(1, 1, d) / math.sqrt(d))
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=3 * d, dropout=dropout, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 1)

    def forward(self, num: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
        tok_num = num.unsqueeze(-1) * self.num_weight + self.num_bias
        tok_cat = self.cat_emb(cat + self.cat_offsets)
        x = torch.cat([self.cls.expand(num.shape[0], -1, -1), tok_num, tok_cat], dim=1)
        x = self.encoder(x)
        return self.head(self.norm(x[:, 0])).squeeze(-1)


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(args.seed)

    num, cat, y, cards = make_table(args.rows, device)
    model = FTTransformer(cards, args.d_model, args.layers, args.heads).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-5, fused=cuda)
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    steps_per_epoch = args.rows // args.batch
    log(f"FT-Transformer {n_params:.2f}M parameters, {args.rows} rows on {device}, batch {args.batch}, "
        f"sampling: {'one GPU permutation per epoch' if args.epoch_permutation else 'seeded CPU randperm per step'}")

    sampler = torch.Generator()  # CPU generator, reseeded every step: reproducible batches after a restart
    gpu_gen = torch.Generator(device=device)
    perm, perm_epoch = None, -1

    progress = Progress(args.batch)
    model.train()
    step, seen, t_last, n_last = 0, 0, time.perf_counter(), 0
    while True:
        if args.epoch_permutation:
            epoch, k = divmod(step, steps_per_epoch)
            if epoch != perm_epoch:
                gpu_gen.manual_seed(args.seed + epoch)
                perm, perm_epoch = torch.randperm(args.rows, device=device, generator=gpu_gen), epoch
            idx = perm[k * args.batch:(k + 1) * args.batch]
        else:
            sampler.manual_seed(args.seed + step)
            idx = torch.randperm(args.rows, generator=sampler)[:args.batch].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            logits = model(num[idx], cat[idx])
            loss = F.binary_cross_entropy_with_logits(logits.float(), y[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        progress.step(samples=args.batch)
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
        if args.steps and step >= args.steps:
            log(f"step {step} samples/s {(seen - n_last) / max(1e-9, time.perf_counter() - t_last):.1f}")
            return 0


if __name__ == "__main__":
    raise SystemExit(main())
