"""GPU time per cause as counters that only grow.

The advisor's breakdown speaks of a sliding window (the last 60 s): summing it scrape after
scrape would count each second several times, and a window's percentages cannot be turned back
into seconds once it has slid. So the account integrates the store's utilisation samples itself:
each scrape attributes the time between where the last one stopped and now, with the same
``attribute`` the advisor uses (busy from NVML's 200 ms samples; idle split by what the job's
main thread was doing), and moves its mark. Every slice of time is counted once, whichever
Prometheus server scrapes and however often; two servers scraping one exporter read one counter.

The newest ``SETTLE_S`` are left for the next scrape: a slice is refined by the host and GPU
poll that follows it (IO wait, PCIe copies), which may not be in the store yet.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from ..analysis import POLL_JOIN_S, STACK_JOIN_S, Bucket, attribute
from ..analysis import MAX_POLL_SLICE_S, MAX_SLICE_S, poll_slices, util_slices

SETTLE_S = POLL_JOIN_S
# A job's counters are kept this long after NVML stops listing it, so a process list that
# misses it for a poll does not restart them; its series are exported only while it is listed.
JOB_KEEP_S = 300.0
# More distinct processes than this are not tracked (bounded memory, bounded series).
MAX_JOBS = 256


def zero_buckets() -> dict[Bucket, float]:
    return {b: 0.0 for b in Bucket}


@dataclass
class JobTotals:
    pid: int
    create_time: float | None
    seconds: dict[Bucket, float] = field(default_factory=zero_buckets)
    gpus: set[int] = field(default_factory=set)
    last_seen: float = 0.0


class TimeAccount:
    """Seconds per bucket since ``start``, per GPU and per job (a process NVML lists on a GPU:
    the job is charged for the GPU's time, so a GPU shared by two jobs counts for both)."""

    def __init__(self, start: float) -> None:
        self.start = start
        self._lock = threading.Lock()
        self._upto: dict[int, float] = {}
        self.gpus: dict[int, dict[Bucket, float]] = {}
        self.jobs: dict[int, JobTotals] = {}

    def advance(
        self,
        store,
        attached: Iterable[int] = (),
        create_times: Mapping[int, float | None] | None = None,
    ) -> None:
        """Attribute the time since the last call; ``attached``: PIDs whose stacks are sampled."""
        with self._lock:
            self._advance(store, set(attached), dict(create_times or {}))

    def _advance(self, store, attached: set[int], create_times: dict[int, float | None]) -> None:
        now = store.now
        if now <= 0:
            return
        on_gpu: dict[int, set[int]] = {}
        for p in store.gpu_processes():
            on_gpu.setdefault(p.gpu_index, set()).add(p.pid)
        listed = set().union(*on_gpu.values()) if on_gpu else set()
        # One attached job that NVML lists nowhere (its PID namespace differs from ours, a fake
        # GPU) feeds every GPU: the advisor makes the same assumption.
        fallback = attached if len(attached) == 1 and not (attached & listed) else set()
        for pid in listed:
            self._job(pid, create_times.get(pid), now)
        cores = store.system.cpu_count if store.system is not None else None
        for i in store.gpu_indices():
            t0 = self._upto.get(i, self.start)
            pts = store.util_window(i, t0 - MAX_SLICE_S, now)
            if pts:
                t1 = min(pts[-1].ts, now - SETTLE_S)
                slices = util_slices(pts, t0, t1) if t1 > t0 else []
            else:
                polls = [s for s in store.gpu_window(i, t0 - MAX_POLL_SLICE_S, now) if s.util_gpu is not None]
                t1 = min(polls[-1].ts, now - SETTLE_S) if polls else t0
                slices = poll_slices(polls, t0, t1) if t1 > t0 else []
            if t1 <= t0:
                continue
            self._upto[i] = t1
            if not slices:
                continue  # a gap in the data: not counted rather than guessed
            pids = on_gpu.get(i, set())
            sampled = (pids & attached) or fallback
            main = [
                s for s in store.stack_window(t0 - STACK_JOIN_S, t1 + STACK_JOIN_S) if s.is_main and s.pid in sampled
            ]
            procs = [p for pid in sampled for p in store.proc_window(pid, t0 - POLL_JOIN_S, t1 + POLL_JOIN_S)]
            bd = attribute(
                i,
                slices,
                main,
                host=store.host_window(t0, t1 + POLL_JOIN_S),
                gpu_samples=store.gpu_window(i, t0, t1 + POLL_JOIN_S),
                procs=procs,
                cores=cores,
            )
            totals = self.gpus.setdefault(i, zero_buckets())
            for b, v in bd.seconds.items():
                totals[b] += v
            for pid in pids:
                job = self.jobs.get(pid)
                if job is not None:
                    job.gpus.add(i)
                    for b, v in bd.seconds.items():
                        job.seconds[b] += v
        for pid in [p for p, j in self.jobs.items() if now - j.last_seen > JOB_KEEP_S]:
            del self.jobs[pid]

    def _job(self, pid: int, create_time: float | None, now: float) -> None:
        job = self.jobs.get(pid)
        if job is not None and create_time is not None and job.create_time not in (None, create_time):
            job = None  # the PID was reused by another process: its counters start over
        if job is None:
            if len(self.jobs) >= MAX_JOBS:
                return
            job = self.jobs[pid] = JobTotals(pid, create_time)
        job.create_time = create_time if create_time is not None else job.create_time
        job.last_seen = now

    def snapshot(self) -> tuple[dict[int, dict[Bucket, float]], dict[int, JobTotals]]:
        with self._lock:
            gpus = {i: dict(v) for i, v in self.gpus.items()}
            jobs = {p: JobTotals(j.pid, j.create_time, dict(j.seconds), set(j.gpus), j.last_seen)
                    for p, j in self.jobs.items()}
        return gpus, jobs
