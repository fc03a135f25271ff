"""Small real PyTorch CPU training loops for the stack-sampling tests and fixtures.

Run as ``python stack_targets.py MODE [ARG]``. Each prints ``ready`` once it is inside its
loop, then runs until killed (``exit`` ends with status 3 on SIGUSR1). Lines the tests look for
end in a HOT or DEADLOCK comment, so tests and fixtures find them by text, not by number.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

torch.set_num_threads(1)  # CI has 2 cores; the sampler needs one


def ready() -> None:
    print("ready", flush=True)


class SlowDataset(Dataset):
    """Stands in for decoding/augmentation that is slower than the model."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int):
        time.sleep(self.delay)  # HOT fetch
        return torch.randn(16), torch.randn(1)


class Net(nn.Module):
    def __init__(self, width: int = 16, depth: int = 2) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        return self.head(self.body(x))  # HOT forward


def train_step(model, opt, x, y):
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def mode_loader(workers: int = 2) -> None:
    """The main process waits on the DataLoader queue: workers are the bottleneck."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowDataset(0.05), batch_size=8, num_workers=workers)
    first = True
    for x, y in loader:  # HOT data-wait
        train_step(model, opt, x, y)
        if first:
            ready()
            first = False


def mode_fetch() -> None:
    """num_workers=0: the dataset runs in the main process."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    first = True
    for x, y in DataLoader(SlowDataset(0.02), batch_size=8, num_workers=0):
        train_step(model, opt, x, y)
        if first:
            ready()
            first = False


def mode_item() -> None:
    """Reads the loss back every step. On CPU ``.item()`` itself is instant, so the matmul on
    the same line stands in for the GPU work a real ``.item()`` would wait for."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    big = torch.randn(384, 384)
    total = 0.0
    ready()
    while True:
        train_step(model, opt, x, y)
        total += (big @ big).sum().item()  # HOT host-sync


def mode_forward() -> None:
    model = Net(width=512, depth=6)
    x = torch.randn(256, 512)
    ready()
    with torch.no_grad():
        while True:
            model(x)


def mode_backward() -> None:
    model = Net(width=512, depth=6)
    x = torch.randn(256, 512)
    ready()
    while True:
        loss = model(x).square().mean()
        loss.backward()  # HOT backward


def mode_optimizer() -> None:
    params = [nn.Parameter(torch.randn(64, 64)) for _ in range(400)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.Adam(params, lr=1e-3, foreach=False)
    ready()
    while True:
        opt.step()  # HOT optimizer


def mode_checkpoint(path: str) -> None:
    model = Net(width=1024, depth=4)
    ready()
    while True:
        torch.save(model.state_dict(), path)  # HOT checkpoint-io


def mode_gc() -> None:
    junk = [[{} for _ in range(50)] for _ in range(4000)]
    ready()
    while True:
        gc.collect()  # HOT gc
        junk.append([])


def mode_h2d() -> None:
    device = "cpu"  # the CPU stand-in for a CUDA device: a real copy, same call shape
    x = torch.randn(2048, 2048)
    ready()
    while True:
        xb = x.to(device, dtype=torch.float64, non_blocking=True)  # HOT h2d-copy
        del xb


def mode_sleep() -> None:
    ready()
    while True:
        time.sleep(0.5)  # HOT idle


def mode_python() -> None:
    """Pure-Python bookkeeping in the loop (metrics, logging): 'other'."""
    ready()
    n = 0
    while True:
        n = sum(i * i for i in range(20000)) + n % 7  # HOT other


def mode_collective() -> None:
    """Rank 0 waits in a barrier for rank 1, which never comes (gloo, two processes)."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    mp.spawn(_collective_rank, nprocs=2, join=True)
    del dist


def _collective_rank(rank: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=2)
    if rank == 1:
        time.sleep(3600)
    ready()
    dist.barrier()  # HOT collective


