#!/usr/bin/env python3
"""How much CPU do GPU monitors themselves use while a training-like GPU load runs?

Measures the whole process tree of each monitor (CPU seconds per wall second, as % of one
core) from psutil's cpu_times, over the same window for each, with a bf16 torch MLP loop
keeping the GPU busy in a separate process (not measured):

  gputop   ``python -m gputop`` (the real UI) in a 120x40 pseudo-terminal, default interval
  nvitop   in a 120x40 pseudo-terminal at its default interval (if installed)
  dmon     ``nvidia-smi dmon -d 1`` in a pseudo-terminal
  gputop-advisor (on request) gputop with its Advisor tab open (``2`` typed after a second)

``--headless-only`` instead measures gputop's collection without the UI, for the breakdown:
NvmlSource alone, HostSource alone, and the full pipeline (sources + store) as the UI runs it,
each polled at the interval in a child process, with per-poll wall times.

Usage (about 75 s for the monitors, 65 s for --headless-only; --with-headless does both):
    python bench/monitor_cpu.py --out DIR
    python bench/monitor_cpu.py --out DIR --headless-only
Writes DIR/monitor_cpu.json and DIR/monitor_cpu.md.

Without a GPU (checking the script itself): ``--tools gputop --gputop-args "--fake 2"`` and
``--headless-only --headless-fake 2``; the load is skipped and the report says so.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import pty
import re
import select
import shlex
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
COLS, ROWS = 120, 40
SNAPSHOT_S = 1.0  # how often the process tree's CPU time is read
BUCKET_S = 5.0  # spread: CPU % over consecutive windows this long
STOP_GRACE_S = 3.0
LOAD_READY_TIMEOUT_S = 120.0

ALL_TOOLS = ("gputop", "nvitop", "dmon")
# Extra tool names: gputop with keys typed a second after it starts (the Advisor tab open).
EXTRA_TOOLS = {"gputop-advisor": ("gputop", b"2")}
KEYS_AFTER_S = 1.0
HEADLESS_MODES = ("nvml", "host", "pipeline")

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[()][A-Za-z0-9]|\x1b[=>78cM]")

# A GPU load like a transformer block's MLP in bf16: tensor cores busy, the host nearly idle.
LOAD_CODE = r"""
import sys, time
deadline = time.time() + float(sys.argv[1])
try:
    import torch
except Exception as exc:
    print("NOLOAD torch not importable: %s" % exc, flush=True); sys.exit(3)
if not torch.cuda.is_available():
    print("NOLOAD no CUDA device", flush=True); sys.exit(3)
torch.manual_seed(0)
x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
w1 = torch.randn(4096, 16384, device="cuda", dtype=torch.bfloat16) * 0.01
w2 = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16) * 0.01
for _ in range(3):
    y = torch.relu(x @ w1) @ w2
torch.cuda.synchronize()
print("READY %s" % torch.cuda.get_device_name(0), flush=True)
steps = 0
while time.time() < deadline:
    y = torch.relu(x @ w1) @ w2
    steps += 1
    if steps % 20 == 0:
        torch.cuda.synchronize()  # keep the launch queue short, as a training step would
"""


# ----------------------------------------------------------------------------- measuring CPU


def _tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root] + root.children(recursive=True)
    except psutil.Error:
        return [root]


def tree_cpu(root: psutil.Process, seen: dict[tuple[int, float], float]) -> float:
    """CPU seconds the tree has used so far, including children that exited (reaped)."""
    for p in _tree(root):
        try:
            with p.oneshot():
                t = p.cpu_times()
                key = (p.pid, p.create_time())
            seen[key] = t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass  # gone: its last reading stays in ``seen``
    return sum(seen.values())


@dataclass
class Window:
    cpu_pct: float | None = None  # % of one core over the window
    window_s: float = 0.0
    spread_pct: list[float] = field(default_factory=list)  # per BUCKET_S window
    gpu_util_mean: float | None = None


def measure(root: psutil.Process, start_at: float, end_at: float, gpu_util=None, alive=None) -> Window:
    """Read the tree's CPU at start_at, every SNAPSHOT_S, and at end_at (monotonic times)."""
    seen: dict[tuple[int, float], float] = {}
    _sleep_until(start_at)
    t0 = time.monotonic()
    c0 = tree_cpu(root, seen)
    points = [(t0, c0)]
    utils: list[float] = []
    while True:
        now = time.monotonic()
        if now >= end_at or (alive is not None and not alive()):
            break
        _sleep_until(min(end_at, now + SNAPSHOT_S))
        points.append((time.monotonic(), tree_cpu(root, seen)))
        if gpu_util is not None:
            u = gpu_util()
            if u is not None:
                utils.append(u)
    t1, c1 = points[-1]
    w = Window(window_s=round(t1 - t0, 2))
    if t1 - t0 > 0.5:
        w.cpu_pct = round(100.0 * (c1 - c0) / (t1 - t0), 2)
    i = 0
    while i < len(points) - 1:  # consecutive buckets of ~BUCKET_S
        j = i
        while j < len(points) - 1 and points[j][0] - points[i][0] < BUCKET_S - 0.01:
            j += 1
        if points[j][0] - points[i][0] >= BUCKET_S - 0.01:
            w.spread_pct.append(round(100.0 * (points[j][1] - points[i][1]) / (points[j][0] - points[i][0]), 2))
        i = j if j > i else i + 1
    if utils:
        w.gpu_util_mean = round(statistics.fmean(utils), 1)
    return w


