#!/usr/bin/env python
"""What attaching gputop's stack sampler costs a running training job, to a fraction of a percent.

    python bench/attach_cost.py --out OUT [--device auto|cuda|cpu] [--budget-s 280]
                                [--window 1.0] [--targets many-threads,cpu-loading,...]

One run measures every target inside ``--budget-s`` seconds of wall time, start-up and warm-up
included: each target gets an equal share (what an earlier one leaves unused goes to the next).

Method, per target (one job, started once, warmed up, then left running):
- The job reports its progress at fixed points of its loop ("cycle boundaries"): on CUDA after
  every ``loss.item()`` (each 10 steps: the CPU may run ahead of the GPU between them, so a step
  count read at an arbitrary moment is off by up to 10 steps), on the CPU after every step; in
  ``checkpoint`` only after each checkpoint (every 40 steps), so that every window holds whole
  checkpoint periods. Each boundary carries its step count, the job's monotonic clock and the
  lost-time probe's total (below), written down a pipe the harness reads.
- Windows alternate D A D A ... A D: D detached, A with gputop's sampler (PySpySource with the
  session's defaults, polled the way the pipeline polls it) attached. A window starts on a
  boundary and ends on the first boundary after ``--window`` seconds, so it holds whole cycles
  and its step rate carries no counting error. The sampler is switched on at a boundary; an A
  window ends at the first boundary after the sampler's last poll has returned, so what a dump
  costs is counted in the A window that made it.
- Each A is compared with the mean of the two D around it, so a linear drift of the job's speed
  cancels; ``slowdown = 1 - steps/s(A) / mean(steps/s(D before), steps/s(D after))``. The
  slowdown is the mean over the A windows. Its 95 % interval is the union of two: a moving-block
  bootstrap over the pairs (blocks of 2: neighbouring pairs share a D window, so they are not
  independent) and a t interval whose variance adds the lag-1 covariance. A 20 % trimmed mean
  is given as a check on outliers (not what the verdict uses: it would hide a rare long stop).
- A lost-time probe inside the job, the co-primary measure: a thread that sleeps 2 ms at a time
  and adds up how late it wakes. A job stopped by py-spy wakes it late by the stop; sampling's
  lost time is A minus its D neighbours, in % of wall time, with the same intervals.
- The sampler's own CPU (its thread and its py-spy processes) over the A windows, % of one core,
  and what gputop itself shows (``SamplingCost.job_cost_pct``).
The sampler is attached once (its first look) before the first window, its start-up burst
spent; between A windows its clocks stand still, so the A windows put end to end are one
steady attach (the CPU budget's refill, the worker round robin and the cost window all see
attached time only), not a fresh attach each window.

Targets (``--device cuda`` sizes; ``cpu`` runs the same code smaller). Every job does the same
work at every step (learning rate 0: the weights never drift toward denormals or a different
state), and its own stalls are kept out of the step rate:
- many-threads: 64-thread intra-op pools (started by CPU ops), 8 DataLoader workers with
  pin-memory and a deep prefetch (token-id batches, far ahead of the loop), an embedding + bf16
  MLP large enough that the step is GPU time. ``cpu`` computes on the machine's cores (the pool
  stays, idle, as on CUDA).
- cpu-loading: DataLoader(num_workers=0) with a per-sample CPU transform in the main process.
- checkpoint: a bf16 MLP that writes a torch.save checkpoint every 40 steps (to /dev/shm where it
  has room: the disk's writeback is not what is measured; the JSON says where it went).
- launch-bound: a small deep MLP, tiny batches: the step is kernel-launch overhead.
- healthy-bf16: a large bf16 MLP, batches already on the device.

Writes OUT/attach_cost.json ({"targets": [{name, threads, slowdown_pct, ci95_pct,
sampler_cpu_pct, device, ...}]}) and OUT/attach_cost.md, after each target.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import platform
import random
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TARGETS = ("many-threads", "cpu-loading", "checkpoint", "launch-bound", "healthy-bf16")
TARGET_SLOWDOWN_PCT = 0.5  # the target: the job loses at most this
TARGET_WORST_PCT = 1.0  # worst slowdown + its interval
TARGET_CPU_PCT = 2.0  # the sampler's own CPU, % of one core
RECORD = struct.Struct("=qdd")  # steps, monotonic time, probe's lost seconds: one per boundary
PROBE_SLEEP_S = 0.002
PROBE_SLACK_S = 0.001  # a wake-up later than this (timer slack, GIL hand-over) counts as lost
SYNC_EVERY = 10  # the job's loss.item(), as real loops log
CHECKPOINT_EVERY = 40
DEFAULT_BUDGET_S = 280.0
CLOSE_MARGIN_S = 3.0  # stopping a job (and its workers), and the statistics, at the end of a share
TRIM = 0.2  # the trimmed mean's cut, each side
SHM_ROOM_BYTES = 2 << 30  # the checkpoint (270 MB on CUDA) goes to /dev/shm only with this free


# --------------------------------------------------------------------------- statistics


def paired_slowdowns(rates: list[float]) -> list[float]:
    """``rates``: steps/s of windows D A D A ... A D. Each A against the mean of its two D
    neighbours: 1 - A / mean(D), in %. A linear drift cancels."""
    if len(rates) < 3 or len(rates) % 2 == 0:
        raise ValueError("need D A D ... A D: an odd number of windows, at least 3")
    out = []
    for i in range(1, len(rates), 2):
        base = (rates[i - 1] + rates[i + 1]) / 2
        out.append(100.0 * (1.0 - rates[i] / base) if base > 0 else float("nan"))
    return out


def paired_differences(values: list[float]) -> list[float]:
    """Like paired_slowdowns for a quantity in % already (lost time): A minus mean(D)."""
    if len(values) < 3 or len(values) % 2 == 0:
        raise ValueError("need D A D ... A D: an odd number of windows, at least 3")
    return [values[i] - (values[i - 1] + values[i + 1]) / 2 for i in range(1, len(values), 2)]


def trimmed_mean(xs: list[float], cut: float = TRIM) -> float:
    xs = sorted(x for x in xs if not math.isnan(x))
    if not xs:
        return float("nan")
    k = int(cut * len(xs))
    return statistics.fmean(xs[k:len(xs) - k] or xs)


def bootstrap_ci(xs: list[float], level: float = 0.95, n: int = 4000, seed: int = 1, block: int = 2,
                 stat=statistics.fmean) -> tuple[float, float]:
    """Percentile interval of ``stat`` by a moving-block bootstrap: blocks of ``block``
    consecutive values, so a dependence between neighbours (pairs sharing a D window) is kept.
    ``block=1`` is the plain bootstrap."""
    xs = [x for x in xs if not math.isnan(x)]
    k = len(xs)
    if not xs:
        return (float("nan"), float("nan"))
    block = max(1, min(block, k))
    starts = k - block + 1
    rng = random.Random(seed)
    per = -(-k // block)
    vals = []
    for _ in range(n):
        sample: list[float] = []
        for _ in range(per):
            s = rng.randrange(starts)
            sample.extend(xs[s:s + block])
        vals.append(stat(sample[:k]))
    vals.sort()
    return (vals[int((1 - level) / 2 * n)], vals[min(n - 1, int((1 + level) / 2 * n))])


# Two-sided 97.5 % quantiles of Student's t, for the t interval (dof 1-30; above, the normal's).
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
         2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
         2.052, 2.048, 2.045, 2.042]


def t_ci(xs: list[float], lag1: bool = True) -> tuple[float, float]:
    """t interval of the mean. With ``lag1`` its variance adds the neighbours' covariance in full
    (the paired slowdowns are MA(1) by construction: neighbouring pairs share a D window), never
    less than without it: ``(g0 + 2 max(g1, 0)) / n``."""
    xs = [x for x in xs if not math.isnan(x)]
    k = len(xs)
    if k < 2:
        return (float("nan"), float("nan"))
    m = statistics.fmean(xs)
    g0 = sum((x - m) ** 2 for x in xs) / (k - 1)
    g1 = sum((xs[i] - m) * (xs[i + 1] - m) for i in range(k - 1)) / (k - 1) if lag1 else 0.0
    var = g0 + 2 * max(g1, 0.0)
    q = _T975[k - 2] if k - 1 <= len(_T975) else 1.96
    h = q * math.sqrt(var / k)
    return (m - h, m + h)


def union(a: tuple[float, float], b: tuple[float, float]) -> list[float]:
    return [min(a[0], b[0]), max(a[1], b[1])]


def cv_pct(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    if len(xs) < 2 or statistics.fmean(xs) == 0:
        return float("nan")
    return 100.0 * statistics.stdev(xs) / statistics.fmean(xs)


def summarize(rates: list[float], lost_pct: list[float]) -> dict:
    """Slowdown with its intervals from the windows' step rates and probe lost time. Each
    ``*ci95_pct`` is the union of the block bootstrap's and the t interval (both kept apart)."""
    slow = paired_slowdowns(rates)
    lost = paired_differences(lost_pct)
    boot, t = bootstrap_ci(slow), t_ci(slow)
    lboot, lt = bootstrap_ci(lost), t_ci(lost)
    ci = union(boot, t)
    return {
        "slowdown_pct": statistics.fmean(slow),
        "ci95_pct": ci,
        "ci95_halfwidth_pct": (ci[1] - ci[0]) / 2,
        "ci95_boot_pct": list(boot),
        "ci95_t_pct": list(t),
        "slowdown_trimmed_pct": trimmed_mean(slow),
        "trimmed_ci95_pct": list(bootstrap_ci(slow, stat=trimmed_mean)),
        "pairs": len(slow),
        "lost_pct": statistics.fmean(lost),
        "lost_ci95_pct": union(lboot, lt),
        "lost_ci95_boot_pct": list(lboot),
        "lost_ci95_t_pct": list(lt),
        "detached_cv_pct": cv_pct(rates[0::2]),
        "pair_sd_pct": statistics.stdev(slow) if len(slow) > 1 else float("nan"),
        "per_window_slowdown_pct": slow,
    }


