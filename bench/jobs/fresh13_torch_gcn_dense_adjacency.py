"""Paper-topic classification on a citation graph: a 3-layer GCN (Kipf & Welling; hidden 256, BatchNorm,
ReLU, dropout 0.5, the OGB arXiv baseline's shape) trained full-batch in plain PyTorch on one GPU on a
40,000-paper graph (128-d text features, 40 subject classes, ~280,000 citations; generated here), fp32
with TF32 matmuls, fused AdamW. One step is one epoch: every node is propagated, the loss is taken on
the training papers.

The propagation matrix D^-1/2 (A + I) D^-1/2 is built as a dense 40,000 x 40,000 fp32 tensor (6.4 GB;
the code predates sparse support in the lab's tooling) and every layer aggregates with
``adj @ (h @ W)``. The graph has ~600,000 non-zeros (0.04 % of the matrix), so each of the three
aggregations in the forward and each of their three gradients in the backward (``adj.T @ grad``) is a
dense GEMM with K = 40,000 that multiplies 1.6 billion mostly-zero entries: ~3.5 TFLOP a step where
the sparse products need ~1.3 GFLOP.

``--sparse-adjacency`` keeps the same normalised matrix as a sparse COO tensor and aggregates with
``torch.sparse.mm`` (cuSPARSE SpMM, and its transpose in the backward).

Prints ``step <n> samples/s <x>`` about once a second (samples are labelled training nodes).
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
    ap.add_argument("--nodes", type=int, default=40_000)
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--classes", type=int, default=40)
    ap.add_argument("--degree", type=float, default=14.0, help="mean citations per paper (both directions)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--sparse-adjacency", action="store_true",
                    help="aggregate with a sparse COO propagation matrix instead of a dense one")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.nodes, args.features, args.classes, args.hidden = 2_000, 32, 8, 32
    return args


def synth_citations(n: int, classes: int, degree: float, device: torch.device, g: torch.Generator):
    """Homophilous random graph: most citations go to papers of the same subject. Returns labels and
    the undirected edge list (each edge once, no self loops)."""
    labels = torch.randint(0, classes, (n,), device=device, generator=g)
    m = int(n * degree / 2)
    src = torch.randint(0, n, (m,), device=device, generator=g)
    by_class = torch.argsort(labels)
    counts = torch.bincount(labels, minlength=classes)
    starts = torch.cumsum(counts, 0) - counts
    same = torch.rand(m, device=device, generator=g) < 0.7
    pick = (torch.rand(m, device=device, generator=g) * counts[labels[src]]).long()
    dst_same = by_class[starts[labels[src]] + pick]
    dst_any = torch.randint(0, n, (m,), device=device, generator=g)
    dst = torch.where(same, dst_same, dst_any)
    keep = src != dst
    return labels, src[keep], dst[keep]


def propagation_matrix(n: int, src: torch.Tensor, dst: torch.Tensor, sparse: bool) -> torch.Tensor:
    """D^-1/2 (A + I) D^-1/2 of the symmetrised graph, dense or as a coalesced sparse COO tensor."""
    device = src.device
    loops = torch.arange(n, device=device)
    rows = torch.cat([src, dst, loops])
    cols = torch.cat([dst, src, loops])
    a = torch.sparse_coo_tensor(torch.stack([rows, cols]), torch.ones(len(rows), device=device), (n, n)).coalesce()
    a = torch.sparse_coo_tensor(a.indices(), torch.ones_like(a.values()), (n, n)).coalesce()  # duplicates count once
    deg = torch.zeros(n, device=device).index_add_(0, a.indices()[0], a.values())
    d = deg.pow(-0.5)
    r, c = a.indices()
    vals = d[r] * a.values() * d[c]
    if sparse:
        return torch.sparse_coo_tensor(a.indices(), vals, (n, n)).coalesce()
    adj = torch.zeros(n, n, device=device)
    adj[r, c] = vals
    return adj


class GCN(nn.Module):
    def __init__(self, features: int, hidden: int, classes: int, layers: int, sparse: bool) -> None:
        super().__init__()
        dims = [features] + [hidden] * (layers - 1) + [classes]
        self.lins = nn.ModuleList(nn.Linear(a, b, bias=False) for a, b in zip(dims[:-1], dims[1:]))
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(b)) for b in dims[1:])
        self.norms = nn.ModuleList(nn.BatchNorm1d(hidden) for _ in range(layers - 1))
        self.sparse = sparse

    def propagate(self, adj: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.sparse.mm(adj, h) if self.sparse else adj @ h

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        h = x
        for i, (lin, b) in enumerate(zip(self.lins, self.biases)):
            h = self.propagate(adj, lin(h)) + b
            if i < len(self.norms):
                h = F.dropout(F.relu(self.norms[i](h)), p=0.5, training=self.training)
        return h


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    g = torch.Generator(device=device).manual_seed(0)
    t0 = time.perf_counter()
    labels, src, dst = synth_citations(args.nodes, args.classes, args.degree, device, g)
    centers = torch.randn(args.classes, args.features, device=device, generator=g)
    x = centers[labels] + 2.0 * torch.randn(args.nodes, args.features, device=device, generator=g)
    train_mask = torch.rand(args.nodes, device=device, generator=g) < 0.54  # the arXiv split's share
    train_idx = train_mask.nonzero().squeeze(1)
    adj = propagation_matrix(args.nodes, src, dst, args.sparse_adjacency)
    nnz = adj._nnz() if adj.is_sparse else int((adj != 0).sum())
    log(f"graph: {args.nodes} nodes, {len(src)} citations, {nnz} non-zeros in the propagation matrix "
        f"({'sparse' if adj.is_sparse else f'dense, {adj.numel() * 4 / 1e9:.1f} GB'}), built in "
        f"{time.perf_counter() - t0:.1f}s")

    model = GCN(args.features, args.hidden, args.classes, args.layers, args.sparse_adjacency).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=5e-4, fused=cuda)
    log(f"GCN {sum(p.numel() for p in model.parameters()) / 1e3:.0f}k parameters, {len(train_idx)} training nodes")

    progress = Progress(len(train_idx))
    model.train()
    step, seen, t_last, n_last = 0, 0, time.perf_counter(), 0
    while True:
        out = model(x, adj)
        loss = F.cross_entropy(out[train_idx], labels[train_idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        progress.step()
        step += 1
        seen += len(train_idx)
        now = time.perf_counter()
        if now - t_last >= 1.0:
            loss_val = loss.item()
            acc = (out[train_idx].argmax(1) == labels[train_idx]).float().mean().item()
            now = time.perf_counter()
            log(f"step {step} samples/s {(seen - n_last) / (now - t_last):.1f} loss {loss_val:.4f} train acc {acc:.3f}")
            t_last, n_last = now, seen
            if not math.isfinite(loss_val):
                raise RuntimeError("loss is not finite")


if __name__ == "__main__":
    raise SystemExit(main())
