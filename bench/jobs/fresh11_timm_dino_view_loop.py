"""Self-supervised pretraining, DINO recipe: a timm ViT-S/16 student and its EMA teacher (DINO head:
3-layer MLP to a 256-d bottleneck, weight-normalized 65,536-way last layer), multi-crop with 2 global
224-pixel crops and 10 local 96-pixel crops per image, 32 images per step (``batch_size_per_gpu`` kept
from the run on a 24 GB workstation card), bf16 autocast, fused AdamW, gradient clipping, teacher
centering and sharpening. One GPU.

The images are stored at 256 x 256 (uint8, generated in memory here); DataLoader workers only batch
them, and the multi-crop augmentation (random resized crops and flips through ``affine_grid`` /
``grid_sample``, colour jitter, grayscale, solarization, normalization) runs on the GPU, batched per
view.

The training step was written from the DINO paper's pseudocode rather than from its reference code:
every view goes through the network on its own, ``torch.cat([student(v) for v in views])`` and
``torch.cat([teacher(v) for v in views[:2]])``: 12 student forwards and backwards and 2 teacher
forwards per step, each of 32 images. A local view is 32 x 37 tokens: the ~250 kernels forward and
~330 backward of each student call then carry matrices of 1,184 x 384, a few microseconds of GPU work
each, and the step is as long as Python and the kernel launches of 14 network calls take (~4 ms of CPU
per student call). The reference implementation (``MultiCropWrapper``) concatenates the views of
equal resolution and calls the backbone once per resolution.

``--batch-views`` concatenates the 2 global views (64 images) and the 10 local views (320 images) and
calls the student once on each, the teacher once on the global views: the same outputs in the same
order, so the loss is unchanged.

Prints ``step <n> samples/s <x>`` about once a second.
"""

from __future__ import annotations

import math
import time

import timm
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.parametrizations import weight_norm

from common import Progress, log, parser, watchdog

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--model", default="vit_small_patch16_224")
    ap.add_argument("--batch", type=int, default=32, help="images per step (DINO's batch_size_per_gpu)")
    ap.add_argument("--global-size", type=int, default=224)
    ap.add_argument("--local-size", type=int, default=96)
    ap.add_argument("--local-crops", type=int, default=10)
    ap.add_argument("--out-dim", type=int, default=65_536)
    ap.add_argument("--head-hidden", type=int, default=2048)
    ap.add_argument("--stored", type=int, default=256, help="side of the stored images")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batch-views", action="store_true",
                    help="one student call per resolution (2 globals together, 10 locals together), one teacher call")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.batch, args.global_size, args.local_size, args.local_crops = 4, 32, 16, 4
        args.out_dim, args.head_hidden, args.stored, args.workers = 512, 128, 40, 0
    return args


class StoredImages(torch.utils.data.Dataset):
    """Photos decoded and resized offline: smooth colour fields with edges and noise, uint8 CHW."""

    def __init__(self, n: int, side: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        chunks = []
        for start in range(0, n, 256):
            m = min(256, n - start)
            low = torch.rand(m, 3, 8, 8, generator=g)
            img = F.interpolate(low, size=(side, side), mode="bicubic", align_corners=False)
            edges = (torch.rand(m, 1, 16, 16, generator=g) > 0.7).float()
            img = img + 0.25 * F.interpolate(edges, size=(side, side), mode="nearest")
            img = img + 0.05 * torch.randn(m, 3, side, side, generator=g)
            chunks.append((img.clamp(0, 1) * 255).to(torch.uint8))
        self.images = torch.cat(chunks)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.images[i]


class GPUMultiCrop:
    """DINO's multi-crop augmentation, batched on the GPU for each view."""

    def __init__(self, global_size: int, local_size: int, local_crops: int, device: torch.device) -> None:
        self.global_size, self.local_size, self.local_crops = global_size, local_size, local_crops
        self.mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(STD, device=device).view(1, 3, 1, 1)

    @staticmethod
    def resized_crop(x: torch.Tensor, size: int, scale: tuple[float, float]) -> torch.Tensor:
        b = x.shape[0]
        area = torch.empty(b, device=x.device).uniform_(*scale)
        log_ratio = torch.empty(b, device=x.device).uniform_(math.log(3 / 4), math.log(4 / 3))
        w = (area * log_ratio.exp()).sqrt().clamp(max=1.0)
        h = (area / log_ratio.exp()).sqrt().clamp(max=1.0)
        cx = (torch.rand(b, device=x.device) * 2 - 1) * (1 - w)
        cy = (torch.rand(b, device=x.device) * 2 - 1) * (1 - h)
        flip = torch.where(torch.rand(b, device=x.device) < 0.5, -1.0, 1.0)
        theta = torch.zeros(b, 2, 3, device=x.device)
        theta[:, 0, 0], theta[:, 0, 2] = w * flip, cx
        theta[:, 1, 1], theta[:, 1, 2] = h, cy
        grid = F.affine_grid(theta, [b, 3, size, size], align_corners=False)
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False)

    @staticmethod
    def color(x: torch.Tensor, p_gray: float, p_solarize: float) -> torch.Tensor:
        b = x.shape[0]
        on = (torch.rand(b, 1, 1, 1, device=x.device) < 0.8).float()
        bright = 1 + on * torch.empty(b, 1, 1, 1, device=x.device).uniform_(-0.4, 0.4)
        contrast = 1 + on * torch.empty(b, 1, 1, 1, device=x.device).uniform_(-0.4, 0.4)
        sat = 1 + on * torch.empty(b, 1, 1, 1, device=x.device).uniform_(-0.2, 0.2)
        x = (x * bright).clamp(0, 1)
        gray = (0.299 * x[:, 0:1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:3])
        x = ((x - gray.mean((2, 3), keepdim=True)) * contrast + gray.mean((2, 3), keepdim=True)).clamp(0, 1)
        gray = (0.299 * x[:, 0:1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:3])
        x = ((x - gray) * sat + gray).clamp(0, 1)
        to_gray = torch.rand(b, 1, 1, 1, device=x.device) < p_gray
        x = torch.where(to_gray, gray.expand_as(x), x)
        if p_solarize:
            solar = torch.rand(b, 1, 1, 1, device=x.device) < p_solarize
            x = torch.where(solar & (x >= 0.5), 1 - x, x)
        return x

    def __call__(self, images: torch.Tensor) -> list[torch.Tensor]:
        x = images.float() / 255
        views = [self.color(self.resized_crop(x, self.global_size, (0.4, 1.0)), 0.2, 0.0),
                 self.color(self.resized_crop(x, self.global_size, (0.4, 1.0)), 0.2, 0.2)]
        views += [self.color(self.resized_crop(x, self.local_size, (0.05, 0.4)), 0.2, 0.0)
                  for _ in range(self.local_crops)]
        return [(v - self.mean) / self.std for v in views]