def verdict(t: dict) -> str:
    why = []
    if not t["slowdown_pct"] <= TARGET_SLOWDOWN_PCT:
        why.append("slowdown")
    if not t["ci95_pct"][1] <= TARGET_WORST_PCT:
        why.append("interval")
    if not t["lost_pct"] <= TARGET_SLOWDOWN_PCT or not t["lost_ci95_pct"][1] <= TARGET_WORST_PCT:
        why.append("lost time")
    if not t["sampler_cpu_pct"] <= TARGET_CPU_PCT:
        why.append("sampler CPU")
    return "met" if not why else f"NOT met ({', '.join(why)})"


def plan_windows(remaining_s: float, cycle_s: float, window_s: float) -> int:
    """How many windows (odd, at least 3) fit in ``remaining_s``: each ends on the first cycle
    boundary after ``window_s``, so it runs half a cycle over on average."""
    n = int(remaining_s // (window_s + cycle_s / 2))
    return max(3, n if n % 2 == 1 else n - 1)


def target_deadlines(start: float, budget_s: float, n: int) -> list[float]:
    """Each target's end: equal shares of the budget, each less the time to stop its job. A target
    that ends early leaves the rest to the next (the deadlines are absolute)."""
    return [start + budget_s * (k + 1) / n - CLOSE_MARGIN_S for k in range(n)]


# --------------------------------------------------------------------------- the targets


def run_target(name: str, fd: int, device: str, ckpt: str | None) -> None:
    """The training job: writes a record at each cycle boundary, with the probe thread."""
    import torch

    cuda = device == "cuda"
    dev = torch.device(device)
    state = {"lost": 0.0}

    def probe() -> None:
        while True:
            t = time.perf_counter()
            time.sleep(PROBE_SLEEP_S)
            late = time.perf_counter() - t - PROBE_SLEEP_S
            if late > PROBE_SLACK_S:
                state["lost"] += late - PROBE_SLACK_S

    big = cuda  # GPU sizes; the CPU run is for checking the bench
    if not cuda:
        torch.set_flush_denormal(True)

    def mlp(width: int, depth: int, head: list | None = None) -> torch.nn.Module:
        layers: list[torch.nn.Module] = list(head or [])
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
        return torch.nn.Sequential(*layers).to(dev)

    def amp():
        return torch.autocast(device_type=dev.type, dtype=torch.bfloat16)

    batches = None
    x_fixed = None
    if name == "many-threads":
        torch.set_num_threads(64)
        # Start the intra-op pools (BLAS's and ATen's parallel_for): their threads exist from the
        # first parallel CPU op on, and stay.
        torch.ones(512, 512) @ torch.ones(512, 512)
        torch.ones(1 << 22).mul_(2)
        if not cuda:
            # The GPU's work runs on the CPU here: on the machine's cores, the 64 threads stay.
            torch.set_num_threads(os.cpu_count() or 1)
        vocab, seq = (8192, 256) if big else (1024, 32)
        width = 4096 if big else 128
        model = mlp(width, 3, head=[torch.nn.Embedding(vocab, width)])

        class Tokens(torch.utils.data.Dataset):
            def __len__(self) -> int:
                return 1 << 30

            def __getitem__(self, i: int) -> torch.Tensor:
                return (torch.arange(seq) * 7 + i) % vocab

        # Workers far ahead of the loop (8 x 8 batches): the step waits on the GPU, not on them.
        loader = torch.utils.data.DataLoader(Tokens(), batch_size=16 if big else 4, num_workers=8,
                                             pin_memory=cuda, persistent_workers=True, prefetch_factor=8)
        batches = iter(loader)
    elif name == "cpu-loading":
        width = 1024 if big else 128
        model = mlp(width, 2)

        class Images(torch.utils.data.Dataset):
            def __init__(self) -> None:
                self.base = torch.randn(3, 32, 32, generator=torch.Generator().manual_seed(0))

            def __len__(self) -> int:
                return 1 << 30

            def __getitem__(self, i: int) -> torch.Tensor:
                x = self.base + (i % 13)
                x = (x - x.mean()) / (x.std() + 1e-6)
                return torch.flip(x, (2,)).reshape(-1)[:width]

        loader = torch.utils.data.DataLoader(Images(), batch_size=64, num_workers=0)
        batches = iter(loader)
    elif name == "checkpoint":
        width = 4096 if big else 512
        model = mlp(width, 4)  # ~67M parameters on the GPU: a 270 MB checkpoint
    elif name == "launch-bound":
        width = 256 if big else 64
        model = mlp(width, 16)
    elif name == "healthy-bf16":
        width = 4096 if big else 512
        model = mlp(width, 4)
    else:
        raise SystemExit(f"unknown target {name}")
    # Learning rate 0: the optimizer runs every kernel, the weights stay where they are.
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    if batches is None:
        batch = {"launch-bound": 32, "healthy-bf16": 4096 if big else 256, "checkpoint": 1024 if big else 128}[name]
        x_fixed = torch.randn(batch, width, device=dev, generator=None)
    record_every = SYNC_EVERY if cuda else 1  # on the CPU every step is synchronous
    if name == "checkpoint":
        record_every = CHECKPOINT_EVERY

    def step(steps: int) -> None:
        x = x_fixed if batches is None else next(batches).to(dev, non_blocking=cuda)
        with amp():
            loss = model(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if steps % SYNC_EVERY == 0:
            loss.item()  # logging, as real loops do: bounds how far the queue runs ahead
        if ckpt is not None and steps % CHECKPOINT_EVERY == 0:
            torch.save(model.state_dict(), ckpt)

    for i in range(1, 41):
        step(i)
    if cuda:
        torch.cuda.synchronize()
    threading.Thread(target=probe, name="lost-time-probe", daemon=True).start()
    desc = torch.cuda.get_device_name() if cuda else f"cpu ({os.cpu_count()} cores)"
    print(json.dumps({"ready": True, "device": desc, "torch": torch.__version__,
                      "record_every": record_every}), flush=True)
    steps = 0
    while True:
        steps += 1
        step(steps)
        if steps % record_every == 0:
            os.write(fd, RECORD.pack(steps, time.monotonic(), state["lost"]))


# --------------------------------------------------------------------------- the harness


def shm_room() -> int:
    """Bytes free in /dev/shm, 0 where there is none (a container's default is 64 MB)."""
    try:
        if not os.access("/dev/shm", os.W_OK):
            return 0
        st = os.statvfs("/dev/shm")
        return st.f_bavail * st.f_frsize
    except OSError:
        return 0


class Job:
    """The target process; a thread reads its boundary records off the pipe."""

    def __init__(self, name: str, device: str) -> None:
        self.name = name
        self.ckpt = None
        if name == "checkpoint":
            where = "/dev/shm" if shm_room() >= SHM_ROOM_BYTES else None
            fd, self.ckpt = tempfile.mkstemp(prefix="attach-cost-", suffix=".pt", dir=where)
            os.close(fd)
        rfd, wfd = os.pipe()
        argv = [sys.executable, __file__, "--run-target", name, "--fd", str(wfd), "--device", device]
        if self.ckpt:
            argv += ["--ckpt", self.ckpt]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, pass_fds=(wfd,))
        os.close(wfd)
        self.pid = self.proc.pid
        self.bounds: list[tuple[int, float, float]] = []  # (steps, monotonic s, lost s)
        self.cond = threading.Condition()
        self.eof = False
        self.reader = threading.Thread(target=self._read, args=(rfd,), daemon=True)
        self.reader.start()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"target {name} exited with {self.proc.wait()}")
        self.info = json.loads(line)

    def _read(self, rfd: int) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(rfd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                break
            buf += chunk
            n = len(buf) // RECORD.size
            recs = [RECORD.unpack_from(buf, i * RECORD.size) for i in range(n)]
            buf = buf[n * RECORD.size:]
            with self.cond:
                self.bounds.extend(recs)
                self.cond.notify_all()
        os.close(rfd)
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def wait(self, pred, timeout: float = 60.0):
        """Wait until ``pred(bounds)`` is not None, and return it."""
        with self.cond:
            end = time.monotonic() + timeout
            while True:
                got = pred(self.bounds)
                if got is not None:
                    return got
                left = end - time.monotonic()
                if self.eof or left <= 0:
                    raise RuntimeError(f"target {self.name}: no progress (exit {self.proc.poll()})")
                self.cond.wait(min(left, 1.0))

    def index(self, i: int) -> int:
        """Wait for boundary ``i``."""
        return self.wait(lambda b: i if len(b) > i else None)

    def first_after(self, t: float, at_least: int = 0) -> int:
        """Wait for the first boundary later than monotonic ``t`` (and at index ``at_least`` or on)."""
        def pred(b):
            i = max(at_least, bisect.bisect_right(b, t, key=lambda r: r[1]))
            return i if i < len(b) else None
        return self.wait(pred)

    def threads(self) -> tuple[int, int]:
        """Threads of the job's main process, and of it with its children."""
        import psutil

        p = psutil.Process(self.pid)
        own = p.num_threads()
        return own, own + sum(c.num_threads() for c in p.children(recursive=True))

    def close(self) -> None:
        import psutil

        try:
            kids = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            kids = []
        for k in kids:
            try:
                k.kill()
            except psutil.Error:
                pass
        self.proc.kill()
        self.proc.wait(30)
        self.reader.join(5)
        if self.ckpt:
            try:
                os.unlink(self.ckpt)
            except OSError:
                pass


# Times in PySpySource's state, moved on by the time spent detached, so that its clocks stand
# still between attached windows (see the module's docstring). Missing ones are skipped.
_MONO_FIELDS = ("_next_cost", "_started", "_main_since", "_confirmed_at")
_WALL_FIELDS = ("_next_proc", "_next_worker", "_retry_at")
_BUCKETS = ("_cpu", "_pause")


def shift_clocks(src, dt: float) -> None:
    for name in _BUCKETS:
        b = getattr(src, name, None)
        if b is not None and hasattr(b, "t"):
            b.t += dt
    for name in _MONO_FIELDS + _WALL_FIELDS:
        v = getattr(src, name, None)
        if isinstance(v, float) and math.isfinite(v):
            setattr(src, name, v + dt)
    hist = getattr(src, "_history", None)
    if hist is not None:
        moved = [(t + dt, tot) for t, tot in hist]
        hist.clear()
        hist.extend(moved)


class Sampler:
    """gputop's sampler on the job, polled on its own thread as the pipeline polls it, only while
    attached; its clocks stand still while detached. Its CPU (thread + py-spy processes) is
    metered per attached window."""

    def __init__(self, pid: int) -> None:
        from gputop.session import stack_sampler
        from gputop.store import Store

        self.src = stack_sampler(pid)
        self.store = Store()
        self.on = threading.Event()
        self.gate = threading.Lock()  # held for a whole poll: detach waits on it
        self.quit = False
        self.cpu = 0.0
        self.stacks = 0
        self.off_total = 0.0
        self.off_since = time.monotonic()
        self.next_poll = 0.0  # on the attached-time clock
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def vnow(self) -> float:
        return time.monotonic() - self.off_total

    def _poll(self) -> None:
        from gputop.model import StackSample

        t0 = time.thread_time()
        out = self.src.poll()
        self.cpu += time.thread_time() - t0
        self.stacks += sum(1 for s in out if isinstance(s, StackSample) and s.is_main and s.pid == self.src.pid)
        self.store.add(out)
        self.next_poll = self.vnow() + self.src.interval

    def _run(self) -> None:
        while not self.quit:
            if not self.on.wait(0.05):
                continue
            wait = self.next_poll - self.vnow()
            if wait > 0:
                time.sleep(min(wait, 0.02))
                continue
            with self.gate:
                if self.on.is_set():
                    self._poll()

    def first_look(self, settle_s: float) -> None:
        """Attach as a user does (the first, blocking look), then spend the start-up burst: the
        windows see the steady rate a long attach settles to."""
        self.attach()
        with self.gate:
            self._poll()
            cpu = getattr(self.src, "_cpu", None)
            if cpu is not None and hasattr(cpu, "level"):
                cpu.level = min(cpu.level, 0.0)
        time.sleep(settle_s)
        self.detach()

    def attach(self) -> None:
        now = time.monotonic()
        dt = now - self.off_since
        self.off_total += dt
        shift_clocks(self.src, dt)
        self.on.set()

    def detach(self) -> None:
        self.on.clear()
        with self.gate:  # a poll in flight finishes first
            pass
        self.off_since = time.monotonic()

    def close(self) -> None:
        self.on.clear()
        self.quit = True
        self.thread.join(10)


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def window_stats(bounds: list[tuple[int, float, float]], i0: int, i1: int) -> dict:
    (s0, t0, l0), (s1, t1, l1) = bounds[i0], bounds[i1]
    dur = t1 - t0
    cyc = [bounds[i + 1][1] - bounds[i][1] for i in range(i0, i1)]
    per = (s1 - s0) / max(1, i1 - i0)
    return {
        "t0": t0, "dur_s": dur, "steps": s1 - s0, "rate": (s1 - s0) / dur,
        "rate_median_cycle": per / statistics.median(cyc),
        "lost_pct": 100.0 * (l1 - l0) / dur, "cycles": i1 - i0,
    }


def measure(name: str, device: str, window: float, warmup: float, settle: float, deadline: float,
            max_pairs: int | None, log) -> dict:
    started = time.monotonic()
    job = Job(name, device)
    try:
        ready = time.monotonic()
        time.sleep(max(0.5, min(warmup, (deadline - time.monotonic()) * 0.15)))
        # The cycle's length from the warm-up's second half.
        since = time.monotonic() - warmup / 2

        def recent(b):
            got = b[bisect.bisect_right(b, since, key=lambda r: r[1]):]
            return got if len(got) >= 3 else None

        recent = job.wait(recent)
        cycle_s = statistics.median(recent[i + 1][1] - recent[i][1] for i in range(len(recent) - 1))
        sampler = Sampler(job.pid)
        sampler.first_look(settle)
        nwin = plan_windows(deadline - time.monotonic(), cycle_s, window)
        if max_pairs:
            nwin = min(nwin, 2 * max_pairs + 1)
        log(f"{name}: ready after {ready - started:.1f} s, cycle {cycle_s * 1000:.1f} ms, about {nwin} windows")
        wins: list[dict] = []
        i0 = job.first_after(time.monotonic())
        w = 0
        while True:
            attached = w % 2 == 1
            if attached:
                cpu0, ch0, st0 = sampler.cpu, children_cpu(), sampler.stacks
                tot = getattr(sampler.src, "_totals", None)
                dumps0, pause0 = (tot.dumps, tot.pause) if tot is not None else (0, 0.0)
                sampler.attach()
                time.sleep(max(0.0, job.bounds[i0][1] + window - time.monotonic()))
                sampler.detach()
                i1 = job.first_after(sampler.off_since, i0 + 1)
            else:
                i1 = job.first_after(job.bounds[i0][1] + window, i0 + 1)
            with job.cond:
                win = window_stats(job.bounds, i0, i1)
            win["attached"] = attached
            if attached:
                win["sampler_cpu_s"] = (sampler.cpu - cpu0) + (children_cpu() - ch0)
                win["stacks"] = sampler.stacks - st0
                if tot is not None:
                    win["dumps"], win["pause_s"] = tot.dumps - dumps0, tot.pause - pause0
                cost = sampler.src.cost
                win["shown_pct"] = cost.job_cost_pct if cost is not None else None
            wins.append(win)
            log(f"{name} w{w:02d} {'A' if attached else 'D'} {win['dur_s']:.2f} s {win['rate']:.2f} steps/s "
                f"lost {win['lost_pct']:.3f} %"
                + (f" sampler {100 * win['sampler_cpu_s'] / win['dur_s']:.2f} %" if attached else ""))
            i0 = i1
            w += 1
            if not attached and w >= 3:
                pairs = (w - 1) // 2
                pair_s = wins[-1]["dur_s"] + wins[-2]["dur_s"]
                if (max_pairs and pairs >= max_pairs) or time.monotonic() + 1.1 * pair_s > deadline:
                    break
        own, total = job.threads()
        sampler.close()
        device_name = job.info["device"]
        ckpt_dir = os.path.dirname(job.ckpt) if job.ckpt else None
    finally:
        job.close()
    rates = [x["rate"] for x in wins]
    res = summarize(rates, [x["lost_pct"] for x in wins])
    med = paired_slowdowns([x["rate_median_cycle"] for x in wins])
    a = [x for x in wins if x["attached"]]
    a_s = sum(x["dur_s"] for x in a)
    shown = [x["shown_pct"] for x in a if x.get("shown_pct") is not None]
    res.update(
        name=name,
        threads=own,
        threads_with_children=total,
        sampler_cpu_pct=100.0 * sum(x["sampler_cpu_s"] for x in a) / a_s,
        shown_cost_pct=statistics.fmean(shown) if shown else None,
        stacks_per_s=sum(x["stacks"] for x in a) / a_s,
        pause_pct=100.0 * sum(x.get("pause_s", 0.0) for x in a) / a_s,
        slowdown_median_cycle_pct=statistics.fmean(med),
        steps_per_s_detached=statistics.fmean(rates[0::2]),
        device=device_name,
        checkpoint_dir=ckpt_dir,
        window_s=statistics.fmean(x["dur_s"] for x in wins),
        cycle_s=cycle_s,
        target_wall_s=time.monotonic() - started,
        startup_s=ready - started,
        rates=rates,
        lost_pct_windows=[x["lost_pct"] for x in wins],
        windows=wins,
    )
    return res


def write_md(path: str, env: dict, targets: list[dict]) -> None:
    def p(v: float | None, d: int = 2) -> str:
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:+.{d}f} %"

    def ci(lo_hi: list[float], d: int = 2) -> str:
        return f"[{p(lo_hi[0], d)}, {p(lo_hi[1], d)}]"

    rows = [
        f"| {t['name']} | {t['threads']} ({t['threads_with_children']}) | {t['pairs']} × {t['window_s']:.2f} s | "
        f"{t['steps_per_s_detached']:.1f} | {t['detached_cv_pct']:.2f} % | "
        f"{p(t['slowdown_pct'])} {ci(t['ci95_pct'])} | "
        f"{p(t['slowdown_trimmed_pct'])} {ci(t['trimmed_ci95_pct'])} | "
        f"{p(t['lost_pct'], 3)} {ci(t['lost_ci95_pct'], 3)} | "
        f"{t['sampler_cpu_pct']:.2f} % | {t['stacks_per_s']:.2f} | "
        f"{'n/a' if t['shown_cost_pct'] is None else format(t['shown_cost_pct'], '.2f') + ' %'} | {verdict(t)} |"
        for t in targets
    ]
    worst = max(targets, key=lambda t: t["ci95_pct"][1]) if targets else None
    text = f"""# What attaching gputop's stack sampler costs the job

Run: {env['when']} on {env['host']}: {env['cpus']} CPUs, {targets[0]['device'] if targets else '?'}, Python
{env['python']}, torch {env['torch']}, py-spy {env['pyspy']}. The whole run in {env['wall_s']:.0f} s of a
{env['budget_s']:g} s budget; windows of about {env['window_s']:g} s, alternating detached and attached on one
running job per target. Produced by `python bench/attach_cost.py {env['argv']}`.

| target | threads (with workers) | pairs × window | steps/s detached | detached CV | slowdown, mean [95 % CI] | trimmed mean [95 % CI] | lost time, probe [95 % CI] | sampler CPU, % of a core | stacks/s | gputop shows | target |
|---|---|---|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

- *window*: whole cycles of the job (10 steps between `loss.item()` calls on CUDA,
  one step on the CPU, one 40-step checkpoint period in `checkpoint`), measured on the job's own
  clock at the cycle boundaries. *detached CV*: the detached windows' step rates, standard
  deviation over mean: the job's own noise at this window length.
- *slowdown*: 1 - steps/s attached ÷ mean of the detached windows before and after, averaged
  over the attached windows. The interval is the union of a moving-block bootstrap (blocks of 2
  pairs, as neighbouring pairs share a detached window) and a t interval with the lag-1
  covariance added (both are in the JSON). *trimmed mean*: {int(TRIM * 100)} % cut each side, a check on outliers only (it would
  hide a rare long stop).
- *lost time*: a probe thread in the job sleeps 2 ms at a time and adds up how late it wakes;
  attached minus detached, % of wall time. A job stopped by py-spy shows here first.
- *sampler CPU*: gputop's sampling thread and its py-spy processes over the attached windows.
- *gputop shows*: the cost the sampler estimates for itself (the status line, `advise`).
- *target*: slowdown ≤ {TARGET_SLOWDOWN_PCT} % and its interval's upper end ≤ {TARGET_WORST_PCT} %, the same for the lost time, sampler ≤ {TARGET_CPU_PCT} % of a core.
"""
    if worst is not None:
        text += (f"\nWorst upper bound: `{worst['name']}`, "
                 f"{p(worst['ci95_pct'][1])} (slowdown {p(worst['slowdown_pct'])}).\n")
    with open(path, "w") as f:
        f.write(text)


