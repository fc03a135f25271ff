"""What the stacks pane and ``gputop stacks`` show, from one evidence window (analysis.window). Pure.

- the latest stack of every thread of the target (one py-spy dump shares one timestamp);
- the share of the main thread's time by category over a window (samples are evenly spaced,
  so a share of samples is a share of time);
- the hottest frames of the main thread over the window;
- the DataLoader workers with CPU, state and their newest stack;
- the stuck verdict.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Sequence

from .classify import category_shares, project_frame
from ..model import Category, Event, Frame, ProcSample, StackSample
from .stuck import StuckVerdict
from .threshold import JUDGEMENT, Threshold

# A worker whose process details are older than this has gone (details come once a second).
WORKER_STALE_S = Threshold(
    5.0, "s", JUDGEMENT,
    "A worker whose process details are older than this has gone: details come once a second.")


@dataclass(frozen=True)
class Hot:
    frame: Frame  # the newest frame of the samples counted here
    via: Frame | None  # the newest project frame under it, when the frame itself is library code
    share: float  # of the main thread's samples in the window
    count: int
    category: Category


@dataclass(frozen=True)
class WorkerView:
    proc: ProcSample
    threads: tuple[StackSample, ...] = ()  # its newest dump, main thread first (may be none yet)

    @property
    def stack(self) -> StackSample | None:
        """The worker's main thread in its newest dump."""
        return next((s for s in self.threads if s.is_main), None)


@dataclass(frozen=True)
class StacksView:
    pid: int
    now: float
    window_s: float
    span_s: float  # the part of the window the main thread's samples cover
    target: ProcSample | None
    threads: tuple[StackSample, ...]  # latest dump of the target, main thread first
    shares: tuple[tuple[Category, float], ...]  # main thread, largest first
    samples: int  # main-thread samples in the window
    hot: tuple[Hot, ...]
    workers: tuple[WorkerView, ...]
    verdict: StuckVerdict
    fault: Event | None  # the newest warning/error from the stacks source, unless resolved
    exited: bool


def latest_threads(samples: Sequence[StackSample], pid: int) -> tuple[StackSample, ...]:
    """The newest dump of ``pid``: every thread, main thread first."""
    mine = [s for s in samples if s.pid == pid]
    if not mine:
        return ()
    ts = mine[-1].ts
    out = [s for s in mine if s.ts == ts]
    out.sort(key=lambda s: (not s.is_main, s.thread_name, s.thread_id))
    return tuple(out)


def main_samples(samples: Sequence[StackSample], pid: int) -> list[StackSample]:
    return [s for s in samples if s.pid == pid and s.is_main]


def hottest(main: Sequence[StackSample], n: int = 8) -> tuple[Hot, ...]:
    """The newest frames the main thread was seen in most often, with their share."""
    if not main:
        return ()
    counts: Counter = Counter()
    first: dict[tuple, StackSample] = {}
    for s in main:
        top = s.frames[0] if s.frames else None
        via = project_frame(s.frames)
        key = (_fkey(top), _fkey(via), s.category)
        counts[key] += 1
        first.setdefault(key, s)
    total = len(main)
    out: list[Hot] = []
    for key, k in counts.most_common(n):
        s = first[key]
        top = s.frames[0] if s.frames else Frame("<no Python frames>", "")
        via = project_frame(s.frames)
        out.append(Hot(top, None if via is top else via, k / total, k, s.category))
    return tuple(out)


def _fkey(f: Frame | None) -> tuple | None:
    return None if f is None else (f.name, f.filename, f.line)


def worker_views(
    procs: dict[int, ProcSample], samples: Sequence[StackSample], now: float, target: int | None = None
) -> tuple[WorkerView, ...]:
    """Workers seen in the last few seconds, each with its newest dump."""
    rows = [
        WorkerView(p, latest_threads(samples, pid))
        for pid, p in procs.items()
        if p.role == "worker" and now - p.ts <= WORKER_STALE_S and (target is None or _descends(p, target, procs))
    ]
    rows.sort(key=lambda w: w.proc.pid)
    return tuple(rows)


def _descends(p: ProcSample, target: int, procs: dict[int, ProcSample]) -> bool:
    seen = set()
    while p.ppid is not None and p.ppid not in seen:
        if p.ppid == target:
            return True
        seen.add(p.ppid)
        parent = procs.get(p.ppid)
        if parent is None:
            return False
        p = parent
    return False


def latest_fault(events: Sequence[Event], source: str = "stacks") -> Event | None:
    """The stacks source's newest event if it is a warning or error (an info event such as
    'resumed' clears it)."""
    for e in reversed(events):
        if e.source == source:
            return e if e.level in ("warning", "error") else None
    return None


def stacks_view_of(pid: int, now: float, window_s: float, samples: Sequence[StackSample],
                   procs_latest: Mapping[int, ProcSample], events: Sequence[Event], verdict: StuckVerdict) -> StacksView:
    """The view of ``pid`` from the window's stack samples (``samples``: since ``now - window_s``),
    each process's newest reading, the newest events and the window's stuck verdict."""
    main = main_samples(samples, pid)
    target = procs_latest.get(pid)
    return StacksView(
        pid=pid,
        now=now,
        window_s=window_s,
        span_s=min(window_s, now - main[0].ts) if main else 0.0,
        target=target,
        threads=latest_threads(samples, pid),
        shares=category_shares(main),
        samples=len(main),
        hot=hottest(main),
        workers=worker_views(dict(procs_latest), samples, now, pid),
        verdict=verdict,
        fault=latest_fault(events),
        exited=target is not None and target.status in ("exited", "zombie"),
    )
