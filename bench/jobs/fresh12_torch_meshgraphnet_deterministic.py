"""Learned cloth/airflow simulator: a MeshGraphNets-style encode-process-decode graph network (Pfaff et al.,
2021) written in plain PyTorch, trained on one GPU to predict per-node accelerations on triangulated
simulation meshes: node and edge encoders, 15 message-passing layers (edge MLP over [edge, sender,
receiver], sum aggregation at the receiver, node MLP over [node, aggregate], residuals), MLPs of two
hidden layers of 128 with an output LayerNorm, bf16 autocast, fused AdamW.

Each batch is two meshes of ~25,600 nodes and ~153,000 directed edges each (~51,200 nodes and
~307,000 edges in all), kept on the GPU with their edge lists (generated here); training noise is added
to the node velocities on the GPU. Messages are gathered with ``index_select`` and summed at the
receivers with ``index_add_``, as torch_geometric's scatter does.

The lab's training template starts with its ``seed_everything(seed, deterministic=True)`` so that
ablations are bit-for-bit reproducible: ``torch.use_deterministic_algorithms(True)``,
``CUBLAS_WORKSPACE_CONFIG=:4096:8``, ``cudnn.deterministic`` and no ``cudnn.benchmark``. In that mode
every CUDA ``index_add_`` (the receiver sums, and the backward of every ``index_select`` gather) is
routed to a sort-based ``index_put_(accumulate=True)``: the 307,000 receiver indices are sorted and the
duplicates summed serially, instead of one pass of atomic adds. That is 45 such operations per step,
and cuBLAS is held to its small deterministic workspace.

``--no-deterministic`` seeds the same way but leaves PyTorch's default (atomic, non-deterministic)
kernels and cuBLAS workspace alone.

Prints ``step <n> samples/s <x>`` about once a second (samples are meshes).
"""

from __future__ import annotations

import math
import os
import random
import time

import numpy as np

from common import Progress, log, parser, watchdog


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--meshes-per-batch", type=int, default=2)
    ap.add_argument("--grid", type=int, default=160, help="mesh resolution: grid x grid nodes, triangulated")
    ap.add_argument("--latent", type=int, default=128)
    ap.add_argument("--layers", type=int, default=15)
    ap.add_argument("--pool", type=int, default=16, help="meshes kept on the device")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--no-deterministic", action="store_true",
                    help="seed only; keep the default (atomic) CUDA kernels and cuBLAS workspace")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.grid, args.latent, args.layers, args.pool = 12, 32, 3, 4
    return args


def seed_everything(seed: int, deterministic: bool) -> None:
    """The lab template's reproducibility switch."""
    if deterministic:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # before the first cuBLAS handle exists
    import torch
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


ARGS = parse_args()
seed_everything(0, deterministic=not ARGS.no_deterministic)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402


def mlp(inp: int, hidden: int, out: int, norm: bool = True) -> nn.Sequential:
    layers = [nn.Linear(inp, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, out)]
    if norm:
        layers.append(nn.LayerNorm(out))
    return nn.Sequential(*layers)


class GraphNetBlock(nn.Module):
    def __init__(self, latent: int) -> None:
        super().__init__()
        self.edge_mlp = mlp(3 * latent, latent, latent)
        self.node_mlp = mlp(2 * latent, latent, latent)

    def forward(self, x: torch.Tensor, e: torch.Tensor, senders: torch.Tensor, receivers: torch.Tensor):
        msg_in = torch.cat([e, x.index_select(0, senders), x.index_select(0, receivers)], dim=-1)
        e_new = self.edge_mlp(msg_in)
        agg = torch.zeros(x.shape[0], e_new.shape[1], device=x.device, dtype=e_new.dtype)
        agg.index_add_(0, receivers, e_new)  # sum of incoming messages at each receiver
        x_new = self.node_mlp(torch.cat([x, agg.to(x.dtype)], dim=-1))
        return x + x_new, e + e_new


class MeshGraphNet(nn.Module):
    def __init__(self, node_in: int, edge_in: int, latent: int, layers: int, out: int) -> None:
        super().__init__()
        self.node_enc = mlp(node_in, latent, latent)
        self.edge_enc = mlp(edge_in, latent, latent)
        self.blocks = nn.ModuleList(GraphNetBlock(latent) for _ in range(layers))
        self.dec = mlp(latent, latent, out, norm=False)

    def forward(self, node_feats, edge_feats, senders, receivers):
        x, e = self.node_enc(node_feats), self.edge_enc(edge_feats)
        for block in self.blocks:
            x, e = block(x, e, senders, receivers)
        return self.dec(x)


