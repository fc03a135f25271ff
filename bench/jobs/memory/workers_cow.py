"""DataLoader workers over a Dataset that holds its samples as a Python list of objects: every
worker's refcount updates copy the parent's pages, so host memory grows as the epoch goes."""
import argparse
import time

import torch
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


data = Records(200_000 if args.tiny else 20_000_000)
loader = DataLoader(data, batch_size=256, shuffle=True, num_workers=2 if args.tiny else 8, persistent_workers=True)
dev = torch.device(args.device)
print(f"growth starts {time.time():.3f}", flush=True)
while True:
    for x in loader:
        x = x.to(dev)
        time.sleep(0.005 if args.tiny else 0.001)
