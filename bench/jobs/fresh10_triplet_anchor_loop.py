"""Speaker verification embeddings: an x-vector TDNN (five 1-D convolution layers of 1,024 / 3,072
channels over 80 log-mel bands, statistics pooling, a 512-d embedding) trained in plain PyTorch on one
GPU with a batch-hard triplet loss, bf16 autocast, fused AdamW. Each batch holds P = 64 speakers x K = 4
three-second utterances (300 frames), cut by DataLoader workers from the utterances kept in memory
(generated here: each speaker has its own spectral envelope).

The triplet loss is the batch-hard loss as found in many re-identification / verification repos: the
256 x 256 embedding distance matrix is computed at once, then a Python loop over the 256 anchors picks
each anchor's hardest positive and hardest negative with boolean-mask indexing,
``dist[i][mask[i]].max()`` and ``dist[i][mask[i] == 0].min()``, and concatenates the 512 results. Every
boolean index is a ``nonzero`` whose size the CPU must read back before it can go on (in the forward
pass, and again in the backward pass's index_put), so each step waits for the GPU ~1,000 times, and the
loss adds ~2,000 tiny kernels forward and ~5,000 backward (per-anchor max/min and index backward).

``--vectorized-mining`` mines the same hardest positives and negatives for all anchors at once with
masked max / min over the distance matrix (a handful of kernels, no host synchronization).

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
    ap.add_argument("--speakers-per-batch", type=int, default=64)
    ap.add_argument("--utts-per-speaker", type=int, default=4)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--channels", type=int, default=1024)
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--margin", type=float, default=0.3)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--vectorized-mining", action="store_true", help="batch-hard mining without the anchor loop")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.speakers_per_batch, args.frames, args.channels, args.workers = 8, 60, 64, 0
    return args


class Utterances(torch.utils.data.Dataset):
    """log-mel utterances (speakers x utts x 80 x frames, float16); an item is a random crop of one."""

    def __init__(self, speakers: int, utts: int, frames: int, crop: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        envelope = rng.normal(0, 0.3, (speakers, 1, 80, 1)).astype(np.float16)
        self.feats = (rng.standard_normal((speakers, utts, 80, frames), dtype=np.float32).astype(np.float16)
                      + envelope)
        self.utts, self.crop = utts, crop

    def __len__(self) -> int:
        return self.feats.shape[0] * self.utts

    def __getitem__(self, i: int):
        spk, utt = divmod(i, self.utts)
        s = np.random.randint(0, self.feats.shape[-1] - self.crop + 1)
        x = torch.from_numpy(self.feats[spk, utt, :, s:s + self.crop].astype(np.float32))
        return x, spk


class PKSampler(torch.utils.data.Sampler):
    """P speakers, K utterances each, per batch (endless)."""

    def __init__(self, speakers: int, utts: int, p: int, k: int, seed: int = 0) -> None:
        self.speakers, self.utts, self.p, self.k = speakers, utts, p, k
        self.rng = np.random.default_rng(seed)

    def __iter__(self):
        while True:
            spk = self.rng.choice(self.speakers, self.p, replace=False)
            utt = np.stack([self.rng.choice(self.utts, self.k, replace=False) for _ in spk])
            yield (spk[:, None] * self.utts + utt).reshape(-1).tolist()


class XVector(nn.Module):
    def __init__(self, c: int, emb: int = 512) -> None:
        super().__init__()
        layers, c_in = [], 80
        for c_out, k, d in [(c, 5, 1), (c, 3, 2), (c, 3, 3), (c, 1, 1), (3 * c, 1, 1)]:
            layers += [nn.Conv1d(c_in, c_out, k, dilation=d, bias=False), nn.BatchNorm1d(c_out), nn.ReLU(inplace=True)]
            c_in = c_out
        self.frames = nn.Sequential(*layers)
        self.embed = nn.Sequential(nn.Linear(2 * c_in, emb), nn.BatchNorm1d(emb))

    def forward(self, x):
        h = self.frames(x)
        stats = torch.cat([h.mean(-1), h.std(-1)], -1)   # statistics pooling
        return self.embed(stats)


def batch_hard_triplet_loss(emb, labels, margin, vectorized):
    dist = torch.cdist(emb, emb).clamp_min(1e-12)
    mask = labels[:, None] == labels[None, :]
    if vectorized:
        dist_ap = dist.masked_fill(~mask, float("-inf")).amax(1)
        dist_an = dist.masked_fill(mask, float("inf")).amin(1)
    else:
        dist_ap, dist_an = [], []
        for i in range(dist.shape[0]):
            dist_ap.append(dist[i][mask[i]].max().unsqueeze(0))
            dist_an.append(dist[i][mask[i] == 0].min().unsqueeze(0))
        dist_ap, dist_an = torch.cat(dist_ap), torch.cat(dist_an)
    y = torch.ones_like(dist_an)
    return F.margin_ranking_loss(dist_an, dist_ap, y, margin=margin), (dist_an > dist_ap).float().mean()


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True

    speakers, utts = (1200, 8) if cuda else (40, 4)
    data = Utterances(speakers, utts, args.frames + 100, args.frames)
    sampler = PKSampler(speakers, utts, args.speakers_per_batch, args.utts_per_speaker)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler, num_workers=args.workers,
                                         pin_memory=cuda, persistent_workers=args.workers > 0,
                                         prefetch_factor=4 if args.workers else None)
    model = XVector(args.channels).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4, fused=cuda)
    batch = args.speakers_per_batch * args.utts_per_speaker
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    log(f"x-vector: {n_params:.1f}M parameters, batch {args.speakers_per_batch} x {args.utts_per_speaker} "
        f"utterances x {args.frames} frames, {'vectorized' if args.vectorized_mining else 'per-anchor'} mining")

    progress = Progress(batch)
    model.train()
    step, seen, t_last, n_last = 0, 0, time.perf_counter(), 0
    for feats, labels in loader:
        feats = feats.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            emb = model(feats)
        loss, frac_ok = batch_hard_triplet_loss(F.normalize(emb.float(), dim=-1), labels, args.margin,
                                                args.vectorized_mining)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        progress.step(samples=feats.shape[0])
        step += 1
        seen += feats.shape[0]
        now = time.perf_counter()
        if now - t_last >= 1.0:
            loss_val, ok = loss.item(), frac_ok.item()
            now = time.perf_counter()
            log(f"step {step} samples/s {(seen - n_last) / (now - t_last):.1f} loss {loss_val:.4f} "
                f"an>ap {ok:.3f}")
            t_last, n_last = now, seen
            if not math.isfinite(loss_val):
                raise RuntimeError("loss is not finite")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
