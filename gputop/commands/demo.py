"""``gputop demo [SCENARIO]``: start a training job with a known bottleneck and watch it live."""

from __future__ import annotations

import argparse
import importlib.util
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO

from ..errors import UserError
from ..workloads import protocol, registry
from .options import add_live_options, require_terminal

DEFAULT_SCENARIO = "dataloader-starved"
# Importing torch, initialising CUDA and writing the io-bound scenario's files take a while on a
# cold machine; past this the child is considered hung.
READY_TIMEOUT_S = 180.0
# A workload finishing a checkpoint or shutting loader workers down needs a few seconds.
STOP_GRACE_S = 10.0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo",
        help="run a small training job with a known bottleneck and watch it live",
        description=(
            "Start one of the bundled PyTorch workloads as a child process and open the live UI "
            "attached to it. Without a GPU the CPU variant runs. The child is stopped on exit."
        ),
    )
    p.add_argument(
        "scenario",
        nargs="?",
        default=DEFAULT_SCENARIO,
        help=f"which workload (default {DEFAULT_SCENARIO}; see --list)",
    )
    p.add_argument("--list", action="store_true", help="describe the scenarios and exit")
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto: CUDA when torch sees a GPU, else the CPU variant (default auto)",
    )
    add_live_options(p, with_pid=False)
    p.set_defaults(func=run)


class Workload:
    """A running scenario: its process, and its progress lines read on a background thread.

    The thread keeps reading after ``ready`` so the child never blocks on a full stdout pipe.
    """

    def __init__(self, proc: subprocess.Popen, stderr_file: IO[bytes]) -> None:
        self.proc = proc
        self._stderr = stderr_file
        self._lines: queue.Queue[protocol.Line | None] = queue.Queue()
        self.last_rate: protocol.Line | None = None
        self.done: protocol.Line | None = None
        self.ready: protocol.Line | None = None
        self._reader = threading.Thread(target=self._read, name="demo-workload-reader", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for text in self.proc.stdout:
            line = protocol.parse_line(text)
            if line is None:
                continue
            if line.kind == protocol.RATE:
                self.last_rate = line
            elif line.kind == protocol.DONE:
                self.done = line
            self._lines.put(line)
        self._lines.put(None)  # end of output

    def wait_ready(self, timeout: float) -> protocol.Line:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise UserError(f"the workload did not report ready within {timeout:.0f} s")
            try:
                line = self._lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait()
                raise UserError(f"the workload exited before it was ready: {self.stderr_tail()}")
            if line.kind == protocol.READY:
                self.ready = line
                return line

    def stderr_tail(self) -> str:
        try:
            self._stderr.flush()
            self._stderr.seek(0)
            lines = [ln.strip() for ln in self._stderr.read().decode(errors="replace").splitlines()]
        except (OSError, ValueError):
            return "(no error output)"
        lines = [ln for ln in lines if ln]
        if not lines:
            return f"exit status {self.proc.returncode}"
        # The workload's own one-line error if it printed one, else the traceback's last line.
        return lines[-1].removeprefix("gputop-workload: error: ")

    def stop(self) -> None:
        """SIGTERM, then after a grace period SIGKILL for the child and whatever it started."""
        stop_process_tree(self.proc, STOP_GRACE_S)
        self._reader.join(timeout=2.0)
        self._stderr.close()


def stop_process_tree(proc: subprocess.Popen, grace_s: float) -> None:
    if proc.poll() is not None:
        return
    try:
        import psutil

        family = psutil.Process(proc.pid).children(recursive=True)
    except Exception:  # psutil missing or the child just exited: the child alone then
        family = []
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except ProcessLookupError:
        pass
    for p in family:  # loader workers left behind by a SIGKILLed parent
        try:
            if p.is_running():
                p.kill()
        except Exception:
            pass


def start_workload(name: str, device: str) -> Workload:
    cmd = [
        sys.executable,
        "-m",
        "gputop.workloads",
        name,
        "--device",
        device,
        "--exit-with-parent",
    ]
    stderr_file = tempfile.TemporaryFile(prefix="gputop-demo-")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr_file,
        text=True,
        env=env,
    )
    return Workload(proc, stderr_file)


def run(args: argparse.Namespace) -> int:
    if args.list:
        print(registry.table())
        return 0
    try:
        scenario = registry.get(args.scenario)
    except KeyError as exc:
        raise UserError(str(exc.args[0])) from None
    if importlib.util.find_spec("torch") is None:
        # README's install, from the checkout: a package index's "gputop" may be another project.
        raise UserError("the demo workloads need PyTorch: pip install '.[torch]' in the gputop checkout (without an "
                        "NVIDIA GPU, first the CPU build: pip install torch --index-url "
                        "https://download.pytorch.org/whl/cpu)")
    require_terminal()  # before the workload starts: no training job for a UI that cannot be shown

    print(f"gputop demo: starting {scenario.name} ({scenario.bottleneck}) ...", file=sys.stderr)
    work = start_workload(scenario.name, args.device)
    try:
        ready = work.wait_ready(READY_TIMEOUT_S)
        print(
            f"gputop demo: {scenario.name} running as pid {work.pid} on {ready.fields.get('device', '?')}",
            file=sys.stderr,
        )
        args.pid = work.pid
        args.demo_scenario = scenario.name
        from .live import run_live

        code = run_live(args)
    finally:
        work.stop()
    summary = work.done or work.last_rate
    if summary is not None:
        rate = summary.num("steps_per_s")
        print(
            f"gputop demo: {scenario.name} stopped after {summary.fields.get('steps', '?')} steps"
            + (f" ({rate:.3g} steps/s)" if rate is not None else ""),
            file=sys.stderr,
        )
    return int(code or 0)