def mode_deadlock() -> None:
    """Trains, then deadlocks: the main thread and a helper take two locks in opposite order."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    for _ in range(20):
        train_step(model, opt, x, y)
    lock_a, lock_b = threading.Lock(), threading.Lock()
    both_hold_one = threading.Barrier(2)

    def helper() -> None:
        with lock_b:
            both_hold_one.wait()
            with lock_a:
                pass

    threading.Thread(target=helper, name="metrics-writer", daemon=True).start()
    ready()
    with lock_a:
        both_hold_one.wait()
        with lock_b:  # DEADLOCK
            pass


def mode_exit() -> None:
    """Trains until SIGUSR1, then exits with status 3 (a crash the monitor must report)."""
    import signal

    stop = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: stop.set())
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    ready()
    while not stop.is_set():
        train_step(model, opt, x, y)
        time.sleep(0.01)
    sys.exit(3)


# --------------------------------------------------------------------------- hung before attach
# Each of these hangs at once and prints ``ready`` when it is hung (or, for the healthy ones,
# working): the tests attach afterwards, as a user finds a job that stopped hours ago.


class Callbacks:
    """A trainer's callback list, in the shape of the frameworks': the step calls its hooks on
    the main thread while a helper thread flushes metrics, and each takes the two locks in the
    other order."""

    def __init__(self) -> None:
        self.state_lock = threading.Lock()
        self.log_lock = threading.Lock()
        self.both_hold_one = threading.Barrier(2)

    def on_step_end(self) -> None:
        with self.state_lock:
            self.both_hold_one.wait()
            with self.log_lock:  # DEADLOCK callback main
                pass

    def flush_metrics(self) -> None:
        with self.log_lock:
            self.both_hold_one.wait()
            with self.state_lock:  # DEADLOCK callback helper
                pass


def mode_callback_deadlock() -> None:
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    cb = Callbacks()
    for _ in range(5):
        train_step(model, opt, x, y)
    threading.Thread(target=cb.flush_metrics, name="metrics-flusher", daemon=True).start()
    threading.Timer(1.0, ready).start()
    cb.on_step_end()


class SocketDataset(Dataset):
    """Each sample comes from a server that accepts the connection and never answers."""

    def __init__(self, address) -> None:
        self.address = address

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int):
        import socket

        conn = socket.create_connection(self.address)
        data = conn.recv(1 << 16)  # HUNG socket recv
        return torch.randn(16), torch.tensor([len(data)], dtype=torch.float32)


def mode_socket_workers() -> None:
    import socket

    server = socket.create_server(("127.0.0.1", 0), backlog=64)  # accepts (the kernel does), never sends
    loader = DataLoader(SocketDataset(server.getsockname()), batch_size=4, num_workers=2)
    threading.Timer(3.0, ready).start()
    for x, y in loader:  # HUNG main loader
        pass


class HangingDataset(Dataset):
    """``__getitem__`` waits on an event nothing sets (a lock or a resource that never comes)."""

    def __init__(self) -> None:
        self.never = threading.Event()

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int):
        self.never.wait()  # HUNG getitem
        return torch.randn(16), torch.randn(1)


def mode_hung_worker() -> None:
    loader = DataLoader(HangingDataset(), batch_size=4, num_workers=2)
    threading.Timer(3.0, ready).start()
    for x, y in loader:
        pass


class BusyDataset(Dataset):
    """A slow sample that computes all the time (decoding in pure Python): slow, not stuck."""

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int):
        end = time.time() + 30.0
        while time.time() < end: pass  # noqa: E701  HOT slow getitem
        return torch.randn(16), torch.randn(1)


def mode_slow_getitem() -> None:
    threading.Timer(1.0, ready).start()
    for x, y in DataLoader(BusyDataset(), batch_size=1, num_workers=0):
        pass


def mode_long_save(path: str) -> None:
    """One long save: many tensors written to disk, flushed to the device as it goes."""
    state = {f"layer{i}": torch.randn(256, 1024) for i in range(64)}  # 64 MiB
    threading.Timer(1.0, ready).start()
    while True:
        with open(path, "wb") as f:
            for _ in range(1000):
                torch.save(state, f)  # HOT long save
                f.flush()
                os.fsync(f.fileno())
                f.seek(0)


def mode_fifo_read(path: str) -> None:
    """Reads its next batch from a FIFO whose writer opened it and then stopped writing."""
    os.mkfifo(path)
    writer = os.open(path, os.O_RDWR)  # keeps a writer on the FIFO, so the read blocks for ever
    threading.Timer(1.0, ready).start()
    with open(path, "rb") as f:
        f.read(4096)  # HUNG fifo read
    del writer


def mode_child_wait() -> None:
    """Waits for a preprocessing child process that never finishes."""
    import subprocess

    child = subprocess.Popen(["sleep", "3600"])
    threading.Timer(1.0, ready).start()
    child.wait()  # HUNG child wait


def mode_collective_pid() -> None:
    """mode_collective, rank 0 saying its PID first (rank 1 never reaches the barrier)."""
    import torch.multiprocessing as mp

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    mp.spawn(_collective_rank_pid, nprocs=2, join=True)


def _collective_rank_pid(rank: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=2)
    if rank == 1:
        time.sleep(3600)
    print(f"rank0 {os.getpid()}", flush=True)
    ready()
    dist.barrier()  # HUNG barrier


# --------------------------------------------------------------------------- reading a tensor back
# On a GPU each of these waits for the device; on CPU the matmul on the same line stands in for
# the work a real read-back would wait for, as in ``mode_item``.


def mode_print_tensor() -> None:
    """Prints the loss tensor each step (to nowhere): formatting reads the tensor back."""
    out = open(os.devnull, "w")
    big = torch.randn(256, 256)
    ready()
    while True:
        print(big @ big, file=out)  # HOT print-tensor


def mode_float_sync() -> None:
    """``float(loss)`` each step, the spelling of ``.item()`` that has no method call."""
    big = torch.randn(384, 384)
    total = 0.0
    ready()
    while True:
        total += float((big @ big).sum())  # HOT float-sync


if __name__ == "__main__":
    mode = sys.argv[1]
    arg = sys.argv[2] if len(sys.argv) > 2 else None
    if mode == "loader":
        mode_loader(int(arg or 2))
    elif mode == "checkpoint":
        mode_checkpoint(arg or os.devnull)
    elif mode == "long_save":
        mode_long_save(arg or os.devnull)
    elif mode == "fifo_read":
        mode_fifo_read(arg)
    else:
        globals()[f"mode_{mode}"]()
