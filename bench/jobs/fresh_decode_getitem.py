"""An image classifier whose Dataset decodes JPEG files in ``__getitem__`` -- PIL open, convert to
RGB, resize the short side to 256, random 224 crop, random flip, to a tensor -- with the
DataLoader's default ``num_workers=0``, so every image is decoded in the training process between
steps while the GPU waits. ``--workers 8`` is the fix: ``DataLoader(num_workers=8)``.

The JPEGs (varied sizes around 400x350, as photos are) are encoded once at start and kept as bytes
in RAM, as a page-cached folder of files would be. torchvision's ResNet-50 in bf16 autocast with
channels_last (a small conv net stands in for ``--tiny``); no download."""

from __future__ import annotations

import io
import random

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from common import Progress, log, parser, watchdog


def make_jpegs(n: int, tiny: bool, seed: int = 0) -> list[bytes]:
    r = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        w, h = (int(r.integers(40, 64)), int(r.integers(36, 60))) if tiny else \
            (int(r.integers(340, 480)), int(r.integers(300, 420)))
        # smooth blobs plus texture: compresses like a photo, not like noise
        small = r.integers(0, 256, (h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
        img = Image.fromarray(small).resize((w, h), Image.BICUBIC)
        arr = np.asarray(img).astype(np.int16) + r.integers(-12, 13, (h, w, 3))
        buf = io.BytesIO()
        Image.fromarray(arr.clip(0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


class JpegFolder(Dataset):
    def __init__(self, files: list[bytes], short: int, crop: int) -> None:
        self.files, self.short, self.crop = files, short, crop
        self.labels = [i % 1000 for i in range(len(files))]

    def __len__(self) -> int:
        return 1 << 30  # endless

    def __getitem__(self, i: int):
        img = Image.open(io.BytesIO(self.files[i % len(self.files)])).convert("RGB")
        w, h = img.size
        s = self.short / min(w, h)
        img = img.resize((max(self.crop, round(w * s)), max(self.crop, round(h * s))), Image.BILINEAR)
        left = random.randint(0, img.size[0] - self.crop)
        top = random.randint(0, img.size[1] - self.crop)
        img = img.crop((left, top, left + self.crop, top + self.crop))
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1)
        return x, self.labels[i % len(self.labels)]


def build_model(tiny: bool) -> torch.nn.Module:
    if tiny:
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 1000))
    import torchvision

    return torchvision.models.resnet50(num_classes=1000)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--workers", type=int, default=0)
    args = p.parse_args()
    watchdog(args.seconds)
    dev = torch.device(args.device)
    short, crop = (36, 32) if args.tiny else (256, 224)
    batch = 8 if args.tiny else args.batch
    files = make_jpegs(64 if args.tiny else 512, args.tiny)
    model = build_model(args.tiny).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    loader = DataLoader(JpegFolder(files, short, crop), batch_size=batch, num_workers=args.workers,
                        pin_memory=dev.type == "cuda", persistent_workers=args.workers > 0, drop_last=True)
    mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255
    progress = Progress(batch)
    log(f"fresh_decode_getitem: resnet50 bf16 batch {batch} workers {args.workers}")
    model.train()
    for x, y in loader:
        x = x.to(dev, non_blocking=True)
        y = y.to(dev, non_blocking=True)
        x = ((x.float() - mean) / std).contiguous(memory_format=torch.channels_last)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        progress.step()


if __name__ == "__main__":
    main()
