"""An image classifier trained the way public example scripts do it (the torchvision ImageNet
reference, timm's train.py): a DataLoader over a map-style dataset, per-sample CPU transforms in the
workers, optional bf16 autocast, optional DDP when started by torchrun. Synthetic images in RAM, so
no download and no disk."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common import Progress, log, parser, watchdog


class Images(Dataset):
    """uint8 images held in RAM; ``augment`` does what a RandomResizedCrop + flip + normalize
    pipeline costs per sample on the CPU."""

    def __init__(self, n: int, size: int, augment: bool) -> None:
        g = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, 256, (n, 3, size + size // 8, size + size // 8), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, 1000, (n,), generator=g)
        self.size, self.augment = size, augment

    def __len__(self) -> int:
        return 1 << 30  # endless: the job runs until it is stopped

    def __getitem__(self, i: int):
        img = self.data[i % len(self.data)]
        s = self.size
        if not self.augment:
            return img[:, :s, :s], self.labels[i % len(self.labels)]
        top, left = (i * 7) % (img.shape[1] - s), (i * 13) % (img.shape[2] - s)
        x = img[:, top:top + s + 16, left:left + s + 16].float()
        x = F.interpolate(x[None], size=(s, s), mode="bilinear", antialias=True, align_corners=False)[0]
        if i % 2:
            x = x.flip(-1)
        x = (x / 255.0 - 0.45) / 0.225
        return x, self.labels[i % len(self.labels)]


def build_model(name: str, tiny: bool) -> torch.nn.Module:
    lib, _, arch = name.partition(":")
    if lib == "cnn":  # a small conv net with no dependency: the CPU smoke test's model
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 1000))
    if lib == "timm":
        import timm

        extra = {"img_size": 32} if tiny and arch.startswith("vit") else {}  # only ViTs take a size
        return timm.create_model(arch, pretrained=False, num_classes=1000, **extra)
    import torchvision

    return getattr(torchvision.models, arch)(num_classes=1000)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--model", default="torchvision:resnet50")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--augment", action="store_true")
    p.add_argument("--no-pin", action="store_true")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    args = p.parse_args()
    watchdog(args.seconds)
    ddp = "RANK" in os.environ
    if ddp:
        import torch.distributed as dist

        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if args.device == "cuda":
            torch.cuda.set_device(local)
    dev = torch.device(args.device, int(os.environ.get("LOCAL_RANK", "0"))) if args.device == "cuda" else torch.device("cpu")
    size = 32 if args.tiny else 224
    batch = 8 if args.tiny else args.batch
    model = build_model(args.model, args.tiny).to(dev)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    loader = DataLoader(
        Images(256 if args.tiny else 1024, size, args.augment), batch_size=batch, shuffle=False,
        num_workers=args.workers, pin_memory=not args.no_pin and dev.type == "cuda",
        persistent_workers=args.workers > 0, drop_last=True,
    )
    mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255
    progress = Progress(batch)
    model.train()
    log(f"vision: {args.model} {args.precision} batch {batch} workers {args.workers} ddp={ddp}")
    for x, y in loader:
        x = x.to(dev, non_blocking=True)
        y = y.to(dev, non_blocking=True)
        if x.dtype == torch.uint8:
            x = (x.float() - mean) / std
        if args.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        progress.step()


if __name__ == "__main__":
    main()