def environment(args: argparse.Namespace) -> dict:
    try:
        import torch

        tv = torch.__version__
    except ImportError:
        tv = None
    from gputop.sources.stacks import find_pyspy

    try:
        pv = subprocess.run([find_pyspy() or "py-spy", "--version"], capture_output=True, text=True).stdout.split()[-1]
    except (OSError, IndexError):
        pv = None
    return {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": tv,
        "pyspy": pv,
        "budget_s": args.budget_s,
        "window_s": args.window,
        "warmup_s": args.warmup,
        "argv": " ".join(sys.argv[1:]),
    }


def main() -> int:
    run_start = time.monotonic()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="directory for attach_cost.json/.md")
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                    help="wall time for the whole run, every target's start-up and warm-up included")
    ap.add_argument("--window", type=float, default=1.0, help="seconds per window (whole cycles)")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds of a job's steps before its windows")
    ap.add_argument("--settle", type=float, default=1.0, help="seconds attached before the windows (first look)")
    ap.add_argument("--pairs", type=int, default=None, help="at most this many attached windows per target")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--run-target", help=argparse.SUPPRESS)
    ap.add_argument("--fd", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run_target:
        run_target(args.run_target, args.fd, args.device, args.ckpt)
        return 0
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    env = environment(args)
    names = [n for n in args.targets.split(",") if n]
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        ap.error(f"unknown targets: {', '.join(unknown)}")
    deadlines = target_deadlines(run_start, args.budget_s, len(names))
    results = []

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - run_start:6.1f} s] {msg}", flush=True)

    for name, deadline in zip(names, deadlines):
        t = measure(name, args.device, args.window, args.warmup, args.settle, deadline, args.pairs, log)
        log(f"== {name}: slowdown {t['slowdown_pct']:+.2f} % [{t['ci95_pct'][0]:+.2f}, {t['ci95_pct'][1]:+.2f}] "
            f"(t {t['ci95_t_pct'][0]:+.2f}, {t['ci95_t_pct'][1]:+.2f}), trimmed {t['slowdown_trimmed_pct']:+.2f} %, "
            f"lost {t['lost_pct']:+.3f} % [{t['lost_ci95_pct'][0]:+.3f}, {t['lost_ci95_pct'][1]:+.3f}], "
            f"detached CV {t['detached_cv_pct']:.2f} %, sampler {t['sampler_cpu_pct']:.2f} % of a core, "
            f"{t['threads']} threads, {t['pairs']} pairs, {verdict(t)}")
        results.append(t)
        env["wall_s"] = time.monotonic() - run_start
        if args.out:  # after each target: a run cut short keeps what it measured
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "attach_cost.json"), "w") as f:
                json.dump({"environment": env, "targets": results}, f, indent=1)
            write_md(os.path.join(args.out, "attach_cost.md"), env, results)
    log(f"done in {time.monotonic() - run_start:.1f} s (budget {args.budget_s:g} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
