"""A timm ConvNeXt-Small classifier trained in plain fp32, the way a first training script is
written: no autocast, no GradScaler, PyTorch's default TF32 settings (cuDNN convolutions may use
TF32, matmuls may not, and ConvNeXt's pointwise layers are ``nn.Linear``). The loader is ample:
uint8 images from RAM, a random crop and flip per sample in 10 workers, normalized on the GPU.
``--amp`` is the fix: ``torch.autocast('cuda', dtype=torch.bfloat16)`` around forward and loss.

timm's ``convnext_small`` built without pretrained weights (a small conv net stands in for
``--tiny``); AdamW and a cosine schedule as timm's train.py sets them; synthetic images."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common import Progress, log, parser, watchdog


class Images(Dataset):
    """uint8 images in RAM; per sample a random 224 crop of the 256 image and a horizontal flip."""

    def __init__(self, n: int, size: int, crop: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, 1000, (n,), generator=g)
        self.crop = crop

    def __len__(self) -> int:
        return 1 << 30  # endless

    def __getitem__(self, i: int):
        img = self.images[i % len(self.images)]
        top, left = torch.randint(0, img.shape[1] - self.crop + 1, (2,)).tolist()
        img = img[:, top:top + self.crop, left:left + self.crop]
        if torch.rand(()) < 0.5:
            img = img.flip(-1)
        return img.contiguous(), self.labels[i % len(self.labels)]


def build_model(tiny: bool) -> torch.nn.Module:
    if tiny:
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 4, stride=4), torch.nn.GELU(), torch.nn.Conv2d(32, 32, 7, padding=3, groups=32),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 1000))
    import timm

    return timm.create_model("convnext_small", pretrained=False, num_classes=1000, drop_path_rate=0.1)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--workers", type=int, default=10)
    p.add_argument("--amp", action="store_true", help="bf16 autocast around forward and loss")
    args = p.parse_args()
    watchdog(args.seconds)
    dev = torch.device(args.device)
    size, crop = (40, 32) if args.tiny else (256, 224)
    batch = 8 if args.tiny else args.batch
    model = build_model(args.tiny).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=4e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100_000)
    loader = DataLoader(Images(64 if args.tiny else 2048, size, crop), batch_size=batch, num_workers=args.workers,
                        pin_memory=dev.type == "cuda", persistent_workers=args.workers > 0, drop_last=True)
    mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255
    progress = Progress(batch)
    log(f"fresh_timm_fp32: convnext_small batch {batch} workers {args.workers} amp={args.amp}")
    model.train()
    for x, y in loader:
        x = (x.to(dev, non_blocking=True).float() - mean) / std
        y = y.to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.amp):
            loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        progress.step()


if __name__ == "__main__":
    main()
