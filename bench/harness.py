#!/usr/bin/env python3
"""Run every bundled workload with and without gputop attached, and record the raw numbers.

For each scenario (gputop.workloads.registry) the workload runs once, and its time is cut into
windows, plain and attached interleaved so drift (clocks, temperature, checkpoint phase) falls on
both sides:

    ready -> warm-up -> plain (W/2) -> gputop attached (~W) -> plain (W/2) -> stop

and for each window the harness collects, itself:
  - steps/s, from the workload's own progress lines (steps the device has finished);
  - GPU: mean utilisation, the fraction of NVML's 200 ms utilisation samples below 10 %,
    GPM tensor-core and SM activity, memory used (the device's and the job's), PCIe RX;
    from gputop's NvmlSource when it imports, else from plain pynvml;
  - host: CPU busy % and iowait % (all cores), disk read rate, load average;
  - the workload's process tree: CPU % of one core (main process and workers), bytes read
    from storage.
"Attached" runs ``python -m gputop advise --pid PID --duration W --json`` when that command
exists (then the top finding and the time from attach to the expected finding are recorded),
else ``python -m gputop stacks --pid PID`` in a loop, else ``py-spy dump`` at 5 Hz; the mode and
its CPU (rusage of the whole subprocess tree, reaped children included) are recorded.

Usage (GPU machine, about 6-7 minutes for all 11 scenarios at the default window):
    python bench/harness.py --out bench/results
    python bench/harness.py --out DIR --scenarios healthy,host-sync --window 10 --device cuda
Without a GPU (checks the harness itself; GPU columns are n/a):
    python bench/harness.py --out /tmp/h --device cpu --window 3 --scenarios healthy,host-sync
Writes DIR/harness.json and DIR/harness.md. A scenario that crashes is recorded as such.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gputop.model import GpuProcess, GpuSample, UtilPoint  # noqa: E402
from gputop.workloads import protocol, registry  # noqa: E402

DEFAULT_WINDOW_S = 10.0  # plain time per scenario (two halves) and attached time
WARMUP_S = 3.0  # after "ready": allocator, cuBLAS heuristics, loader prefetch settle
# 11 scenarios x (start ~8 s + warm-up + 2 windows + stop) must fit one session's device time.
DEFAULT_BUDGET_S = 470.0
SETUP_ESTIMATE_S = 12.0  # start + stop of one workload, for the budget check
READY_TIMEOUT_S = 150.0
STOP_GRACE_S = 10.0
ATTACH_GRACE_S = 25.0  # advise's start-up and final evaluation beyond its --duration
GPU_POLL_S = 1.0
RATE_LINE_WAIT_S = 1.2  # workloads print a rate line every second
RATE_LINE_MAX_WAIT_S = 5.0  # ...but a busy machine can delay one
LOW_UTIL_PCT = 10.0  # a 200 ms utilisation sample below this counts as idle
PYSPY_HZ = 5.0
# The advisor calls a job stuck after this long without progress (its default, 30 s, is longer
# than a window; 10 s is still above any single checkpoint save in these scenarios).
STUCK_AFTER_S = 10.0

# Visibility thresholds, from what the scenarios are built to do (see the registry signatures).
HEALTHY_MIN_UTIL = 85.0  # a GPU-bound bf16 loop keeps NVML util near 100 %
STARVED_MAX_UTIL_RATIO = 0.5  # data-bound jobs: util at most half the healthy job's
SYNC_MIN_UTIL_DROP = 10.0  # host-sync: util points below healthy
H2D_MIN_UTIL_DROP = 20.0
FP32_MAX_TENSOR = 2.0  # GPM tensor activity "near zero"
FP32_MIN_UTIL = 80.0
LAUNCH_MAX_SM = 25.0  # GPM SM activity of microsecond kernels
LAUNCH_MIN_MAIN_CPU = 80.0  # the launching thread runs flat out
SATURATED_MIN_WORKER_CPU = 70.0
IO_MIN_READ_MBPS = 50.0
IO_MIN_IOWAIT = 1.0
OVERSUB_MIN_HOST_CPU = 70.0
CKPT_MIN_LOW_FRAC = 0.1  # share of idle 200 ms samples the saves cause
STUCK_MAX_UTIL = 5.0


# --------------------------------------------------------------------------- the workload


class Workload:
    """A scenario as a child process; its progress lines are read (and timestamped) on a thread."""

    def __init__(self, name: str, device: str, duration: float, tmpdir: str | None) -> None:
        self.name = name
        self._err = tempfile.TemporaryFile(mode="w+")
        cmd = [sys.executable, "-m", "gputop.workloads", name, "--device", device,
               "--duration", f"{duration:.0f}", "--exit-with-parent"]
        if tmpdir:
            cmd += ["--tmpdir", tmpdir]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=self._err, text=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.lines: list[protocol.Line] = []
        self._q: queue.Queue[protocol.Line | None] = queue.Queue()
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        for text in self.proc.stdout:  # type: ignore[union-attr]
            line = protocol.parse_line(text)
            if line is not None:
                self.lines.append(line)
                self._q.put(line)
        self._q.put(None)

    def wait_ready(self, timeout: float) -> protocol.Line:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._q.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait()
                raise RuntimeError(f"exited before ready (status {self.proc.returncode}): {self.stderr_tail()}")
            if line.kind == protocol.READY:
                return line
        raise RuntimeError(f"not ready after {timeout:.0f} s")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rates(self) -> list[tuple[float, float]]:
        return [(ln.num("t"), ln.num("steps")) for ln in list(self.lines) if ln.kind == protocol.RATE]

    def done(self) -> protocol.Line | None:
        return next((ln for ln in reversed(self.lines) if ln.kind == protocol.DONE), None)

    def stderr_tail(self, n: int = 3) -> str:
        try:
            self._err.flush()
            self._err.seek(0)
            lines = [ln.strip() for ln in self._err.read().splitlines() if ln.strip()]
        except (OSError, ValueError):
            return ""
        return " | ".join(lines[-n:])

    def stop(self) -> None:
        stop_tree(self.proc, STOP_GRACE_S)
        self._t.join(timeout=3)


def stop_tree(proc: subprocess.Popen, grace: float) -> None:
    if proc.poll() is not None:
        return
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        family = []
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for p in family:
        try:
            p.kill()
        except psutil.Error:
            pass


def steps_at(rates: list[tuple[float, float]], t: float) -> float | None:
    """Steps finished by time ``t``, interpolated between the rate lines around it."""
    before = [(rt, n) for rt, n in rates if rt is not None and rt <= t]
    after = [(rt, n) for rt, n in rates if rt is not None and rt >= t]
    if not before or not after:
        return None
    (t0, n0), (t1, n1) = before[-1], after[0]
    return n0 if t1 == t0 else n0 + (n1 - n0) * (t - t0) / (t1 - t0)


def steps_per_s(rates: list[tuple[float, float]], spans: list[tuple[float, float]]) -> float | None:
    """Steps the device finished per second over ``spans`` (rate lines come once a second)."""
    steps = secs = 0.0
    for t0, t1 in spans:
        a, b = steps_at(rates, t0), steps_at(rates, t1)
        if a is None or b is None:
            return None
        steps += b - a
        secs += t1 - t0
    return round(steps / secs, 3) if secs > 0 else None


# --------------------------------------------------------------------------- GPU sampling


class PlainNvml:
    """Fallback when gputop's NvmlSource does not import: the few readings the harness needs."""

    name = "pynvml"

    def __init__(self, clock=time.time) -> None:
        import pynvml as nv

        self.nv = nv
        self.clock = clock
        nv.nvmlInit()
        self.handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        self.last_ts = [0] * len(self.handles)
        self.gpm = [None] * len(self.handles)

    def poll(self) -> list[object]:
        nv, ts, out = self.nv, self.clock(), []
        for i, h in enumerate(self.handles):
            util = nv.nvmlDeviceGetUtilizationRates(h)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            gpm = self._gpm(i, h)
            out.append(GpuSample(ts, i, util_gpu=float(util.gpu), util_mem=float(util.memory),
                                 mem_used=int(mem.used), mem_total=int(mem.total),
                                 sm_active=gpm.get("sm"), tensor_active=gpm.get("tensor")))
            try:
                _, samples = nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, self.last_ts[i])
                for s in samples:
                    if s.timeStamp > self.last_ts[i]:
                        out.append(UtilPoint(s.timeStamp / 1e6, i, float(s.sampleValue.uiVal)))
                        self.last_ts[i] = s.timeStamp
            except nv.NVMLError:
                pass
            try:
                for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
                    out.append(GpuProcess(ts, i, int(p.pid), used_memory=p.usedGpuMemory))
            except nv.NVMLError:
                pass
        return out

    def _gpm(self, i: int, h) -> dict[str, float]:
        nv = self.nv
        try:
            sample = nv.nvmlGpmSampleAlloc()
            nv.nvmlGpmSampleGet(h, sample)
        except Exception:
            return {}
        prev, self.gpm[i] = self.gpm[i], sample
        if prev is None:
            return {}
        try:
            req = nv.c_nvmlGpmMetricsGet_t()
            req.version = nv.NVML_GPM_METRICS_GET_VERSION
            req.numMetrics = 2
            req.sample1, req.sample2 = prev, sample
            req.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_UTIL
            req.metrics[1].metricId = nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL
            nv.nvmlGpmMetricsGet(req)
            return {"sm": req.metrics[0].value, "tensor": req.metrics[1].value}
        except Exception:
            return {}
        finally:
            try:
                nv.nvmlGpmSampleFree(prev)
            except Exception:
                pass

    def close(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except Exception:
            pass


def open_gpu_source() -> tuple[object | None, str]:
    """(source, how): gputop's NvmlSource, else plain pynvml, else (None, why not)."""
    try:
        from gputop.sources.nvml import NvmlSource

        return NvmlSource.open(interval=GPU_POLL_S), "gputop.sources.nvml"
    except ImportError:
        pass
    except Exception as exc:  # NvmlUnavailable: no driver or no GPU
        return None, f"no GPU readings: {exc}"
    try:
        return PlainNvml(), "pynvml"
    except Exception as exc:
        return None, f"no GPU readings: {type(exc).__name__}: {exc}"


class GpuSampler:
    """Polls the GPU source on a thread for the whole run; windows are cut out afterwards."""

    def __init__(self, source) -> None:
        self.source = source
        self.samples: list[object] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)
        if source is not None:
            self._t.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.extend(self.source.poll())
            except Exception:
                pass
            self._stop.wait(GPU_POLL_S)

    def close(self) -> None:
        self._stop.set()
        if self.source is not None:
            self._t.join(timeout=5)
            self.source.close()

    def gpu_of(self, pid: int) -> int:
        for s in reversed(self.samples):
            if isinstance(s, GpuProcess) and s.pid == pid:
                return s.gpu_index
        return 0

    def window(self, spans: list[tuple[float, float]], pid: int) -> dict:
        if self.source is None:
            return {}
        idx = self.gpu_of(pid)

        def inside(ts: float) -> bool:
            return any(t0 <= ts <= t1 for t0, t1 in spans)

        samples = [s for s in self.samples if isinstance(s, GpuSample) and s.index == idx and inside(s.ts)]
        points = [s.util for s in self.samples if isinstance(s, UtilPoint) and s.index == idx and inside(s.ts)]
        procs = [s for s in self.samples if isinstance(s, GpuProcess) and s.pid == pid and inside(s.ts)]

        def mean(vals):
            vals = [v for v in vals if v is not None]
            return round(statistics.fmean(vals), 2) if vals else None

        def top(vals):
            vals = [v for v in vals if v is not None]
            return max(vals) if vals else None

        mem = top(s.mem_used for s in samples)
        job_mem = top(p.used_memory for p in procs)
        return {
            "gpu_index": idx,
            "util_mean": mean(points) if points else mean(s.util_gpu for s in samples),
            "util_points": len(points),
            "util_low_frac": round(sum(p < LOW_UTIL_PCT for p in points) / len(points), 3) if points else None,
            "tensor_active_mean": mean(s.tensor_active for s in samples),
            "sm_active_mean": mean(s.sm_active for s in samples),
            "mem_used_gib": round(mem / 2**30, 2) if mem is not None else None,
            "job_mem_gib": round(job_mem / 2**30, 2) if job_mem is not None else None,
            "pcie_rx_mbps": mean(s.pcie_rx_bps / 1e6 if s.pcie_rx_bps is not None else None for s in samples),
            "power_w": mean(s.power_w for s in samples),
        }


