"""What the Stacks and Ranks panes' views cost, and where it runs.

The views (``analysis.window.stacks_view``, ``analysis.window.job_view``) walk every stack
sample in their windows: a minute for the bar, the hottest frames and the ranks, the stuck
threshold plus a minute for the stuck verdict. They used to be computed by the panes at each UI
refresh, on Textual's event loop; ``analysis.views`` computes them on the pipeline's thread once a
second and the panes lay out what it published. This measures, on stores like a long session's
(an hour of 2 s polls of every rank's GPU, processes, workers and /proc; the store's stack ring
full, ``--samples`` of it within the stuck verdict's 90 s reach):

- each view computed once (what a pane used to do per refresh, and what the stage now does per
  second), and the stage's whole poll;
- a UI refresh (``GputopApp.tick``) of each tab with the views published: what is left on the
  event loop.

    python bench/pane_views.py --out DIR      # writes DIR/pane_views.json and DIR/pane_views.md

Stacks are the recorded py-spy dumps under tests/fixtures/stacks (forward, backward, data wait,
DDP all-reduce, ...), each dump the target's main thread, three other threads and two workers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gputop.analysis.classify import classify, is_library  # noqa: E402
from gputop.analysis.ranks import ranks_message  # noqa: E402
from gputop.analysis.window import job_view  # noqa: E402
from gputop.analysis.window import stacks_view  # noqa: E402
from gputop.analysis.views import ViewsStage, pane_views  # noqa: E402
from gputop.model import Event, GpuProcess, ProcSample, TaskSample, ThreadState  # noqa: E402
from gputop.present.ranks import ranks_pane_lines as rank_lines  # noqa: E402
from gputop.present.stacks import stacks_pane_lines as stack_lines  # noqa: E402
from gputop.sources.fake import FakeGpuSource  # noqa: E402
from gputop.sources.stacks import StackParser  # noqa: E402
from gputop.store import Store  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "stacks"
DUMPS = ("forward", "backward", "data-wait", "fw-ddp-allreduce-wait", "optimizer", "host-sync", "data-fetch",
         "fw-ddp-straggler")
REACH_S = 90.0  # the stuck verdict's: the default threshold (30 s) plus a minute of history
STUCK_AFTER_S = 30.0
THREADS, WORKERS = 4, 2  # per dump: the main thread and three others; two workers' main threads
SCENARIOS = ((1, 4_000), (8, 10_000), (8, 20_000))  # (ranks, stack samples within reach)
T0 = 1_700_000_000.0


def recorded_dumps() -> list[list]:
    out = []
    for name in DUMPS:
        doc = json.loads((FIXTURES / f"{name}.json").read_text())
        parser = StackParser(lambda fn, ln, d=doc: d.get("source_lines", {}).get(f"{fn}:{ln}"), classify, is_library)
        pid = doc["dump"][0]["pid"]
        out.append([s for s in parser.samples(doc["dump"], 0.0) if s.pid == pid])
    return out


def session_store(ranks: int, in_reach: int, session_s: float = 3600.0) -> tuple[Store, list[int]]:
    """The store at the end of a ``session_s`` session of a ``ranks``-rank job (1: one process, no
    multi-rank job: the Ranks tab is not there)."""
    now = [T0]
    store = Store()
    gpu = FakeGpuSource(gpus=ranks, interval=2.0, clock=lambda: now[0], hostname="bench")
    pids = [10_000 + 100 * r for r in range(ranks)]
    if ranks > 1:
        store.add([Event(T0, "ranks", ranks_message({p: r for r, p in enumerate(pids)}, 9999))])
    dumps = recorded_dumps()
    per_dump = THREADS + WORKERS
    rate = in_reach / per_dump / REACH_S  # dumps per second, all ranks together
    end = T0 + session_s
    next_dump = max(T0, end - store.retention.stack_samples / per_dump / rate)  # what the ring keeps
    k = 0
    while now[0] < end:
        now[0] += 2.0
        t = now[0]
        batch = gpu.poll() + [GpuProcess(t, r, p, 30 << 30) for r, p in enumerate(pids)]
        for r, p in enumerate(pids):
            batch.append(ProcSample(t, p, 9999, "python", cmdline="python train.py", cpu_percent=100.0, rss=8 << 30,
                                    num_threads=30, status="running", role="target" if r == 0 else "gpu", create_time=T0))
            batch += [ProcSample(t, p + 1 + w, p, "pt_data_worker", cpu_percent=90.0, status="running", role="worker",
                                 create_time=T0) for w in range(WORKERS)]
            batch.append(TaskSample(t, p, 9999, tuple(ThreadState(p + i, state="R", cpu_ns=int((t - T0) * 1e9))
                                                      for i in range(THREADS)), rchar=int(t), wchar=int(t)))
        store.add(batch)
        while next_dump <= t:
            p = pids[k % ranks]
            base = dumps[(k // ranks) % len(dumps)]
            main = next((s for s in base if s.is_main), base[0])
            others = [s for s in base if not s.is_main] or [main]
            dump = [replace(main, ts=next_dump, pid=p, thread_id=p)]
            dump += [replace(others[i % len(others)], ts=next_dump, pid=p, thread_id=p + 1 + i, is_main=False,
                             thread_name=f"Thread-{i}") for i in range(THREADS - 1)]
            dump += [replace(main, ts=next_dump, pid=p + 1 + w, thread_id=p + 1 + w) for w in range(WORKERS)]
            store.add(dump)
            k += 1
            next_dump += 1.0 / rate
    return store, pids


def timed(f, n: int = 20) -> dict:
    f()
    xs = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        xs.append((time.perf_counter() - t) * 1e3)
    return {"median_ms": round(statistics.median(xs), 2), "max_ms": round(max(xs), 2)}


async def ui_ticks(store: Store, target: int, n: int = 15) -> dict:
    """A UI refresh of each tab, a new PaneViews published before each (as each second live)."""
    from gputop.pipeline import Pipeline
    from gputop.session import Session
    from gputop.ui.app import GputopApp

    session = Session(store=store, pipeline=Pipeline(store, []), mode="fake", target_pid=target)
    store.add([pane_views(store, target, STUCK_AFTER_S)])
    app = GputopApp(session, interval=1.0, refresh=600)
    out = {}
    async with app.run_test(size=(120, 40)) as pilot:
        tabs = (("1", "processes"), ("3", "stacks")) + ((("4", "ranks"),) if store.pane_views() and store.pane_views().job else ())
        for key, tab in tabs:
            await pilot.press(key)
            await pilot.pause()
            xs = []
            for _ in range(n):
                store.add([pane_views(store, target, STUCK_AFTER_S)])
                t = time.perf_counter()
                app.tick()
                xs.append((time.perf_counter() - t) * 1e3)
                await pilot.pause()
            out[tab] = {"median_ms": round(statistics.median(xs), 2), "max_ms": round(max(xs), 2)}
    return out


def run_scenario(ranks: int, in_reach: int) -> dict:
    store, pids = session_store(ranks, in_reach)
    now, target = store.now, pids[0]
    sv = stacks_view(store, target, STUCK_AFTER_S)
    jv = job_view(store, 60.0)
    return {
        "ranks": ranks,
        "stack_samples_in_store": store.sizes()["stacks"],
        "in_reach_90s": len(store.stack_window(now - REACH_S, now)),
        "in_window_60s": len(store.stack_window(now - 60.0, now)),
        "stacks_view": timed(lambda: stacks_view(store, target, STUCK_AFTER_S)),
        "job_view": timed(lambda: job_view(store, 60.0)),
        "present_stacks": timed(lambda: stack_lines(sv, 118)),
        "present_ranks": timed(lambda: rank_lines(jv, 118)) if jv is not None else None,
        "stage_poll": timed(lambda: ViewsStage(store, target, STUCK_AFTER_S).poll()),
        "ui_tick_with_published_views": asyncio.run(ui_ticks(store, target)),
    }


def markdown(res: list[dict], meta: dict) -> str:
    lines = ["# Stacks and Ranks panes: what their views cost, and where it runs", "",
             f"Generated by `python bench/pane_views.py` on {meta['platform']}, {meta['cpus']} CPUs, Python "
             f"{meta['python']}; load average at the end {meta['load']}.", "",
             "Each store: an hour of a job's 2 s polls (GPUs, processes, workers, /proc), its stack ring full (20,000), "
             "the samples within the stuck verdict's 90 s reach as given. Before, a pane computed its view at every UI "
             "refresh on the event loop (every 2 s live, 0.5 s in a replay, while its tab is shown); now the views stage "
             "computes both on the pipeline's thread once a second and the UI tick only lays them out. Milliseconds, "
             "median (max) of 20 runs; UI ticks of 15.", "",
             "| ranks | samples in 90 s / 60 s | stacks_view | job_view | stage poll (pipeline thread) | present stacks / ranks | "
             "UI tick now: processes / stacks / ranks |",
             "|---|---|---|---|---|---|---|"]
    for r in res:
        t = r["ui_tick_with_published_views"]
        def f(d: dict | None, fmt: str = ".1f", spread: bool = True) -> str:
            if d is None:
                return "-"
            return f"{d['median_ms']:{fmt}}" + (f" ({d['max_ms']:{fmt}})" if spread else "")

        who = "1 (one process)" if r["ranks"] == 1 else str(r["ranks"])
        lines.append(f"| {who} | {r['in_reach_90s']:,} / {r['in_window_60s']:,} | {f(r['stacks_view'])} | "
                     f"{f(r['job_view'])} | {f(r['stage_poll'])} | {f(r['present_stacks'], '.2f', False)} / "
                     f"{f(r['present_ranks'], '.2f', False)} | {f(t.get('processes'), spread=False)} / "
                     f"{f(t.get('stacks'), spread=False)} / {f(t.get('ranks'), spread=False)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    res = [run_scenario(r, n) for r, n in SCENARIOS]
    meta = {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "load": tuple(round(x, 2) for x in os.getloadavg())}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pane_views.json").write_text(json.dumps({"meta": meta, "results": res}, indent=2) + "\n")
    md = markdown(res, meta)
    (args.out / "pane_views.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
