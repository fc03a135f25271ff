#!/usr/bin/env python3
"""Does gputop name a job's memory growth before it dies, and how well does it forecast the death?

Six plain user scripts (bench/jobs/memory/): a graph kept by `total_loss += loss`, outputs kept
in a list, a slow leak (a few MB a step), a healthy job whose allocator warms up then plateaus, a
saw-tooth (a periodic eval at a larger batch), and DataLoader workers whose Dataset of Python
objects is copied page by page (copy-on-read). Each runs under a memory cap so the leaks really
die: a ballast process holds all of the card (or the host) but ``--room`` GiB, so the limit the
job meets is the one NVML (or the host) reports, the one the forecast is made against. (A cap
inside the job, ``torch.cuda.set_per_process_memory_fraction``, is invisible to NVML: the
forecast would be late by design.)

gputop attaches to each job through its own session (the same advisor as ``advise``) and the
bench notes, per job: ``truth``, ``named`` (memory-growth shown, on the right device, with the
leak's line where the stacks hold it), ``t_named_s`` (from the job's "growth starts" line),
``eta_predicted_s`` (the forecast when first named) against ``eta_actual_s`` (from then to the
job's death), and ``false_alarm`` (memory-growth shown on a job that does not leak).

Targets (issue 27): every leak named within 30 s of its growth becoming visible, the forecast
within 25 % of the actual time once named, no false alarm on the healthy and saw-tooth jobs.

Usage, on the GPU machine:
    python bench/memory.py --out bench/results            # writes memory.json and memory.md
Smoke test on a CPU (host-memory job, small; prints the rows, writes nothing):
    python bench/memory.py --device cpu --tiny
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gputop.session import Config, open_live  # noqa: E402

JOBS = ROOT / "bench" / "jobs" / "memory"


@dataclass(frozen=True)
class Job:
    script: str
    truth: str  # "gpu-leak", "host-leak", "healthy"
    line: str | None = None  # the leaking line's text, where the stacks can hold it
    cpu: bool = False  # meaningful on a CPU (host memory)


SUITE = (
    Job("total_loss.py", "gpu-leak", "total_loss += loss"),
    Job("outputs_list.py", "gpu-leak", "all_outputs.append(outputs)"),
    Job("slow_leak.py", "gpu-leak"),
    Job("healthy.py", "healthy", cpu=True),
    Job("sawtooth.py", "healthy"),
    Job("workers_cow.py", "host-leak", cpu=True),
)


@dataclass
class Row:
    job: str
    truth: str
    named: bool = False
    line_named: bool | None = None
    t_named_s: float | None = None
    eta_predicted_s: float | None = None
    eta_actual_s: float | None = None
    eta_error: float | None = None  # (predicted - actual) / actual
    false_alarm: bool = False
    exit_cause: str | None = None
    note: str = ""


def ballast(device: str, room_gib: float) -> subprocess.Popen | None:
    """A process that holds all of the card's (or the host's) memory but ``room_gib``."""
    if device == "cpu":
        code = ("import psutil, time, mmap\n"
                f"n = max(0, psutil.virtual_memory().available - int({room_gib} * 2**30))\n"
                "m = mmap.mmap(-1, n)\n"
                "for i in range(0, n, 4096): m[i] = 1\n"
                "print('ready', flush=True)\n"
                "time.sleep(1e9)\n")
    else:
        code = ("import torch, time\n"
                "free, total = torch.cuda.mem_get_info()\n"
                f"x = torch.empty(max(0, free - int({room_gib} * 2**30)), dtype=torch.uint8, device='cuda')\n"
                "print('ready', flush=True)\n"
                "time.sleep(1e9)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    if p.stdout.readline().strip() != "ready":
        raise SystemExit("the ballast did not start")
    return p


def run_job(job: Job, device: str, tiny: bool, limit_s: float) -> Row:
    args = [sys.executable, str(JOBS / job.script), "--device", device] + (["--tiny"] if tiny else [])
    if job.truth == "healthy":
        args += ["--seconds", str(limit_s)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    row = Row(job.script, job.truth)
    growth_start = None
    session = open_live(Config(pid=proc.pid, interval=1.0))
    session.start()
    named_at = None
    try:
        t_end = time.time() + limit_s
        while time.time() < t_end and proc.poll() is None:
            time.sleep(1.0)
            if growth_start is None:
                growth_start = _growth_start(proc)
            if named_at is not None:
                continue
            f = next((f for f in session.store.findings() if f.id == "memory-growth"), None)
            if f is None:
                continue
            named_at = time.time()
            ctx = session.advisor.advisor.last_context
            mem = ctx.memory if ctx is not None else None
            row.named = (f.gpu_index is not None) == (job.truth == "gpu-leak") and job.truth != "healthy"
            row.false_alarm = job.truth == "healthy"
            if job.line is not None:
                row.line_named = job.line in f.action
            row.t_named_s = None if growth_start is None else round(named_at - growth_start, 1)
            if mem is not None:
                gr = mem.gpu(f.gpu_index).growth if f.gpu_index is not None and mem.gpu(f.gpu_index) else mem.host
                row.eta_predicted_s = None if gr is None or gr.eta_s is None else round(gr.eta_s, 1)
        died = proc.poll() is not None
        time.sleep(3.0)  # the exit's last polls
        ctx = session.advisor.advisor.last_context
        if ctx is not None and ctx.memory is not None:
            row.exit_cause = ctx.memory.exit_cause
        if died and named_at is not None:
            row.eta_actual_s = round(time.time() - 3.0 - named_at, 1)
            if row.eta_predicted_s:
                row.eta_error = round((row.eta_predicted_s - row.eta_actual_s) / row.eta_actual_s, 3)
        if not died:
            row.note = f"alive after {limit_s:.0f} s"
    finally:
        session.stop()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return row


def _growth_start(proc: subprocess.Popen) -> float | None:
    """The job's own "growth starts <epoch>" line, if it has printed it (non-blocking)."""
    os.set_blocking(proc.stdout.fileno(), False)
    text = proc.stdout.readline() or ""
    return float(text.split()[-1]) if text.startswith("growth starts") else None


