"""Gradient accumulation under DDP as written without ``no_sync()``: the optimizer steps once every
``--accum`` micro-batches, but every micro-batch's ``backward`` all-reduces the gradients (the
benchmark's in-sample job for ``accumulation-sync``; bench/accumulation_sync.py runs it).

    python -m torch.distributed.run --standalone --nproc-per-node 2 bench/jobs/accum_ddp.py [--fixed]

``--fixed`` runs all but the last micro-batch of each step under ``no_sync()``, from a module of
its own (accum_ddp_fixed.py): this file never names the skip, as the job it stands for. CPU ranks
with gloo, one thread each; prints the progress lines of common.py on rank 0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from common import Progress


def _exit_with_the_launcher() -> None:
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--accum", type=int, default=8)
    ap.add_argument("--fixed", action="store_true")
    args = ap.parse_args()
    threading.Thread(target=_exit_with_the_launcher, daemon=True).start()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
        torch.nn.Linear(2048, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = 8
    x, y = torch.randn(batch, 512), torch.randint(0, 10, (batch,))
    progress = Progress(batch) if dist.get_rank() == 0 else None
    skip = None
    if args.fixed:
        from accum_ddp_fixed import skip_sync_unless
        skip = skip_sync_unless
    for step in range(10**9):
        last = (step + 1) % args.accum == 0
        with skip(model, last) if skip else contextlib.nullcontext():
            loss = torch.nn.functional.cross_entropy(model(x), y) / args.accum
            loss.backward()
        if (step + 1) % args.accum == 0:
            opt.step()
            opt.zero_grad()
        if progress is not None:
            progress.step()


if __name__ == "__main__":
    main()
