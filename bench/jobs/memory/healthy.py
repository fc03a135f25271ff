"""A healthy job: its weights loaded shard by shard first (the GPU's memory rises for ~16 s, as a
large checkpoint read from disk makes it), then training whose caching allocator warms up over
the first steps, then flat memory."""
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
shards = []
for i in range(2 if args.tiny else 16):  # 16 x 256 MiB, a shard a second
    shards.append(torch.empty(2**26, device=dev).normal_())
    time.sleep(1.0)
running = 0.0
end = time.time() + args.seconds
while time.time() < end:
    x = torch.randn(batch, width, device=dev)
    loss = model(x).logsumexp(-1).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    running += loss.item()
