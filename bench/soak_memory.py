#!/usr/bin/env python3
"""Is gputop's memory flat over a long session, UI included?

Drives the real app (GputopApp, headless, 160x48) over the real pipeline with scripted GPUs, the
real host source and the advisor, on a simulated clock: hours of 1 s polls go through in minutes,
and the display redraws every ``--tick-every`` polls as it would at the default 2 s interval.
At checkpoints it records the process's RSS, the number of live Python objects and the number of
samples the store holds. Memory is bounded when all three stop growing once the store's rings
are full (the longest ring, the GPU samples, holds an hour of 1 s polls).

Usage (about 2-3 minutes for the default 4 simulated hours on a laptop-class CPU):
    python bench/soak_memory.py --out bench/results [--hours 4] [--gpus 2]
Writes DIR/soak_memory.json and DIR/soak_memory.md.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gputop.advisor.engine import add_advisor  # noqa: E402
from gputop.session import UI_IDLE_ADVISOR_EVERY_S, Session  # noqa: E402
from gputop.pipeline import Pipeline  # noqa: E402
from gputop.sources.fake import FakeGpuSource  # noqa: E402
from gputop.sources.host import HostSource  # noqa: E402
from gputop.store import Store  # noqa: E402
from gputop.ui.app import GputopApp  # noqa: E402


class SimClock:
    def __init__(self, start: float) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t


def snapshot(store: Store, sim_s: float, started: float) -> dict:
    gc.collect()
    return {
        "sim_hours": round(sim_s / 3600, 3),
        "wall_s": round(time.monotonic() - started, 1),
        "rss_mib": round(psutil.Process().memory_info().rss / 2**20, 1),
        "objects": len(gc.get_objects()),
        "store_items": sum(store.sizes().values()),
    }


async def soak(hours: float, gpus: int, tick_every: int, checkpoints: int) -> list[dict]:
    clock = SimClock(time.time())
    store = Store()
    fake = FakeGpuSource(gpus=gpus, clock=clock)
    host = HostSource(clock=clock)
    pipeline = Pipeline(store, [fake, host], clock=clock)
    session = Session(store=store, pipeline=pipeline, gpu=fake, host=host, mode="fake", interval=1.0,
                      advisor_idle_every=UI_IDLE_ADVISOR_EVERY_S)  # as the live UI runs it
    session.advisor = add_advisor(session)
    app = GputopApp(session, interval=2.0, refresh=1e6)  # redrawn by hand below, on the sim clock
    polls = int(hours * 3600)
    every = max(1, polls // checkpoints)
    rows = []
    started = time.monotonic()
    async with app.run_test(size=(160, 48)) as pilot:
        for n in range(1, polls + 1):
            clock.t += 1.0
            pipeline.poll_once()
            if n % tick_every == 0:
                app.tick()
                await pilot.pause()  # let the compositor paint, as the event loop would
            if n % every == 0 or n == polls:
                rows.append(snapshot(store, n, started))
                print(f"  {rows[-1]}", flush=True)
    return rows


def write_report(out: Path, data: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak_memory.json").write_text(json.dumps(data, indent=2))
    rows = data["rows"]
    half = [r for r in rows if r["sim_hours"] >= data["params"]["hours"] / 2]
    lines = [
        "# Memory over a long session, UI included",
        "",
        f"Machine: {data['machine']}. The real app (headless, 160x48) over the real pipeline: "
        f"{data['params']['gpus']} scripted GPUs, the host source and the advisor, "
        f"{data['params']['hours']:g} simulated hours of 1 s polls, the display redrawn every "
        f"{data['params']['tick_every']} polls. Measured after a full garbage collection.",
        "",
        "| simulated hours | RSS MiB | Python objects | samples in the store | wall s |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['sim_hours']:.2f} | {r['rss_mib']:.1f} | {r['objects']} | {r['store_items']} | {r['wall_s']:.0f} |")
    if len(half) >= 2:
        rss = [r["rss_mib"] for r in half]
        objs = [r["objects"] for r in half]
        lines += [
            "",
            f"Second half of the session: RSS {min(rss):.1f}-{max(rss):.1f} MiB "
            f"({max(rss) - rss[0]:+.1f} MiB from its start), Python objects {min(objs)}-{max(objs)} "
            f"({max(objs) - objs[0]:+d}).",
        ]
    (out / "soak_memory.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench-results")
    p.add_argument("--hours", type=float, default=4.0, help="simulated hours (default 4)")
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--tick-every", type=int, default=2, help="polls between redraws (default 2: the 2 s default)")
    p.add_argument("--checkpoints", type=int, default=16)
    args = p.parse_args(argv)
    if args.hours <= 0 or args.gpus < 1 or args.tick_every < 1 or args.checkpoints < 1:
        p.error("--hours, --gpus, --tick-every and --checkpoints must be positive")
    print(f"soaking {args.hours:g} simulated hours ...", flush=True)
    rows = asyncio.run(soak(args.hours, args.gpus, args.tick_every, args.checkpoints))
    data = {
        "machine": f"{psutil.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}",
        "params": vars(args) | {"out": None},
        "rows": rows,
    }
    write_report(Path(args.out), data)
    print(f"wrote {args.out}/soak_memory.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
