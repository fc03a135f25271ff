"""ImageNet-style ResNet-50 training with timm on one GPU, the way timm's train.py does it without
its ``--channels-last`` flag: bf16 autocast, SGD with Nesterov momentum from timm's optimizer factory,
label smoothing, cosine schedule stepped per update.

Images are decoded ahead of time: DataLoader workers serve random 224-pixel crops (and flips) of
uint8 images held in memory; the batch is normalized on the GPU. Model and batches are in PyTorch's
default NCHW (contiguous) memory format.

``--channels-last`` converts the model and every batch to ``torch.channels_last`` (NHWC), timm's
``--channels-last``; nothing else changes.

Prints ``step <n> samples/s <x>`` about once a second.
"""

from __future__ import annotations

import math
import time

import torch
import timm
from timm.loss import LabelSmoothingCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler

from common import Progress, log, parser, watchdog

MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--img-size", type=int, default=224)
    ap.add_argument("--workers", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: train forever)")
    ap.add_argument("--channels-last", action="store_true", help="model and batches in torch.channels_last")
    args = ap.parse_args(argv)
    if args.device == "cpu" or args.tiny:
        args.model, args.batch, args.img_size, args.workers = "resnet18", 8, 64, 0
    return args


class DecodedImages(torch.utils.data.Dataset):
    """A shard of decoded training images (uint8, 3 x 256 x 256) with their labels; serves a random
    crop of ``size`` pixels, flipped half of the time."""

    def __init__(self, n: int, size: int, classes: int = 1000, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.full = size + size // 7
        self.images = torch.randint(0, 256, (n, 3, self.full, self.full), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, classes, (n,), generator=g)
        self.size = size

    def __len__(self) -> int:
        return 1_281_167

    def __getitem__(self, i: int):
        j = int(torch.randint(0, len(self.images), ()))
        top, left = (int(v) for v in torch.randint(0, self.full - self.size + 1, (2,)))
        img = self.images[j, :, top:top + self.size, left:left + self.size]
        if torch.rand(()) < 0.5:
            img = img.flip(-1)
        return img.contiguous(), self.labels[j]


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True  # fixed 224-pixel crops

    data = DecodedImages(1024 if cuda else 64, args.img_size)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True,
                                         num_workers=args.workers, pin_memory=cuda,
                                         persistent_workers=args.workers > 0)
    model = timm.create_model(args.model, pretrained=False, num_classes=1000).to(device)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = create_optimizer_v2(model, opt="sgd", lr=args.lr, momentum=0.9, weight_decay=5e-5)
    updates_per_epoch = len(loader)
    scheduler = CosineLRScheduler(optimizer, t_initial=100 * updates_per_epoch, warmup_t=5 * updates_per_epoch,
                                  warmup_lr_init=1e-4, t_in_epochs=False)
    criterion = LabelSmoothingCrossEntropy(smoothing=0.1)
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1)
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    log(f"{args.model}: {n_params:.1f}M parameters, batch {args.batch} at {args.img_size}px, {args.workers} workers, "
        f"memory format {'channels_last' if args.channels_last else 'NCHW (contiguous)'}")

    progress = Progress(args.batch)
    model.train()
    step, seen, t_last, n_last = 0, 0, time.perf_counter(), 0
    while True:
        for images, labels in loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            images = ((images.float() - mean) / std).contiguous(memory_format=memory_format)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                loss = criterion(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            scheduler.step_update(num_updates=step)
            progress.step(samples=images.shape[0])
            seen += images.shape[0]
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
