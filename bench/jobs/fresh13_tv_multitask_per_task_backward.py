"""Indoor scene understanding, multi-task: one shared torchvision ResNet-50 encoder (dilated, output
stride 8, as in DeepLabV3) and three torchvision ``DeepLabHead`` decoders (ASPP) for 13-class semantic
segmentation, depth and surface normals, trained jointly on one GPU on NYUv2-style RGB-D frames of
288 x 384 (the split's 795 training frames; generated here, kept on the GPU as uint8), bf16 autocast,
channels_last, SGD with momentum and a poly schedule, batches of 16 frames, equal task weights.

The training step comes from the team's multi-task repo, where PCGrad needed each task's gradient
separately: it calls ``backward`` once per task loss with ``retain_graph=True`` and lets the three
gradients accumulate in ``.grad``. PCGrad is off in this config (the gradients are not projected, just
summed), but the per-task loop stayed: each of the three backward passes runs through its own head and
through the whole shared ResNet-50, so the encoder's backward (its most expensive part) is done three
times per step for the same result that one backward of the summed loss gives.

``--single-backward`` calls ``backward`` once on the weighted sum of the task losses.

Prints ``step <n> samples/s <x>`` about once a second (samples are frames).
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torchvision.models.segmentation.deeplabv3 import DeepLabHead

from common import Progress, log, parser, watchdog

TASKS = {"semantic": 13, "depth": 1, "normal": 3}


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--height", type=int, default=288)
    ap.add_argument("--width", type=int, default=384)
    ap.add_argument("--frames", type=int, default=795, help="training frames (NYUv2 train split)")
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--single-backward", action="store_true",
                    help="one backward of the weighted sum of the task losses instead of one per task")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.batch, args.height, args.width, args.frames = 2, 64, 96, 16
    return args


class MultiTaskNet(nn.Module):
    """Shared dilated ResNet-50 (output stride 8), one DeepLabV3 head per task, outputs upsampled to the input."""

    def __init__(self) -> None:
        super().__init__()
        r = torchvision.models.resnet50(weights=None, replace_stride_with_dilation=[False, True, True])
        self.encoder = nn.Sequential(r.conv1, r.bn1, r.relu, r.maxpool, r.layer1, r.layer2, r.layer3, r.layer4)
        self.heads = nn.ModuleDict({task: DeepLabHead(2048, out) for task, out in TASKS.items()})

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        size = x.shape[-2:]
        feats = self.encoder(x)
        return {task: F.interpolate(head(feats), size=size, mode="bilinear", align_corners=False)
                for task, head in self.heads.items()}


def task_losses(out: dict[str, torch.Tensor], seg: torch.Tensor, depth: torch.Tensor,
                normal: torch.Tensor) -> dict[str, torch.Tensor]:
    valid = (depth > 0).float()  # missing depth (and normals) where the sensor saw nothing
    n_valid = valid.sum().clamp(min=1)
    pred_n = F.normalize(out["normal"].float(), dim=1)
    return {
        "semantic": F.cross_entropy(out["semantic"].float(), seg, ignore_index=255),
        "depth": ((out["depth"].float() - depth).abs() * valid).sum() / n_valid,
        "normal": ((1 - (pred_n * normal).sum(1, keepdim=True)) * valid).sum() / n_valid,
    }


def synth_frames(n: int, h: int, w: int, device: torch.device, g: torch.Generator):
    """Rooms of a few planar regions: RGB (uint8), labels (uint8, 255 = unlabelled), depth (m), unit normals."""
    rgb = torch.randint(0, 256, (n, 3, h, w), device=device, generator=g, dtype=torch.uint8)
    yy = torch.linspace(0, 1, h, device=device)[:, None]
    xx = torch.linspace(0, 1, w, device=device)[None, :]
    cut = torch.rand(n, 2, 1, 1, device=device, generator=g)
    region = (yy > cut[:, :1]).long() * 2 + (xx > cut[:, 1:]).long()  # 4 planar regions per frame
    classes = torch.randint(0, 13, (n, 4), device=device, generator=g)
    seg = classes.gather(1, region.view(n, -1)).view(n, h, w).to(torch.uint8)
    seg[torch.rand(n, h, w, device=device, generator=g) < 0.1] = 255
    depth = (1 + 4 * torch.rand(n, 4, device=device, generator=g)).gather(1, region.view(n, -1)).view(n, 1, h, w)
    depth = depth * (torch.rand(n, 1, h, w, device=device, generator=g) > 0.05)  # sensor holes
    normals = F.normalize(torch.randn(n, 4, 3, device=device, generator=g), dim=-1)
    normal = normals.gather(1, region.view(n, -1, 1).expand(-1, -1, 3)).view(n, h, w, 3).permute(0, 3, 1, 2)
    return rgb, seg, depth.contiguous(), normal.contiguous()


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True  # fixed input size
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    g = torch.Generator(device=device).manual_seed(0)
    rgb, seg, depth, normal = synth_frames(args.frames, args.height, args.width, device, g)
    model = MultiTaskNet().to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    total = 40_000
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: (1 - min(s, total - 1) / total) ** 0.9)
    weights = {task: 1.0 for task in TASKS}
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
    log(f"multi-task net {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, batch {args.batch} x "
        f"{args.height}x{args.width}, {'one backward of the summed loss' if args.single_backward else 'one backward per task'}")

    progress = Progress(args.batch)
    model.train()
    step, seen, t_last, n_last = 0, 0, time.perf_counter(), 0
    while True:
        idx = torch.randint(0, args.frames, (args.batch,), device=device, generator=g)
        x, s, d, n = rgb[idx], seg[idx].long(), depth[idx], normal[idx]
        flip = torch.rand(args.batch, device=device, generator=g) < 0.5
        f4 = flip.view(-1, 1, 1, 1)
        x, d, n = torch.where(f4, x.flip(3), x), torch.where(f4, d.flip(3), d), torch.where(f4, n.flip(3), n)
        s = torch.where(flip.view(-1, 1, 1), s.flip(2), s)
        n = torch.cat([torch.where(f4, -n[:, :1], n[:, :1]), n[:, 1:]], 1)  # a mirrored normal points the other way in x
        x = ((x.float() - mean) / std).contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            out = model(x)
        losses = task_losses(out, s, d, n)
        optimizer.zero_grad(set_to_none=True)
        if args.single_backward:
            sum(weights[t] * losses[t] for t in TASKS).backward()
        else:
            # one backward per task: each task's gradient accumulates into .grad in turn (the PCGrad code path,
            # without the projection)
            names = list(TASKS)
            for i, task in enumerate(names):
                (weights[task] * losses[task]).backward(retain_graph=i < len(names) - 1)
        optimizer.step()
        scheduler.step()
        progress.step()
        step += 1
        seen += args.batch
        now = time.perf_counter()
        if now - t_last >= 1.0:
            vals = {t: v.item() for t, v in losses.items()}
            now = time.perf_counter()
            log(f"step {step} samples/s {(seen - n_last) / (now - t_last):.1f} "
                + " ".join(f"{t} {v:.3f}" for t, v in vals.items()))
            t_last, n_last = now, seen
            if not all(math.isfinite(v) for v in vals.values()):
                raise RuntimeError("loss is not finite")


if __name__ == "__main__":
    raise SystemExit(main())
