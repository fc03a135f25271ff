"""Bounded, time-indexed storage of samples.

Every series is a fixed-capacity ring, so memory is flat however long a session runs.
Writers are the pipeline's source threads, readers the UI and the analysis: one lock guards it.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass
from typing import Generic, Iterable, Iterator, TypeVar

from .model import (
    Event,
    Finding,
    GpuInfo,
    GpuProcess,
    GpuSample,
    HostSample,
    ProcSample,
    StackSample,
    SystemInfo,
    UtilPoint,
    PaneViews,
    Verdict,
    Evidence,
    Reset,
    TaskSample,
)

T = TypeVar("T")

# What the store keeps, each a model type with its own timestamp (``ts``): a batch may mix them,
# and ``add`` dispatches on the type, so the clock moves only with what is kept.
STORED = (
    GpuSample, UtilPoint, HostSample, ProcSample, GpuProcess, StackSample, TaskSample, Event, GpuInfo, SystemInfo,
    Finding, Verdict, PaneViews,
)


class Ring(Generic[T]):
    """A fixed-capacity buffer of samples in time order (each item has ``.ts``).

    Oldest items are overwritten. Indexing is logical (0 = oldest) so ``bisect`` can search
    by time in O(log n) without copying.
    """

    __slots__ = ("_buf", "_cap", "_start", "_len")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self._buf: list[T | None] = [None] * capacity
        self._cap = capacity
        self._start = 0
        self._len = 0

    @property
    def capacity(self) -> int:
        return self._cap

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> T:
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(i)
        return self._buf[(self._start + i) % self._cap]  # type: ignore[return-value]

    def __iter__(self) -> Iterator[T]:
        for i in range(self._len):
            yield self._buf[(self._start + i) % self._cap]  # type: ignore[misc]

    def append(self, item: T) -> None:
        # Samples from one source arrive in order; one that is older than the newest (clock
        # step, a late buffer entry) is dropped rather than breaking the time order.
        if self._len and item.ts < self[-1].ts:  # type: ignore[attr-defined]
            return
        if self._len < self._cap:
            self._buf[(self._start + self._len) % self._cap] = item
            self._len += 1
        else:
            self._buf[self._start] = item
            self._start = (self._start + 1) % self._cap

    def insert(self, item: T) -> None:
        """Add ``item`` at its place in time. For series that several sources feed (events): their
        threads race, so an item a few ms older than the newest is late, not wrong, and dropping it
        would lose a message the user must see (why an attach failed)."""
        if not self._len or item.ts >= self[-1].ts:  # type: ignore[attr-defined]
            self.append(item)
            return
        pos = bisect.bisect_right(self, item.ts, key=lambda s: s.ts)  # type: ignore[arg-type]
        if pos == 0 and self._len == self._cap:
            return  # older than everything a full ring keeps
        items = list(self)
        items.insert(pos, item)
        items = items[-self._cap:]
        self._buf = items + [None] * (self._cap - len(items))
        self._start, self._len = 0, len(items)

    def latest(self) -> T | None:
        return self[-1] if self._len else None

    def window(self, t0: float, t1: float = float("inf")) -> list[T]:
        """Items with ``t0 <= ts <= t1``."""
        lo = bisect.bisect_left(self, t0, key=lambda s: s.ts)  # type: ignore[arg-type]
        hi = bisect.bisect_right(self, t1, key=lambda s: s.ts)  # type: ignore[arg-type]
        return [self[i] for i in range(lo, hi)]

    def clear(self) -> None:
        self._buf = [None] * self._cap
        self._start = 0
        self._len = 0


@dataclass(frozen=True)
class Retention:
    """How much history each series keeps. Defaults cover an hour of 1 s polls."""

    gpu_samples: int = 3600  # per GPU: 1 h at 1 s
    util_points: int = 4500  # per GPU: 15 min of NVML's 200 ms buffer
    host_samples: int = 3600
    proc_samples: int = 600  # per process: 10 min at 1 s
    max_processes: int = 256  # distinct PIDs tracked at once
    stack_samples: int = 20000  # ~10 min at 5 threads x 5 Hz
    events: int = 500
    task_samples: int = 120  # per process: 2 min of /proc readings at 1 s


class Store:
    """The single place samples live. Thread-safe; every read returns plain lists."""

    def __init__(self, retention: Retention | None = None) -> None:
        self.retention = retention or Retention()
        self._lock = threading.RLock()
        self.version = 0  # bumped on every change, so readers can skip unchanged redraws
        self.analysis_version = 0  # bumped when findings or published analysis change
        self.resets = 0  # Reset markers seen (replay jumps): derived stages start over on each
        self._clear()

    def _clear(self) -> None:
        self.system: SystemInfo | None = None
        self.gpu_info: dict[int, GpuInfo] = {}
        self._gpu: dict[int, Ring[GpuSample]] = {}
        self._util: dict[int, Ring[UtilPoint]] = {}
        self._gpu_procs: list[GpuProcess] = []
        # Every poll's process list, per (GPU, PID): the job's own memory over time, which the
        # memory forecast fits (the snapshot above is only the latest poll).
        self._gpu_proc_hist: dict[tuple[int, int], Ring[GpuProcess]] = {}
        self._procs: dict[int, Ring[ProcSample]] = {}
        self._tasks: dict[int, Ring[TaskSample]] = {}
        self._host: Ring[HostSample] = Ring(self.retention.host_samples)
        self._stacks: Ring[StackSample] = Ring(self.retention.stack_samples)
        self._events: Ring[Event] = Ring(self.retention.events)
        self._verdict: Verdict | None = None  # the advisor's latest: findings, breakdowns
        self._views: PaneViews | None = None  # the views stage's latest: what the Stacks and Ranks panes show
        self._findings_seen: Ring[Finding] = Ring(self.retention.events)  # as recorded
        self.now = 0.0  # newest timestamp seen: the store's clock (live or replayed)

    # ----------------------------------------------------------------- writing

    def add(self, samples: Iterable[object]) -> None:
        """Add one batch from a source.

        A batch holding GPU samples is one NVML poll (or, in replay, several): the GPU
        processes stamped with its newest poll time replace the previous process snapshot, so a
        poll that found no processes clears it.
        """
        with self._lock:
            procs: list[GpuProcess] = []
            poll_ts: float | None = None
            for s in samples:
                if isinstance(s, Reset):
                    # A replay's jump: what follows in the batch is the state at the new position.
                    self._clear()
                    self.resets += 1
                    procs, poll_ts = [], None
                    self.analysis_version += 1
                    continue
                if not isinstance(s, STORED):
                    continue  # not the model's: nothing to keep, and no clock to move
                if s.ts > self.now:
                    self.now = s.ts
                if isinstance(s, GpuSample):
                    self._ring(self._gpu, s.index, self.retention.gpu_samples).append(s)
                    poll_ts = s.ts if poll_ts is None else max(poll_ts, s.ts)
                elif isinstance(s, UtilPoint):
                    self._ring(self._util, s.index, self.retention.util_points).append(s)
                elif isinstance(s, HostSample):
                    self._host.append(s)
                elif isinstance(s, ProcSample):
                    self._add_proc(s)
                elif isinstance(s, GpuProcess):
                    procs.append(s)
                    self._add_gpu_proc(s)
                elif isinstance(s, StackSample):
                    self._stacks.append(s)
                elif isinstance(s, TaskSample):
                    self._add_task(s)
                elif isinstance(s, Event):
                    self._events.insert(s)
                elif isinstance(s, GpuInfo):
                    self.gpu_info[s.index] = s
                elif isinstance(s, SystemInfo):
                    self.system = s
                elif isinstance(s, Finding):
                    self._findings_seen.append(s)
                elif isinstance(s, Verdict):
                    self._verdict = s
                    self.analysis_version += 1
                elif isinstance(s, PaneViews):
                    # Not an analysis_version change: the advisor's pane need not redraw for it;
                    # the Stacks and Ranks panes tell one PaneViews from the next by identity.
                    self._views = s
            if poll_ts is not None:
                self._gpu_procs = [p for p in procs if p.ts >= poll_ts]
            self.version += 1

    def has_data_before(self, ts: float) -> bool:
        """Whether any GPU, host or stack sample is at or before ``ts`` (history to look back on)."""
        with self._lock:
            rings = [*self._util.values(), *self._gpu.values(), self._stacks, self._host]
            return any(len(r) and r[0].ts <= ts for r in rings)

    def pending_findings(self) -> list[Finding]:
        """What the advisor sees but has not confirmed yet (it must hold a few seconds)."""
        with self._lock:
            return list(self._verdict.pending) if self._verdict is not None else []

    def verdict_target(self) -> tuple[bool, int | None]:
        """(whether the advisor has published a verdict, the PID of the job it speaks of)."""
        with self._lock:
            return (self._verdict is not None, self._verdict.target_pid if self._verdict is not None else None)

    def collecting(self) -> Evidence | None:
        """What the advisor still collects before its first verdict (None: it has had enough, or
        has not run)."""
        with self._lock:
            return self._verdict.collecting if self._verdict is not None else None

    def pane_views(self) -> PaneViews | None:
        """The latest views of the Stacks and Ranks panes (``analysis.views``), None before the first."""
        with self._lock:
            return self._views

    def breakdowns(self) -> tuple[object, ...]:
        """Where each device's time went over the advisor's window (its latest ``Verdict``)."""
        with self._lock:
            return self._verdict.breakdowns if self._verdict is not None else ()

    @staticmethod
    def _ring(d: dict[int, Ring[T]], key: int, cap: int) -> Ring[T]:
        r = d.get(key)
        if r is None:
            r = d[key] = Ring(cap)
        return r

    def _add_proc(self, s: ProcSample) -> None:
        ring = self._procs.get(s.pid)
        if ring is None:
            if len(self._procs) >= self.retention.max_processes:
                # Evict the process seen longest ago: bounded however many PIDs come and go.
                oldest = min(self._procs, key=lambda p: self._procs[p][-1].ts)
                del self._procs[oldest]
            ring = self._procs[s.pid] = Ring(self.retention.proc_samples)
        ring.append(s)

    def _add_gpu_proc(self, s: GpuProcess) -> None:
        key = (s.gpu_index, s.pid)
        ring = self._gpu_proc_hist.get(key)
        if ring is None:
            if len(self._gpu_proc_hist) >= self.retention.max_processes:
                oldest = min(self._gpu_proc_hist, key=lambda k: self._gpu_proc_hist[k][-1].ts)
                del self._gpu_proc_hist[oldest]
            ring = self._gpu_proc_hist[key] = Ring(self.retention.proc_samples)
        ring.append(s)

    def _add_task(self, s: TaskSample) -> None:
        ring = self._tasks.get(s.pid)
        if ring is None:
            if len(self._tasks) >= self.retention.max_processes:
                oldest = min(self._tasks, key=lambda p: self._tasks[p][-1].ts)
                del self._tasks[oldest]
            ring = self._tasks[s.pid] = Ring(self.retention.task_samples)
        ring.append(s)

    # ----------------------------------------------------------------- reading

    def gpu_indices(self) -> list[int]:
        with self._lock:
            return sorted(set(self._gpu) | set(self.gpu_info))

    def latest_gpu(self, index: int) -> GpuSample | None:
        with self._lock:
            r = self._gpu.get(index)
            return r.latest() if r else None

    def gpu_window(self, index: int, t0: float, t1: float = float("inf")) -> list[GpuSample]:
        with self._lock:
            r = self._gpu.get(index)
            return r.window(t0, t1) if r else []

    def util_window(self, index: int, t0: float, t1: float = float("inf")) -> list[UtilPoint]:
        with self._lock:
            r = self._util.get(index)
            return r.window(t0, t1) if r else []

    def gpu_processes(self) -> list[GpuProcess]:
        with self._lock:
            return list(self._gpu_procs)

    def gpu_process_window(self, pids: Iterable[int], t0: float, t1: float = float("inf")) -> list[GpuProcess]:
        """Every poll's entries for ``pids`` (on any GPU) in [t0, t1], in no particular order."""
        want = set(pids)
        with self._lock:
            return [p for (_, pid), r in self._gpu_proc_hist.items() if pid in want for p in r.window(t0, t1)]

    def latest_proc(self, pid: int) -> ProcSample | None:
        with self._lock:
            r = self._procs.get(pid)
            return r.latest() if r else None

    def proc_window(self, pid: int, t0: float, t1: float = float("inf")) -> list[ProcSample]:
        with self._lock:
            r = self._procs.get(pid)
            return r.window(t0, t1) if r else []

    def procs_latest(self) -> dict[int, ProcSample]:
        with self._lock:
            return {pid: r[-1] for pid, r in self._procs.items() if len(r)}

    def task_window(self, pid: int, t0: float, t1: float = float("inf")) -> list[TaskSample]:
        with self._lock:
            r = self._tasks.get(pid)
            return r.window(t0, t1) if r else []

    def task_windows(self, t0: float, t1: float = float("inf")) -> dict[int, list[TaskSample]]:
        """/proc readings of every process read, per pid, in [t0, t1]."""
        with self._lock:
            return {pid: r.window(t0, t1) for pid, r in self._tasks.items() if len(r)}

    def latest_host(self) -> HostSample | None:
        with self._lock:
            return self._host.latest()

    def host_window(self, t0: float, t1: float = float("inf")) -> list[HostSample]:
        with self._lock:
            return self._host.window(t0, t1)

    def stack_window(self, t0: float, t1: float = float("inf")) -> list[StackSample]:
        with self._lock:
            return self._stacks.window(t0, t1)

    def events(self, n: int | None = None) -> list[Event]:
        with self._lock:
            items = list(self._events)
            return items[-n:] if n else items

    def findings(self) -> list[Finding]:
        """The advisor's current findings, ranked (its latest ``Verdict``)."""
        with self._lock:
            return list(self._verdict.findings) if self._verdict is not None else []

    def findings_window(self, t0: float, t1: float = float("inf")) -> list[Finding]:
        """Findings that arrived as samples (from a recording), in time order."""
        with self._lock:
            return self._findings_seen.window(t0, t1)

    def sizes(self) -> dict[str, int]:
        """Item counts per series: what a memory-bound test checks."""
        with self._lock:
            out = {
                "host": len(self._host),
                "stacks": len(self._stacks),
                "events": len(self._events),
                "processes": len(self._procs),
                "proc_samples": sum(len(r) for r in self._procs.values()),
                "task_samples": sum(len(r) for r in self._tasks.values()),
            }
            for i, r in self._gpu.items():
                out[f"gpu{i}"] = len(r)
            for i, r in self._util.items():
                out[f"util{i}"] = len(r)
            return out


