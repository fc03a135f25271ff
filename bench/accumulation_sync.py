#!/usr/bin/env python3
"""Gradient accumulation that all-reduces every micro-batch: does ``gputop advise`` on the
launcher's PID name it (``accumulation-sync``), how soon, and does its stated bound hold the
speed-up the fix measures?

The job (bench/jobs/accum_ddp.py, in-sample: the rule was built on it) is a 2-rank DDP job that
steps its optimizer every ``--accum`` micro-batches while every ``backward`` all-reduces; its fix
runs all but the last micro-batch under ``no_sync()``. It runs ``--rounds`` times as written and
fixed, alternately (a shared machine's load drifts: alternating keeps it out of the ratio), each
measured over ``--measure`` s past its warm-up; ``advise`` attaches to the as-written job once, past
its warm-up, as a user would.

    python bench/accumulation_sync.py --out bench/results     # CPU ranks, gloo

CPU only (gloo): the all-reduce blocks the ranks' threads at the end of backward, where the
stacks see it. On NCCL it is a kernel on the GPU; that run is owed to a GPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "bench" / "jobs" / "accum_ddp.py"
ATTACH_AFTER_S = 12.0  # past the advisor's warm-up (WARMUP_AGE_S, 10 s)


def start(log: Path, fixed: bool, accum: int) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(ROOT / "bench" / "jobs") + os.pathsep + env.get("PYTHONPATH", "")
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                 "2", str(JOB), "--accum", str(accum), *(["--fixed"] if fixed else [])],
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def stop(job: subprocess.Popen) -> None:
    try:
        os.killpg(job.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    job.wait()


def wait_ready(job: subprocess.Popen, log: Path) -> float:
    t0 = time.monotonic()
    while "gputop-workload ready" not in log.read_text():
        if job.poll() is not None or time.monotonic() - t0 > 120:
            raise SystemExit("the job did not start: " + log.read_text()[-800:])
        time.sleep(0.2)
    return t0


def rate(log: Path, t0: float, t1: float) -> float | None:
    pts = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if parts[:2] == ["gputop-workload", "rate"]:
            kv = dict(p.split("=", 1) for p in parts[2:] if "=" in p)
            if t0 <= float(kv["t"]) <= t1:
                pts.append((float(kv["t"]), int(kv["samples"])))
    if len(pts) < 2:
        return None
    return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])


def measure(tmp: Path, fixed: bool, accum: int, seconds: float, i: int) -> float | None:
    log = tmp / f"rate-{'fixed' if fixed else 'as-is'}-{i}.log"
    job = start(log, fixed, accum)
    try:
        wait_ready(job, log)
        time.sleep(2.0)
        t0 = time.time()
        time.sleep(seconds)
        return rate(log, t0, time.time())
    finally:
        stop(job)


def advise(tmp: Path, accum: int, duration: float) -> dict:
    log = tmp / "advised.log"
    job = start(log, False, accum)
    try:
        t0 = wait_ready(job, log)
        time.sleep(max(0.0, t0 + ATTACH_AFTER_S - time.monotonic()))
        res = subprocess.run([sys.executable, "-m", "gputop", "advise", "--pid", str(job.pid), "--duration",
                              str(duration), "--json"], capture_output=True, text=True, timeout=duration + 120, cwd=ROOT)
        if res.returncode != 0:
            raise SystemExit("advise failed: " + res.stderr[-800:])
        return json.loads(res.stdout)
    finally:
        stop(job)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for accumulation_sync_cpu.{json,md}")
    ap.add_argument("--accum", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--measure", type=float, default=8.0)
    ap.add_argument("--duration", type=float, default=15.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        report = advise(tmp, args.accum, args.duration)
        pairs = []
        for i in range(args.rounds):
            pairs.append((measure(tmp, False, args.accum, args.measure, i), measure(tmp, True, args.accum, args.measure, i)))
    f = next((f for f in report["findings"] if f["id"] == "accumulation-sync"), None)
    seen = {s["id"]: s["first_seen_s"] for s in report.get("seen", [])}
    loud = sorted({r["top"] for r in report.get("top_timeline", []) if r.get("severity") in ("warning", "critical")
                   and r.get("top") != "accumulation-sync"})
    speedups = [b / a for a, b in pairs if a and b]
    result = {
        "machine": f"{platform.node()}: {os.cpu_count()} cores, CPU only (gloo)",
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "job": "bench/jobs/accum_ddp.py (in-sample)", "accum": args.accum,
        "named": f is not None, "t_named_s": seen.get("accumulation-sync"),
        "false_warnings": loud,
        "title": f["title"] if f else None, "expected_gain": f.get("expected_gain") if f else None,
        "gain_bound": f.get("gain_predicted") if f else None,
        "step": report.get("step"),
        "rates": [{"as_is": a, "fixed": b} for a, b in pairs],
        "speedup_median": round(statistics.median(speedups), 2) if speedups else None,
        "speedups": [round(s, 2) for s in speedups],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "accumulation_sync_cpu.json").write_text(json.dumps(result, indent=2) + "\n")
    bound = result["gain_bound"]
    held = bound is not None and result["speedup_median"] is not None and result["speedup_median"] <= bound * 1.1
    md = [
        "# Gradient accumulation without no_sync() (CPU, gloo)", "",
        f"Machine: {result['machine']}, {result['when']}. `python bench/accumulation_sync.py --out DIR`: "
        f"`gputop advise --pid LAUNCHER --duration {args.duration:g} --json` attached {ATTACH_AFTER_S:g} s after "
        f"the job started; the fix measured {args.rounds} times, alternating with the job as written, "
        f"{args.measure:g} s each. In-sample: the rule was built on this job. Not a GPU result.", "",
        "| named | first shown (s) | false warnings | stated bound | measured speed-up (median) | each round |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| {'yes' if result['named'] else 'NO'} | {result['t_named_s']} | {', '.join(loud) or 0} | "
        f"{bound if bound is not None else '-'}x | {result['speedup_median']}x | "
        f"{', '.join(f'{s}x' for s in result['speedups'])} |", "",
        f"Finding: {result['title']}; gain: {result['expected_gain']}.", "",
        f"Step as sampled: {result['step']}.", "",
        ("The bound held (the measured speed-up is under it, within 10 %)." if held else
         "The bound did NOT hold: the measured speed-up is above it (or nothing was measured)."),
    ]
    (args.out / "accumulation_sync_cpu.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