def _sleep_until(t: float) -> None:
    d = t - time.monotonic()
    if d > 0:
        time.sleep(d)


# ----------------------------------------------------------------------------- a tool in a pty


def _become_terminal_owner() -> None:  # runs in the child between fork and exec
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class PtyRun:
    """A command on a COLSxROWS pseudo-terminal whose output is read (and dropped) all along.

    A reader must drain the terminal continuously: a full pty buffer blocks the app.
    """

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                env=env,
                cwd=str(ROOT),
                close_fds=True,
                preexec_fn=_become_terminal_owner,
            )
        except BaseException:
            os.close(master)
            os.close(slave)
            raise
        os.close(slave)
        self._master = master
        self.bytes = 0
        self._tail = b""
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([self._master], [], [], 0.2)
                if not ready:
                    continue
                data = os.read(self._master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                return
            if not data:
                return
            self.bytes += len(data)
            self._tail = (self._tail + data)[-8192:]

    def send(self, data: bytes) -> None:
        try:
            os.write(self._master, data)
        except OSError:
            pass

    def tail_text(self, n: int = 400) -> str:
        text = _ANSI.sub("", self._tail.decode("utf-8", "replace"))
        text = re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", " ", text)
        return " ".join(text.split())[-n:]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, STOP_GRACE_S)):
                try:
                    os.killpg(self.proc.pid, sig)  # its own session: this tool's processes only
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        # The child is gone: the reader drains what the terminal still holds and ends at EIO. Told
        # to stop first, it could leave the last of the output unread (a loaded machine's flake).
        self._reader.join(2.0)
        self._stop.set()
        self._reader.join(1.0)
        try:
            os.close(self._master)
        except OSError:
            pass
        return self.proc.returncode


# ----------------------------------------------------------------------------- tools


