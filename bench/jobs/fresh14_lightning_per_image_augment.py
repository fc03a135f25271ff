"""Crop-disease classification from field photos of leaves (120 disease / crop classes) with a
torchvision ResNet-50 trained from scratch in a PyTorch Lightning module on one GPU:
``precision="bf16-mixed"``, channels_last, SGD with Nesterov momentum (fused) and a warmup-cosine
schedule stepped per batch, label smoothing, batches of 256 photos.

The photos are kept as uint8 256 x 256 frames in host memory (generated here; the real job
memory-maps a pre-resized shard). Eight persistent DataLoader workers only index the frames and
hand over CHW uint8 tensors; Lightning pins and copies them. The augmentation runs on the GPU, in
``on_after_batch_transfer``, with torchvision's ``transforms.v2`` (RandomResizedCrop to 224,
horizontal flip, ColorJitter, to float, Normalize). A v2 transform draws one set of random
parameters per call, so to give every photo its own crop and jitter the module calls the pipeline
photo by photo and stacks the results. ``--batched-augment`` applies the same augmentations to the
whole batch at once, with per-photo parameters drawn as tensors (``roi_align`` for the crops, a
per-photo flip mask, per-photo jitter factors).

Nothing is logged through ``self.log`` and the progress bar is off; the loss is read about once a
second.

Prints ``step <n> samples/s <x>`` about once a second (samples are photos).
"""

from __future__ import annotations

import math
import os
import tempfile
import time

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
import torchvision
from torchvision.ops import roi_align
from torchvision.transforms import v2

from common import Progress, log, parser, watchdog

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--stored", type=int, default=256, help="side of the stored frames")
    ap.add_argument("--photos", type=int, default=6_000, help="photos held in host memory")
    ap.add_argument("--classes", type=int, default=120)
    ap.add_argument("--arch", default="resnet50")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--batched-augment", action="store_true",
                    help="augment the whole batch at once instead of photo by photo")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.batch, args.image, args.stored, args.photos, args.classes = 8, 64, 72, 256, 10
        args.arch, args.workers = "resnet18", min(args.workers, 1)
    return args


class LeafPhotos(torch.utils.data.Dataset):
    """uint8 HWC frames in host memory, returned as CHW uint8; all augmentation happens on the GPU."""

    def __init__(self, n: int, stored: int, classes: int) -> None:
        rng = np.random.default_rng(0)
        self.frames = rng.integers(0, 256, size=(n, stored, stored, 3), dtype=np.uint8)
        self.labels = rng.integers(0, classes, size=n)

    def __len__(self) -> int:
        return len(self.frames)

    def __getitem__(self, i: int):
        return torch.from_numpy(np.ascontiguousarray(self.frames[i].transpose(2, 0, 1))), int(self.labels[i])


def per_image_pipeline(size: int) -> v2.Compose:
    return v2.Compose([
        v2.RandomResizedCrop(size, scale=(0.25, 1.0), antialias=True),
        v2.RandomHorizontalFlip(),
        v2.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(MEAN, STD),
    ])


