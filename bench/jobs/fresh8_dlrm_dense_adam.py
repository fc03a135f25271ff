"""Click-through-rate model on Criteo-style logs: a DLRM (bottom MLP for the 13 dense features, 26
embedding tables for the categorical ones, pairwise dot interaction, top MLP), plain PyTorch, one GPU.

The 26 categorical features are hashed into tables of their Criteo cardinality, capped at
``--max-rows`` rows (3M), which is about 14.8M rows of 64 floats: 945M embedding parameters. The
whole preprocessed day sits on the GPU and batches of 8,192 samples are gathered from it, so the
input pipeline costs nothing. The model is trained with ``torch.optim.Adam(model.parameters())``,
as the team's other models are, under bf16 autocast.

``--sparse`` makes the tables ``nn.Embedding(sparse=True)`` and trains them with
``torch.optim.SparseAdam`` (only the rows a batch looked up are updated), the MLPs with
``Adam(fused=True)``. ``--fused-adam`` keeps the dense tables but uses ``Adam(fused=True)`` for
everything.

Prints ``step <n> samples/s <x>`` about once a second.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from torch import nn

from common import Progress, log, parser, watchdog

# cardinalities of the 26 categorical columns of the Criteo Kaggle display-advertising day
CRITEO_CARDINALITIES = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27,
                        14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]
N_DENSE = 13


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=64, help="embedding dimension")
    ap.add_argument("--max-rows", type=int, default=3_000_000, help="hash size cap per table")
    ap.add_argument("--samples", type=int, default=4_000_000, help="samples of the day kept on the GPU")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: train forever)")
    ap.add_argument("--sparse", action="store_true",
                    help="sparse embedding gradients, SparseAdam for the tables and fused Adam for the MLPs")
    ap.add_argument("--fused-adam", action="store_true", help="dense tables, but Adam(fused=True) for everything")
    args = ap.parse_args(argv)
    if args.device == "cpu" or args.tiny:
        args.batch, args.dim, args.max_rows, args.samples = 256, 8, 2000, 20_000
    return args


def mlp(sizes: list[int], last_act: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_act:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, table_sizes: list[int], dim: int, sparse: bool = False) -> None:
        super().__init__()
        self.embs = nn.ModuleList(nn.Embedding(n, dim, sparse=sparse) for n in table_sizes)
        for e, n in zip(self.embs, table_sizes):
            nn.init.uniform_(e.weight, -1.0 / math.sqrt(n), 1.0 / math.sqrt(n))  # as in the DLRM reference
        self.bottom = mlp([N_DENSE, 512, 256, dim])
        n_feat = len(table_sizes) + 1
        li, lj = torch.triu_indices(n_feat, n_feat, offset=1)
        self.register_buffer("li", li, persistent=False)
        self.register_buffer("lj", lj, persistent=False)
        self.top = mlp([dim + len(li), 1024, 1024, 512, 256, 1], last_act=False)

    def forward(self, dense: torch.Tensor, cats: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        feats = [x] + [emb(cats[:, i]) for i, emb in enumerate(self.embs)]
        t = torch.stack(feats, dim=1)                       # (B, 27, dim)
        z = torch.bmm(t, t.transpose(1, 2))                 # pairwise dot products
        inter = z[:, self.li, self.lj]
        return self.top(torch.cat([x.to(inter.dtype), inter], dim=1)).squeeze(1)


def make_day(n: int, table_sizes: list[int], device: torch.device, seed: int = 0):
    """A preprocessed day of logs: log-transformed counts, hashed categorical ids (skewed: a few ids
    are very frequent, as in the real logs) and clicks (about a quarter positive)."""
    g = torch.Generator(device=device).manual_seed(seed)
    dense = torch.log1p(torch.rand(n, N_DENSE, device=device, generator=g).pow(-1.5) - 1.0)
    cats = torch.empty(n, len(table_sizes), dtype=torch.long, device=device)
    for i, rows in enumerate(table_sizes):
        u = torch.rand(n, device=device, generator=g)
        ids = (u.pow(3.0) * rows).long().clamp_(max=rows - 1)
        cats[:, i] = (ids * 2654435761) % rows  # spread the hot ids over the table
    w = torch.randn(N_DENSE, device=device, generator=g)
    score = (dense - dense.mean(0)) @ w * 0.5 + ((cats[:, 2] % 7) == 0).float() - 1.2
    clicks = (torch.rand(n, device=device, generator=g) < torch.sigmoid(score)).float()
    return dense, cats, clicks


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)

    table_sizes = [min(n, args.max_rows) for n in CRITEO_CARDINALITIES]
    dense_all, cats_all, clicks_all = make_day(args.samples, table_sizes, device)
    with torch.device(device):
        model = DLRM(table_sizes, args.dim, sparse=args.sparse)

    if args.sparse:
        emb_params = list(model.embs.parameters())
        other = [p for n, p in model.named_parameters() if not n.startswith("embs.")]
        opts = [torch.optim.SparseAdam(emb_params, lr=args.lr), torch.optim.Adam(other, lr=args.lr, fused=True)]
    elif args.fused_adam:
        opts = [torch.optim.Adam(model.parameters(), lr=args.lr, fused=True)]
    else:
        opts = [torch.optim.Adam(model.parameters(), lr=args.lr)]

    n_emb = sum(p.numel() for p in model.embs.parameters()) / 1e6
    n_mlp = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("embs.")) / 1e6
    log(f"DLRM: {sum(table_sizes) / 1e6:.1f}M embedding rows x {args.dim} ({n_emb:.0f}M parameters), "
        f"MLPs {n_mlp:.1f}M parameters, batch {args.batch}, optimizer "
        f"{'SparseAdam + fused Adam' if args.sparse else 'fused Adam' if args.fused_adam else 'Adam'}")

    progress = Progress(args.batch)
    model.train()
    step, seen, t_last, n_last = 0, 0, time.perf_counter(), 0
    warned_nan = False
    n_batches = args.samples // args.batch
    while True:
        perm = torch.randperm(args.samples, device=device)
        for b in range(n_batches):
            idx = perm[b * args.batch:(b + 1) * args.batch]
            dense, cats, clicks = dense_all[idx], cats_all[idx], clicks_all[idx]
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                logits = model(dense, cats)
            loss = F.binary_cross_entropy_with_logits(logits.float(), clicks)
            for opt in opts:
                opt.zero_grad(set_to_none=True)
            loss.backward()
            for opt in opts:
                opt.step()
            progress.step(samples=args.batch)
            step += 1
            seen += args.batch
            now = time.perf_counter()
            if now - t_last >= 1.0:
                loss_val = loss.item()
                now = time.perf_counter()
                log(f"step {step} samples/s {(seen - n_last) / (now - t_last):.1f} loss {loss_val:.4f}")
                t_last, n_last = now, seen
                # A diverged loss is logged, not fatal: the job is here for its speed (the job as first
                # written stopped at ~150 steps when the synthetic clicks' loss reached nan).
                if not math.isfinite(loss_val) and not warned_nan:
                    log("warning: loss is not finite")
                    warned_nan = True
            if args.steps and step >= args.steps:
                log(f"step {step} samples/s {(seen - n_last) / max(1e-9, time.perf_counter() - t_last):.1f}")
                return 0


if __name__ == "__main__":
    raise SystemExit(main())
