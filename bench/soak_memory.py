#!/usr/bin/env python3
"""Is gputop's memory flat over a long session, UI included?

Drives the real app (GputopApp, headless, 160x48) over the real pipeline with scripted GPUs, the
real host source and the advisor, on a simulated clock: hours of polls at ``--interval`` (the
live default, 2 s) go through in minutes, and the display redraws every 2 simulated seconds as
the live UI does. At checkpoints it records the process's RSS, the number of live Python objects
and the samples each of the store's series holds.

The store is a set of fixed-capacity rings, so memory grows until they are full and is flat
after. The longest to fill are the GPU and host series (3600 samples each): 3600 polls, so two
hours at the default 2 s interval (an hour at 1 s). A session watched for its first minutes
sees RSS climb; the report says when the rings are full and from when RSS stops growing.

Usage (about 5 minutes for the default 4 simulated hours on a laptop-class CPU):
    python bench/soak_memory.py --out bench/results [--hours 4] [--gpus 4] [--interval 2]
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

from gputop.advisor import add_job_stage  # noqa: E402
from gputop.commands.options import DEFAULT_INTERVAL  # noqa: E402
from gputop.session import UI_IDLE_ADVISOR_EVERY_S, Session  # noqa: E402
from gputop.pipeline import Pipeline  # noqa: E402
from gputop.sources.fake import FakeGpuSource  # noqa: E402
from gputop.sources.host import HostSource  # noqa: E402
from gputop.store import Retention, Store  # noqa: E402

# RSS moves by a page or an allocator arena now and then; a rise of this much or less after a
# checkpoint is not growth.
LEVEL_TOLERANCE_MIB = 1.0
# The UI redraws at the live default whatever the poll interval.
REDRAW_EVERY_S = 2.0
# NVML's utilisation buffer (and the scripted source, which mimics it) holds a point every 200 ms:
# those rings fill with time, whatever the poll interval.
UTIL_POINT_S = 0.2
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
        "series": store.sizes(),
    }


def ring_capacities(retention: Retention, series: dict[str, int]) -> dict[str, int]:
    """The capacity of each fixed-size ring among ``series`` (Store.sizes() names)."""
    caps: dict[str, int] = {}
    for name in series:
        if name.startswith("gpu"):
            caps[name] = retention.gpu_samples
        elif name.startswith("util"):
            caps[name] = retention.util_points
        elif name == "host":
            caps[name] = retention.host_samples
    return caps


def fill_seconds(capacities: dict[str, int], interval: float) -> dict[str, float]:
    """How long each ring takes to fill: a sample a poll, or a utilisation point every 200 ms."""
    return {n: c * (UTIL_POINT_S if n.startswith("util") else interval) for n, c in capacities.items()}


def rings_full_at(rows: list[dict], capacities: dict[str, int]) -> dict | None:
    """The first checkpoint at which every sampled ring holds its capacity, or None."""
    for r in rows:
        if capacities and all(r["series"].get(name, 0) >= cap for name, cap in capacities.items()):
            return r
    return None


def levels_off_at(rows: list[dict], key: str = "rss_mib", tolerance: float = LEVEL_TOLERANCE_MIB) -> dict | None:
    """The first checkpoint after which ``key`` never rises more than ``tolerance`` above its
    value there; None when it is still rising at the last checkpoint (no later point to judge by)."""
    for i, r in enumerate(rows[:-1]):
        if all(later[key] <= r[key] + tolerance for later in rows[i + 1 :]):
            return r
    return None


async def soak(hours: float, gpus: int, interval: float, checkpoints: int) -> tuple[list[dict], Store]:
    clock = SimClock(time.time())
    store = Store()
    fake = FakeGpuSource(gpus=gpus, interval=interval, clock=clock)
    host = HostSource(clock=clock)
    pipeline = Pipeline(store, [fake, host], clock=clock)
    session = Session(store=store, pipeline=pipeline, gpu=fake, host=host, mode="fake",
                      interval=interval, advisor_idle_every=UI_IDLE_ADVISOR_EVERY_S)  # as the live UI runs it
    session.stage = add_job_stage(session)
    session.advisor = session.stage.advisor
    app = GputopApp(session, interval=REDRAW_EVERY_S, refresh=1e6)  # redrawn by hand below, on the sim clock
    polls = max(1, int(hours * 3600 / interval))
    every = max(1, polls // checkpoints)
    tick_every = max(1, round(REDRAW_EVERY_S / interval))
    rows = []
    started = time.monotonic()
    async with app.run_test(size=(160, 48)) as pilot:
        for n in range(1, polls + 1):
            clock.t += interval
            pipeline.poll_once()
            if n % tick_every == 0:
                app.tick()
                await pilot.pause()  # let the compositor paint, as the event loop would
            if n % every == 0 or n == polls:
                rows.append(snapshot(store, n * interval, started))
                print(f"  {rows[-1]}", flush=True)
    return rows, store


def write_report(out: Path, data: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak_memory.json").write_text(json.dumps(data, indent=2))
    rows = data["rows"]
    params = data["params"]
    half = [r for r in rows if r["sim_hours"] >= params["hours"] / 2]
    full = data.get("rings_full_h")
    level = data.get("rss_levels_off_h")
    lines = [
        "# Memory over a long session, UI included",
        "",
        f"Machine: {data['machine']}. The real app (headless, 160x48) over the real pipeline: "
        f"{params['gpus']} scripted GPUs (`gputop --fake {params['gpus']}`), the host source and the "
        f"advisor, {params['hours']:g} simulated hours of {params['interval']:g} s polls, the display "
        f"redrawn every {REDRAW_EVERY_S:g} s. Measured after a full garbage collection.",
        "",
        "| simulated hours | RSS MiB | Python objects | samples in the store | rings full | wall s |",
        "|---|---|---|---|---|---|",
    ]
    caps = data.get("ring_capacities", {})
    for r in rows:
        filled = sum(r["series"].get(n, 0) >= c for n, c in caps.items())
        lines.append(f"| {r['sim_hours']:.2f} | {r['rss_mib']:.1f} | {r['objects']} | {r['store_items']} "
                     f"| {filled}/{len(caps)} | {r['wall_s']:.0f} |")
    ret = Retention()
    util_min = ret.util_points * UTIL_POINT_S / 60
    lines += [
        "",
        "## Where it levels off",
        "",
        f"Every series is a fixed-capacity ring. The GPU series ({ret.gpu_samples} samples a GPU) and the "
        f"host series ({ret.host_samples}) get a sample a poll: they fill after "
        f"{max(ret.gpu_samples, ret.host_samples)} polls, "
        f"{max(ret.gpu_samples, ret.host_samples) * params['interval'] / 3600:g} h at {params['interval']:g} s "
        f"(the live default is {DEFAULT_INTERVAL:g} s). NVML's 200 ms utilisation points "
        f"({ret.util_points} a GPU) fill in {util_min:g} min at any interval. Until the last ring is "
        f"full ({data['expected_full_h']:g} h here) RSS grows with the samples kept, which is what a "
        "session watched for its first minutes shows.",
        "",
        f"- Rings full: {f'{full:.2f} h' if full is not None else 'not within this run'}.",
        f"- RSS stops growing (no later rise above {LEVEL_TOLERANCE_MIB:g} MiB) at: "
        + (f"{level:.2f} h, at {data['rss_levels_off_mib']:.1f} MiB." if level is not None else "not within this run."),
    ]
    if len(half) >= 2:
        rss = [r["rss_mib"] for r in half]
        objs = [r["objects"] for r in half]
        lines += [
            f"- Second half of the session: RSS {min(rss):.1f}-{max(rss):.1f} MiB "
            f"({max(rss) - rss[0]:+.1f} MiB from its start), Python objects {min(objs)}-{max(objs)} "
            f"({max(objs) - objs[0]:+d}).",
        ]
    (out / "soak_memory.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench-results")
    p.add_argument("--hours", type=float, default=4.0, help="simulated hours (default 4)")
    p.add_argument("--gpus", type=int, default=4, help="scripted GPUs (default 4)")
    p.add_argument("--interval", type=float, default=DEFAULT_INTERVAL,
                   help=f"simulated seconds between polls (default {DEFAULT_INTERVAL:g}, the live default)")
    p.add_argument("--checkpoints", type=int, default=16)
    args = p.parse_args(argv)
    if not (args.hours > 0 and args.gpus >= 1 and args.checkpoints >= 1 and 0 < args.interval <= 3600):
        p.error("--hours, --gpus, --interval and --checkpoints must be positive")
    print(f"soaking {args.hours:g} simulated hours ...", flush=True)
    rows, store = asyncio.run(soak(args.hours, args.gpus, args.interval, args.checkpoints))
    caps = ring_capacities(store.retention, rows[-1]["series"])
    full = rings_full_at(rows, caps)
    level = levels_off_at(rows)
    data = {
        "machine": f"{psutil.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}",
        "params": vars(args) | {"out": None},
        "ring_capacities": caps,
        "expected_full_h": round(max(fill_seconds(caps, args.interval).values(), default=0) / 3600, 3),
        "rings_full_h": full["sim_hours"] if full else None,
        "rss_levels_off_h": level["sim_hours"] if level else None,
        "rss_levels_off_mib": level["rss_mib"] if level else None,
        "rows": rows,
    }
    write_report(Path(args.out), data)
    print(f"wrote {args.out}/soak_memory.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
