"""Histopathology patch classification: a ViT-B/16 (12 pre-LayerNorm blocks, width 768, 12 heads, 86M
parameters) trained from scratch in plain PyTorch on one GPU on 224-pixel H&E tissue patches (9 tissue
classes, NCT-CRC-HE style): bf16 autocast, ``F.scaled_dot_product_attention`` (flash attention), fused
AdamW, a cosine schedule, clipping, label smoothing; batches of 192 patches.

The patches are stored as uint8 256 x 256 tiles on the GPU (generated here); random 224-pixel crops,
flips, 90-degree rotations and normalisation are batched tensor ops on the GPU.

The model code comes from the group's ViT-g/14 pathology foundation-model recipe, where activations do
not fit without recomputation: its config turns ``grad_checkpointing`` on, and every block runs under
``torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)``, so the backward pass recomputes
each block's forward (attention and MLP, ~a third of the step's FLOPs again). For this ViT-B at batch 192
the saved activations would take ~15 GB: on an 80-141 GB GPU nothing needs recomputing.

``--no-grad-checkpointing`` runs the blocks directly (activations kept for the backward).

Prints ``step <n> samples/s <x>`` about once a second.
"""

from __future__ import annotations

import math
import random
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from common import Progress, log, parser, watchdog


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=192)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--patch", type=int, default=16)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--tiles", type=int, default=8192, help="uint8 tiles kept on the device")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--no-grad-checkpointing", action="store_true",
                    help="keep activations instead of recomputing every block in the backward")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.batch, args.image, args.patch, args.width, args.layers, args.heads, args.tiles = 8, 32, 8, 64, 2, 4, 64
    return args


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width, eps=1e-6)
        self.attn = Attention(width, heads)
        self.norm2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    def __init__(self, image: int, patch: int, width: int, layers: int, heads: int, classes: int,
                 grad_checkpointing: bool) -> None:
        super().__init__()
        self.grad_checkpointing = grad_checkpointing
        self.patch_embed = nn.Conv2d(3, width, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        self.pos_embed = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width, eps=1e-6)
        self.head = nn.Linear(width, classes)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(self.norm(x[:, 0]))


MEAN = (0.70, 0.55, 0.78)  # H&E stain statistics
STD = (0.15, 0.20, 0.13)


def augment(tiles: torch.Tensor, idx: torch.Tensor, size: int, g: torch.Generator, rng: random.Random) -> torch.Tensor:
    """Random crop (one offset per batch), flips and 90-degree rotations, then normalisation, on the device."""
    full = tiles.shape[-1]
    y0, x0 = rng.randrange(full - size + 1), rng.randrange(full - size + 1)
    x = tiles[idx, :, y0:y0 + size, x0:x0 + size].float().div_(255)
    flip = torch.rand(len(idx), 1, 1, 1, device=x.device, generator=g) < 0.5
    x = torch.where(flip, x.flip(3), x)
    x = torch.rot90(x, rng.randrange(4), (2, 3))
    mean = torch.tensor(MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=x.device).view(1, 3, 1, 1)
    return (x - mean) / std


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    g = torch.Generator(device=device).manual_seed(0)
    rng = random.Random(0)
    full = args.image * 8 // 7
    tiles = torch.randint(0, 256, (args.tiles, 3, full, full), generator=g, device=device, dtype=torch.uint8)
    labels = torch.randint(0, 9, (args.tiles,), generator=g, device=device)
    model = VisionTransformer(args.image, args.patch, args.width, args.layers, args.heads, 9,
                              grad_checkpointing=not args.no_grad_checkpointing).to(device)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "pos_embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2 or "pos_embed" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.999), fused=cuda)
    warmup, total = 1_000, 100_000
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup else
        0.5 * (1 + math.cos(math.pi * min(1.0, (s - warmup) / (total - warmup)))))
    log(f"ViT {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, batch {args.batch} x "
        f"{args.image} px, gradient checkpointing {model.grad_checkpointing}")

    progress = Progress(args.batch)
    model.train()
    step, seen, t_last, n_last = 0, 0, time.perf_counter(), 0
    while True:
        order = torch.randperm(args.tiles, device=device, generator=g)
        for s in range(0, args.tiles - args.batch + 1, args.batch):
            idx = order[s:s + args.batch]
            x = augment(tiles, idx, args.image, g, rng)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                logits = model(x)
            loss = F.cross_entropy(logits.float(), labels[idx], label_smoothing=0.1)
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
