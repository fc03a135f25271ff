#!/usr/bin/env python3
"""Attach to jobs that hung before gputop came: how soon is "stuck" said, and is the kind right?

Each target is started, let hang (or work) for ``--hung-for`` seconds, then ``gputop advise --pid
P --duration D --json`` runs with every other option at its default (``--stuck-after`` 30 s).
Recorded per target: the top finding, when "stuck" was first shown after attaching (the advisor's
own ``first_seen_s``), the title (the kind and where), and whether that matches the truth.

Targets: the `stuck` workload (every DataLoader worker blocks, on CUDA when there is a GPU: the
GPU sits idle, so NVML's buffer says how long), tests/stack_targets.py's deadlock in a callback,
DataLoader workers hung on a socket and inside ``__getitem__``, a FIFO read, a child wait; and as
controls, a slow ``__getitem__`` at full CPU and a long checkpoint save, which must not be stuck.

    python bench/stuck_attach.py --out bench/results [--device cuda]
Writes OUT/stuck_attach.json and OUT/stuck_attach.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ROOT / "tests" / "stack_targets.py"

# name: (argv after python, expected kind word in the title, or None when it must not be stuck)
def targets(device: str, tmp: str) -> dict[str, tuple[list[str], str | None]]:
    return {
        "stuck workload (all workers blocked)": (["-m", "gputop.workloads", "stuck", "--device", device], "DataLoader worker"),
        "deadlock in a callback": ([str(TARGETS), "callback_deadlock"], "deadlock"),
        "workers hung on a socket": ([str(TARGETS), "socket_workers"], "socket"),
        "worker hung in __getitem__": ([str(TARGETS), "hung_worker"], "DataLoader worker"),
        "read from a FIFO": ([str(TARGETS), "fifo_read", os.path.join(tmp, "b.fifo")], "IO hang"),
        "wait for a child": ([str(TARGETS), "child_wait"], "child"),
        "slow __getitem__ (control)": ([str(TARGETS), "slow_getitem"], None),
        "long checkpoint save (control)": ([str(TARGETS), "long_save", os.path.join(tmp, "c.pt")], None),
    }


def wait_ready(p: subprocess.Popen, timeout: float = 120.0) -> None:
    end = time.time() + timeout
    while time.time() < end:
        line = p.stdout.readline()
        if "ready" in line:
            return
        if not line and p.poll() is not None:
            raise RuntimeError(f"{p.args} exited {p.returncode}")
    raise RuntimeError(f"{p.args} never got ready")


def kill_tree(p: subprocess.Popen) -> None:
    import psutil

    try:
        for k in psutil.Process(p.pid).children(recursive=True):
            k.kill()
    except psutil.Error:
        pass
    p.kill()
    p.wait(10)


def run_one(argv: list[str], expect: str | None, duration: float, hung_for: float, stuck_workload: bool) -> dict:
    p = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         cwd=ROOT)
    try:
        wait_ready(p)
        # The workload trains a few seconds before its workers block: let it get there.
        time.sleep(hung_for + (8.0 if stuck_workload else 0.0))
        t0 = time.time()
        r = subprocess.run([sys.executable, "-m", "gputop", "advise", "--pid", str(p.pid), "--duration",
                            str(duration), "--json"], capture_output=True, text=True, cwd=ROOT, timeout=duration + 60)
        report = json.loads(r.stdout) if r.returncode == 0 else {}
    finally:
        kill_tree(p)
    findings = report.get("findings", [])
    stuck = next((f for f in findings if f["id"] == "stuck"), None)
    seen = next((s for s in report.get("seen", []) if s["id"] == "stuck"), None)
    if expect is None:
        correct = stuck is None
    else:
        correct = stuck is not None and expect.lower() in stuck["title"].lower()
    return {
        "top_finding": findings[0]["id"] if findings else None,
        "stuck": stuck is not None,
        "t_stuck_s": seen["first_seen_s"] if seen else None,
        "title": stuck["title"] if stuck else None,
        "expected": expect,
        "correct": correct,
        "advise_wall_s": round(time.time() - t0, 1),
        "error": r.stderr.strip()[-300:] if r.returncode else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--hung-for", type=float, default=2.0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="gputop-stuck-bench-")
    rows = []
    for name, (argv, expect) in targets(args.device, tmp).items():
        row = {"name": name, **run_one(argv, expect, args.duration, args.hung_for, "gputop.workloads" in argv)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    gpu = None
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True).stdout.strip() or None
    except OSError:
        pass
    times = [r["t_stuck_s"] for r in rows if r["expected"] and r["stuck"]]
    result = {
        "host": platform.node(), "cpus": os.cpu_count(), "gpu": gpu, "device": args.device,
        "duration_s": args.duration, "hung_for_s": args.hung_for, "stuck_after_s": 30.0,
        "targets": rows,
        "correct": sum(r["correct"] for r in rows), "total": len(rows),
        "median_t_stuck_s": statistics.median(times) if times else None,
        "max_t_stuck_s": max(times) if times else None,
    }
    (out / "stuck_attach.json").write_text(json.dumps(result, indent=1))
    lines = [
        "# Stuck at attach",
        "",
        f"Run: {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, GPU: {gpu or 'none'}, targets on `{args.device}`"
        " where they use a device. Each job hung (or worked) before `gputop advise --pid P --duration"
        f" {args.duration:g} --json` attached, every other option at its default (stuck-after 30 s). Produced by"
        " `python bench/stuck_attach.py --out DIR`.",
        "",
        f"**{result['correct']} of {result['total']} right**; stuck said {result['median_t_stuck_s']} s"
        f" (median) and at most {result['max_t_stuck_s']} s after attaching.",
        "",
        "| job | truth | top finding | stuck after (s) | title | right |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['name']} | {r['expected'] or 'not stuck'} | {r['top_finding']} | {r['t_stuck_s']} | "
                     f"{(r['title'] or '').replace('|', '/')[:120]} | {'yes' if r['correct'] else 'NO'} |")
    (out / "stuck_attach.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