def grid_mesh(n: int, rng: np.random.Generator):
    """A jittered n x n grid, triangulated, as a simulator's rest mesh: positions and directed edges."""
    ii, jj = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    pos = np.stack([ii, jj], -1).reshape(-1, 2).astype(np.float32) / n
    pos += rng.normal(0, 0.15 / n, pos.shape).astype(np.float32)
    idx = (ii * n + jj)
    und = np.concatenate([np.stack([idx[:, :-1].ravel(), idx[:, 1:].ravel()], 1),      # along rows
                          np.stack([idx[:-1, :].ravel(), idx[1:, :].ravel()], 1),      # along columns
                          np.stack([idx[:-1, 1:].ravel(), idx[1:, :-1].ravel()], 1)])  # quad diagonals
    edges = np.concatenate([und, und[:, ::-1]])
    return pos, edges[rng.permutation(len(edges))]  # edge order as the mesh file stores it


def make_pool(count: int, grid: int, device: torch.device):
    rng = np.random.default_rng(0)
    pool = []
    for _ in range(count):
        pos, edges = grid_mesh(grid, rng)
        n = len(pos)
        world = np.concatenate([pos, rng.normal(0, 0.02, (n, 1)).astype(np.float32)], 1)  # 3-D world position
        vel = rng.normal(0, 0.01, (n, 3)).astype(np.float32)
        node_type = rng.integers(0, 3, n)
        acc = rng.normal(0, 1e-3, (n, 3)).astype(np.float32)
        pool.append({k: torch.from_numpy(v).to(device) for k, v in
                     dict(pos=pos, world=world, vel=vel, node_type=node_type, acc=acc, edges=edges).items()})
    return pool


def make_batch(pool, k: int, noise: float):
    """k meshes as one disconnected graph: node features [velocity + noise, one-hot type], edge features
    [relative mesh position, its norm, relative world position, its norm], target acceleration."""
    meshes = random.sample(pool, k)
    xs, es, snd, rcv, ys, offset = [], [], [], [], [], 0
    for m in meshes:
        s, r = m["edges"][:, 0], m["edges"][:, 1]
        vel = m["vel"] + noise * torch.randn_like(m["vel"])
        xs.append(torch.cat([vel, nn.functional.one_hot(m["node_type"], 9).float()], 1))
        dp, dw = m["pos"][s] - m["pos"][r], m["world"][s] - m["world"][r]
        es.append(torch.cat([dp, dp.norm(dim=1, keepdim=True), dw, dw.norm(dim=1, keepdim=True)], 1))
        snd.append(s + offset)
        rcv.append(r + offset)
        ys.append(m["acc"])
        offset += len(m["pos"])
    return torch.cat(xs), torch.cat(es), torch.cat(snd), torch.cat(rcv), torch.cat(ys)


def main() -> int:
    args = ARGS
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True

    t0 = time.perf_counter()
    pool = make_pool(args.pool, args.grid, device)
    model = MeshGraphNet(3 + 9, 2 + 1 + 3 + 1, args.latent, args.layers, 3).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, fused=cuda)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.1 ** (1 / 5_000_000))
    n_nodes = args.grid ** 2 * args.meshes_per_batch
    n_edges = int(pool[0]["edges"].shape[0]) * args.meshes_per_batch
    log(f"MeshGraphNet {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, {args.layers} layers; "
        f"batch {args.meshes_per_batch} meshes, {n_nodes} nodes, {n_edges} edges; deterministic algorithms "
        f"{torch.are_deterministic_algorithms_enabled()}; pool built in {time.perf_counter() - t0:.1f}s")

    progress = Progress(args.meshes_per_batch)
    model.train()
    step, seen, t_last, n_last = 0, 0, time.perf_counter(), 0
    while True:
        x, e, snd, rcv, y = make_batch(pool, args.meshes_per_batch, noise=3e-3)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            pred = model(x, e, snd, rcv)
        loss = (pred.float() - y / 1e-3).pow(2).sum(-1).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        progress.step()
        step += 1
        seen += args.meshes_per_batch
        now = time.perf_counter()
        if now - t_last >= 1.0:
            loss_val = loss.item()
            now = time.perf_counter()
            log(f"step {step} samples/s {(seen - n_last) / (now - t_last):.2f} loss {loss_val:.4f}")
            t_last, n_last = now, seen
            if not math.isfinite(loss_val):
                raise RuntimeError("loss is not finite")


if __name__ == "__main__":
    raise SystemExit(main())
