"""What every real-jobs benchmark job shares: its arguments' common part and its progress lines.

A job counts the samples it has trained on and prints, on stdout,
``gputop-workload ready pid=P`` once it is past its warm-up, then every half second
``gputop-workload rate t=T steps=N samples=M``. A job whose warm-up is itself what the advisor
should see (a long ``torch.compile``) also prints ``gputop-workload attach pid=P`` where it enters
it (``attach_point``): the bench attaches there instead of after the ready line. The bench measures a job's throughput from two of
those lines, so a change that alters the batch size is compared in samples/s, not steps/s.

Counting happens when the training step returns on the CPU: in steady state the GPU finishes
steps at the rate the CPU queues them, so over a window of several seconds the rate is the GPU's.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

RATE_EVERY_S = 0.5


class Progress:
    def __init__(self, batch_size: int, warm_s: float = 4.0, warm_steps: int = 5) -> None:
        self.batch_size = batch_size
        self.warm_s, self.warm_steps = warm_s, warm_steps
        self.steps = 0
        self.samples = 0
        self.first: float | None = None
        self.ready = False
        self._lock = threading.Lock()
        threading.Thread(target=self._report, daemon=True).start()

    def step(self, samples: int | None = None) -> None:
        now = time.time()
        with self._lock:
            self.steps += 1
            self.samples += self.batch_size if samples is None else samples
            if self.first is None:
                self.first = now
        if not self.ready and self.steps >= self.warm_steps and now - self.first >= self.warm_s:
            self.ready = True
            print(f"gputop-workload ready pid={os.getpid()}", flush=True)

    def _report(self) -> None:
        while True:
            time.sleep(RATE_EVERY_S)
            with self._lock:
                line = f"gputop-workload rate t={time.time():.3f} steps={self.steps} samples={self.samples}"
            print(line, flush=True)


def attach_point() -> None:
    """Where the bench attaches to a job marked ``attach_early``: before its warm-up ends."""
    print(f"gputop-workload attach pid={os.getpid()}", flush=True)


def parser(doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="tiny sizes, for a CPU smoke test")
    p.add_argument("--seconds", type=float, default=900.0, help="stop after this long")
    return p


def watchdog(seconds: float) -> None:
    """A job never outlives its bench run, even if the bench is killed."""
    def stop() -> None:
        time.sleep(seconds)
        os._exit(0)

    threading.Thread(target=stop, daemon=True).start()
    parent = os.getppid()

    def orphan() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=orphan, daemon=True).start()


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
