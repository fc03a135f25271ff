"""Species identification from camera-trap and field photos (1,000 species): a timm ConvNeXt-Tiny
(28M parameters, drop path 0.1, trained from scratch) in a PyTorch Lightning module on one GPU,
``precision="bf16-mixed"``, channels_last, AdamW (foreach; Lightning's clipping refuses a fused one) with a warmup-cosine schedule stepped per batch,
label smoothing, gradient clipping at 1.0 (Lightning's ``gradient_clip_val``), batches of 256 crops of
224 px.

The photos are kept as a uint8 array of 256 x 256 frames in host memory (generated here; the real job
memory-maps a pre-resized shard). Eight DataLoader workers (persistent, prefetching) cut a random
224-px crop and flip in uint8 and hand over CHW uint8 tensors; Lightning pins and copies them; the
conversion to float and the normalisation run on the GPU in ``on_after_batch_transfer``. Nothing is
logged through ``self.log`` and the progress bar is off; the loss is read about once a second.

This one is healthy: ConvNeXt-T's convolutions, LayerNorms and MLPs keep the GPU busy (~90-100 ms per
step of 256 on an H100), the workers deliver a batch every few milliseconds, there is no host sync in
the step, and the GPU runs back to back.

Prints ``step <n> samples/s <x>`` about once a second (samples are photos).
"""

from __future__ import annotations

import math
import os
import tempfile
import time

import lightning as L
import numpy as np
import timm
import torch
import torch.nn.functional as F

from common import Progress, log, parser, watchdog


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--stored", type=int, default=256, help="side of the stored frames")
    ap.add_argument("--photos", type=int, default=8_000, help="photos held in host memory")
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--arch", default="convnext_tiny")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--lr", type=float, default=4e-3)
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.batch, args.image, args.stored, args.photos, args.classes = 8, 64, 72, 256, 10
        args.arch, args.workers = "convnext_atto", min(args.workers, 1)
    return args


class Photos(torch.utils.data.Dataset):
    """uint8 HWC frames in host memory; a random crop and a random horizontal flip, returned as CHW uint8."""

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


class SpeciesClassifier(L.LightningModule):
    def __init__(self, arch: str, classes: int, lr: float, batch: int) -> None:
        super().__init__()
        self.model = timm.create_model(arch, pretrained=False, num_classes=classes, drop_path_rate=0.1)
        self.model = self.model.to(memory_format=torch.channels_last)
        self.lr, self.batch = lr, batch
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255, persistent=False)
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255, persistent=False)

    def on_after_batch_transfer(self, batch, dataloader_idx):
        x, y = batch
        x = ((x.float() - self.mean) / self.std).contiguous(memory_format=torch.channels_last)
        return x, y

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.model(x), y, label_smoothing=0.1)

    def configure_optimizers(self):
        decay = [p for p in self.parameters() if p.dim() > 1]
        no_decay = [p for p in self.parameters() if p.dim() <= 1]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=self.lr * self.batch / 4096, foreach=True)
        # Not fused: Lightning refuses gradient_clip_val with a fused AdamW under bf16-mixed
        # ("does not allow for gradient clipping because it performs unscaling internally").
        warmup, total = 2_000, 300_000
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

    data = Photos(args.photos, args.stored, args.image, args.classes)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True,
                                         num_workers=args.workers, persistent_workers=args.workers > 0,
                                         prefetch_factor=4 if args.workers else None, pin_memory=cuda)
    module = SpeciesClassifier(args.arch, args.classes, args.lr, args.batch)
    log(f"{args.arch} {sum(p.numel() for p in module.parameters()) / 1e6:.1f}M parameters, batch {args.batch}, "
        f"workers {args.workers}")
    trainer = L.Trainer(accelerator="gpu" if cuda else "cpu", devices=1,
                        precision="bf16-mixed" if cuda else "32-true", max_epochs=-1, gradient_clip_val=1.0,
                        benchmark=True, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0,
                        default_root_dir=os.path.join(tempfile.gettempdir(), "species-lightning"),
                        callbacks=[Throughput(args.batch)])
    trainer.fit(module, train_dataloaders=loader)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