class DINOHead(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, hidden: int = 2048, bottleneck: int = 256) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(in_dim, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, bottleneck))
        self.last_layer = weight_norm(nn.Linear(bottleneck, out_dim, bias=False))
        g = self.last_layer.parametrizations.weight.original0
        g.data.fill_(1.0)
        g.requires_grad = False  # norm_last_layer=True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last_layer(F.normalize(self.mlp(x), dim=-1))


class DINO(nn.Module):
    def __init__(self, args, drop_path: float) -> None:
        super().__init__()
        extra = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3) if args.tiny else {}
        self.backbone = timm.create_model(args.model, pretrained=False, num_classes=0, dynamic_img_size=True,
                                          drop_path_rate=drop_path, **extra)
        self.head = DINOHead(self.backbone.num_features, args.out_dim, hidden=args.head_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


class DINOLoss(nn.Module):
    def __init__(self, out_dim: int, n_views: int, device, student_temp: float = 0.1, teacher_temp: float = 0.04,
                 center_momentum: float = 0.9) -> None:
        super().__init__()
        self.n_views, self.student_temp, self.teacher_temp = n_views, student_temp, teacher_temp
        self.center_momentum = center_momentum
        self.register_buffer("center", torch.zeros(1, out_dim, device=device))

    def forward(self, student_out: torch.Tensor, teacher_out: torch.Tensor) -> torch.Tensor:
        log_p = F.log_softmax(student_out.float() / self.student_temp, dim=-1).chunk(self.n_views)
        q = F.softmax((teacher_out.float() - self.center) / self.teacher_temp, dim=-1).detach().chunk(2)
        total, pairs = 0.0, 0
        for iq, t in enumerate(q):
            for v, s in enumerate(log_p):
                if v == iq:
                    continue
                total = total + torch.sum(-t * s, dim=-1).mean()
                pairs += 1
        with torch.no_grad():
            batch_center = teacher_out.float().mean(0, keepdim=True)
            self.center.mul_(self.center_momentum).add_(batch_center, alpha=1 - self.center_momentum)
        return total / pairs


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True

    data = StoredImages(2048 if cuda else 64, args.stored)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True,
                                         num_workers=args.workers, pin_memory=cuda,
                                         persistent_workers=args.workers > 0)
    augment = GPUMultiCrop(args.global_size, args.local_size, args.local_crops, device)
    n_views = 2 + args.local_crops

    student = DINO(args, drop_path=0.1).to(device)
    teacher = DINO(args, drop_path=0.0).to(device)
    teacher.load_state_dict(student.state_dict())
    for p in teacher.parameters():
        p.requires_grad = False
    s_params = [p for p in student.parameters()]
    t_params = [p for p in teacher.parameters()]
    trainable = [p for p in s_params if p.requires_grad]
    decay = [p for p in trainable if p.dim() >= 2]
    no_decay = [p for p in trainable if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.04}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=5e-4 * args.batch / 256, fused=cuda)
    criterion = DINOLoss(args.out_dim, n_views, device)
    momentum = 0.996
    n_params = sum(p.numel() for p in trainable) / 1e6
    log(f"DINO {args.model}: {n_params:.1f}M trainable parameters, {args.batch} images x (2 x {args.global_size}px + "
        f"{args.local_crops} x {args.local_size}px), {'views batched by resolution' if args.batch_views else 'one call per view'}")

    progress = Progress(args.batch)
    student.train()
    teacher.train()
    step, seen, t_last, n_last = 0, 0, time.perf_counter(), 0
    while True:
        for images in loader:
            images = images.to(device, non_blocking=True)
            with torch.no_grad():
                views = augment(images)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                with torch.no_grad():
                    if args.batch_views:
                        teacher_out = teacher(torch.cat(views[:2]))
                    else:
                        teacher_out = torch.cat([teacher(v) for v in views[:2]])
                if args.batch_views:
                    student_out = torch.cat([student(torch.cat(views[:2])), student(torch.cat(views[2:]))])
                else:
                    student_out = torch.cat([student(v) for v in views])
                loss = criterion(student_out, teacher_out)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 3.0)
            optimizer.step()
            with torch.no_grad():  # EMA teacher
                torch._foreach_mul_(t_params, momentum)
                torch._foreach_add_(t_params, s_params, alpha=1 - momentum)
            progress.step(samples=images.shape[0])
            step += 1
            seen += images.shape[0]
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
