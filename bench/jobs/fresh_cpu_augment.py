"""An image classifier whose batch augmentation runs in the training loop on the CPU: the loader
yields uint8 batches, and the loop turns each batch into floats, takes a random resized crop,
flips half the images, jitters brightness and contrast and adds Gaussian noise, all on the CPU
tensor, and only then calls ``.to(device)``, the way a loop grows when augmentation is added after
the fact. ``--gpu-augment`` is the fix: the same ops on the batch after ``.to(device)``.

torchvision's ResNet-50 in bf16 autocast with channels_last (a small conv net stands in for
``--tiny``). Synthetic 256x256 images in RAM, no download."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common import Progress, log, parser, watchdog

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


class RawImages(Dataset):
    """uint8 images and labels held in RAM, returned as they are: the transforms are in the loop."""

    def __init__(self, n: int, size: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, 1000, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        return self.images[i], self.labels[i]


def augment(x: torch.Tensor, out: int, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """RandomResizedCrop (one box per batch) + horizontal flip + colour jitter + noise + normalize,
    on whatever device ``x`` is on."""
    dev = x.device
    x = x.float().div_(255.0)
    n, _, h, w = x.shape
    scale = float(torch.empty(1).uniform_(0.5, 1.0))
    ch, cw = int(h * scale ** 0.5), int(w * scale ** 0.5)
    top = int(torch.randint(0, h - ch + 1, (1,)))
    left = int(torch.randint(0, w - cw + 1, (1,)))
    x = x[:, :, top:top + ch, left:left + cw]
    x = F.interpolate(x, size=(out, out), mode="bilinear", antialias=True, align_corners=False)
    flip = torch.rand(n, 1, 1, 1, device=dev) < 0.5
    x = torch.where(flip, x.flip(-1), x)
    brightness = torch.empty(n, 1, 1, 1, device=dev).uniform_(0.8, 1.2)
    contrast = torch.empty(n, 1, 1, 1, device=dev).uniform_(0.8, 1.2)
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    x = ((x * brightness - mean) * contrast + mean).clamp_(0.0, 1.0)
    x = x + 0.03 * torch.randn_like(x)
    return (x - mean) / std


def build_model(tiny: bool) -> torch.nn.Module:
    if tiny:
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 1000))
    import torchvision

    return torchvision.models.resnet50(num_classes=1000)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--gpu-augment", action="store_true", help="augment after .to(device), on the GPU")
    args = p.parse_args()
    watchdog(args.seconds)
    dev = torch.device(args.device)
    size, out = (48, 32) if args.tiny else (256, 224)
    batch = 8 if args.tiny else args.batch
    model = build_model(args.tiny).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4, nesterov=True)
    loader = DataLoader(RawImages(64 if args.tiny else 1024, size), batch_size=batch, shuffle=True,
                        num_workers=args.workers, pin_memory=dev.type == "cuda", persistent_workers=args.workers > 0,
                        drop_last=True)
    norm = {d: (torch.tensor(MEAN, device=d).view(1, 3, 1, 1), torch.tensor(STD, device=d).view(1, 3, 1, 1))
            for d in {torch.device("cpu"), dev}}
    progress = Progress(batch)
    log(f"fresh_cpu_augment: batch {batch} workers {args.workers} gpu_augment={args.gpu_augment}")
    model.train()
    while True:
        for x, y in loader:
            if args.gpu_augment:
                x = augment(x.to(dev, non_blocking=True), out, *norm[dev])
            else:
                x = augment(x, out, *norm[torch.device("cpu")]).to(dev, non_blocking=True)
            y = y.to(dev, non_blocking=True)
            x = x.contiguous(memory_format=torch.channels_last)
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            progress.step()


if __name__ == "__main__":
    main()
