"""Poll the real NVML source a few times and print what it produced (a sanity check on new hardware).

    python scripts/nvml_probe.py --polls 5
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gputop.sources.nvml import NvmlSource  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--polls", type=int, default=5)
    p.add_argument("--interval", type=float, default=1.0)
    args = p.parse_args()
    src = NvmlSource.open(interval=args.interval)
    costs = []
    for i in range(args.polls):
        t0 = time.perf_counter()
        batch = src.poll()
        costs.append((time.perf_counter() - t0) * 1000)
        kinds: dict[str, int] = {}
        for s in batch:
            kinds[type(s).__name__] = kinds.get(type(s).__name__, 0) + 1
        print(f"poll {i}: {costs[-1]:.2f} ms {kinds}")
        for s in batch:
            if type(s).__name__ in ("SystemInfo", "GpuInfo", "Event") or (i == args.polls - 1 and type(s).__name__ in ("GpuSample", "GpuProcess")):
                print("   ", json.dumps(dataclasses.asdict(s), default=str))
        time.sleep(args.interval)
    src.close()
    print(f"poll cost ms: median {statistics.median(costs):.2f}, max {max(costs):.2f}")


if __name__ == "__main__":
    main()
