"""DataLoader workers over a Dataset that holds its samples as a Python list of objects: every
worker's refcount updates copy the parent's pages, so host memory grows as the epoch goes."""
import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--device", default="cuda")
p.add_argument("--tiny", action="store_true")
args = p.parse_args()


class Records(Dataset):
    def __init__(self, n):
        self.items = [{"id": i, "text": "sample %d " % i * 8, "label": i % 10} for i in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        item = self.items[i]
        return torch.tensor([len(item["text"]), item["label"]], dtype=torch.float32)


data = Records(200_000 if args.tiny else 3_000_000)
loader = DataLoader(data, batch_size=256, shuffle=True, num_workers=2 if args.tiny else 8, persistent_workers=True)
dev = torch.device(args.device)
width = 256 if args.tiny else (4096 if dev.type == "cuda" else 1024)
model = nn.Sequential(*[nn.Linear(width, width) for _ in range(8)]).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
rows = 64 if args.tiny else (2048 if dev.type == "cuda" else 256)  # a step of ~35 ms on an H100
print(f"growth starts {time.time():.3f}", flush=True)
step = 0
while True:
    for x in loader:
        x = x.to(dev, non_blocking=True)
        inp = torch.randn(rows, width, device=dev) + x.mean()
        loss = model(inp).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
