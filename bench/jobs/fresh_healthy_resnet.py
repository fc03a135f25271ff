"""A healthy image-classification job, the control: torchvision's ResNet-50 in bf16 autocast with
channels_last, batch 256, SGD with Nesterov momentum, and a loader with workers enough -- 12
workers doing a random crop and flip per uint8 sample, pinned memory, non-blocking copies,
normalization on the GPU. Nothing in it should be worth changing: more workers or a larger batch
gain little.

Synthetic images in RAM, no download; a small conv net stands in for ``--tiny``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common import Progress, log, parser, watchdog


class Images(Dataset):
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
            torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 1000))
    import torchvision

    return torchvision.models.resnet50(num_classes=1000)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--workers", type=int, default=12)
    args = p.parse_args()
    watchdog(args.seconds)
    dev = torch.device(args.device)
    size, crop = (40, 32) if args.tiny else (256, 224)
    batch = 8 if args.tiny else args.batch
    model = build_model(args.tiny).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * batch / 256, momentum=0.9, weight_decay=5e-5, nesterov=True)
    loader = DataLoader(Images(64 if args.tiny else 2048, size, crop), batch_size=batch, num_workers=args.workers,
                        pin_memory=dev.type == "cuda", persistent_workers=args.workers > 0, drop_last=True,
                        prefetch_factor=4 if args.workers > 0 else None)
    mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255
    progress = Progress(batch)
    log(f"fresh_healthy_resnet: resnet50 bf16 batch {batch} workers {args.workers}")
    model.train()
    for x, y in loader:
        x = x.to(dev, non_blocking=True)
        y = y.to(dev, non_blocking=True)
        x = ((x.float() - mean) / std).contiguous(memory_format=torch.channels_last)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        progress.step()


if __name__ == "__main__":
    main()
