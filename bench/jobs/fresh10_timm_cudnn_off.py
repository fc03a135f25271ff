"""Dish recognition (Food-101-style, 101 classes): timm ResNet-50 trained from scratch on one GPU with a
timm-train.py-like loop: channels_last, bf16 autocast, SGD with Nesterov momentum, label smoothing,
cosine schedule, batches of 256 random 224-pixel crops (with flips) of images stored at 256 x 256.

The images were decoded and resized offline to a uint8 array (generated in memory here); DataLoader
workers cut the crops, the normalization runs on the GPU.

The script starts with the lab's ``seed_everything`` helper, copied between projects for reproducible
runs. Besides seeding Python, NumPy and torch it sets ``torch.backends.cudnn.deterministic = True`` and
``torch.backends.cudnn.enabled = False``, the latter overriding the ``cudnn.benchmark = True`` the
script sets. With cuDNN off, every convolution falls back to PyTorch's own im2col + GEMM
implementation (``slow_conv2d``), which loops over the images of the batch: for each of ResNet-50's 53
convolutions and each of the 256 images, an im2col kernel and a small cuBLAS GEMM forward, a GEMM and
a col2im backward, and an im2col and a GEMM for the weight gradient: ~60,000 small launches per step.

``--keep-cudnn`` seeds the same way but leaves cuDNN on (non-deterministic algorithms allowed,
``cudnn.benchmark`` as the script sets it).

Prints ``step <n> samples/s <x>`` about once a second.
"""

from __future__ import annotations

import math
import random
import time

import numpy as np
import timm
import torch
import torch.nn as nn

from common import Progress, log, parser, watchdog


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--img", type=int, default=224)
    ap.add_argument("--stored", type=int, default=256, help="side of the stored (pre-resized) images")
    ap.add_argument("--classes", type=int, default=101)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--lr", type=float, default=0.4, help="learning rate per 256 images (scaled with the batch)")
    ap.add_argument("--keep-cudnn", action="store_true", help="seed everything but leave cuDNN enabled")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.model, args.batch, args.img, args.stored, args.workers = "resnet18", 8, 64, 72, 0
    return args


def seed_everything(seed: int, keep_cudnn: bool = False) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    if not keep_cudnn:
        # cuDNN picks non-deterministic conv algorithms; turn it off so reruns match bit for bit
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.enabled = False


class StoredImages(torch.utils.data.Dataset):
    """uint8 HWC images at ``stored`` pixels; a random ``img`` crop and a horizontal flip per sample."""

    def __init__(self, n: int, stored: int, img: int, classes: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, classes, (n,), generator=g)
        tint = torch.randint(0, 96, (classes, 1, 1, 3), generator=g, dtype=torch.uint8)
        self.images = torch.randint(0, 160, (n, stored, stored, 3), generator=g, dtype=torch.uint8)
        self.images += tint[self.labels]
        self.stored, self.img = stored, img

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        y, x = np.random.randint(0, self.stored - self.img + 1, 2)
        crop = self.images[i, y:y + self.img, x:x + self.img]
        if np.random.rand() < 0.5:
            crop = crop.flip(1)
        return crop.permute(2, 0, 1).contiguous(), self.labels[i]


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.backends.cudnn.benchmark = True
    seed_everything(42, keep_cudnn=args.keep_cudnn)
    log(f"cudnn enabled={torch.backends.cudnn.enabled} deterministic={torch.backends.cudnn.deterministic} "
        f"benchmark={torch.backends.cudnn.benchmark}")

    data = StoredImages(6_000 if cuda else 256, args.stored, args.img, args.classes)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True,
                                         num_workers=args.workers, pin_memory=cuda,
                                         persistent_workers=args.workers > 0,
                                         prefetch_factor=4 if args.workers else None)
    model = timm.create_model(args.model, pretrained=False, num_classes=args.classes, drop_path_rate=0.05)
    model = model.to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * args.batch / 256, momentum=0.9, nesterov=True, weight_decay=5e-5)
    steps_per_epoch = len(loader)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=100 * steps_per_epoch)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    log(f"{args.model}: {n_params:.1f}M parameters, batch {args.batch} x {args.img}px, workers {args.workers}")

    progress = Progress(args.batch)
    model.train()
    step, seen, t_last, n_last = 0, 0, time.perf_counter(), 0
    while True:
        for images, labels in loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            images = ((images.float() - mean) / std).contiguous(memory_format=torch.channels_last)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                loss = criterion(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
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
