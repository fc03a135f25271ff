"""A healthy job: the caching allocator warms up over the first steps, then memory is flat."""
import argparse
import time

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--device", default="cuda")
p.add_argument("--tiny", action="store_true")
p.add_argument("--seconds", type=float, default=600.0)
args = p.parse_args()
dev = torch.device(args.device)
width = 256 if args.tiny else 4096
model = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 10)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
batch = 32 if args.tiny else 1024
running = 0.0
end = time.time() + args.seconds
while time.time() < end:
    x = torch.randn(batch, width, device=dev)
    loss = model(x).logsumexp(-1).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    running += loss.item()
