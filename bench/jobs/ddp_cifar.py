"""A CIFAR-10 ResNet-18 trained with DistributedDataParallel under torchrun, in the shape of
pytorch/examples' ``distributed/ddp-tutorial-series/multigpu_torchrun.py`` (a ``Trainer`` with
``_run_batch``/``_run_epoch``, a ``DistributedSampler``, ``set_epoch`` each epoch) with the model of
the widely copied pytorch-cifar repository (3x3 stem, no max-pool), the standard CIFAR transforms
per sample in the loader's workers, and bf16 autocast. Each step the loss is averaged over the
ranks with ``dist.all_reduce`` and read with ``.item()`` for the running loss a progress bar shows,
as many DDP scripts do. Synthetic images in RAM, no download."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from common import Progress, log, parser, watchdog

MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).view(3, 1, 1)
STD = torch.tensor([0.2470, 0.2435, 0.2616]).view(3, 1, 1)


class Cifar(Dataset):
    """uint8 32x32 images in RAM; RandomCrop(32, padding=4) + RandomHorizontalFlip + ToTensor + Normalize."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g)
        self.targets = torch.randint(0, 10, (n,), generator=g).tolist()

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        img = self.data[i].float().div(255.0)  # ToTensor
        img = F.pad(img, (4, 4, 4, 4))
        top, left = torch.randint(0, 9, (2,)).tolist()
        img = img[:, top:top + 32, left:left + 32]
        if torch.rand(1).item() < 0.5:
            img = img.flip(-1)
        return (img - MEAN) / STD, self.targets[i]


class BasicBlock(torch.nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(planes)
        self.conv2 = torch.nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(planes)
        self.shortcut = torch.nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = torch.nn.Sequential(torch.nn.Conv2d(in_planes, planes, 1, stride, bias=False),
                                                torch.nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(torch.nn.Module):
    def __init__(self, width: int = 64, num_classes: int = 10) -> None:
        super().__init__()
        self.in_planes = width
        self.conv1 = torch.nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(width)
        self.layer1 = self._make_layer(width, 2, 1)
        self.layer2 = self._make_layer(2 * width, 2, 2)
        self.layer3 = self._make_layer(4 * width, 2, 2)
        self.layer4 = self._make_layer(8 * width, 2, 2)
        self.linear = torch.nn.Linear(8 * width, num_classes)

    def _make_layer(self, planes: int, blocks: int, stride: int) -> torch.nn.Sequential:
        layers = []
        for s in [stride] + [1] * (blocks - 1):
            layers.append(BasicBlock(self.in_planes, planes, s))
            self.in_planes = planes
        return torch.nn.Sequential(*layers)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)


class Trainer:
    def __init__(self, model, train_data: DataLoader, optimizer, scheduler, dev: torch.device, log_every: int,
                 progress: Progress) -> None:
        self.dev = dev
        self.model = DDP(model.to(dev), device_ids=[dev.index] if dev.type == "cuda" else None)
        self.train_data, self.optimizer, self.scheduler = train_data, optimizer, scheduler
        self.log_every, self.progress = log_every, progress
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.running, self.steps = 0.0, 0

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        with torch.autocast(self.dev.type, dtype=torch.bfloat16):
            output = self.model(source)
            loss = F.cross_entropy(output, targets)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.steps += 1
        if self.steps % self.log_every == 0:  # the running loss over all ranks, for the progress bar
            reduced = loss.detach().clone()
            dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
            self.running = 0.98 * self.running + 0.02 * reduced.item() / self.world

    def _run_epoch(self, epoch: int):
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            source = source.to(self.dev)
            targets = targets.to(self.dev)
            self._run_batch(source, targets)
            self.progress.step()
        if self.rank == 0:
            log(f"epoch {epoch} running loss {self.running:.4f}")

    def train(self):
        epoch = 0
        while True:
            self._run_epoch(epoch)
            epoch += 1


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=128, help="per GPU")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--persistent-workers", action="store_true")
    p.add_argument("--log-every", type=int, default=1, help="all-reduce and read the loss every N steps")
    args = p.parse_args()
    watchdog(args.seconds)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    batch = 8 if args.tiny else args.batch
    dataset = Cifar(512 if args.tiny else 50000)
    loader = DataLoader(dataset, batch_size=batch, pin_memory=dev.type == "cuda", shuffle=False,
                        sampler=DistributedSampler(dataset), num_workers=args.workers,
                        persistent_workers=args.persistent_workers and args.workers > 0, drop_last=True)
    model = ResNet18(8 if args.tiny else 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10**6)
    progress = Progress(batch)
    log(f"ddp_cifar: resnet18 bf16 batch {batch} workers {args.workers} persistent={args.persistent_workers} "
        f"log_every {args.log_every} world {dist.get_world_size()}")
    Trainer(model, loader, optimizer, scheduler, dev, args.log_every, progress).train()


if __name__ == "__main__":
    main()
