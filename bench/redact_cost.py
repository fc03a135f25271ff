#!/usr/bin/env python
"""What redacting a command line costs: gputop redacts every process's command line it keeps (the
host source on each poll, the stack sampler, the recorder), so this must stay cheap.

    python bench/redact_cost.py [--out DIR]

Times ``redact_cmdline`` over the typical command lines the redaction tests use (training jobs,
launchers, servers; ~100 characters each), best of 5 rounds of 20 passes, and one 1,000-character
line. Writes DIR/redact_cost.json and .md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import random
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gputop.redact import redact_cmdline  # noqa: E402

TARGET_US = 20.0  # per typical line: ~100 processes polled each second stay under 2 ms


def typical_lines() -> list[list[str]]:
    spec = importlib.util.spec_from_file_location("test_redact", os.path.join(ROOT, "tests", "test_redact.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return [c.split() for c in mod.TYPICAL]


def per_line_us(lines: list[list[str]], rounds: int = 5, passes: int = 20) -> float:
    for c in lines:
        redact_cmdline(c)
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(passes):
            for c in lines:
                redact_cmdline(c)
        best = min(best, (time.perf_counter() - t) / (passes * len(lines)))
    return best * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = ap.parse_args()
    lines = typical_lines() * 5
    random.Random(0).shuffle(lines)
    typical = per_line_us(lines)
    long_line = [["python", "train.py"] + [f"--opt{i}=value{i}" for i in range(70)]]
    long_us = per_line_us(long_line)
    res = {"when": time.strftime("%Y-%m-%d %H:%M"), "python": platform.python_version(), "cpus": os.cpu_count(),
           "lines": len(lines), "typical_us_per_line": typical, "long_line_chars": len(" ".join(long_line[0])),
           "long_us": long_us, "target_us": TARGET_US, "met": typical <= TARGET_US}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "redact_cost.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(args.out, "redact_cost.md"), "w") as f:
        f.write(f"""# What redacting a command line costs

Run {res['when']}, Python {res['python']}, {res['cpus']} CPUs: `python bench/redact_cost.py`.

| lines | per typical line (best of 5) | a {res['long_line_chars']}-character line | target | met |
|---|---|---|---|---|
| {len(lines)} (the redaction tests' typical lines, shuffled) | {typical:.1f} µs | {long_us:.1f} µs | ≤ {TARGET_US:g} µs | {'yes' if res['met'] else 'NO'} |
""")
    print(f"{typical:.1f} µs per typical line, {long_us:.1f} µs for a {res['long_line_chars']}-character line")
    return 0


if __name__ == "__main__":
    sys.exit(main())
