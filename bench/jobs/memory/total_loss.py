"""Validation without torch.no_grad(), summed with `total_loss += loss`: every batch's graph,
activations included, stays alive in the sum until the GPU is full."""
import argparse
import time

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--device", default="cuda")
p.add_argument("--tiny", action="store_true")
args = p.parse_args()
dev = torch.device(args.device)
width = 256 if args.tiny else 4096
model = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 10)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
batch = 32 if args.tiny else 64  # ~5 MB of activations kept a step

for step in range(100):  # training that is fine
    x = torch.randn(batch, width, device=dev)
    loss = model(x).logsumexp(-1).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"growth starts {time.time():.3f}", flush=True)
total_loss = 0.0
while True:  # a validation loop that never ends, as a long one would look
    x = torch.randn(batch, width, device=dev)
    loss = model(x).logsumexp(-1).mean()
    total_loss += loss
    time.sleep(0.05)  # the next batch's loading, as a long validation set would take
