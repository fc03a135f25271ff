"""An accelerate job as its examples write one: ``Accelerator(mixed_precision=...)``,
``accelerator.prepare(model, optimizer, loader)``, ``accelerator.backward(loss)``.

``--task frames``: large float32 frames (video, medical volumes) batched on the CPU and copied to the
GPU each step, with the loader's pin_memory as given. ``--task mlp``: a small MLP on small batches,
the way tabular and RL examples start."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration
from torch.utils.data import DataLoader, Dataset

from common import Progress, log, parser, watchdog


class Frames(Dataset):
    def __init__(self, shape: tuple[int, ...], n: int = 64) -> None:
        self.data = torch.randn((n, *shape))

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int):
        return self.data[i % len(self.data)], i % 10


class Rows(Dataset):
    def __init__(self, dim: int, n: int = 65536) -> None:
        self.x = torch.randn(n, dim)
        self.y = torch.randint(0, 10, (n,))

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int):
        return self.x[i % len(self.x)], self.y[i % len(self.y)]


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--task", choices=("frames", "mlp", "vit"), default="frames")
    p.add_argument("--mixed-precision", default="bf16")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--pin", action="store_true")
    args = p.parse_args()
    watchdog(args.seconds)
    acc = Accelerator(mixed_precision=args.mixed_precision, cpu=args.device == "cpu",
                      dataloader_config=DataLoaderConfiguration(non_blocking=args.pin))
    batch = 4 if args.tiny else args.batch
    if args.task == "frames":
        shape = (3, 32, 32) if args.tiny else (8, 512, 512)
        data = Frames(shape)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(shape[0], 32, 4, stride=4), torch.nn.GELU(), torch.nn.Conv2d(32, 64, 4, stride=4),
            torch.nn.GELU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10))
    elif args.task == "vit":  # timm's ViT on images already in RAM, as its accelerate examples train it
        import timm

        from vision import Images

        data = Images(256 if args.tiny else 1024, 32 if args.tiny else 224, augment=False)
        model = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=1000,
                                  **({"img_size": 32} if args.tiny else {}))
    else:
        dim = 32 if args.tiny else 256
        data = Rows(dim)
        layers: list[torch.nn.Module] = []
        for _ in range(8):
            layers += [torch.nn.Linear(dim, dim), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers, torch.nn.Linear(dim, 10))
    loader = DataLoader(data, batch_size=batch, num_workers=args.workers, pin_memory=args.pin,
                        persistent_workers=args.workers > 0, drop_last=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt, loader = acc.prepare(model, opt, loader)
    progress = Progress(batch)
    log(f"accelerate: {args.task} {args.mixed_precision} batch {batch} workers {args.workers} pin={args.pin}")
    model.train()
    for x, y in loader:
        if x.dtype == torch.uint8:
            x = x.float().div_(255.0)
        loss = F.cross_entropy(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        progress.step()


if __name__ == "__main__":
    main()
