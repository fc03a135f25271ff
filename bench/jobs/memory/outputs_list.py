"""A training loop that keeps every step's outputs in a list for a metric at the end of the
epoch: the outputs keep their graphs, so each step's activations stay on the GPU."""
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
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
batch = 32 if args.tiny else 256

print(f"growth starts {time.time():.3f}", flush=True)
all_outputs = []
while True:
    x = torch.randn(batch, width, device=dev)
    outputs = model(x)
    loss = outputs.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    all_outputs.append(outputs)
    time.sleep(0.02)
