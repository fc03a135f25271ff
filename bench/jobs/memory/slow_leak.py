"""A cache keyed by step that is never trimmed: a few MB a step, a slow death."""
import argparse
import time

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--device", default="cuda")
p.add_argument("--tiny", action="store_true")
args = p.parse_args()
dev = torch.device(args.device)
width = 256 if args.tiny else 2048
model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
batch = 32 if args.tiny else 512
cache = {}

print(f"growth starts {time.time():.3f}", flush=True)
step = 0
while True:
    x = torch.randn(batch, width, device=dev)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    cache[step] = x.detach().clone()  # 4 MB a step at full size
    step += 1
    time.sleep(0.05)