def markdown(rows: list[Row]) -> str:
    head = "| job | truth | named | line | t_named_s | eta_predicted_s | eta_actual_s | error | false alarm | exit |\n"
    head += "|---|---|---|---|---|---|---|---|---|---|\n"
    return head + "".join(
        f"| {r.job} | {r.truth} | {r.named} | {r.line_named} | {r.t_named_s} | {r.eta_predicted_s} | "
        f"{r.eta_actual_s} | {r.eta_error} | {r.false_alarm} | {r.exit_cause or ''} |\n" for r in rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="small jobs, a short watch: a smoke test")
    p.add_argument("--room", type=float, default=None, help="GiB left free by the ballast (default: 6 on a GPU, "
                   "no ballast with --tiny)")
    p.add_argument("--limit", type=float, default=None, help="seconds to watch each job (default 900; 90 with --tiny)")
    p.add_argument("--only", nargs="*", help="job scripts to run")
    p.add_argument("--out", type=Path, default=None, help="folder for memory.json and memory.md (none: print only)")
    args = p.parse_args()
    limit = args.limit or (90.0 if args.tiny else 900.0)
    jobs = [j for j in SUITE if (not args.only or j.script in args.only) and (args.device == "cuda" or j.cpu)]
    room = args.room if args.room is not None else (None if args.tiny else 6.0)
    rows = []
    for job in jobs:
        hold = ballast(args.device, room) if room is not None else None
        try:
            rows.append(run_job(job, args.device, args.tiny, limit))
        finally:
            if hold is not None:
                hold.kill()
                hold.wait()
        print(json.dumps(asdict(rows[-1])), flush=True)
    print(markdown(rows))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "memory.json").write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
        (args.out / "memory.md").write_text(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
