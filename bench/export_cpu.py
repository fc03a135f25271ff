#!/usr/bin/env python3
"""The exporter's own CPU: is `gputop export` within 1 % of a core at a 15 s scrape?

Starts ``python -m gputop export`` (its default 5 s interval, no job attached) and measures the
process tree's CPU time (user + system, children included) with psutil in three phases after a
warm-up:

  cadence   a scrape every 15 s, as Prometheus does by default: the number asked for
  idle      no scrapes: what sampling (GPU source, host source, advisor) costs on its own
  scrapes   back-to-back scrapes: CPU per scrape, and the size of one

Usage (about 3.5 min with the defaults):
    python bench/export_cpu.py --out bench/results                  # fake GPUs (2)
    python bench/export_cpu.py --out DIR --real --label "beside a bf16 job"   # this machine's GPUs
Writes DIR/export_cpu.json and DIR/export_cpu.md (``--name`` changes the file names).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import urllib.request

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tree_cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for c in p.children(recursive=True):
        try:
            ct = c.cpu_times()
            total += ct.user + ct.system
        except psutil.NoSuchProcess:
            pass
    return total


def scrape(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as r:
        return len(r.read())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", default="export_cpu")
    ap.add_argument("--real", action="store_true", help="this machine's GPUs instead of --fake 2")
    ap.add_argument("--fake", type=int, default=2)
    ap.add_argument("--export-args", default="", help="more arguments for gputop export (e.g. '--attach all')")
    ap.add_argument("--label", default="", help="what else ran, for the report")
    ap.add_argument("--warmup", type=float, default=20.0)
    ap.add_argument("--cadence", type=float, default=120.0, help="seconds of 15 s scrapes")
    ap.add_argument("--idle", type=float, default=60.0)
    ap.add_argument("--scrapes", type=int, default=200)
    args = ap.parse_args()

    cmd = [sys.executable, "-m", "gputop", "export", "--listen", "127.0.0.1:0"]
    if not args.real:
        cmd += ["--fake", str(args.fake)]
    cmd += args.export_args.split()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        if "serving" not in line:
            raise SystemExit(f"exporter did not start: {line}{proc.stderr.read()}")
        url = line.split()[3]
        ps = psutil.Process(proc.pid)
        time.sleep(args.warmup)
        scrape(url)

        # cadence: a scrape every 15 s
        c0, t0 = tree_cpu(ps), time.monotonic()
        n = 0
        while time.monotonic() - t0 < args.cadence:
            scrape(url)
            n += 1
            time.sleep(max(0.0, t0 + 15.0 * n - time.monotonic()))
        cadence_pct = 100 * (tree_cpu(ps) - c0) / (time.monotonic() - t0)

        # idle: sampling alone
        c0, t0 = tree_cpu(ps), time.monotonic()
        time.sleep(args.idle)
        idle_pct = 100 * (tree_cpu(ps) - c0) / (time.monotonic() - t0)
        idle_wall = time.monotonic() - t0

        # back-to-back scrapes: CPU per scrape (less the idle rate over the same wall time)
        c0, t0 = tree_cpu(ps), time.monotonic()
        size = 0
        for _ in range(args.scrapes):
            size = scrape(url)
        wall = time.monotonic() - t0
        per_scrape_ms = 1000 * ((tree_cpu(ps) - c0) - idle_pct / 100 * wall) / args.scrapes
        rss = ps.memory_info().rss
    finally:
        proc.terminate()
        proc.wait(10)

    result = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine()},
        "source": "real GPUs" if args.real else f"fake ({args.fake} GPUs)",
        "export_args": args.export_args,
        "label": args.label,
        "interval_s": 5.0,
        "cadence_15s_cpu_pct": round(cadence_pct, 3),
        "cadence_window_s": args.cadence,
        "idle_cpu_pct": round(idle_pct, 3),
        "idle_window_s": round(idle_wall, 1),
        "per_scrape_cpu_ms": round(per_scrape_ms, 2),
        "estimate_15s_cpu_pct": round(idle_pct + per_scrape_ms / 1000 / 15 * 100, 3),
        "scrape_bytes": size,
        "rss_mib": round(rss / 2**20, 1),
        "budget_pct": 1.0,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{args.name}.json"), "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    ok = "within" if result["cadence_15s_cpu_pct"] <= 1.0 else "OVER"
    md = f"""# Exporter CPU

Run: {result['when']}, {result['host']['cpus']} CPUs, Python {result['host']['python']}; GPU source:
{result['source']}{(', ' + args.label) if args.label else ''}. `gputop export` at its default 5 s interval,
no job attached{(' (' + args.export_args + ')') if args.export_args else ''}. CPU is the process tree (user + system,
children included) as % of one core. Produced by `python bench/export_cpu.py --out DIR`.

| measure | value |
|---|---|
| CPU at a 15 s scrape ({args.cadence:g} s of scrapes) | **{result['cadence_15s_cpu_pct']:.2f} %** ({ok} the 1 % budget) |
| CPU with no scrapes (sampling alone, {result['idle_window_s']:g} s) | {result['idle_cpu_pct']:.2f} % |
| CPU per scrape ({args.scrapes} back to back, less the idle rate) | {result['per_scrape_cpu_ms']:.1f} ms |
| idle + per scrape / 15 s | {result['estimate_15s_cpu_pct']:.2f} % |
| one scrape | {result['scrape_bytes'] / 1024:.1f} KiB |
| RSS at the end | {result['rss_mib']} MiB |

CPU times tick in 10 ms: over {args.cadence:g} s the resolution is about {1.0 / args.cadence:.3f} % of a core.
"""
    with open(os.path.join(args.out, f"{args.name}.md"), "w") as f:
        f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
