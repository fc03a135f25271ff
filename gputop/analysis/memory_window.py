"""The job's memory over the last minutes, as series for ``memory_growth``: per GPU the job's own
NVML memory (its processes summed per poll), and on the host the used memory, the main
process's RSS and each DataLoader worker's RSS and private memory (USS). Pure: samples in, a
``MemoryView`` out.

On the host, whose memory grows tells two causes apart (``host_cause``): a forked worker's RSS
counts the pages it shares with the main process from the start, so copy-on-read (the Dataset's
Python objects copied page by page into each worker as their refcounts are touched) shows as
the workers' USS growing while their RSS stays flat and the main process's is flat; a leak in
the main process shows as its RSS growing while the workers' USS is flat."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Mapping, Sequence

from ..model import GpuInfo, GpuProcess, GpuSample, HostSample, ProcSample
from .efficiency import WORKER_MAX_HOPS
from .memory_cause import LeakLine
from .memory_growth import EARLY_HORIZON, FLAT, SHORT, Growth, bounded, fit_lag_s, forecast_of, growth
from .threshold import JUDGEMENT, Threshold

# The forecast looks back this far: long enough that a leak of a few MB a step stands out of an
# allocator's steps, as far as the store keeps processes (10 min). Judgement.
MEMORY_WINDOW_S = Threshold(
    600.0, "s", JUDGEMENT,
    "The memory forecast looks back this far: a leak of a few MB a step stands out of an allocator's steps, as far"
    " as the store keeps processes (10 min).")

PROCESS, DEVICE = "process", "device"

# How much of the workers must grow for the growth to be the Dataset's copy-on-read: every
# worker reads the same kind of samples, so the copying grows them all alike; one growing
# worker of many is that worker's own affair. Judgement.
COPY_WORKER_SHARE = Threshold(
    0.5, "share", JUDGEMENT,
    "At least this share of the workers whose USS is read must grow for copy-on-read: every worker reads the same "
    "kind of samples, so the copying grows them all alike.")
# A worker whose RSS grows at least this share of its USS's rate grows with new memory too (a
# cache filled in each worker), not only with pages it shared turning private. Judgement.
RSS_ALIKE_SHARE = Threshold(
    0.5, "share", JUDGEMENT,
    "A worker's RSS growing at least this share of its USS's rate is new memory too, not only shared pages turned "
    "private.")

COPY_ON_READ, MAIN_LEAK = "copy-on-read", "main-process"

# The workers' private memory (USS) must grow at least this share of the job's growth for the
# growth to be their copy-on-read: judged, against their USS and the main process's RSS together
# (the main process's RSS drifting by a KB/s beside the workers' 13 MB/s was read as "both grow"
# and the copying's forecast fell back to a line as it levelled off); before their USS can be
# judged (MIN_POINTS reads each: two minutes at one every 12 s), over the reads there are against
# the host growth's rate, for a leak named early. Judgement: copy-on-read alone makes the two
# rates one (a copied page counts once, in the group and in one worker's USS); a leak in the main
# process beside it leaves the workers' share well under it.
COPY_GROWTH_SHARE = Threshold(
    0.5, "share", JUDGEMENT,
    "The workers' USS growing at least this share of the job's growth (with the main process's RSS; before their "
    "USS can be judged, of the host growth's rate) makes it their copy-on-read, bounded by what they share.")

# A worker whose newest reading (any: its stacks' details each second, its USS every 12 s) is older
# than this has exited: its private memory no longer counts in the job's. Judgement: more than two
# of the host source's USS periods (12 s), so a worker read only for its USS is not dropped
# between two reads.
PRIVATE_GONE_S = Threshold(
    30.0, "s", JUDGEMENT,
    "A worker not seen for this long has exited and its private memory no longer counts in the job's total: more "
    "than two USS periods (12 s), so a worker read only for its USS is not dropped between two reads.")


@dataclass(frozen=True)
class GpuMemory:
    index: int
    growth: Growth
    # What the series is: the job's processes as NVML lists them (PROCESS), or the whole card's
    # used memory where NVML gives no per-process figure (DEVICE: other processes count in it).
    source: str


@dataclass(frozen=True)
class WorkerMemory:
    pid: int
    growth: Growth  # of its RSS
    # Of its private memory (USS): None where the host source read none (a recording from before
    # it, a kernel without smaps_rollup, no permission).
    uss: Growth | None = None

    @property
    def rss_alike(self) -> bool:
        """Its RSS grows with its USS (new memory in the worker), not flat under it."""
        u = self.uss
        return u is not None and u.growing and self.growth.growing and self.growth.rate >= RSS_ALIKE_SHARE * u.rate


@dataclass(frozen=True)
class WorkersPrivate:
    """The DataLoader workers' private memory (USS) taken together, as people see it: the host
    line and the process table live, the report, the exporter. Every figure is the memory view's
    (no fit of its own), so what is shown agrees with what the advisor says."""

    read: int  # workers whose USS was read
    total: float  # bytes: each one's latest USS, summed
    judged: int  # of them, with history enough for a verdict
    growing: int  # of those, growing steadily
    median_rate: float = 0.0  # bytes/s: the growing workers' median (the advisor's "each (median)"); 0: none grows
    total_rate: float = 0.0  # bytes/s: the growing workers' rates summed (how fast the total grows)
    cause: str | None = None  # MemoryView.host_cause: COPY_ON_READ, MAIN_LEAK or None

    @property
    def grows(self) -> bool:
        """The workers' private memory grows as copy-on-read is judged: at least
        COPY_WORKER_SHARE of the workers judged grow (one growing worker of many is its own affair)."""
        return self.growing > 0 and self.growing >= COPY_WORKER_SHARE * self.judged


def median_rate(growths: Sequence[Growth]) -> float:
    """The growing series' median rate, bytes/s, the advisor's way (the upper median of an even
    count); 0.0 for none."""
    rates = sorted(g.rate for g in growths if g.growing)
    return rates[len(rates) // 2] if rates else 0.0


@dataclass(frozen=True)
class MemoryView:
    gpus: tuple[GpuMemory, ...] = ()
    host: Growth | None = None  # the host's used memory against its total (or the job's cgroup against its limit)
    workers: tuple[WorkerMemory, ...] = ()
    main: Growth | None = None  # the target's own RSS
    # Lines of the job's own code seen in its stacks that keep a step's tensor with its graph.
    leaks: tuple[LeakLine, ...] = ()
    # What likely ended the target, with its evidence, once it has exited (memory_cause).
    exit_cause: str | None = None
    # The host's growth is the job's control group against its memory limit (a container's, where
    # the OOM killer acts first), not the whole host against its total.
    host_cgroup: bool = False
    # The job's own memory on the host now, bytes: its main process's RSS and its workers' private
    # memory (USS) where read (a forked worker's RSS counts the pages it shares). Beside the
    # host's used memory, which ``host.used`` is, so neither is read as the other. None: no RSS.
    job_host: float | None = None
    # Bytes/s: the workers' USS rising over their first reads, too few to judge, on which the host
    # forecast was taken as their copy-on-read (``early_copying``); None: it was not.
    early_copy: float | None = None

    @property
    def uss_read(self) -> tuple[WorkerMemory, ...]:
        """The workers whose private memory has history enough to judge."""
        return tuple(w for w in self.workers if w.uss is not None and w.uss.judged)

    @property
    def uss_growing(self) -> tuple[WorkerMemory, ...]:
        return tuple(w for w in self.uss_read if w.uss is not None and w.uss.growing)

    @property
    def host_cause(self) -> str | None:
        """Whose host memory grows, on the evidence of USS: COPY_ON_READ (at least
        COPY_WORKER_SHARE of the workers' USS grows, the main process's RSS not, or by less than
        the rest of COPY_GROWTH_SHARE), MAIN_LEAK (the main process's RSS grows, no worker's USS
        does), None (no USS read, both grow alike, or neither)."""
        return cause_of(self.workers, self.main)

    @property
    def private(self) -> WorkersPrivate | None:
        """The workers' private memory together; None where no worker's USS was read."""
        read = [w for w in self.workers if w.uss is not None]
        if not read:
            return None
        grow = [w.uss for w in self.uss_growing if w.uss is not None]
        return WorkersPrivate(read=len(read), total=sum(w.uss.used for w in read if w.uss is not None),
                              judged=len(self.uss_read), growing=len(grow), median_rate=median_rate(grow),
                              total_rate=sum(g.rate for g in grow), cause=self.host_cause)

    def worker(self, pid: int) -> WorkerMemory | None:
        return next((w for w in self.workers if w.pid == pid), None)

    def gpu(self, index: int) -> GpuMemory | None:
        return next((g for g in self.gpus if g.index == index), None)

    def growing_on(self, index: int) -> bool:
        g = self.gpu(index)
        return g is not None and g.growth.growing


def cause_of(workers: Sequence[WorkerMemory], main: Growth | None) -> str | None:
    """MemoryView.host_cause, from the workers' memory and the main process's RSS. The main
    process's growth counts beside the workers' only for its share of the two (COPY_GROWTH_SHARE)."""
    read = [w for w in workers if w.uss is not None and w.uss.judged]
    grow = [w.uss for w in read if w.uss is not None and w.uss.growing]
    main_rate = main.rate if main is not None and main.growing else 0.0
    copying = sum(g.rate for g in grow)
    if read and grow and len(grow) >= COPY_WORKER_SHARE * len(read) and (
            main_rate <= (1 - COPY_GROWTH_SHARE) * (copying + main_rate)):
        return COPY_ON_READ
    if read and not grow and main_rate > 0:
        return MAIN_LEAK
    return None


def still_shared(workers: Sequence[WorkerMemory], procs: Mapping[int, Sequence[ProcSample]]) -> float | None:
    """What the growing workers still share with the main process, bytes: each one's RSS less
    its USS at its latest USS read. Copy-on-read can grow a worker's private memory by that much
    at most: a page is copied once, then it is the worker's. An upper bound: a shared page no
    refcount is written on (the libraries' text, objects the workers never touch) stays shared.
    A worker reading a Dataset of 3M dicts at random copied 0.68 GB of the 1.2 GB it shared and
    no more (the dicts' key tables and the ints it never read stayed shared): bounded by twice
    its true ceiling there, the forecast errs early, as a line does, by less.
    None: a growing worker with no RSS to set it against, or one whose RSS grows with its USS
    (it allocates too: its growth has no such bound)."""
    total = 0.0
    grow = [w for w in workers if w.uss is not None and w.uss.judged and w.uss.growing]
    if not grow or any(w.rss_alike for w in grow):
        return None
    for w in grow:
        samples = procs.get(w.pid, ())
        last = next((s for s in reversed(samples) if s.uss is not None), None)
        # The USS read's own RSS (the same smaps_rollup); else the latest RSS (flat: the pages
        # it shares are counted in it from the fork).
        rss = last.rss if last is not None and last.rss is not None else next(
            (s.rss for s in reversed(samples) if s.rss is not None), None)
        if last is None or last.uss is None or rss is None:
            return None
        total += max(0.0, float(rss) - float(last.uss))
    return total


def early_copying(workers: Sequence[WorkerMemory], procs: Mapping[int, Sequence[ProcSample]],
                  main: Growth | None, rate: float) -> tuple[float, float] | None:
    """Before any worker's USS has history enough to judge: the workers' copy-on-read as the
    reads there are show it, for the host forecast growing at ``rate`` (bytes/s). At least
    COPY_WORKER_SHARE of the workers read twice rose, none with its RSS rising alike (it
    allocates), their USS rising at least COPY_GROWTH_SHARE of ``rate`` together (the median
    worker's rate times the workers read), and the main process's RSS not rising by the rest.
    Returns (what every worker read still shares, bytes; their USS's rate, bytes/s); None when
    the reads do not show that."""
    if rate <= 0 or any(w.uss is not None and w.uss.judged for w in workers):
        return None
    shared, rates, twice = 0.0, [], 0
    for w in workers:
        reads = [(s.ts, float(s.uss), float(s.rss)) for s in procs.get(w.pid, ())
                 if s.uss is not None and s.rss is not None]
        if not reads:
            continue
        # Every worker read counts in the bound (one read once is likely copying too): a bound
        # left short of a worker's shared pages would forecast too late.
        shared += max(0.0, reads[-1][2] - reads[-1][1])
        if len(reads) < 2 or reads[-1][0] <= reads[0][0]:
            continue
        twice += 1
        du, dr = reads[-1][1] - reads[0][1], reads[-1][2] - reads[0][2]
        if du > 0 and dr >= RSS_ALIKE_SHARE * du:
            return None  # new memory in the worker: no bound from what it shares
        if du > 0:
            rates.append(du / (reads[-1][0] - reads[0][0]))
    read = sum(1 for w in workers if w.uss is not None)
    if not twice or len(rates) < COPY_WORKER_SHARE * twice:
        return None
    together = sorted(rates)[len(rates) // 2] * read
    main_rate = _rate_of(main)
    if together < COPY_GROWTH_SHARE * rate or main_rate > (1 - COPY_GROWTH_SHARE) * rate:
        return None
    return shared, together


def _copying(g: Growth, left: float, lag_s: float | None = None, main: Growth | None = None) -> Growth:
    """``g``, the job's host memory growing as its workers copy what they share (copy-on-read),
    forecast as growth bounded by ``left`` (``still_shared``) whose rate falls in proportion to
    what is left of it: each worker copies a page on its first touch, so with shuffled reads the
    pages still shared are found at a rate in proportion to their number. A straight line
    forecast the 16-core host's OOM in 53 s when it came in 98 s.

    Growth judged early is judged only for its urgency (memory_growth.EARLY_HORIZON): bounded,
    if its slow end no longer reaches the limit that soon it is weighed, not judged, until the
    minute is up. ``main``: the main process's RSS, whose growth beside it (a small share:
    COPY_GROWTH_SHARE) is a line, never bounded."""
    b = bounded(g, left, lag_s, steady=_rate_of(main))
    if b.early and (b.eta_high_s is None or b.eta_high_s > EARLY_HORIZON * b.span_s):
        return Growth(SHORT, used=g.used, limit=g.limit, span_s=g.span_s, rising=g.rate, rising_in_loop=True,
                      ceiling=b.ceiling)
    return b


def _rate_of(g: Growth | None) -> float:
    """Bytes/s ``g`` grows at: its rate judged, else what it is seen rising at; 0 for none."""
    if g is None:
        return 0.0
    return g.rate if g.growing else g.rising


def job_gpu_series(index: int, processes: Sequence[GpuProcess], family: Collection[int]) -> list[tuple[float, float]]:
    """The job's memory on GPU ``index`` per poll: its processes' used memory summed (a poll
    where NVML gave none of them a figure is left out)."""
    by_ts: dict[float, float] = {}
    for p in processes:
        if p.gpu_index == index and p.pid in family and p.used_memory is not None:
            by_ts[p.ts] = by_ts.get(p.ts, 0.0) + p.used_memory
    return sorted(by_ts.items())


def memory_view(gpus: Collection[int], gpu_samples: Mapping[int, Sequence[GpuSample]],
                gpu_processes: Sequence[GpuProcess], host: Sequence[HostSample],
                procs: Mapping[int, Sequence[ProcSample]], family: Collection[int],
                workers: Collection[int] = (), gpu_info: Mapping[int, GpuInfo] | None = None,
                early_since: float | None = None) -> MemoryView:
    """``gpus``: the job's GPUs; ``gpu_processes``: NVML's process lists over the window (every
    poll's); ``procs``: per pid, the family's process samples (the workers', and the target's for
    its RSS); ``family``: the target and its workers; ``workers``: the DataLoader workers;
    ``early_since``: since when the job has been in its training loop (not loading, not
    compiling): growth since then is judged on less history when urgent (memory_growth.EARLY_SPAN_S)."""
    out: list[GpuMemory] = []
    for i in sorted(gpus):
        samples = gpu_samples.get(i, ())
        last = next((s for s in reversed(samples) if s.mem_used is not None), None)
        info = (gpu_info or {}).get(i)
        limit = (last.mem_total if last is not None and last.mem_total else None) or (info.memory_total if info else None)
        series = job_gpu_series(i, gpu_processes, family)
        source = PROCESS
        if not series:
            series = [(s.ts, float(s.mem_used)) for s in samples if s.mem_used is not None]
            source = DEVICE
        if not series:
            continue
        # The card fills with everyone's memory: the headroom is what the whole card has left.
        used_now = float(last.mem_used) if last is not None and last.mem_used is not None else None
        out.append(GpuMemory(i, _judged(series, limit, used_now, early_since), source))
    host_growth = None
    cgroup = bool(host) and host[-1].cgroup_limit is not None and host[-1].cgroup_used is not None
    total = float(host[-1].mem_total) if host and host[-1].mem_total else None
    used_now = float(host[-1].mem_total - host[-1].mem_available) if total else None
    ws = []
    for pid in sorted(workers):
        samples = procs.get(pid, ())
        series = [(s.ts, float(s.rss)) for s in samples if s.rss is not None]
        # USS is read every few seconds, not every poll: its series is the polls that have it.
        private = [(s.ts, float(s.uss)) for s in samples if s.uss is not None]
        if series:
            ws.append(WorkerMemory(pid, growth(series), growth(private) if private else None))
    main = None
    job_host = None
    for pid in set(family) - set(workers):  # the target (family is the target and its workers)
        series = [(s.ts, float(s.rss)) for s in procs.get(pid, ()) if s.rss is not None]
        if series:
            # Each worker's latest USS read (its series' last point), not a fit's figure.
            job_host = series[-1][1] + sum(
                next(float(s.uss) for s in reversed(procs.get(w.pid, ())) if s.uss is not None)
                for w in ws if w.uss is not None)
            # Against what the host has free: its forecast is the job's own.
            main = _judged(series, total, used_now, early_since) if total else growth(series)
    # The workers' copy-on-read is bounded by what they still share: forecast so, not as a line.
    left = still_shared(ws, procs) if cause_of(ws, main) == COPY_ON_READ else None
    early_copy = None

    def bound_for(g: Growth) -> float | None:
        """What the workers still share, for the host growth ``g``: as judged from their USS, or,
        named before that can be judged (a fast leak), as their first reads show it."""
        nonlocal early_copy
        if left is None and g.growing:
            found = early_copying(ws, procs, main, g.rate)
            if found is not None:
                early_copy = found[1]
                return found[0]
        return left

    if cgroup:
        # The group's own use against its limit: the limit binds before the host's total does.
        cs = [(h.ts, float(h.cgroup_used)) for h in host if h.cgroup_used is not None]
        host_growth = _judged(cs, float(host[-1].cgroup_limit), None, early_since)
        bound = bound_for(host_growth)
        if bound is not None and host_growth.growing:
            host_growth = _copying(host_growth, bound, main=main)
    elif total:
        hs = [(h.ts, float(h.mem_total - h.mem_available)) for h in host if h.mem_total]
        whole = _judged(hs, total, None, early_since)
        host_growth = _job_on_host(whole, main, ws, total, used_now, bound_for(whole))
    return MemoryView(tuple(out), host_growth, tuple(ws), main=main, host_cgroup=cgroup, job_host=job_host,
                      early_copy=early_copy if host_growth is not None and host_growth.ceiling is not None else None)


def _job_on_host(whole: Growth, main: Growth | None, ws: Sequence[WorkerMemory], total: float,
                 used_now: float, left: float | None = None) -> Growth:
    """The host's memory growth as the job's own: the whole host's used memory moves with every
    process on it (a test suite beside the job read as 4 GB/min, a neighbour's 1.5 GB freed and
    taken again hid a steady leak), so the rate is the job's (its main process's RSS, its workers'
    private memory) against what the host has free. Only where the workers' private memory has no
    history yet (copy-on-read shows nowhere else) does the whole host's growth stand in.
    ``left``: the growth is the workers' copy-on-read, bounded by what they still share."""
    parts = [g for g in [main, *(w.uss for w in ws)] if g is not None and g.growing]
    if parts:
        rate, low, high = (sum(g.rate for g in parts), sum(g.rate_low for g in parts),
                           sum(g.rate_high for g in parts))
        line = forecast_of(rate, low, high, used_now, total, max(g.span_s for g in parts),
                           early=any(g.early for g in parts))
        copying = [g for g in parts if g is not main]
        if left is None or not copying:
            return line
        # Each worker's fit measured its rate at its own time: what was left then, as one lag.
        lag = sum(g.rate * fit_lag_s(g) for g in copying) / sum(g.rate for g in copying)
        return _copying(line, left, lag, main)
    if whole.growing and ws and not any(w.uss is not None and w.uss.judged for w in ws):
        # The whole host stands in; bounded where the workers' first reads show their copying.
        return whole if left is None else _copying(whole, left, main=main)
    # Too short to judge, the job's own memory may already be seen rising (memory-rising weighs
    # it): kept, or a 35 s watch of a job leaking 1.6 GB/min in its RSS said nothing of memory.
    rising = [g for g in [main, *(w.uss for w in ws)] if g is not None and not g.judged and g.rising > 0]
    if rising:
        return Growth(SHORT, used=used_now, limit=total, span_s=max(g.span_s for g in rising),
                      rising=sum(g.rising for g in rising), rising_in_loop=all(g.rising_in_loop for g in rising))
    if whole.rising > 0 and ws and not any(w.uss is not None and w.uss.judged for w in ws):
        return whole  # the workers' private memory not yet read: the whole host stands in, as above
    return Growth(FLAT if whole.judged else whole.kind, used=used_now, limit=total, span_s=whole.span_s)


def _judged(series: Sequence[tuple[float, float]], limit: float | None, used_now: float | None,
            early_since: float | None) -> Growth:
    """A minute of history judged as ever; less, only its part since the loop began, and early.
    With no training loop known (``early_since`` None: a CPU job's loop does no model step, or
    the job is loading), less than a minute is only weighed: how fast it rises, never a verdict."""
    g = growth(series, limit, used_now, weigh=early_since is None)
    if g.judged or early_since is None:
        return g
    return growth([p for p in series if p[0] >= early_since], limit, used_now, early=True)


def owner_of(pid: int, parents: Mapping[int, int], jobs: Collection[int]) -> int | None:
    """The nearest of ``jobs`` ``pid`` runs under (``parents``: pid -> ppid), within
    WORKER_MAX_HOPS; None: under none of them."""
    cur = parents.get(pid)
    for _ in range(WORKER_MAX_HOPS):
        if cur is None or cur <= 1:
            return None
        if cur in jobs:
            return cur
        cur = parents.get(cur)
    return None


def jobs_private(jobs: Collection[int], latest: Mapping[int, ProcSample],
                 window: Callable[[int], Sequence[ProcSample]], now: float) -> dict[int, WorkersPrivate]:
    """Each job's workers' private memory, for the jobs (processes) given: its workers are the
    processes under it (the nearest job up their parents) whose USS was read over ``window`` (a
    pid's samples over MEMORY_WINDOW_S; the host source reads only the DataLoader workers') and
    that are still seen (PRIVATE_GONE_S). ``latest``: each process's newest sample. A job none of
    whose workers was read has no entry."""
    jobs = set(jobs)
    if not jobs:
        return {}
    parents = {p.pid: p.ppid for p in latest.values() if p.ppid is not None}
    under: dict[int, dict[int, Sequence[ProcSample]]] = {}
    for pid, p in latest.items():
        if pid in jobs or p.ts < now - PRIVATE_GONE_S:
            continue
        job = owner_of(pid, parents, jobs)
        if job is None:
            continue
        samples = window(pid)
        if any(s.uss is not None for s in samples):
            under.setdefault(job, {})[pid] = samples
    out: dict[int, WorkersPrivate] = {}
    for job, procs in under.items():
        workers = set(procs)
        view = memory_view((), {}, [], [], {**procs, job: window(job)}, {job} | workers, workers)
        private = view.private
        if private is not None:
            out[job] = private
    return out


__all__ = ["COPY_ON_READ", "COPY_WORKER_SHARE", "DEVICE", "COPY_GROWTH_SHARE", "GpuMemory", "MAIN_LEAK", "MEMORY_WINDOW_S", "MemoryView",
           "PRIVATE_GONE_S", "PROCESS", "RSS_ALIKE_SHARE", "WorkerMemory", "WorkersPrivate", "cause_of", "early_copying",
           "job_gpu_series",
           "jobs_private", "median_rate", "memory_view", "still_shared"]
