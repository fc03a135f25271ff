#!/usr/bin/env python
"""What attaching gputop's stack sampler costs a running training job, to a fraction of a percent.

    python bench/attach_cost.py --out bench/results [--device auto|cuda|cpu] [--pairs 20]
                                [--window 10] [--targets many-threads,cpu-loading,...]

Method, per target (one job, started once, warmed up, then left running):
- Windows of ``--window`` seconds alternate D A D A ... A D: D detached, A with gputop's sampler
  (PySpySource with the session's defaults, polled the way the pipeline polls it) attached.
  Each A is compared with the mean of the two D around it, so a linear drift of the job's speed
  cancels; ``slowdown = 1 - steps/s(A) / mean(steps/s(D before), steps/s(D after))``.
- The mean slowdown over the ``--pairs`` A windows, with a 95 % confidence interval (bootstrap
  percentile over the A windows, fixed seed; the t interval is stored beside it).
- Beside the step rate, a lost-time probe inside the job: a thread that sleeps 2 ms at a time and
  adds up how late it wakes. A job stopped by py-spy wakes it late by the stop; sampling's lost
  time is the same difference, A minus its D neighbours, in % of wall time.
- The sampler's own CPU (its thread and its py-spy processes) in the A windows, % of one core,
  and what gputop itself shows (``SamplingCost.job_cost_pct``).
The sampler is attached once before the first window and only polled in A windows; each A starts
with its CPU budget's burst spent (the state a long attach is in), so a window measures the
steady cost, not the first seconds after attaching (the burst of ~30 dumps, once).

Targets (``--device cuda`` sizes; ``cpu`` runs the same code smaller):
- many-threads: a 64-thread intra-op pool, 8 DataLoader workers, pin-memory, bf16 MLP.
- cpu-loading: DataLoader(num_workers=0) with a per-sample CPU transform in the main process.
- checkpoint: a bf16 MLP that writes a torch.save checkpoint every 40 steps.
- launch-bound: a small deep MLP, tiny batches: the step is kernel-launch overhead.
- healthy-bf16: a large bf16 MLP, batches already on the device.

Writes OUT/attach_cost.json ({"targets": [{name, threads, slowdown_pct, ci95_pct,
sampler_cpu_pct, device, ...}]}) and OUT/attach_cost.md. Each target takes about
(2 * pairs + 1) * window + warm-up seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
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
COUNTER = struct.Struct("qdd")  # steps, probe lost seconds, probe wall seconds
PROBE_SLEEP_S = 0.002
PROBE_SLACK_S = 0.001  # a wake-up later than this (timer slack, GIL hand-over) counts as lost


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


def bootstrap_ci(xs: list[float], level: float = 0.95, n: int = 10000, seed: int = 1) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean."""
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return (float("nan"), float("nan"))
    rng = random.Random(seed)
    k = len(xs)
    means = sorted(sum(rng.choice(xs) for _ in range(k)) / k for _ in range(n))
    lo = means[int((1 - level) / 2 * n)]
    hi = means[min(n - 1, int((1 + level) / 2 * n))]
    return (lo, hi)


# Two-sided 97.5 % quantiles of Student's t, for the t interval (dof 1-30; above, the normal's).
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
         2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
         2.052, 2.048, 2.045, 2.042]


def t_ci(xs: list[float]) -> tuple[float, float]:
    xs = [x for x in xs if not math.isnan(x)]
    if len(xs) < 2:
        return (float("nan"), float("nan"))
    m, sd = statistics.fmean(xs), statistics.stdev(xs)
    q = _T975[len(xs) - 2] if len(xs) - 1 <= len(_T975) else 1.96
    h = q * sd / math.sqrt(len(xs))
    return (m - h, m + h)


def summarize(rates: list[float], lost_pct: list[float]) -> dict:
    """Slowdown with its intervals from the windows' step rates and probe lost time."""
    slow = paired_slowdowns(rates)
    lost = paired_differences(lost_pct)
    lo, hi = bootstrap_ci(slow)
    mean = statistics.fmean(slow)
    return {
        "slowdown_pct": mean,
        "ci95_pct": [lo, hi],
        "ci95_halfwidth_pct": (hi - lo) / 2,
        "ci95_t_pct": list(t_ci(slow)),
        "pairs": len(slow),
        "lost_pct": statistics.fmean(lost),
        "lost_ci95_pct": list(bootstrap_ci(lost)),
        "per_window_slowdown_pct": slow,
    }