# --------------------------------------------------------------------------- a paused view

# A store frozen at one moment: what the display shows while the user has paused it. Collection
# goes on into the store; the snapshot keeps the latest values as they were at the pause and cuts
# every window at that moment, so zooming, resizing or re-sorting a paused view redraws the same
# moment instead of jumping to live data.


class StoreSnapshot:
    """The read side of `Store` the panels use, as it was when the snapshot was taken."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.now = store.now
        self.version = store.version
        self.system: SystemInfo | None = store.system
        self.gpu_info: dict[int, GpuInfo] = dict(store.gpu_info)
        self._indices = store.gpu_indices()
        self._latest_gpu = {i: store.latest_gpu(i) for i in self._indices}
        self._latest_host = store.latest_host()
        self._gpu_processes = store.gpu_processes()
        self._procs_latest = store.procs_latest()
        # The GPU panels' memory forecast is part of the paused moment, like the figure beside it.
        self._views = store.pane_views()

    def pane_views(self) -> PaneViews | None:
        return self._views

    def gpu_indices(self) -> list[int]:
        return list(self._indices)

    def latest_gpu(self, index: int) -> GpuSample | None:
        return self._latest_gpu.get(index)

    def latest_host(self) -> HostSample | None:
        return self._latest_host

    def gpu_processes(self) -> list[GpuProcess]:
        return list(self._gpu_processes)

    def procs_latest(self) -> dict[int, ProcSample]:
        return dict(self._procs_latest)

    def util_window(self, index: int, t0: float, t1: float = float("inf")) -> list[UtilPoint]:
        return self._store.util_window(index, t0, min(t1, self._end))

    def gpu_window(self, index: int, t0: float, t1: float = float("inf")) -> list[GpuSample]:
        return self._store.gpu_window(index, t0, min(t1, self._end))

    @property
    def _end(self) -> float:
        # Windows are half-open [t0, t1): the sample taken at the pause itself belongs in.
        return self.now + 1e-6
