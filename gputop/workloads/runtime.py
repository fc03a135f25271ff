"""What every workload shares: the device, the step counter, progress lines and stopping.

A workload builds its model and data, calls ``run.ready()``, then drives ``run.loop(step)`` or
``run.loop_loader(loader, step)``. Steps are counted when the device has finished them (a CUDA
event per step, queried without blocking), so steps/s is real throughput even though the CPU
queues work ahead. A reporter thread prints a rate line every second whether or not the main
thread makes progress, which is how a stuck job shows ``steps_per_s=0``.
"""

from __future__ import annotations

import collections
import importlib
import contextlib
import os
import signal
import sys
import threading
import time
from typing import Callable, Iterable, Iterator, TextIO

import torch

from . import protocol

# Reporting period; the harness measures over windows of several of these.
RATE_INTERVAL_S = 1.0
# After --duration, a main thread that has not returned (a save in progress, a deadlock) is
# interrupted this much later, so a workload never outlives its duration by more than this.
OVERRUN_GRACE_S = 3.0


class Stop(BaseException):
    """Raised in the main thread by SIGTERM/SIGINT or by the duration watchdog."""


def resolve_device(requested: str) -> torch.device:
    """``auto`` means CUDA when torch sees a GPU, else CPU. Raises ValueError for cuda without one."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA GPU")
    if requested not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {requested!r} (auto, cpu or cuda)")
    return torch.device(requested)


class Run:
    def __init__(
        self,
        scenario: str,
        device: torch.device,
        duration: float | None = None,
        max_steps: int | None = None,
        out: TextIO | None = None,
        tmpdir: str | None = None,
        exit_with_parent: bool = False,
    ) -> None:
        self.scenario = scenario
        # The parent at start: when it changes we were orphaned (the demo or harness died).
        self._parent = os.getppid() if exit_with_parent else None
        self.device = device
        self.is_cuda = device.type == "cuda"
        self.duration = duration
        self.max_steps = max_steps
        self.tmpdir = tmpdir
        self._out = out or sys.stdout
        self._print_lock = threading.Lock()
        self.dispatched = 0
        self.completed = 0
        self._pending: collections.deque[tuple[int, torch.cuda.Event]] = collections.deque()
        self.t_ready: float | None = None  # monotonic
        self.cpu_ready: float | None = None  # process CPU time (all threads) at ready
        self._deadline: float | None = None
        self._finished = threading.Event()
        self._watchdog_fired = False
        self.phases: dict[str, float] = collections.defaultdict(float)
        self._reporter: threading.Thread | None = None
        self.extra: dict[str, object] = {}  # scenario facts for the done line

    # ----------------------------------------------------------------- output

    def emit(self, kind: str, **fields: object) -> None:
        line = protocol.format_line(kind, **fields)
        with self._print_lock:
            try:
                self._out.write(line + "\n")
                self._out.flush()
            except (BrokenPipeError, ValueError):
                pass  # nobody is reading any more; keep training until stopped

    def note(self, message: str) -> None:
        self.emit(protocol.NOTE, msg=message)

    # ----------------------------------------------------------------- lifecycle

    def ready(self, **facts: object) -> None:
        """Set-up is done: print the ready line and start the clock and the reporter."""
        self.t_ready = time.monotonic()
        self.cpu_ready = time.process_time()
        if self.duration is not None:
            self._deadline = self.t_ready + self.duration
        self.emit(
            protocol.READY,
            scenario=self.scenario,
            device=self.device.type,
            pid=os.getpid(),
            **facts,
        )
        self._reporter = threading.Thread(target=self._report_loop, name="workload-reporter", daemon=True)
        self._reporter.start()

    def warm_up(self, step: Callable[..., None], *args: object) -> None:
        """One step before ``ready``, not counted: cuBLAS handles, optimizer state and the
        allocator's first blocks are set up here, not inside the measured window."""
        step(*args)
        if self.is_cuda:
            torch.cuda.synchronize()
        self.phases.clear()
        self.extra.clear()

    def should_stop(self) -> bool:
        if self.max_steps is not None and self.dispatched >= self.max_steps:
            return True
        return self._deadline is not None and time.monotonic() >= self._deadline

    def step_done(self) -> None:
        self.dispatched += 1
        if self.is_cuda:
            ev = torch.cuda.Event()
            ev.record()
            self._pending.append((self.dispatched, ev))
        else:
            self.completed = self.dispatched

    def _drain_completed(self) -> int:
        # Runs on the reporter thread: popleft/append on a deque are atomic, query() never blocks.
        while self._pending:
            n, ev = self._pending[0]
            if not ev.query():
                break
            self._pending.popleft()
            self.completed = n
        return self.completed

    def _report_loop(self) -> None:
        last_t, last_n = time.monotonic(), 0
        while not self._finished.wait(RATE_INTERVAL_S):
            now = time.monotonic()
            n = self._drain_completed()
            rate = (n - last_n) / (now - last_t) if now > last_t else 0.0
            self.emit(protocol.RATE, t=time.time(), steps=n, steps_per_s=round(rate, 3))
            last_t, last_n = now, n
            orphaned = self._parent is not None and os.getppid() != self._parent
            if orphaned or (self._deadline is not None and now > self._deadline + OVERRUN_GRACE_S):
                self._watchdog_fired = not orphaned
                # A real signal (not interrupt_main) so a main thread blocked in a queue wakes up.
                signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
                return

    def finish(self, reason: str) -> None:
        """Stop the reporter, wait for queued GPU work, print the summary line."""
        self._finished.set()
        if self._reporter is not None and self._reporter is not threading.current_thread():
            self._reporter.join(timeout=2 * RATE_INTERVAL_S)  # no rate line after the done line
        if self._watchdog_fired and reason == "signal":
            reason = "duration"
        if self.is_cuda and reason != "signal":
            torch.cuda.synchronize()
            self._pending.clear()
            self.completed = self.dispatched
        else:
            self._drain_completed()
        elapsed = time.monotonic() - self.t_ready if self.t_ready is not None else 0.0
        fields: dict[str, object] = {
            "scenario": self.scenario,
            "steps": self.completed,
            "seconds": round(elapsed, 3),
            "steps_per_s": round(self.completed / elapsed, 3) if elapsed > 0 else 0.0,
            "reason": reason,
        }
        if self.cpu_ready is not None:
            # CPU seconds this process (every thread, not its loader workers) spent since ready:
            # steps per CPU second do not depend on how much of the machine others take.
            fields["cpu_s"] = round(time.process_time() - self.cpu_ready, 3)
        for name, spent in sorted(self.phases.items()):
            fields[f"frac_{name}"] = round(spent / elapsed, 4) if elapsed > 0 else 0.0
        if self.is_cuda:
            fields["max_mem_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 3)
        fields.update(self.extra)
        self.emit(protocol.DONE, **fields)

    # ----------------------------------------------------------------- loops

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time spent in a named phase (data, sync, h2d, ckpt), reported as a fraction at the end."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] += time.perf_counter() - t0

    def loop(self, step: Callable[[int], None]) -> None:
        """Call ``step(i)`` until the duration or step limit is reached."""
        i = 0
        while not self.should_stop():
            step(i)
            self.step_done()
            i += 1

    def loop_loader(
        self,
        loader: Iterable,
        step: Callable[[object], None],
        ready: dict[str, object] | None = None,
        on_exit: Callable[[], None] | None = None,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        """Start the loader, report ready, then train batch by batch (epoch after epoch),
        timing the wait for each batch as the "data" phase.

        The workers are started and the first batch made before ``ready``: worker start-up
        (a fork server importing torch, say) is set-up, not a data stall. ``on_exit`` runs
        before the workers are shut down (the stuck scenario releases its blocked workers
        there, so shutdown does not wait on them).
        """
        it = None
        try:
            it = iter(loader)
            pending = [next(it)]
            self.ready(**(ready or {}))
            if on_ready is not None:
                on_ready()
            while True:
                exhausted = False
                while not self.should_stop():
                    if pending:
                        batch = pending.pop()
                    else:
                        with self.phase("data"):
                            try:
                                batch = next(it)
                            except StopIteration:
                                exhausted = True
                                break
                    step(batch)
                    self.step_done()
                if not exhausted:
                    return
                it = iter(loader)
        finally:
            if on_exit is not None:
                on_exit()
            # Shut the workers down now, not whenever the iterator happens to be collected.
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            del it


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM/SIGINT raise Stop in this process; forked loader workers die the default way."""
    main_pid = os.getpid()

    def handler(signum: int, frame: object) -> None:
        if os.getpid() != main_pid:  # a DataLoader worker inherited this handler
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise Stop(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def execute(
    scenario,
    device: torch.device,
    duration: float | None = None,
    steps: int | None = None,
    tmpdir: str | None = None,
    out: TextIO | None = None,
    exit_with_parent: bool = False,
) -> int:
    """Run one registry scenario to its end (duration, steps or a signal); prints the done line."""
    module_name, func_name = scenario.entry.split(":")
    module = importlib.import_module(f"{__package__}.{module_name}")
    func = getattr(module, func_name)
    torch.manual_seed(0)
    run = Run(
        scenario.name,
        device,
        duration=duration,
        max_steps=steps,
        out=out,
        tmpdir=tmpdir,
        exit_with_parent=exit_with_parent,
    )
    with stop_on_signals():
        try:
            func(run)
            reason = "steps" if steps is not None and run.dispatched >= steps else "duration"
        except Stop:
            reason = "signal"
        try:
            if run.t_ready is not None:
                run.finish(reason)
        except Stop:
            pass  # a second signal while summing up: just go
    return 0