# --------------------------------------------------------------------------- the targets


def run_target(name: str, path: str, device: str) -> None:
    """The training job: counts its steps into the shared counter, with the probe thread."""
    import torch

    cuda = device == "cuda"
    dev = torch.device(device)
    f = open(path, "r+b")
    mm = mmap.mmap(f.fileno(), COUNTER.size)
    lock = threading.Lock()
    state = {"steps": 0, "lost": 0.0, "start": time.perf_counter()}

    def publish() -> None:
        with lock:
            COUNTER.pack_into(mm, 0, state["steps"], state["lost"], time.perf_counter() - state["start"])

    def probe() -> None:
        while True:
            t = time.perf_counter()
            time.sleep(PROBE_SLEEP_S)
            late = time.perf_counter() - t - PROBE_SLEEP_S
            if late > PROBE_SLACK_S:
                state["lost"] += late - PROBE_SLACK_S
            publish()

    big = cuda  # GPU sizes; the CPU run is for debugging the bench
    sync_every = 10

    def mlp(width: int, depth: int) -> torch.nn.Module:
        layers: list[torch.nn.Module] = []
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
        return torch.nn.Sequential(*layers).to(dev)

    def amp():
        return torch.autocast(device_type=dev.type, dtype=torch.bfloat16)

    batches = None
    if name == "many-threads":
        torch.set_num_threads(64)
        # Start the intra-op pool: its threads exist from the first parallel CPU op on.
        torch.ones(512, 512) @ torch.ones(512, 512)
        width = 2048 if big else 256
        model = mlp(width, 4)

        class DS(torch.utils.data.Dataset):
            def __len__(self) -> int:
                return 1 << 30

            def __getitem__(self, i: int) -> torch.Tensor:
                return torch.full((width,), float(i % 7))

        loader = torch.utils.data.DataLoader(DS(), batch_size=512 if big else 64, num_workers=8,
                                             pin_memory=cuda, persistent_workers=True, prefetch_factor=4)
        batches = iter(loader)
    elif name == "cpu-loading":
        width = 1024 if big else 128
        model = mlp(width, 2)

        class DS(torch.utils.data.Dataset):
            def __len__(self) -> int:
                return 1 << 30

            def __getitem__(self, i: int) -> torch.Tensor:
                x = torch.randn(3, 32, 32)
                x = (x - x.mean()) / (x.std() + 1e-6)
                return torch.flip(x, (2,)).reshape(-1)[:width]

        loader = torch.utils.data.DataLoader(DS(), batch_size=64, num_workers=0)
        batches = iter(loader)
    elif name == "checkpoint":
        width = 4096 if big else 512
        model = mlp(width, 4)  # ~67M parameters on the GPU: a 270 MB checkpoint
        ckpt = tempfile.NamedTemporaryFile(prefix="attach-cost-", suffix=".pt", delete=False).name
    elif name == "launch-bound":
        width = 256 if big else 64
        model = mlp(width, 16)
    elif name == "healthy-bf16":
        width = 4096 if big else 512
        model = mlp(width, 4)
    else:
        raise SystemExit(f"unknown target {name}")
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    batch = {"launch-bound": 32, "healthy-bf16": 4096 if big else 256, "checkpoint": 1024 if big else 128}
    fixed = torch.randn(batch.get(name, 64), width, device=dev)

    def step(i: int) -> None:
        x = fixed
        if batches is not None:
            x = next(batches).to(dev, non_blocking=cuda)
        with amp():
            loss = model(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i % sync_every == 0:
            loss.item()  # logging, as real loops do: bounds how far the queue runs ahead
        if name == "checkpoint" and i % 40 == 39:
            torch.save(model.state_dict(), ckpt)

    for i in range(20):
        step(i)
    if cuda:
        torch.cuda.synchronize()
    threading.Thread(target=probe, name="lost-time-probe", daemon=True).start()
    desc = torch.cuda.get_device_name() if cuda else f"cpu ({os.cpu_count()} cores)"
    print(json.dumps({"ready": True, "device": desc, "torch": torch.__version__}), flush=True)
    i = 0
    while True:
        step(i)
        i += 1
        with lock:
            state["steps"] = i
        if i % 4 == 0:
            publish()


# --------------------------------------------------------------------------- the harness


class Job:
    def __init__(self, name: str, device: str) -> None:
        fd, self.path = tempfile.mkstemp(prefix="attach-cost-")
        os.write(fd, b"\0" * COUNTER.size)
        os.close(fd)
        self.f = open(self.path, "r+b")
        self.mm = mmap.mmap(self.f.fileno(), COUNTER.size)
        self.proc = subprocess.Popen([sys.executable, __file__, "--run-target", name, "--counter", self.path,
                                      "--device", device], stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"target {name} exited with {self.proc.wait()}")
        self.info = json.loads(line)
        self.pid = self.proc.pid

    def read(self) -> tuple[int, float, float]:
        return COUNTER.unpack_from(self.mm, 0)

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
        os.unlink(self.path)


class Sampler:
    """gputop's sampler on the job, polled on its own thread as the pipeline polls it, only while
    attached; its CPU (thread + py-spy processes) metered over the attached time."""

    def __init__(self, pid: int) -> None:
        from gputop.session import stack_sampler
        from gputop.store import Store

        self.src = stack_sampler(pid)
        self.store = Store()
        self.on = threading.Event()
        self.quit = False
        self.cpu = 0.0
        self.stacks = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from gputop.model import StackSample

        while not self.quit:
            if not self.on.wait(0.05):
                continue
            t0 = time.thread_time()
            out = self.src.poll()
            self.cpu += time.thread_time() - t0
            self.stacks += sum(1 for s in out if isinstance(s, StackSample) and s.is_main and s.pid == self.src.pid)
            self.store.add(out)
            end = time.monotonic() + self.src.interval
            while self.on.is_set() and time.monotonic() < end:
                time.sleep(min(0.05, end - time.monotonic()))

    def attach(self) -> None:
        # A long attach has spent its burst: start each window there (see the module's docstring).
        # Refill first: the detached window's refill must not become budget for this one.
        self.src._cpu.allows(time.monotonic())
        self.src._cpu.level = min(self.src._cpu.level, 0.0)
        self.on.set()

    def detach(self) -> None:
        self.on.clear()
        time.sleep(0.06)  # let a poll in flight finish inside the window that started it

    def close(self) -> None:
        self.on.clear()
        self.quit = True
        self.thread.join(10)


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measure(name: str, device: str, pairs: int, window: float, warmup: float, log) -> dict:
    job = Job(name, device)
    try:
        time.sleep(warmup)
        sampler = Sampler(job.pid)
        # The attach itself (first look, burst) before the measured windows.
        sampler.on.set()
        time.sleep(min(8.0, warmup))
        sampler.detach()
        rates, lost, cpu_pct, shown, stacks = [], [], [], [], 0
        for w in range(2 * pairs + 1):
            attached = w % 2 == 1
            if attached:
                cpu0, ch0, st0 = sampler.cpu, children_cpu(), sampler.stacks
                sampler.attach()
            s0, l0, p0 = job.read()
            t0 = time.perf_counter()
            time.sleep(window)
            s1, l1, p1 = job.read()
            t1 = time.perf_counter()
            if attached:
                sampler.detach()
                cpu = (sampler.cpu - cpu0) + (children_cpu() - ch0)
                cpu_pct.append(100.0 * cpu / (t1 - t0))
                stacks += sampler.stacks - st0
                if sampler.src.cost is not None:
                    shown.append(sampler.src.cost.job_cost_pct)
            rates.append((s1 - s0) / (t1 - t0))
            lost.append(100.0 * (l1 - l0) / max(1e-9, p1 - p0))
            log(f"{name} w{w:02d} {'A' if attached else 'D'} {rates[-1]:.2f} steps/s lost {lost[-1]:.3f} %"
                + (f" sampler {cpu_pct[-1]:.2f} %" if attached else ""))
        own, total = job.threads()
        sampler.close()
        res = summarize(rates, lost)
        res.update(
            name=name,
            threads=own,
            threads_with_children=total,
            sampler_cpu_pct=statistics.fmean(cpu_pct),
            shown_cost_pct=statistics.fmean(shown) if shown else None,
            stacks_per_s=stacks / (pairs * window),
            steps_per_s_detached=statistics.fmean(rates[0::2]),
            device=job.info["device"],
            window_s=window,
            rates=rates,
            lost_pct_windows=lost,
        )
        return res
    finally:
        job.close()


def verdict(t: dict) -> str:
    worst = t["ci95_pct"][1]
    ok = t["slowdown_pct"] <= TARGET_SLOWDOWN_PCT and worst <= TARGET_WORST_PCT and t["sampler_cpu_pct"] <= TARGET_CPU_PCT
    return "met" if ok else "NOT met"


def write_md(path: str, env: dict, targets: list[dict]) -> None:
    def p(v: float | None, d: int = 2) -> str:
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:+.{d}f} %"

    rows = [
        f"| {t['name']} | {t['threads']} ({t['threads_with_children']}) | {t['steps_per_s_detached']:.1f} | "
        f"{p(t['slowdown_pct'])} [{p(t['ci95_pct'][0])}, {p(t['ci95_pct'][1])}] | "
        f"{p(t['lost_pct'], 3)} [{p(t['lost_ci95_pct'][0], 3)}, {p(t['lost_ci95_pct'][1], 3)}] | "
        f"{t['sampler_cpu_pct']:.2f} % | {t['stacks_per_s']:.2f} | "
        f"{'n/a' if t['shown_cost_pct'] is None else format(t['shown_cost_pct'], '.2f') + ' %'} | {verdict(t)} |"
        for t in targets
    ]
    text = f"""# What attaching gputop's stack sampler costs the job

Run: {env['when']} on {env['host']}: {env['cpus']} CPUs, {targets[0]['device'] if targets else '?'}, Python
{env['python']}, torch {env['torch']}, py-spy {env['pyspy']}. {env['pairs']} attached windows of {env['window_s']:g} s,
each between two detached ones, per target. Produced by `python bench/attach_cost.py {env['argv']}`.

| target | threads (with workers) | steps/s detached | slowdown, mean [95 % CI] | lost time, probe [95 % CI] | sampler CPU, % of a core | stacks/s | gputop shows | target |
|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

- *slowdown*: 1 - steps/s attached ÷ mean of the detached windows before and after, averaged
  over the attached windows; the interval is a bootstrap percentile interval of that mean
  (the t interval is in the JSON).
- *lost time*: a probe thread in the job sleeps 2 ms at a time and adds up how late it wakes;
  attached minus detached, % of wall time. A job stopped by py-spy shows here first.
- *sampler CPU*: gputop's sampling thread and its py-spy processes over the attached windows.
- *gputop shows*: the cost the sampler estimates for itself (the status line, `advise`).
- *target*: slowdown ≤ {TARGET_SLOWDOWN_PCT} %, slowdown + interval ≤ {TARGET_WORST_PCT} %, sampler ≤ {TARGET_CPU_PCT} % of a core.
"""
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
        "pairs": args.pairs,
        "window_s": args.window,
        "argv": " ".join(sys.argv[1:]),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="directory for attach_cost.json/.md")
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--pairs", type=int, default=20, help="attached windows per target")
    ap.add_argument("--window", type=float, default=10.0, help="seconds per window")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds before the first window")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--run-target", help=argparse.SUPPRESS)
    ap.add_argument("--counter", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run_target:
        run_target(args.run_target, args.counter, args.device)
        return 0
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    env = environment(args)
    results = []

    def log(msg: str) -> None:
        print(msg, flush=True)

    for name in args.targets.split(","):
        t = measure(name, args.device, args.pairs, args.window, args.warmup, log)
        log(f"== {name}: slowdown {t['slowdown_pct']:+.2f} % [{t['ci95_pct'][0]:+.2f}, {t['ci95_pct'][1]:+.2f}], "
            f"lost {t['lost_pct']:+.3f} %, sampler {t['sampler_cpu_pct']:.2f} % of a core, {t['threads']} threads")
        results.append(t)
        if args.out:  # after each target: a run cut short keeps what it measured
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "attach_cost.json"), "w") as f:
                json.dump({"environment": env, "targets": results}, f, indent=1)
            write_md(os.path.join(args.out, "attach_cost.md"), env, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