# --------------------------------------------------------------------------- host sampling


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


@dataclass
class HostSnap:
    t: float
    cpu: object
    disk: object
    procs: dict  # pid -> (cpu seconds, read bytes, is root)


def host_snap(pid: int) -> HostSnap:
    procs = {}
    for p in _tree(pid):
        try:
            ct = p.cpu_times()
            try:
                rb = p.io_counters().read_bytes
            except (psutil.Error, AttributeError):
                rb = None
            procs[p.pid] = (ct.user + ct.system, rb, p.pid == pid)
        except psutil.Error:
            pass
    return HostSnap(time.time(), psutil.cpu_times(), psutil.disk_io_counters(), procs)


def host_delta(pairs: list[tuple[HostSnap, HostSnap]]) -> dict:
    """Host and process-tree rates over one or more (start, end) snapshot pairs."""
    wall = busy = total = iowait = disk_read = job_cpu = main_cpu = job_read = 0.0
    worker_max = 0.0
    workers = 0
    for a, b in pairs:
        dt = b.t - a.t
        if dt <= 0:
            continue
        wall += dt
        fa, fb = a.cpu._asdict(), b.cpu._asdict()
        d = {k: fb[k] - fa.get(k, 0.0) for k in fb}
        tot = sum(d.values())
        total += tot
        idle = d.get("idle", 0.0) + d.get("iowait", 0.0)
        busy += tot - idle
        iowait += d.get("iowait", 0.0)
        if a.disk is not None and b.disk is not None:
            disk_read += b.disk.read_bytes - a.disk.read_bytes
        for pid, (cpu_b, rb_b, is_root) in b.procs.items():
            cpu_a, rb_a, _ = a.procs.get(pid, (0.0, 0, is_root))
            used = cpu_b - cpu_a
            job_cpu += used
            if is_root:
                main_cpu += used
            else:
                worker_max = max(worker_max, used / dt * 100)
            if rb_b is not None and rb_a is not None:
                job_read += rb_b - rb_a
        workers = max(workers, sum(1 for v in b.procs.values() if not v[2]))
    if wall <= 0:
        return {}
    return {
        "host_cpu_pct": round(busy / total * 100, 1) if total else None,
        "iowait_pct": round(iowait / total * 100, 2) if total else None,
        "disk_read_mbps": round(disk_read / wall / 1e6, 1),
        "job_cpu_pct": round(job_cpu / wall * 100, 1),  # % of one core, whole tree
        "main_cpu_pct": round(main_cpu / wall * 100, 1),
        "worker_cpu_max_pct": round(worker_max, 1) if workers else None,
        "workers": workers,
        "job_read_mbps": round(job_read / wall / 1e6, 1),
        "load1": round(os.getloadavg()[0], 2),
    }