@dataclass
class Result:
    tool: str
    interval: str
    status: str = "ok"  # ok | not installed | failed
    cmd: str = ""
    cpu_pct: float | None = None
    spread_pct: list[float] = field(default_factory=list)
    window_s: float = 0.0
    gpu_util_mean: float | None = None
    output_bytes_per_s: float | None = None
    notes: str = ""
    polls: dict = field(default_factory=dict)  # headless: per-source poll wall times
    calls: dict = field(default_factory=dict)  # headless nvml: per-metric NVML wall and CPU time


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(TERM="xterm-256color", COLUMNS=str(COLS), LINES=str(ROWS), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("NO_COLOR", None)
    return env


def tool_command(tool: str, gputop_args: str) -> tuple[list[str] | None, str, str]:
    """(argv or None when missing, interval label, note)."""
    if tool == "gputop":
        from_args = _interval_in(gputop_args)
        from gputop.cli import DEFAULT_INTERVAL

        label = f"{from_args} s" if from_args else f"{DEFAULT_INTERVAL:g} s (default)"
        return [sys.executable, "-m", "gputop", *shlex.split(gputop_args)], label, ""
    if tool == "nvitop":
        exe = shutil.which("nvitop")
        if exe:
            return [exe], "2 s (default)", ""
        import importlib.util

        if importlib.util.find_spec("nvitop") is not None:
            return [sys.executable, "-m", "nvitop"], "2 s (default)", ""
        return None, "2 s (default)", "not installed"
    if tool == "dmon":
        exe = shutil.which("nvidia-smi")
        if exe:
            return [exe, "dmon", "-d", "1"], "1 s", ""
        return None, "1 s", "not installed (no nvidia-smi on PATH)"
    raise ValueError(tool)


def _interval_in(args: str) -> str | None:
    parts = shlex.split(args)
    for i, a in enumerate(parts):
        if a in ("-i", "--interval") and i + 1 < len(parts):
            return parts[i + 1]
        if a.startswith("--interval="):
            return a.split("=", 1)[1]
    return None


def run_tool(tool: str, args: argparse.Namespace, gpu_util) -> Result:
    base, keys = EXTRA_TOOLS.get(tool, (tool, b""))
    argv, label, note = tool_command(base, args.gputop_args)
    res = Result(tool=tool, interval=label)
    if argv is None:
        res.status, res.notes = "not installed", note
        return res
    # Program names without the directory they were found in: the report is about the tools.
    shown = ["python" if a == sys.executable else (os.path.basename(a) if n == 0 else a) for n, a in enumerate(argv)]
    res.cmd = " ".join(shlex.quote(a) for a in shown)
    try:
        run = PtyRun(argv, _env())
    except OSError as exc:
        res.status, res.notes = "failed", f"could not start: {exc}"
        return res
    started = time.monotonic()
    if keys:
        threading.Timer(KEYS_AFTER_S, run.send, args=(keys,)).start()
        res.notes = f"keys typed after {KEYS_AFTER_S:g} s: {keys.decode()!r}"
    try:
        root = psutil.Process(run.proc.pid)
        b0 = run.bytes
        w = measure(root, started + args.warmup, started + args.duration, gpu_util, alive=run.alive)
        b1 = run.bytes
    except psutil.Error as exc:
        w, b0, b1 = Window(), 0, 0
        res.notes = f"could not measure: {exc}"
    exited_early = not run.alive()
    rc = run.stop()
    if exited_early or w.cpu_pct is None:
        res.status = "failed"
        res.notes = f"exited early (code {rc}): {run.tail_text()}" if exited_early else (res.notes or "no measurement")
        return res
    res.cpu_pct, res.spread_pct, res.window_s, res.gpu_util_mean = w.cpu_pct, w.spread_pct, w.window_s, w.gpu_util_mean
    res.output_bytes_per_s = round((b1 - b0) / w.window_s, 1) if w.window_s else None
    if res.output_bytes_per_s is not None and res.output_bytes_per_s < 1:
        res.notes = "drew nothing during the window: " + run.tail_text(200)
    return res


# ----------------------------------------------------------------------------- headless (child side)


def headless_child(mode: str, duration: float, interval: float, fake: int | None, out: str) -> int:
    sys.path.insert(0, str(ROOT))
    times: dict[str, list[float]] = {}
    report: dict = {"mode": mode}

    def timed(name: str, fn):
        bucket = times.setdefault(name, [])

        def wrapper():
            t = time.perf_counter()
            try:
                return fn()
            finally:
                bucket.append(time.perf_counter() - t)

        return wrapper

    try:
        if mode == "pipeline":
            from gputop.session import Config, open_live

            session = open_live(Config(interval=interval, fake=fake, advisor=False))
            for src in session.pipeline.sources:
                src.poll = timed(src.name, src.poll)  # type: ignore[method-assign]
            if session.gpu is None and fake is None:
                report["note"] = "no NVML source (NVML unavailable): host only"
            session.pipeline.start()
            time.sleep(duration)
            session.pipeline.stop()
        else:
            if mode == "nvml":
                from gputop.session import _gpu_source

                src, notes = _gpu_source(interval, fake, time.time)
                if src is None:
                    raise RuntimeError(notes[-1].message if notes else "NVML unavailable")
                if hasattr(src, "_get"):
                    src._get = _per_call_costs(src._get, report.setdefault("calls", {}))  # type: ignore[attr-defined]
            else:
                from gputop.sources.host import HostSource

                src = HostSource(interval=interval)
            poll = timed(src.name, src.poll)
            end = time.monotonic() + duration
            next_at = time.monotonic()
            while time.monotonic() < end:
                poll()
                next_at += interval
                _sleep_until(min(next_at, end))
            src.close()
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
    for key, c in report.get("calls", {}).items():
        n = max(1, len(times.get("nvml", ())))
        c["cpu_ms_per_poll"] = round(c.pop("cpu_s") * 1000 / n, 3)
        c["wall_ms_per_poll"] = round(c.pop("wall_s") * 1000 / n, 3)
    report["polls"] = {
        name: {
            "n": len(v),
            "median_ms": round(statistics.median(v) * 1000, 3),
            "p95_ms": round(sorted(v)[max(0, int(len(v) * 0.95) - 1)] * 1000, 3),
            "max_ms": round(max(v) * 1000, 3),
        }
        for name, v in times.items()
        if v
    }
    Path(out).write_text(json.dumps(report))
    return 0


def _per_call_costs(get, calls: dict):
    """Wrap NvmlSource._get: wall and CPU (this thread) time per metric key, summed."""

    def wrapper(g, key, fn, *args, **kwargs):
        w, c = time.perf_counter(), time.thread_time()
        try:
            return get(g, key, fn, *args, **kwargs)
        finally:
            entry = calls.setdefault(key, {"n": 0, "cpu_s": 0.0, "wall_s": 0.0})
            entry["n"] += 1
            entry["cpu_s"] += time.thread_time() - c
            entry["wall_s"] += time.perf_counter() - w

    return wrapper


def run_headless(mode: str, args: argparse.Namespace, gpu_util) -> Result:
    label = f"{args.interval:g} s"
    res = Result(tool=f"headless {mode}", interval=label)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "child.json")
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--_child",
            mode,
            "--_child-out",
            out,
            "--duration",
            str(args.duration),
            "--interval",
            str(args.interval),
        ]
        if args.headless_fake is not None:
            cmd += ["--headless-fake", str(args.headless_fake)]
        what = {
            "nvml": "NvmlSource.poll() in a loop",
            "host": "HostSource.poll() in a loop",
            "pipeline": "session.open_live() without the advisor: sources on their threads + store, no UI",
        }[mode]
        res.cmd = f"{what}, every {args.interval:g} s" + (
            f", fake GPUs: {args.headless_fake}" if args.headless_fake is not None else ""
        )
        proc = subprocess.Popen(cmd, cwd=str(ROOT), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        started = time.monotonic()
        try:
            w = measure(
                psutil.Process(proc.pid),
                started + args.warmup,
                started + args.duration,
                gpu_util,
                alive=lambda: proc.poll() is None,
            )
        except psutil.Error as exc:
            w = Window()
            res.notes = f"could not measure: {exc}"
        try:
            _, err = proc.communicate(timeout=args.duration + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        report = {}
        if os.path.exists(out):
            report = json.loads(Path(out).read_text())
    res.polls = report.get("polls", {})
    res.calls = report.get("calls", {})
    if report.get("error") or proc.returncode or w.cpu_pct is None:
        res.status = "failed"
        res.notes = report.get("error") or (err.decode(errors="replace").strip().splitlines() or ["no result"])[-1]
        return res
    res.cpu_pct, res.spread_pct, res.window_s, res.gpu_util_mean = w.cpu_pct, w.spread_pct, w.window_s, w.gpu_util_mean
    notes = [report["note"]] if report.get("note") else []
    for name, p in res.polls.items():
        notes.append(f"{name} poll {p['median_ms']:.2f} ms median, {p['max_ms']:.1f} ms max ({p['n']} polls)")
    res.notes = "; ".join(notes)
    return res


# ----------------------------------------------------------------------------- load and machine


class Load:
    """The GPU load in its own process; absent (with the reason) when there is no CUDA."""

    def __init__(self, seconds: float) -> None:
        self.note = ""
        self.device = None
        self.proc: subprocess.Popen | None = None
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", LOAD_CODE, str(seconds)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        except OSError as exc:
            self.note = f"load not started: {exc}"
            return
        line = self._first_line(LOAD_READY_TIMEOUT_S)
        if line.startswith("READY"):
            self.device = line[len("READY") :].strip()
            self.note = f"bf16 MLP loop (8192x4096 @ 4096x16384 @ 16384x4096) on {self.device}"
        else:
            self.stop()
            reason = line[len("NOLOAD") :].strip() if line.startswith("NOLOAD") else (line or "no answer")
            self.note = f"no GPU load ({reason}): monitors measured on an idle machine"

    def _first_line(self, timeout: float) -> str:
        assert self.proc and self.proc.stdout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if ready:
                line = self.proc.stdout.readline()
                if not line:
                    return ""
                if line.startswith(("READY", "NOLOAD")):
                    return line.strip()
            elif self.proc.poll() is not None:
                return ""
        return "timed out"

    @property
    def running(self) -> bool:
        return self.device is not None and self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()


class GpuProbe:
    """The parent's own NVML handle: machine facts and GPU 0's utilisation during each window."""

    def __init__(self) -> None:
        self.nv = None
        self.handle = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:
            self.nv = None

    def util(self) -> float | None:
        if self.nv is None:
            return None
        try:
            return float(self.nv.nvmlDeviceGetUtilizationRates(self.handle).gpu)
        except Exception:
            return None

    def machine(self) -> dict:
        info: dict = {
            "cores": os.cpu_count(),
            "cpu": _cpu_model(),
            "python": platform.python_version(),
            "psutil": psutil.__version__,
            "platform": platform.platform(),
        }
        if self.nv is not None:
            nv = self.nv
            for key, fn in (
                ("gpu", lambda: nv.nvmlDeviceGetName(self.handle)),
                ("gpu_count", nv.nvmlDeviceGetCount),
                ("driver", nv.nvmlSystemGetDriverVersion),
            ):
                try:
                    v = fn()
                    info[key] = v.decode() if isinstance(v, bytes) else v
                except Exception:
                    pass
        else:
            info["gpu"] = "none (NVML unavailable)"
        return info

    def close(self) -> None:
        if self.nv is not None:
            try:
                self.nv.nvmlShutdown()
            except Exception:
                pass


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# ----------------------------------------------------------------------------- report


def write_report(out_dir: Path, data: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "monitor_cpu.json").write_text(json.dumps(data, indent=2))
    m = data["machine"]
    gpu = f"{m.get('gpu', '?')} x{m.get('gpu_count', '?')}, driver {m.get('driver', '?')}" if "driver" in m else m.get("gpu")
    lines = [
        "# Monitor CPU cost",
        "",
        f"Machine: {gpu}; {m.get('cores')} cores ({m.get('cpu')}); Python {m.get('python')}.",
        f"GPU load: {data['load']}.",
        f"Each tool ran {data['params']['duration']:g} s; the first {data['params']['warmup']:g} s are left out. "
        "CPU is the whole process tree (user + system, children included), as % of one core; "
        f"spread = the same over consecutive {BUCKET_S:g} s windows. CPU times tick in 10 ms, so over "
        f"{data['params']['duration'] - data['params']['warmup']:g} s the resolution is about "
        f"{1.0 / (data['params']['duration'] - data['params']['warmup']):.2f} %.",
        "",
        "| tool | interval | CPU % of one core | spread (min-max) | GPU util % | notes |",
        "|---|---|---|---|---|---|",
    ]
    for r in data["results"]:
        cpu = f"{r['cpu_pct']:.2f}" if r["cpu_pct"] is not None else r["status"]
        spread = f"{min(r['spread_pct']):.2f}-{max(r['spread_pct']):.2f}" if r["spread_pct"] else ""
        util = f"{r['gpu_util_mean']:.0f}" if r["gpu_util_mean"] is not None else ""
        notes = r["notes"].replace("|", "/")
        if r["output_bytes_per_s"] is not None:
            notes = (f"output {r['output_bytes_per_s'] / 1024:.1f} KiB/s; " + notes).rstrip("; ")
        lines.append(f"| {r['tool']} | {r['interval']} | {cpu} | {spread} | {util} | {notes} |")
    per_tool: dict[str, list[float]] = {}
    for r in data["results"]:
        if r["cpu_pct"] is not None:
            per_tool.setdefault(r["tool"], []).append(r["cpu_pct"])
    if any(len(v) > 1 for v in per_tool.values()):
        lines += ["", "| tool | rounds | mean CPU % | min | max |", "|---|---|---|---|---|"]
        for tool, v in per_tool.items():
            lines.append(f"| {tool} | {len(v)} | {statistics.fmean(v):.2f} | {min(v):.2f} | {max(v):.2f} |")
    for r in data["results"]:
        calls = r.get("calls") or {}
        if not calls:
            continue
        lines += [
            "",
            f"NVML calls in `{r['tool']}` ({r['interval']}), per poll, heaviest first: CPU is this thread's "
            "time (user + system), wall includes waiting on the driver.",
            "",
            "| metric | calls per poll | CPU ms | wall ms |",
            "|---|---|---|---|",
        ]
        polls = max(1, (r.get("polls") or {}).get("nvml", {}).get("n", 1))
        for key, c in sorted(calls.items(), key=lambda kv: -kv[1]["cpu_ms_per_poll"]):
            lines.append(f"| {key} | {c['n'] / polls:.1f} | {c['cpu_ms_per_poll']:.3f} | {c['wall_ms_per_poll']:.3f} |")
    cmds = dict.fromkeys(f"{r['tool']}: `{r['cmd']}`" for r in data["results"] if r["cmd"])
    lines += ["", "Command lines: " + "; ".join(cmds)]
    (out_dir / "monitor_cpu.md").write_text("\n".join(lines) + "\n")


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench-results", help="directory for monitor_cpu.json / .md")
    p.add_argument("--duration", type=float, default=20.0, help="seconds each tool runs (default 20)")
    p.add_argument("--warmup", type=float, default=3.0, help="first seconds left out (default 3)")
    p.add_argument("--tools", default=",".join(ALL_TOOLS), help="comma list of: " + ", ".join((*ALL_TOOLS, *EXTRA_TOOLS)))
    p.add_argument("--rounds", type=int, default=1, help="run the tool list this many times, interleaved")
    p.add_argument("--gputop-args", default="", help='extra arguments for gputop, e.g. "--fake 2"')
    p.add_argument("--headless-only", action="store_true", help="measure the collection pipeline without a UI")
    p.add_argument("--with-headless", action="store_true", help="the monitors, then the headless breakdown")
    p.add_argument("--headless-fake", type=int, default=None, metavar="N", help="headless runs use N fake GPUs")
    p.add_argument("--interval", type=float, default=1.0, help="headless poll interval (default 1)")
    p.add_argument("--no-load", action="store_true", help="do not start the GPU load")
    p.add_argument("--_child", choices=HEADLESS_MODES, help=argparse.SUPPRESS)
    p.add_argument("--_child-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.duration <= args.warmup + 1:
        p.error("--duration must be more than --warmup + 1 s")
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    bad = [t for t in tools if t not in ALL_TOOLS and t not in EXTRA_TOOLS]
    if bad:
        p.error(f"unknown tool(s): {', '.join(bad)} (choose from {', '.join((*ALL_TOOLS, *EXTRA_TOOLS))})")
    args.tool_list = tools
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args._child:
        return headless_child(args._child, args.duration, args.interval, args.headless_fake, args._child_out)

    plan: list[tuple[str, str]] = []
    if not args.headless_only:
        plan += [("tool", t) for _ in range(max(1, args.rounds)) for t in args.tool_list]
    if args.headless_only or args.with_headless:
        plan += [("headless", m) for m in HEADLESS_MODES]
    budget = len(plan) * (args.duration + 2 * STOP_GRACE_S) + 60

    probe = GpuProbe()
    load = None
    load_note = "none (--no-load)"
    if not args.no_load:
        print("starting the GPU load ...", flush=True)
        load = Load(budget)
        load_note = load.note
    print(f"load: {load_note}", flush=True)

    results: list[Result] = []
    try:
        for kind, name in plan:
            print(f"measuring {kind} {name} for {args.duration:g} s ...", flush=True)
            try:
                r = run_tool(name, args, probe.util) if kind == "tool" else run_headless(name, args, probe.util)
            except Exception as exc:  # one tool's trouble must not lose the others' numbers
                r = Result(tool=name, interval="", status="failed", notes=f"{type(exc).__name__}: {exc}")
            if load is not None and load.device is not None and not load.running:
                r.notes = (r.notes + "; " if r.notes else "") + "GPU load had stopped"
            results.append(r)
            shown = f"{r.cpu_pct:.2f} % of one core" if r.cpu_pct is not None else r.status
            extra = f" ({r.notes})" if r.notes and not r.notes.startswith(r.status) else ""
            print(f"  {r.tool}: {shown}{extra}", flush=True)
    finally:
        if load is not None:
            load.stop()
        machine = probe.machine()
        probe.close()

    data = {
        "params": {
            "duration": args.duration,
            "warmup": args.warmup,
            "rounds": args.rounds,
            "gputop_args": args.gputop_args,
            "headless_interval": args.interval,
            "headless_fake": args.headless_fake,
            "pty": f"{COLS}x{ROWS} TERM=xterm-256color",
        },
        "machine": machine,
        "load": load_note,
        "results": [asdict(r) for r in results],
    }
    out = Path(args.out)
    write_report(out, data)
    print(f"wrote {out / 'monitor_cpu.json'} and {out / 'monitor_cpu.md'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
