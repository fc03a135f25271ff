"""Land-use classification of satellite image chips (62 categories, fMoW-style) with a timm ViT-B/16
trained from scratch on one GPU: bf16 autocast, fused AdamW with a warmup-cosine schedule, label
smoothing, clipping at 1.0, drop path 0.1, batches of 256 chips of 224 px.

The chips are kept as uint8 256 x 256 frames in host memory (generated here; the real job
memory-maps a pre-resized shard). Eight persistent DataLoader workers cut a random 224-px crop and a
flip in uint8; the batch is pinned, copied asynchronously and normalised on the GPU. The loss is read
about once a second.

The script carries a training-stability monitor (``ActivationMonitor``): a forward hook on every leaf
module of the network that accumulates the mean, standard deviation and largest magnitude of the
module's output (in fp32, on the GPU, no sync) and writes the averages to a JSONL file every 200 steps,
for the run's dashboard. ``--stats-every N`` samples the statistics on one step in N only (the
hooks return at once on the other steps); the default, 1, samples every step.

Prints ``step <n> samples/s <x>`` about once a second (samples are chips).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time

import numpy as np
import timm
import torch
import torch.nn.functional as F

from common import Progress, log, parser, watchdog


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--stored", type=int, default=256, help="side of the stored chips")
    ap.add_argument("--chips", type=int, default=6_000, help="chips held in host memory")
    ap.add_argument("--classes", type=int, default=62)
    ap.add_argument("--arch", default="vit_base_patch16_224")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--stats-every", type=int, default=1, help="sample activation statistics every N steps")
    ap.add_argument("--stats-flush", type=int, default=200, help="write the statistics every N steps")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.batch, args.image, args.stored, args.chips, args.classes = 8, 64, 72, 256, 10
        args.arch, args.workers, args.stats_flush = "vit_tiny_patch16_224", min(args.workers, 1), 20
    return args


class Chips(torch.utils.data.Dataset):
    """uint8 HWC chips in host memory; a random crop and a random horizontal flip, returned as CHW uint8."""

    def __init__(self, n: int, stored: int, crop: int, classes: int) -> None:
        rng = np.random.default_rng(0)
        self.frames = rng.integers(0, 256, size=(n, stored, stored, 3), dtype=np.uint8)
        self.labels = rng.integers(0, classes, size=n)
        self.stored, self.crop = stored, crop

    def __len__(self) -> int:
        return len(self.frames)

    def __getitem__(self, i: int):
        y0, x0 = np.random.randint(0, self.stored - self.crop + 1, size=2)
        img = self.frames[i, y0:y0 + self.crop, x0:x0 + self.crop]
        if np.random.rand() < 0.5:
            img = img[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1))), int(self.labels[i])


class ActivationMonitor:
    """Per-module output statistics (mean, std, max |x|), accumulated on the GPU and flushed to JSONL."""

    def __init__(self, model: torch.nn.Module, path: str) -> None:
        self.path = path
        self.active = False
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {}
        self.handles = []
        for name, module in model.named_modules():
            if name and not any(True for _ in module.children()):
                self.handles.append(module.register_forward_hook(self._hook(name)))

    def _hook(self, name: str):
        def fn(module, inputs, output):
            if not self.active or not torch.is_tensor(output):
                return
            x = output.detach().float()
            stats = torch.stack((x.mean(), x.std(), x.abs().amax()))
            if name in self.sums:
                self.sums[name] += stats
                self.counts[name] += 1
            else:
                self.sums[name] = stats
                self.counts[name] = 1
        return fn

    def flush(self, step: int) -> None:
        if not self.sums:
            return
        names = list(self.sums)
        table = (torch.stack([self.sums[n] for n in names]).cpu() /
                 torch.tensor([self.counts[n] for n in names], dtype=torch.float32)[:, None])
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, "modules": {n: [round(v, 5) for v in row.tolist()]
                                                          for n, row in zip(names, table)}}) + "\n")
        self.sums.clear()
        self.counts.clear()


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    data = Chips(args.chips, args.stored, args.image, args.classes)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True,
                                         num_workers=args.workers, persistent_workers=args.workers > 0,
                                         prefetch_factor=4 if args.workers else None, pin_memory=cuda)
    kw = {"img_size": args.image, "depth": 2} if args.tiny else {}
    model = timm.create_model(args.arch, pretrained=False, num_classes=args.classes, drop_path_rate=0.1,
                              **kw).to(device)
    stats_path = os.path.join(tempfile.gettempdir(), f"landuse-vit-activations-{os.getpid()}.jsonl")
    monitor = ActivationMonitor(model, stats_path)
    log(f"{args.arch} {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, batch {args.batch}, "
        f"{len(monitor.handles)} modules monitored every {args.stats_every} step(s) -> {stats_path}")

    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.999), fused=cuda)
    warmup, total = 5_000, 200_000
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warmup if s < warmup else
        0.5 * (1 + math.cos(math.pi * min(1.0, (s - warmup) / (total - warmup)))))

    progress = Progress(args.batch)
    step, t_last, n_last = 0, time.perf_counter(), 0
    model.train()
    while True:
        for x, y in loader:
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            x = (x.float() - mean) / std
            monitor.active = step % args.stats_every == 0
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            step += 1
            if step % args.stats_flush == 0:
                monitor.flush(step)
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
