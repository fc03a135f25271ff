"""A CPU training job whose DataLoader workers copy its Dataset page by page (copy-on-read), and
its fix, for the workers' private-memory tests: ``python tests/cow_job.py list|numpy [n]``.

``list``: the Dataset holds ``n`` Python ints in a list. Two forked workers (persistent) each
read a slice per sample; slicing a list takes a reference to every int in it, and writing the
int's refcount copies the page it sits on into the worker: the worker's private memory (USS)
grows with every page it touches while its RSS counts the same pages before and after (shared
then, private now). ``numpy``: the same numbers in one int64 array: reading a slice writes
nothing, so the workers' USS stays flat. The samples are paced (a sleep per sample) so the
first epoch's copying takes ~30 s: a growth a monitor can watch, not a jump (~4 MiB/s a worker).
Prints "ready" once the first batch is trained on.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

# 8M ints: ~220 MB of int objects (28 B each) and a 64 MB pointer array in the parent; each
# worker copies the int pages of the half of the samples it reads, ~110 MB, over one epoch.
N = 8_000_000
CHUNK = 2_000  # ints read per sample: 4,000 samples an epoch
# 2 workers x batches of 8 samples x 15 ms a sample: ~130 samples/s, ~30 s an epoch.
SAMPLE_S = 0.015
BATCH = 8


class ListData(Dataset):
    def __init__(self, n: int) -> None:
        # Distinct ints (CPython caches only -5..256): each one an object with its own refcount.
        self.data = list(range(10**6, 10**6 + n))

    def __len__(self) -> int:
        return len(self.data) // CHUNK

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(SAMPLE_S)
        part = self.data[i * CHUNK:(i + 1) * CHUNK]  # a reference to each int: its page is written
        return torch.tensor([float(sum(part) % 1000)])


class ArrayData(ListData):
    def __init__(self, n: int) -> None:
        self.data = np.arange(10**6, 10**6 + n, dtype=np.int64)

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(SAMPLE_S)
        return torch.tensor([float(self.data[i * CHUNK:(i + 1) * CHUNK].sum() % 1000)])


def _exit_with_the_parent() -> None:
    # A test killed mid-run (a timeout) may leave no one to stop the job: it would run on.
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def main() -> None:
    threading.Thread(target=_exit_with_the_parent, daemon=True).start()
    kind = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else N
    torch.set_num_threads(1)
    ds = ListData(n) if kind == "list" else ArrayData(n)
    loader = DataLoader(ds, batch_size=BATCH, num_workers=2, persistent_workers=True,
                        multiprocessing_context="fork")
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    ready = False
    while True:
        for x in loader:
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if not ready:
                ready = True
                print("ready", flush=True)


if __name__ == "__main__":
    main()
