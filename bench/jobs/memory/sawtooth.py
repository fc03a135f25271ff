"""Training with a periodic evaluation at a four times larger batch: memory rises for the eval
and falls back after it, every time, and never grows."""
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
batch = 32 if args.tiny else 512
end = time.time() + args.seconds
step = 0
while time.time() < end:
    x = torch.randn(batch, width, device=dev)
    loss = model(x).logsumexp(-1).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    if step % 300 == 0:
        with torch.no_grad():
            outs = [model(torch.randn(4 * batch, width, device=dev)) for _ in range(8)]
            val = sum(o.mean().item() for o in outs)
        del outs
        if dev.type == "cuda":
            torch.cuda.empty_cache()  # give the eval's memory back, as some eval loops do
