"""Class-conditional latent diffusion at 256 px with a DiT-B/2 (130M parameters: 12 blocks, 768 wide,
12 heads, patch 2 over 32 x 32 x 4 VAE latents, 256 tokens), trained in plain PyTorch on one GPU the
"fast-DiT" way: the VAE latents are precomputed, so the GPU only trains the transformer.

adaLN-Zero blocks, flash attention through ``scaled_dot_product_attention``, bf16 autocast, fused
AdamW (lr 1e-4, no weight decay), epsilon prediction with the linear 1,000-step schedule, 10 %
label drop for classifier-free guidance, and an EMA of the weights (decay 0.9999) updated every step
with one ``torch._foreach_lerp_`` over all tensors. Batches of 256 latents.

The latents are fp16 [4, 32, 32] arrays in host memory (generated here; the real job memory-maps
the extracted features), with their flipped twins; four persistent DataLoader workers pick one of the
two and hand over the tensors, pinned and copied asynchronously. Timesteps, noise and the label drop
are drawn on the GPU; the loss is read about once a second.

Prints ``step <n> samples/s <x>`` about once a second (samples are latents, i.e. images).
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
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--latent", type=int, default=32, help="latent side (256 px / 8)")
    ap.add_argument("--patch", type=int, default=2)
    ap.add_argument("--depth", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--latents", type=int, default=40_000, help="latents held in host memory")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--ema-every", type=int, default=1, help="update the EMA weights every N steps")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.batch, args.latent, args.depth, args.width, args.heads = 4, 8, 2, 64, 4
        args.classes, args.latents, args.workers = 10, 256, min(args.workers, 1)
    return args


def modulate(x, shift, scale):
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


def sincos_pos_embed(width: int, grid: int) -> torch.Tensor:
    def one_axis(pos):
        omega = 1.0 / 10_000 ** (np.arange(width // 4, dtype=np.float64) / (width / 4))
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    gh, gw = np.meshgrid(np.arange(grid, dtype=np.float64), np.arange(grid, dtype=np.float64), indexing="ij")
    return torch.from_numpy(np.concatenate([one_axis(gh), one_axis(gw)], axis=1)).float()[None]


class TimestepEmbedder(nn.Module):
    def __init__(self, width: int, freq_dim: int = 256) -> None:
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, width), nn.SiLU(), nn.Linear(width, width))

    def forward(self, t):
        half = self.freq_dim // 2
        freqs = torch.exp(-math.log(10_000) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
        args = t.float()[:, None] * freqs[None]
        return self.mlp(torch.cat([torch.cos(args), torch.sin(args)], dim=-1))


class DiTBlock(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(width, 6 * width))
        nn.init.zeros_(self.ada[1].weight)
        nn.init.zeros_(self.ada[1].bias)

    def forward(self, x, c):
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = self.ada(c).chunk(6, dim=1)
        b, n, d = x.shape
        q, k, v = self.qkv(modulate(self.norm1(x), shift_a, scale_a)).view(b, n, 3, self.heads, d // self.heads) \
            .permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)
        x = x + gate_a.unsqueeze(1) * self.proj(y)
        h = self.fc2(F.gelu(self.fc1(modulate(self.norm2(x), shift_m, scale_m)), approximate="tanh"))
        return x + gate_m.unsqueeze(1) * h


class DiT(nn.Module):
    def __init__(self, latent: int, patch: int, depth: int, width: int, heads: int, classes: int,
                 channels: int = 4) -> None:
        super().__init__()
        self.patch, self.channels, self.grid = patch, channels, latent // patch
        self.embed = nn.Conv2d(channels, width, patch, stride=patch)
        self.register_buffer("pos", sincos_pos_embed(width, self.grid), persistent=False)
        self.t_embed = TimestepEmbedder(width)
        self.y_embed = nn.Embedding(classes + 1, width)  # the last row is the "no label" token
        self.blocks = nn.ModuleList(DiTBlock(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))
        self.out = nn.Linear(width, patch * patch * channels)
        for m in self.modules():
            if isinstance(m, nn.Linear) and m is not self.out:
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        for blk in self.blocks:
            nn.init.zeros_(blk.ada[1].weight)
            nn.init.zeros_(blk.ada[1].bias)
        nn.init.normal_(self.y_embed.weight, std=0.02)
        nn.init.zeros_(self.ada[1].weight)
        nn.init.zeros_(self.ada[1].bias)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, x, t, y):
        b = x.shape[0]
        h = self.embed(x).flatten(2).transpose(1, 2) + self.pos
        c = self.t_embed(t) + self.y_embed(y)
        for blk in self.blocks:
            h = blk(h, c)
        shift, scale = self.ada(c).chunk(2, dim=1)
        h = self.out(modulate(self.norm(h), shift, scale))
        p, g = self.patch, self.grid
        return h.view(b, g, g, p, p, self.channels).permute(0, 5, 1, 3, 2, 4).reshape(b, self.channels, g * p, g * p)


class Latents(torch.utils.data.Dataset):
    """Precomputed VAE latents (fp16) of each image and of its horizontal flip; one of the two at random."""

    def __init__(self, n: int, side: int, classes: int) -> None:
        rng = np.random.default_rng(0)
        self.latents = (rng.standard_normal((n, 2, 4, side, side), dtype=np.float32) * 4.5).astype(np.float16)
        self.labels = rng.integers(0, classes, size=n)

    def __len__(self) -> int:
        return len(self.latents)

    def __getitem__(self, i: int):
        return torch.from_numpy(self.latents[i, np.random.randint(2)]), int(self.labels[i])


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    model = DiT(args.latent, args.patch, args.depth, args.width, args.heads, args.classes).to(device)
    params = list(model.parameters())
    ema = [p.detach().clone() for p in params]
    log(f"DiT {sum(p.numel() for p in params) / 1e6:.0f}M parameters, {model.grid ** 2} tokens, "
        f"batch {args.batch}, workers {args.workers}, EMA every {args.ema_every} step(s)")

    data = Latents(args.latents, args.latent, args.classes)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True,
                                         num_workers=args.workers, persistent_workers=args.workers > 0,
                                         prefetch_factor=4 if args.workers else None, pin_memory=cuda)
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, fused=cuda)
    betas = torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64)
    alpha_bar = torch.cumprod(1 - betas, 0).float().to(device)

    progress = Progress(args.batch)
    step, t_last, n_last = 0, time.perf_counter(), 0
    model.train()
    while True:
        for x, y in loader:
            x = x.to(device, non_blocking=True).float().mul_(0.18215)
            y = y.to(device, non_blocking=True)
            y = torch.where(torch.rand(y.shape, device=device) < 0.1, torch.full_like(y, args.classes), y)
            t = torch.randint(0, 1000, (x.shape[0],), device=device)
            noise = torch.randn_like(x)
            ab = alpha_bar[t].view(-1, 1, 1, 1)
            x_t = ab.sqrt() * x + (1 - ab).sqrt() * noise
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                pred = model(x_t, t, y)
            loss = F.mse_loss(pred.float(), noise)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step % args.ema_every == 0:
                with torch.no_grad():
                    torch._foreach_lerp_(ema, params, 1 - 0.9999 ** args.ema_every)
            progress.step()
            now = time.perf_counter()
            if now - t_last >= 1.0:
                loss_val = loss.item()
                now = time.perf_counter()
                log(f"step {step} samples/s {(step - n_last) * args.batch / (now - t_last):.1f} loss {loss_val:.4f}")
                t_last, n_last = now, step
                if not math.isfinite(loss_val):
                    raise RuntimeError("loss is not finite")


if __name__ == "__main__":
    raise SystemExit(main())
