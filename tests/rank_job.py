"""A 2-rank gloo job for the multi-rank tests, started with ``python -m torch.distributed.run``.

Modes: ``healthy`` (both ranks do the same light work between all-reduces), ``straggler`` (rank 1 builds
its batch in slow pure Python, rank 0 waits for it in all_reduce), ``hang`` (rank 1 never reaches
the all_reduce rank 0 waits in), ``accum`` (gradient accumulation under DDP, every micro-batch
all-reducing). Each rank prints "ready" once the process group works. Any world
size works; a second argument names the odd rank instead of 1 (the across-hosts test's 4 ranks).
"""

from __future__ import annotations

import os
import sys
import threading
import time

import torch
import torch.distributed as dist


def load_batch(n: int) -> torch.Tensor:
    # The slow Python data path: per-element work the interpreter does one item at a time.
    total = 0.0
    for i in range(n):
        total += ((i * 7) % 13) ** 0.5
    return torch.full((64,), total / n)


def train_step(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    for _ in range(4):
        x = torch.tanh(w @ x)
    return x


def never_arrives() -> None:
    while True:
        time.sleep(0.05)


def accumulate() -> None:
    """Gradient accumulation over ACCUM micro-batches under DDP, every backward all-reducing the
    gradients (no skipped sync): the optimizer uses only the last all-reduce of each ACCUM."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
        torch.nn.Linear(2048, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 512), torch.randint(0, 10, (8,))
    _ready_then_wait_for_go(model, opt, x, y)
    for step in range(10**9):
        loss = torch.nn.functional.cross_entropy(model(x), y) / ACCUM
        loss.backward()
        if (step + 1) % ACCUM == 0:
            opt.step()
            opt.zero_grad()


ACCUM = 8


def _ready_then_wait_for_go(model, opt, x: torch.Tensor, y: torch.Tensor) -> None:
    """Says "ready". Where ``RANK_JOB_GO`` names a file, the rank first goes once through the
    loop's work (ACCUM micro-batches and an optimizer step: DDP's first backward rebuilds its
    buckets, the first step imports more of torch), says "ready", then waits for that file before
    its loop starts: a test starts the job early, while other jobs are watched, and lets its loop
    run, warmed up and past the job's warm-up age, when its own watch starts. Defined here, below
    the loop, so the loop keeps its line numbers (the accumulation finding names them)."""
    go = os.environ.get("RANK_JOB_GO")
    if go:
        for _ in range(ACCUM):
            loss = torch.nn.functional.cross_entropy(model(x), y) / ACCUM
            loss.backward()
        opt.step()
        opt.zero_grad()
    print(f"rank {dist.get_rank()} ready", flush=True)
    while go and not os.path.exists(go):
        time.sleep(0.05)


def _exit_with_the_launcher() -> None:
    # A test killed mid-run (a timeout) may leave no one to stop the ranks: they would spin on.
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def main() -> None:
    threading.Thread(target=_exit_with_the_launcher, daemon=True).start()
    mode = sys.argv[1]
    odd = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    w = torch.randn(64, 64) / 8
    dist.all_reduce(torch.ones(4))
    if mode == "accum":
        accumulate()
    print(f"rank {rank} ready", flush=True)
    while True:
        if mode == "straggler" and rank == odd:
            batch = load_batch(150_000)
        elif mode == "healthy":
            # Equal light work and a pause on both ranks: balanced even on a busy shared machine.
            batch = load_batch(2_000)
            time.sleep(0.02)
        else:
            batch = torch.ones(64)
        if mode == "hang" and rank == odd:
            never_arrives()
        dist.all_reduce(train_step(w, batch))


if __name__ == "__main__":
    main()