# --------------------------------------------------------------------------- gputop attached


def _gputop_has(command: str) -> bool:
    try:
        r = subprocess.run([sys.executable, "-m", "gputop", command, "--help"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and "usage" in r.stdout


def detect_attach_mode() -> tuple[str, bool]:
    """('advise' | 'stacks' | 'py-spy' | 'none', whether advise takes --stuck-after)."""
    if _gputop_has("advise"):
        r = subprocess.run([sys.executable, "-m", "gputop", "advise", "--help"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
        return "advise", "--stuck-after" in r.stdout
    if _gputop_has("stacks"):
        return "stacks", False
    if shutil.which("py-spy"):
        return "py-spy", False
    return "none", False


def wait_rusage(proc: subprocess.Popen, timeout: float) -> float:
    """Reap ``proc``; returns the CPU seconds it and its reaped descendants used (rusage)."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return ru.ru_utime + ru.ru_stime
        if time.monotonic() > deadline:
            proc.kill()
            _, status, ru = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            return ru.ru_utime + ru.ru_stime
        time.sleep(0.05)


class Attacher:
    """gputop attached to the workload for about ``duration`` seconds, in the detected mode."""

    def __init__(self, mode: str, stuck_flag: bool) -> None:
        self.mode = mode
        self.stuck_flag = stuck_flag

    def run(self, pid: int, duration: float, alive) -> dict:
        start = time.time()
        if self.mode == "advise":
            out = self._advise(pid, duration)
        elif self.mode in ("stacks", "py-spy"):
            out = self._loop(pid, duration, alive)
        else:
            time.sleep(duration)
            out = {"cpu_s": 0.0}
        end = time.time()
        out.update(mode=self.mode, t0=start, t1=end, wall_s=round(end - start, 2))
        out["cpu_pct"] = round(out["cpu_s"] / (end - start) * 100, 1) if end > start else None
        return out

    def _advise(self, pid: int, duration: float) -> dict:
        cmd = [sys.executable, "-m", "gputop", "advise", "--pid", str(pid), "--duration", f"{duration:g}", "--json"]
        if self.stuck_flag:
            cmd += ["--stuck-after", f"{STUCK_AFTER_S:g}"]
        t_attach = time.time()
        err = tempfile.TemporaryFile(mode="w+")
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
        chunks: list[str] = []
        reader = threading.Thread(target=lambda: chunks.append(proc.stdout.read()), daemon=True)
        reader.start()
        cpu_s = wait_rusage(proc, duration + ATTACH_GRACE_S)
        t_exit = time.time()
        reader.join(timeout=5)
        out: dict = {"cpu_s": cpu_s, "returncode": proc.returncode}
        try:
            report = json.loads("".join(chunks))
        except ValueError:
            err.seek(0)
            out["error"] = "advise printed no JSON: " + " | ".join(err.read().strip().splitlines()[-3:])
            return out
        finally:
            err.close()
        # advise's clock starts after its imports: place it by its end minus what it watched.
        started = t_exit - float(report.get("duration_s") or duration)
        out["startup_s"] = round(max(0.0, started - t_attach), 2)
        out["top"] = report.get("top")
        out["findings"] = [
            {k: f.get(k) for k in ("id", "severity", "confidence", "cost_s", "first_seen_s")}
            for f in report.get("findings", [])
        ]
        out["seen"] = {s["id"]: round(s["first_seen_s"] + (started - t_attach), 2)
                       for s in report.get("seen", []) if s.get("first_seen_s") is not None}
        # Where advise says the device's time went (first device), and the largest lost share.
        devices = report.get("breakdown") or []
        if devices:
            buckets = {b["id"]: b.get("percent") for b in devices[0].get("buckets", [])}
            out["breakdown"] = buckets
            lost = {k: v for k, v in buckets.items() if k != "busy" and v}
            out["top_bucket"] = max(lost, key=lost.get) if lost else None
        return out

    def _loop(self, pid: int, duration: float, alive) -> dict:
        if self.mode == "stacks":
            cmd = [sys.executable, "-m", "gputop", "stacks", "--pid", str(pid), "--json"]
            period = 0.0  # back to back: each call is a fresh process
        else:
            cmd = ["py-spy", "dump", "--pid", str(pid), "--json"]
            period = 1.0 / PYSPY_HZ
        cpu_s, calls, failures = 0.0, 0, 0
        deadline = time.monotonic() + duration
        while time.monotonic() < deadline and alive():
            t = time.monotonic()
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            cpu_s += wait_rusage(proc, 30)
            calls += 1
            failures += proc.returncode != 0
            time.sleep(max(0.0, period - (time.monotonic() - t)))
        return {"cpu_s": cpu_s, "calls": calls, "failures": failures}


# --------------------------------------------------------------------------- verdicts


def judge_finding(scenario: registry.Scenario, att: dict) -> dict:
    """Did the advisor say what the registry expects, and how long after attach?"""
    if "findings" not in att:
        return {}
    expected = scenario.expected_finding
    if expected is None:
        loud = [f["id"] for f in att["findings"] if f.get("severity") in ("warning", "critical")]
        return {"correct": not loud, "time_to_correct_s": None, "unexpected": loud}
    ids = [f["id"] for f in att["findings"]]
    t = att.get("seen", {}).get(expected)
    return {"correct": expected in ids, "top_correct": att.get("top") == expected, "time_to_correct_s": t}


def _v(ok: bool | None, detail: str) -> dict:
    return {"visible": ok, "detail": detail}


def _num(d: dict, key: str):
    return d.get(key) if d else None


def visible(name: str, plain: dict, healthy: dict | None, job: dict) -> dict:
    """Is the scenario's bottleneck visible in the raw numbers? None: not measurable here."""
    util = _num(plain, "util_mean")
    h_util = _num(healthy, "util_mean") if healthy else None
    tensor, sm = _num(plain, "tensor_active_mean"), _num(plain, "sm_active_mean")
    low = _num(plain, "util_low_frac")
    ref = f"healthy {h_util:.0f} %" if h_util is not None else "no healthy run"

    def starved() -> tuple[bool | None, str]:
        if util is None:
            frac = job.get("frac_data")
            if frac is None:
                return None, "no GPU readings"
            return frac > 0.3, f"no GPU readings; the job waited for data {frac:.0%} of its time"
        limit = h_util * STARVED_MAX_UTIL_RATIO if h_util is not None else 40.0
        return util <= limit, f"GPU util {util:.0f} % vs {ref} (limit {limit:.0f} %)"

    if name == "healthy":
        if util is None:
            return _v(None, "no GPU readings")
        ok = util >= HEALTHY_MIN_UTIL and (tensor is None or tensor >= 10)
        return _v(ok, f"GPU util {util:.0f} %, tensor {tensor if tensor is not None else 'n/a'} %")
    if name == "dataloader-starved":
        return _v(*starved())
    if name == "workers-saturated":
        ok, detail = starved()
        w = _num(plain, "worker_cpu_max_pct")
        if w is not None:
            detail += f"; busiest worker {w:.0f} % of a core"
            if ok is not None:
                ok = ok and w >= SATURATED_MIN_WORKER_CPU
        return _v(ok, detail)
    if name == "io-bound":
        ok, detail = starved()
        rd, iow = _num(plain, "job_read_mbps"), _num(plain, "iowait_pct")
        io_ok = (rd or 0) >= IO_MIN_READ_MBPS or (iow or 0) >= IO_MIN_IOWAIT
        detail += f"; job reads {rd} MB/s from storage, iowait {iow} %"
        return _v(io_ok if ok is None else (ok and io_ok), detail)
    if name == "oversubscribed":
        ok, detail = starved()
        hc, load = _num(plain, "host_cpu_pct"), _num(plain, "load1")
        cores = os.cpu_count() or 1
        busy = (hc or 0) >= OVERSUB_MIN_HOST_CPU or (load or 0) >= cores
        detail += f"; host CPU {hc} %, load {load} on {cores} cores"
        return _v(busy if ok is None else (ok and busy), detail)
    if name == "host-sync":
        if util is None:
            return _v(None, "no GPU readings")
        limit = (h_util - SYNC_MIN_UTIL_DROP) if h_util is not None else HEALTHY_MIN_UTIL
        return _v(util <= limit, f"GPU util {util:.0f} % vs {ref}; sync {job.get('frac_sync')} of the time")
    if name == "pageable-h2d":
        if util is None:
            return _v(None, "no GPU readings")
        limit = (h_util - H2D_MIN_UTIL_DROP) if h_util is not None else 70.0
        rx = _num(plain, "pcie_rx_mbps")
        return _v(util <= limit, f"GPU util {util:.0f} % vs {ref}; PCIe RX {rx} MB/s; copy {job.get('frac_h2d')} of the time")
    if name == "fp32-no-tensor-cores":
        if util is None or tensor is None:
            return _v(None, f"util {util}, tensor {tensor} (GPM needed)")
        return _v(tensor <= FP32_MAX_TENSOR and util >= FP32_MIN_UTIL, f"GPU util {util:.0f} %, tensor {tensor:.1f} %")
    if name == "launch-bound":
        main = _num(plain, "main_cpu_pct")
        if sm is None:
            return _v(None, f"no GPM SM activity; main process {main} % CPU")
        ok = sm <= LAUNCH_MAX_SM and (main or 0) >= LAUNCH_MIN_MAIN_CPU
        return _v(ok, f"GPM SM activity {sm:.1f} %, GPU util {util} %, main process {main} % of a core")
    if name == "checkpoint-stall":
        if low is None:
            frac = job.get("frac_ckpt")
            return _v(None if frac is None else frac > 0.05, f"no GPU readings; saving {frac} of the time")
        return _v(low >= CKPT_MIN_LOW_FRAC, f"{low:.0%} of 200 ms samples idle; saving {job.get('frac_ckpt')} of the time")
    if name == "stuck":
        rate = _num(plain, "steps_per_s_after_stall")
        ok = rate == 0 and (util is None or util <= STUCK_MAX_UTIL)
        return _v(ok, f"steps/s after the stall {rate}, GPU util {util}")
    return _v(None, "no check for this scenario")


# --------------------------------------------------------------------------- one scenario


def run_scenario(sc: registry.Scenario, args, gpu: GpuSampler, attacher: Attacher, healthy: dict | None) -> dict:
    res: dict = {"scenario": sc.name, "bottleneck": sc.bottleneck, "expected_finding": sc.expected_finding,
                 "expected_category": sc.expected_category.value if sc.expected_category else None,
                 "signature": sc.signature}
    device = args.device
    if device == "cpu" and not sc.cpu:
        res["status"] = "skipped: no CPU variant"
        return res
    half = args.window / 2
    budget = WARMUP_S + 2 * args.window + ATTACH_GRACE_S + 30
    w = None
    try:
        w = Workload(sc.name, device, budget, args.tmpdir)
        ready = w.wait_ready(READY_TIMEOUT_S)
        res["ready"] = dict(ready.fields)
        time.sleep(WARMUP_S)

        def plain_window() -> tuple[tuple[float, float], tuple[HostSnap, HostSnap]]:
            a = host_snap(w.pid)
            time.sleep(half)
            b = host_snap(w.pid)
            return (a.t, b.t), (a, b)

        span1, snaps1 = plain_window()
        if not w.alive():
            raise RuntimeError(f"exited during the first window: {w.stderr_tail()}")
        a = host_snap(w.pid)
        att = attacher.run(w.pid, args.window, w.alive)
        b = host_snap(w.pid)
        span_att = (att["t0"], att["t1"])
        span2, snaps2 = plain_window()
        if not w.alive():
            raise RuntimeError(f"exited during the last window: {w.stderr_tail()}")
        # One more rate line, to interpolate the window's end (late on a loaded machine).
        deadline = time.time() + RATE_LINE_MAX_WAIT_S
        time.sleep(RATE_LINE_WAIT_S)
        while time.time() < deadline and not any(t >= span2[1] for t, _ in w.rates()):
            time.sleep(0.1)
    except Exception as exc:
        res["status"] = f"crashed: {exc}"
        if w is not None:
            w.stop()
        return res
    w.stop()
    rates = w.rates()
    plain = {"steps_per_s": steps_per_s(rates, [span1, span2])}
    plain.update(host_delta([snaps1, snaps2]))
    plain.update(gpu.window([span1, span2], w.pid))
    if sc.stalls:
        plain["steps_per_s_after_stall"] = steps_per_s(rates, [span2])
    attached = {"steps_per_s": steps_per_s(rates, [span_att])}
    attached.update(host_delta([(a, b)]))
    attached.update(gpu.window([span_att], w.pid))
    done = w.done()
    job = {k: v for k, v in (done.fields.items() if done else [])}
    job_nums = {k: float(v) for k, v in job.items() if k.startswith("frac_") or k in ("max_mem_gib", "saves")}
    res.update(status="ok", plain=plain, attached=attached, job=job_nums)
    p, q = plain["steps_per_s"], attached["steps_per_s"]
    res["slowdown_pct"] = round((p - q) / p * 100, 1) if p and q is not None else None
    res["gputop"] = {k: v for k, v in att.items() if k not in ("t0", "t1")}
    res["gputop"].update(judge_finding(sc, att))
    res["check"] = visible(sc.name, plain, healthy, job_nums)
    return res


# --------------------------------------------------------------------------- report


def _fmt(v, digits: int = 0) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def markdown(meta: dict, rows: list[dict]) -> str:
    out = ["# gputop workload harness", ""]
    out.append(
        f"{meta['started']} on {meta['host']}: {meta['gpu'] or 'no GPU'}, {meta['cpu_count']} cores, "
        f"torch {meta['torch']}, device `{meta['device']}`, window {meta['window_s']:g} s "
        f"(plain {meta['window_s'] / 2:g} s + attached + plain {meta['window_s'] / 2:g} s, after {WARMUP_S:g} s warm-up), "
        f"gputop attached as `{meta['attach_mode']}`, GPU readings from {meta['gpu_source']}; "
        f"total {meta['total_s']:.0f} s."
    )
    out.append("")
    head = ["scenario", "status", "steps/s", "steps/s gputop", "slowdown %", "GPU util %", "util<10 %",
            "tensor %", "SM %", "GPU mem GiB", "host CPU %", "iowait %", "job CPU %", "gputop CPU %",
            "top finding", "expected", "t→correct s", "visible"]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    for r in rows:
        p, a, g, c = r.get("plain", {}), r.get("attached", {}), r.get("gputop", {}), r.get("check", {})
        status = r["status"] if r["status"] == "ok" else r["status"].split(":")[0]
        cells = [
            r["scenario"], status, _fmt(p.get("steps_per_s"), 1), _fmt(a.get("steps_per_s"), 1),
            _fmt(r.get("slowdown_pct"), 1), _fmt(p.get("util_mean")), _fmt(p.get("util_low_frac"), 2),
            _fmt(p.get("tensor_active_mean"), 1), _fmt(p.get("sm_active_mean"), 1),
            _fmt(p.get("job_mem_gib") or p.get("mem_used_gib"), 1), _fmt(p.get("host_cpu_pct")),
            _fmt(p.get("iowait_pct"), 1), _fmt(p.get("job_cpu_pct")), _fmt(g.get("cpu_pct"), 1),
            (g.get("top") or "(none)") if "top" in g else "n/a", _fmt(r.get("expected_finding")) if r.get("expected_finding") else "(none)",
            _fmt(g.get("time_to_correct_s"), 1), _fmt(c.get("visible")),
        ]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "Columns: steps/s are steps the device finished, without and with gputop attached; util, "
            "tensor and SM activity (GPM), memory, host and job CPU are from the plain windows; job CPU "
            "is the workload's process tree in % of one core; gputop CPU is its whole process tree "
            "(rusage); util<10 % is the share of NVML's 200 ms samples below 10 %.", "",
            "## Details", ""]
    for r in rows:
        out.append(f"- **{r['scenario']}** ({r['bottleneck']}): {r['status']}.")
        if "check" in r:
            out.append(f"  Raw evidence: {r['check']['detail']}. Expected: {r['signature']}.")
        g = r.get("gputop", {})
        if g.get("findings") is not None:
            ids = ", ".join(f"{f['id']} ({f['severity']})" for f in g["findings"]) or "none"
            out.append(f"  gputop advise: {ids}; correct: {_fmt(g.get('correct'))}; start-up {g.get('startup_s')} s.")
            if g.get("breakdown"):
                parts = ", ".join(f"{k} {v} %" for k, v in g["breakdown"].items())
                out.append(f"  Time breakdown (advise): {parts}.")
        elif g.get("error"):
            out.append(f"  gputop: {g['error']}")
        if r.get("job"):
            out.append("  Job's own accounting: " + ", ".join(f"{k}={v:g}" for k, v in sorted(r["job"].items())) + ".")
    return "\n".join(out) + "\n"


def environment(device: str) -> dict:
    info = {"host": platform.node(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "torch": None, "gpu": None, "driver": None}
    try:
        r = subprocess.run([sys.executable, "-c", "import torch;print(torch.__version__);"
                            "print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"],
                           capture_output=True, text=True, timeout=120)
        lines = r.stdout.splitlines()
        info["torch"] = lines[0] if lines else None
        info["gpu"] = (lines[1] if len(lines) > 1 else "") or None
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        info["driver"] = v.decode() if isinstance(v, bytes) else v
        pynvml.nvmlShutdown()
    except Exception:
        pass
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for harness.json and harness.md")
    ap.add_argument("--scenarios", help="comma-separated subset (default: all)")
    ap.add_argument("--window", type=float, default=DEFAULT_WINDOW_S, help=f"seconds (default {DEFAULT_WINDOW_S:g})")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S,
                    help=f"skip scenarios that would end past this many seconds (default {DEFAULT_BUDGET_S:g})")
    ap.add_argument("--tmpdir", help="where io-bound and checkpoint-stall write (default: a disk-backed temp dir)")
    args = ap.parse_args(argv)

    names = args.scenarios.split(",") if args.scenarios else registry.names()
    try:
        scenarios = [registry.get(n.strip()) for n in names if n.strip()]
    except KeyError as exc:
        ap.error(str(exc.args[0]))
    if args.window <= 0:
        ap.error("--window must be positive")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    t_start = time.time()
    env = environment(args.device)
    if args.device == "auto":
        args.device = "cuda" if env["gpu"] else "cpu"
    source, how = open_gpu_source() if args.device == "cuda" else (None, "not used (cpu)")
    gpu = GpuSampler(source)
    mode, stuck_flag = detect_attach_mode()
    attacher = Attacher(mode, stuck_flag)
    print(f"harness: {len(scenarios)} scenario(s) on {args.device}, window {args.window:g} s, "
          f"gputop as {mode}, GPU readings: {how}", file=sys.stderr, flush=True)

    rows: list[dict] = []
    healthy = None
    per = SETUP_ESTIMATE_S + WARMUP_S + 2 * args.window + 5
    try:
        for sc in scenarios:
            if time.time() - t_start + per > args.budget:
                rows.append({"scenario": sc.name, "bottleneck": sc.bottleneck, "status": "skipped: time budget",
                             "expected_finding": sc.expected_finding, "signature": sc.signature})
                continue
            t0 = time.time()
            try:
                r = run_scenario(sc, args, gpu, attacher, healthy)
            except Exception as exc:  # the harness's own bug must not lose the other scenarios
                r = {"scenario": sc.name, "bottleneck": sc.bottleneck, "status": f"crashed: harness: {exc!r}",
                     "expected_finding": sc.expected_finding, "signature": sc.signature}
            r["elapsed_s"] = round(time.time() - t0, 1)
            if sc.name == "healthy" and r.get("status") == "ok":
                healthy = r["plain"]
            rows.append(r)
            p = r.get("plain", {})
            print(f"harness: {sc.name}: {r['status']}, {_fmt(p.get('steps_per_s'), 1)} steps/s, "
                  f"util {_fmt(p.get('util_mean'))}, visible {_fmt(r.get('check', {}).get('visible'))}, "
                  f"top {r.get('gputop', {}).get('top')} ({r['elapsed_s']:.0f} s)", file=sys.stderr, flush=True)
    finally:
        gpu.close()

    meta = {**env, "started": time.strftime("%Y-%m-%d %H:%M", time.localtime(t_start)), "device": args.device,
            "window_s": args.window, "warmup_s": WARMUP_S, "attach_mode": mode, "gpu_source": how,
            "stuck_after_s": STUCK_AFTER_S if stuck_flag else None, "total_s": round(time.time() - t_start, 1)}
    (out_dir / "harness.json").write_text(json.dumps({"meta": meta, "scenarios": rows}, indent=2, default=str) + "\n")
    (out_dir / "harness.md").write_text(markdown(meta, rows))
    print(f"harness: wrote {out_dir / 'harness.md'} and harness.json in {meta['total_s']:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