def batched_augment(x: torch.Tensor, size: int, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """RandomResizedCrop + flip + brightness/contrast/saturation jitter + normalise, per-photo parameters."""
    b, _, h, w = x.shape
    dev = x.device
    x = x.float() / 255
    area = torch.empty(b, device=dev).uniform_(0.25, 1.0) * h * w
    log_ratio = torch.empty(b, device=dev).uniform_(math.log(3 / 4), math.log(4 / 3))
    ratio = torch.exp(log_ratio)
    cw = torch.sqrt(area * ratio).clamp(8, w)
    ch = torch.sqrt(area / ratio).clamp(8, h)
    x0 = torch.rand(b, device=dev) * (w - cw)
    y0 = torch.rand(b, device=dev) * (h - ch)
    boxes = torch.stack((torch.arange(b, device=dev, dtype=torch.float32), x0, y0, x0 + cw, y0 + ch), dim=1)
    x = roi_align(x, boxes, output_size=size, spatial_scale=1.0, sampling_ratio=2, aligned=True)
    flip = torch.rand(b, 1, 1, 1, device=dev) < 0.5
    x = torch.where(flip, x.flip(-1), x)
    gray_w = torch.tensor([0.299, 0.587, 0.114], device=dev).view(1, 3, 1, 1)
    bright = torch.empty(b, 1, 1, 1, device=dev).uniform_(0.6, 1.4)
    x = (x * bright).clamp_(0, 1)
    contrast = torch.empty(b, 1, 1, 1, device=dev).uniform_(0.6, 1.4)
    gray_mean = (x * gray_w).sum(1, keepdim=True).mean((2, 3), keepdim=True)
    x = (contrast * x + (1 - contrast) * gray_mean).clamp_(0, 1)
    sat = torch.empty(b, 1, 1, 1, device=dev).uniform_(0.6, 1.4)
    gray = (x * gray_w).sum(1, keepdim=True)
    x = (sat * x + (1 - sat) * gray).clamp_(0, 1)
    return (x - mean) / std


class LeafDisease(L.LightningModule):
    def __init__(self, arch: str, classes: int, lr: float, batch: int, image: int, batched: bool) -> None:
        super().__init__()
        self.model = getattr(torchvision.models, arch)(num_classes=classes)
        self.model = self.model.to(memory_format=torch.channels_last)
        self.lr, self.batch, self.image, self.batched = lr, batch, image, batched
        self.augment = per_image_pipeline(image)
        self.register_buffer("mean", torch.tensor(MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(STD).view(1, 3, 1, 1), persistent=False)

    def on_after_batch_transfer(self, batch, dataloader_idx):
        x, y = batch
        if self.trainer.training:
            if self.batched:
                x = batched_augment(x, self.image, self.mean, self.std)
            else:
                x = torch.stack([self.augment(img) for img in x])
        return x.contiguous(memory_format=torch.channels_last), y

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.model(x), y, label_smoothing=0.1)

    def configure_optimizers(self):
        decay = [p for p in self.parameters() if p.dim() > 1]
        no_decay = [p for p in self.parameters() if p.dim() <= 1]
        opt = torch.optim.SGD([{"params": decay, "weight_decay": 5e-5}, {"params": no_decay, "weight_decay": 0.0}],
                              lr=self.lr * self.batch / 256, momentum=0.9, nesterov=True,
                              fused=self.model.fc.weight.is_cuda)
        warmup, total = 1_500, 250_000
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: (s + 1) / warmup if s < warmup else
            0.5 * (1 + math.cos(math.pi * min(1.0, (s - warmup) / (total - warmup)))))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Throughput(L.Callback):
    def __init__(self, batch: int) -> None:
        self.progress = Progress(batch)
        self.batch = batch
        self.step, self.seen, self.t_last, self.n_last = 0, 0, time.perf_counter(), 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.progress.step()
        self.step += 1
        self.seen += self.batch
        now = time.perf_counter()
        if now - self.t_last >= 1.0:
            loss_val = outputs["loss"].item()
            now = time.perf_counter()
            log(f"step {self.step} samples/s {(self.seen - self.n_last) / (now - self.t_last):.1f} loss {loss_val:.4f}")
            self.t_last, self.n_last = now, self.seen
            if not math.isfinite(loss_val):
                raise RuntimeError("loss is not finite")


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    cuda = args.device == "cuda"
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    data = LeafPhotos(args.photos, args.stored, args.classes)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True,
                                         num_workers=args.workers, persistent_workers=args.workers > 0,
                                         prefetch_factor=4 if args.workers else None, pin_memory=cuda)
    module = LeafDisease(args.arch, args.classes, args.lr, args.batch, args.image, args.batched_augment)
    log(f"{args.arch} {sum(p.numel() for p in module.parameters()) / 1e6:.1f}M parameters, batch {args.batch}, "
        f"augmentation {'batched' if args.batched_augment else 'per photo'}")
    trainer = L.Trainer(accelerator="gpu" if cuda else "cpu", devices=1,
                        precision="bf16-mixed" if cuda else "32-true", max_epochs=-1,
                        benchmark=True, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0,
                        default_root_dir=os.path.join(tempfile.gettempdir(), "leaf-disease-lightning"),
                        callbacks=[Throughput(args.batch)])
    trainer.fit(module, train_dataloaders=loader)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
