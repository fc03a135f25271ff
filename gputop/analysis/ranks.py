"""The local ranks of a multi-rank job, each seen from its own main thread's stacks, and the rank
the others wait for. Pure: stack samples and events in.

The session names the ranks once, in an event (``ranks_message``): the advisor, a replay and the
report read the same map back (``rank_map``), so no new sample type is needed.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Callable, Mapping, Sequence

from ..model import Category, Event, GpuProcess, GpuSample, ProcSample, StackSample
from .classify import category_shares, hot_place, is_library, own_frames, project_frame, rank_samples, short_path, stack_key
from .efficiency import BUSY_UTIL_PCT
from .hang import collective_fn
from .spin import WaitPoll, mean_wait, paired_gap, wait_series
from .step_order import when_in_step
from .throttle import decode_throttle
from .stats import wilson_interval
from .threshold import IntThreshold, JUDGEMENT, Threshold

RANKS_SOURCE = "ranks"
_RANK_PID = re.compile(r"rank (\d+) pid (\d+)")

def ranks_message(pid_rank: Mapping[int, int], launcher: int | None) -> str:
    parts = ", ".join(f"rank {r} pid {p}" for p, r in sorted(pid_rank.items(), key=lambda x: x[1]))
    return f"multi-rank job{f' (launcher {launcher})' if launcher else ''}: {parts}"


def rank_map(events: Sequence[Event]) -> dict[int, int]:
    """pid -> rank, from the newest ranks event."""
    for e in reversed(events):
        if e.source == RANKS_SOURCE:
            return {int(p): int(r) for r, p in _RANK_PID.findall(e.message)}
    return {}


def cpu_ranks(pid_rank: Mapping[int, int], gpu_processes: Sequence[GpuProcess], gpus: bool) -> frozenset[int]:
    """The ranks that train on the CPU (their main thread computes their backward): NVML lists
    none of them on a GPU. ``gpus``: the machine has GPUs NVML reads; where it lists no process
    on them at all (its first poll not in yet, another PID namespace) which rank holds one cannot
    be told, and none is taken for a CPU rank."""
    on_gpu = {p.pid for p in gpu_processes}
    if not pid_rank or (gpus and not on_gpu):
        return frozenset()
    return frozenset(p for p in pid_rank if p not in on_gpu)


def as_ranks(stacks: Sequence[StackSample], pid_rank: Mapping[int, int], gpu_processes: Sequence[GpuProcess] = (),
             gpus: bool = False) -> list[StackSample]:
    """``stacks`` with each CPU rank's main-thread samples judged as a rank's
    (``classify.rank_category``: off the CPU in backward or in DDP's forward prologue, it waits in
    a collective). Every reader of a multi-rank job's stacks (the ranks view, the advisor's
    context, the stuck verdict) takes them from here; one process's stacks pass unchanged."""
    return rank_samples(stacks, cpu_ranks(pid_rank, gpu_processes, gpus))


@dataclass(frozen=True)
class RankView:
    rank: int
    pid: int
    gpu: int | None  # NVML lists the rank's process on this GPU
    samples: int  # main-thread samples in the window
    shares: tuple[tuple[Category, float], ...]  # largest first
    collective: float  # share in collectives
    collective_fn: str | None  # the torch.distributed function it waits in ("all_reduce")
    hot: str | None  # outside collectives, the commonest project place: "load_batch (train.py:40)"
    hot_share: float  # of all its samples
    latest: StackSample | None
    env: tuple[tuple[str, str], ...] = ()  # its performance environment, redacted (the host source's)
    # Its GPU's polls, each with the share of it the GPU waited for a peer (analysis.spin): NCCL
    # waits in a kernel on the GPU while the host runs on, so the stacks alone miss it.
    gpu_waits: tuple[WaitPoll, ...] = ()
    gpu_util: float | None = None  # its GPU's mean utilisation over the window (%)
    gpu_sm: float | None = None  # its GPU's mean SM activity (GPM, %)
    # The commonest place over all its samples, waits included: the user's frame under a wait in
    # torch ("main (train.py:80)" under all_reduce), for a rank that does nothing else (``hot`` None).
    top: str | None = None
    top_share: float = 0.0
    # It does something now: its newest samples are not all one stack, or its thread was on a CPU
    # in most of them. A rank blocked in one place (a hang) works at nothing.
    works: bool = True
    # Its DataLoader workers' commonest place (their own code): what its input pipeline spends
    # its time on, "decode_record (data.py:88)"; None without worker stacks.
    worker_hot: str | None = None
    # Other processes NVML lists on its GPU (not ranks of the job): a GPU it shares.
    gpu_guests: tuple[int, ...] = ()
    # Why its GPU's clocks were held down (power, heat, a hardware slowdown) in at least a third
    # of its busy polls: the same work takes it longer.
    gpu_throttled: tuple[str, ...] = ()
    # The data-parallel wrapper its stacks show: "DDP", "FSDP" or None (neither seen).
    wrapper: str | None = None
    # The function of the user's code it runs that the other ranks (nearly) never do, and its
    # share of its samples: what a straggler does that the others wait for ("evaluate
    # (train.py:522)", 0.37); None where it runs nothing of its own.
    only_here: str | None = None
    only_here_share: float = 0.0
    # The user's function its collective samples are called from, most often ("average_gradients
    # (train.py:606)"), and the share of its collective samples under it; None: none of its own
    # (DDP's reducer, FSDP's hooks, a library).
    collective_caller: str | None = None
    collective_caller_share: float = 0.0
    # Whether its collective is called once per turn of the loop its step's other work runs in
    # (True: the call sits in that loop itself, as ``dist.all_reduce(flat)`` after backward does),
    # or from a loop of its own inside the step (False: one call per tensor); None where the
    # source's loops were not read.
    collective_once_per_step: bool | None = None
    # Where in its step its hot place runs (analysis.step_order): BEFORE_FORWARD (it prepares the
    # batch) or AFTER_UPDATE (work of its own after the backward: an EMA, a metric); None unknown.
    hot_when: str | None = None
    # When it last took part in the step, as far as anything shows: its newest main-thread sample
    # in the model, a collective or a sync, or its GPU's newest poll busy with kernels (a rank
    # sampled once a second may sit in its own code at every sample and still launch its step's
    # kernels each time round). None: never in the window. A rank that never arrives (a loop
    # that never returns) stops taking part when it enters it; a straggler goes on arriving.
    arrived: float | None = None

    def share(self, cat: Category) -> float:
        return dict(self.shares).get(cat, 0.0)

    @property
    def gpu_wait(self) -> float | None:
        """The share of the window its GPU waited for a peer (spinning in a collective)."""
        return mean_wait(self.gpu_waits)

    @property
    def wait(self) -> float:
        """The share of the window it waited for its peers: in a collective on its host (gloo,
        or a blocking NCCL call) or on its GPU (NCCL's kernel spinning), whichever is larger."""
        return max(self.collective, self.gpu_wait or 0.0)


# The model's own step: its samples say "the step", not what one rank does apart.
MODEL_PHASES = (Category.FORWARD, Category.BACKWARD, Category.OPTIMIZER)
# A rank's own work outside the model (Python data handling, metrics, ...) in at least this share
# of its samples is its hot place, before the model's step. Judgement: a fifth.
OWN_WORK_MIN_SHARE = Threshold(
    0.2, "share", JUDGEMENT,
    "A rank's own work outside the model in at least this share of its samples is its hot place, before the "
    "model's step: a fifth.")


def hot_line(v: RankView) -> tuple[str | None, float, bool]:
    """Where a rank's time goes, as the Ranks pane, the exporter's hot line and the straggler
    finding name it: (place, share of its samples, whether it is the rank's own work).

    The function only this rank runs, when it holds at least half of what its hot place does
    (the straggler rule's choice: a rank sleeping in `load_batch` is off the CPU, so no "work",
    and its hot place was the loop's line at 3 % while it spent 91 % in `load_batch`); else its
    hot place; else, for a rank that only waits, where its own code waits (not its own work)."""
    if v.only_here and (not v.hot or v.only_here_share >= v.hot_share / 2):
        return v.only_here, v.only_here_share, True
    if v.hot:
        return v.hot, v.hot_share, True
    return v.top, v.top_share, False


def rank_view(rank: int, pid: int, main: Sequence[StackSample], gpu: int | None = None) -> RankView:
    n = len(main)
    coll = [s for s in main if s.category is Category.COLLECTIVE]
    fns = Counter(f for f in (collective_fn(s) for s in coll) if f)
    anywhere: Counter = Counter()
    any_lines: dict[tuple, Counter] = {}
    for s in main:
        # The user's frame under library frames; a stack all in libraries by its newest frame.
        g = project_frame(s.frames) or (own_frames(s.frames)[0] if s.frames else None)
        if g is not None:
            key = (g.name, short_path(g.filename))
            anywhere[key] += 1
            any_lines.setdefault(key, Counter())[g.line] += 1
    # Outside collectives and idle waits: the place of the user's code it works in most. Its
    # own work outside the model first, when there is a share of it worth naming: the model's
    # forward/backward samples all sit on the loop's line (under library frames), which names
    # the step, not what this rank does that the others do not (an FSDP rank tokenizing in
    # Python was named by its `loss.backward()` line, where it waited on the GPU 38 % of the
    # time, over `tokenize_slowly` spread over its lines).
    work = [s for s in main if s.category not in (Category.COLLECTIVE, Category.IDLE)]
    own = [s for s in work if s.category not in MODEL_PHASES]
    found = (hot_place(own) if n and len(own) >= OWN_WORK_MIN_SHARE * n else None) or hot_place(work)
    hot, hot_share = (found[0], found[1] / n) if found else (None, 0.0)
    top, top_share = None, 0.0
    if anywhere:
        (name, path), k = anywhere.most_common(1)[0]
        top, top_share = f"{name} ({path}:{any_lines[(name, path)].most_common(1)[0][0]})", k / n
    caller = hot_place(coll)
    once = collective_once_per_step(main)
    recent = main[-WORKS_RECENT:]
    works = bool(recent) and (len({stack_key(s.frames) for s in recent}) > 1
                              or sum(1 for s in recent if s.active) >= len(recent) / 2)
    arrived = max((s.ts for s in main if s.category in _TAKES_PART), default=None)
    return RankView(rank, pid, gpu, n, category_shares(main), len(coll) / n if n else 0.0,
                    fns.most_common(1)[0][0] if fns else None, hot, hot_share, main[-1] if main else None,
                    top=top, top_share=top_share, works=works, wrapper=wrapper_of(main),
                    collective_caller=caller[0] if caller else None,
                    collective_caller_share=caller[1] / len(coll) if caller and coll else 0.0,
                    collective_once_per_step=once, arrived=arrived)


def _loops_of(frames) -> list[tuple[str, str, int]]:
    """(function, file, first line of its innermost loop) of each user frame of ``frames`` whose
    line sits in a loop read from its source, innermost frame first."""
    return [(f.name, f.filename, f.loop) for f in frames if f.loop and not is_library(f.filename)]


def collective_once_per_step(main: Sequence[StackSample]) -> bool | None:
    """Whether a rank's collectives are called once a turn of its outermost loop (the training
    loop: ``dist.all_reduce(flat)`` after backward) rather than from a loop nested in it (one call
    per tensor, the tutorial's ``for p in model.parameters(): dist.all_reduce(p.grad)``, inline or
    in a helper). Nested: a caller's frame further up sits in a loop too, or the function's other
    samples show a loop of its that starts before the call's (the training loop around it). Read
    from the loops (``Frame.loop``) of the user's frames; None where the collectives' were not read."""
    earliest: dict[tuple[str, str], int] = {}
    for s in main:
        if s.category is not Category.COLLECTIVE:
            for name, path, loop in _loops_of(s.frames):
                earliest[(name, path)] = min(loop, earliest.get((name, path), loop))
    verdicts = []
    for s in main:
        if s.category is Category.COLLECTIVE:
            loops = _loops_of(s.frames)
            if loops:
                (name, path, loop), outer = loops[0], loops[1:]
                verdicts.append(not outer and earliest.get((name, path), loop) >= loop)
    if not verdicts:
        return None
    return sum(verdicts) > len(verdicts) / 2


# A main-thread sample in one of these is the rank taking part in the step (RankView.arrived).
_TAKES_PART = (*MODEL_PHASES, Category.COLLECTIVE, Category.HOST_SYNC)
# A GPU poll at least this busy is the rank's step running on it (RankView.arrived). Judgement:
# a straggler's short forward/backward in a long step still shows a few % in a one-second poll;
# an idle GPU reads 0 %.
ARRIVED_GPU_UTIL = Threshold(
    5.0, "%", JUDGEMENT,
    "A rank's GPU poll at least this busy is its step running there: a straggler's short compute in a long step "
    "still shows a few % in a one-second poll; an idle GPU reads 0 %.")


_DDP_FILE = "/torch/nn/parallel/distributed.py"
_ENGINE_FILES = ("/torch/autograd/graph.py", "/torch/autograd/__init__.py")
_FSDP_DIRS = ("/torch/distributed/fsdp/", "/torch/distributed/_composable/fsdp/")


def wrapper_of(main: Sequence[StackSample]) -> str | None:
    """DDP or FSDP, as any of the samples' frames show it (FSDP first: it may sit under DDP-free
    code only)."""
    seen: set[str] = set()
    ddp = False
    for s in main:
        # A collective wait inside autograd's engine is DDP's reducer all-reducing in backward
        # (classify.rank_category): DDP, though its forward's own frame (a tiny model's forward is
        # rarely sampled) is not among the samples yet: a healthy gloo DDP job was told its
        # gradients were all-reduced "by hand" until a forward sample showed the wrapper.
        if not ddp and s.category is Category.COLLECTIVE and any(
                f.filename.replace("\\", "/").endswith(_ENGINE_FILES) for f in s.frames):
            ddp = True
        for f in s.frames:
            if f.filename in seen:
                continue
            seen.add(f.filename)
            path = f.filename.replace("\\", "/")
            if any(d in path for d in _FSDP_DIRS):
                return "FSDP"
            ddp = ddp or path.endswith(_DDP_FILE)
    return "DDP" if ddp else None


# A rank's newest this many samples (2 s at the multi-rank sampler's ~5 Hz shared budget, after
# the attach burst) tell whether it does something now.
WORKS_RECENT = IntThreshold(
    10, "samples", JUDGEMENT,
    "A rank's newest this many samples tell whether it does something now: 2 s at the multi-rank sampler's ~5 Hz "
    "after the attach burst.")


def rank_views(ranks: Mapping[int, int], stacks: Sequence[StackSample], t0: float,
               gpu_processes: Sequence[GpuProcess] = (),
               procs: Mapping[int, Sequence[ProcSample]] | None = None,
               gpu_samples: Mapping[int, Sequence[GpuSample]] | None = None,
               t1: float | None = None) -> tuple[RankView, ...]:
    """One view per rank (``ranks``: pid -> rank) over its main thread's samples since ``t0``;
    ``procs`` (pid -> samples, time order) gives each rank's environment; ``gpu_samples`` (GPU
    index -> polls) each rank's GPU's waits, when every rank holds a GPU of its own."""
    gpu = {p.pid: p.gpu_index for p in gpu_processes}
    by_pid: dict[int, list[StackSample]] = {p: [] for p in ranks}
    for s in stacks:
        if s.is_main and s.pid in by_pid and s.ts >= t0:
            by_pid[s.pid].append(s)
    envs = {p: next((x.env for x in reversed(ss) if x.env), ()) for p, ss in (procs or {}).items()}
    rank_gpus = [gpu.get(p) for p in ranks]
    waits: dict[int, tuple[WaitPoll, ...]] = {}
    polls: dict[int, list[GpuSample]] = {}
    # One GPU per rank, none shared between ranks: then a GPU's waits are its rank's.
    if gpu_samples and rank_gpus and None not in rank_gpus and len(set(rank_gpus)) == len(rank_gpus):
        end = t1 if t1 is not None else max((s.ts for ss in gpu_samples.values() for s in ss), default=t0)
        mine = {i: gpu_samples.get(i, ()) for i in rank_gpus}
        waits = wait_series(mine, t0, end)
        polls = {i: [s for s in ss if t0 <= s.ts <= end and s.error is None] for i, ss in mine.items()}

    def mean_of(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    # Each rank's workers: the processes whose parent it is (the host source's readings).
    parent = {p: ss[-1].ppid for p, ss in (procs or {}).items() if ss}
    worker_main: dict[int, list[StackSample]] = {}
    for st in stacks:
        owner = parent.get(st.pid)
        if st.is_main and owner in ranks and st.ts >= t0 and st.category is not Category.IDLE:
            worker_main.setdefault(owner, []).append(st)

    only = _only_here({p: by_pid[p] for p in ranks})
    views = []
    for p, r in ranks.items():
        g = gpu.get(p)
        ps = polls.get(g, []) if g is not None else []
        views.append(replace(rank_view(r, p, sorted(by_pid[p], key=lambda s: s.ts), g), env=envs.get(p, ()),
                             gpu_waits=waits.get(g, ()) if g is not None else (),
                             gpu_util=mean_of([s.util_gpu for s in ps if s.util_gpu is not None]),
                             gpu_sm=mean_of([s.sm_active for s in ps if s.sm_active is not None]),
                             worker_hot=_hot_place(worker_main.get(p, ())),
                             gpu_guests=tuple(sorted({q.pid for q in gpu_processes if g is not None
                                                      and q.gpu_index == g and q.pid not in ranks})),
                             gpu_throttled=_throttled(ps),
                             only_here=only.get(p, (None, 0.0))[0], only_here_share=only.get(p, (None, 0.0))[1]))
        v = views[-1]
        busy = [s.ts for s in ps if s.util_gpu is not None and s.util_gpu >= ARRIVED_GPU_UTIL]
        if busy and (v.arrived is None or busy[-1] > v.arrived):
            views[-1] = v = replace(v, arrived=busy[-1])
        if v.hot:
            views[-1] = v = replace(v, hot_when=when_in_step(sorted(by_pid[p], key=lambda s: s.ts), v.hot))
        if not v.works and _moves_data((procs or {}).get(p, ()), v.latest.ts if v.latest else t0):
            # One stack, off the CPU, yet writing or reading at a rate: a checkpoint's file writes
            # (torch.save blocked in write() for seconds), not a hang. A rank hung in Python moves
            # no bytes.
            views[-1] = replace(v, works=True)
    return tuple(sorted(views, key=lambda v: v.rank))


# A function of the user's code is a rank's own when it is under at least this share of the
# rank's samples and under at most ONLY_ELSEWHERE_MAX of every other rank's. Judgement: a tenth
# is a phase worth naming (a 10 % phase the others wait for is the advisor's 10 % bar); 2 % is
# sampling's stray hit of a call every rank makes rarely.
ONLY_HERE_MIN = Threshold(
    0.10, "share", JUDGEMENT,
    "A function of the user's code under at least this share of a rank's samples is a phase worth naming: a 10 % "
    "phase the others wait for is the advisor's 10 % bar.")
ONLY_ELSEWHERE_MAX = Threshold(
    0.02, "share", JUDGEMENT,
    "A rank's own function is under at most this share of every other rank's samples (ONLY_HERE_MIN of its own): "
    "2 % is sampling's stray hit of a call every rank makes rarely.")


def _only_here(by_pid: Mapping[int, Sequence[StackSample]]) -> dict[int, tuple[str, float]]:
    """Per rank, the user-code function it runs that no other rank does (see ``RankView.only_here``):
    of those, the one under most of its samples, the innermost of a chain under as many (a metric
    ``roc_auc_per_class`` rather than the ``log_metrics`` that calls it)."""
    if len(by_pid) < 2:
        return {}
    shares: dict[int, dict[tuple[str, str], float]] = {}
    depth: dict[tuple[str, str], int] = {}
    lines: dict[tuple[str, str], Counter] = {}
    # A file is the user's (and its short name) once per file, not once per frame: 8 ranks of
    # 300 thirty-frame samples took 137 ms a tick asking each frame.
    place: dict[str, str | None] = {}
    for p, ss in by_pid.items():
        c: Counter = Counter()
        for smp in ss:
            seen = set()
            for d, f in enumerate(own_frames(smp.frames)):
                path = place.get(f.filename, "")
                if path == "":
                    path = place[f.filename] = None if is_library(f.filename) else short_path(f.filename)
                if path is None:
                    continue
                key = (f.name, path)
                if key in seen:
                    continue
                seen.add(key)
                c[key] += 1
                depth[key] = min(depth.get(key, d), d)
                lines.setdefault(key, Counter())[f.line] += 1
        shares[p] = {k: n / len(ss) for k, n in c.items()} if ss else {}
    out = {}
    for p, mine in shares.items():
        cands = [(sh, -depth[k], k) for k, sh in mine.items() if sh >= ONLY_HERE_MIN
                 and all(other.get(k, 0.0) <= ONLY_ELSEWHERE_MAX for q, other in shares.items() if q != p)]
        if cands:
            sh, _, (name, path) = max(cands, key=lambda c: (round(c[0], 2), c[1]))
            out[p] = (f"{name} ({path}:{lines[(name, path)].most_common(1)[0][0]})", sh)
    return out


# A rank whose process reads or writes at least this much per second (the host source's I/O
# rates) in its last WORKS_IO_S makes progress, whatever its stacks say. Judgement: 8 MB/s is far
# above a hung process's (none) and far below a checkpoint's (GB in seconds).
WORKS_IO_BPS = Threshold(
    8e6, "bytes/s", JUDGEMENT,
    "A rank reading or writing this much per second makes progress whatever its stacks say: far above a hung "
    "process's (none), far below a checkpoint's (GB in seconds).")
WORKS_IO_S = Threshold(
    4.0, "s", JUDGEMENT,
    "How far back a rank's I/O rates count for WORKS_IO_BPS.")


def _moves_data(procs: Sequence[ProcSample], now: float) -> bool:
    recent = [x for x in procs if now - WORKS_IO_S <= x.ts <= now + WORKS_IO_S]
    return any((x.io_write_bps or 0.0) + (x.io_read_bps or 0.0) >= WORKS_IO_BPS for x in recent)


# A reason holds a GPU's clocks down in at least this share of its busy polls to count. Judgement:
# a third, as the efficiency check's own (advisor.rules.system).
THROTTLED_SHARE = Threshold(
    0.3, "share", JUDGEMENT,
    "A reason holds a GPU's clocks down in at least this share of its busy polls to count: a third, as the "
    "efficiency check's own.")


def _throttled(polls: Sequence[GpuSample]) -> tuple[str, ...]:
    busy = [p for p in polls if (p.util_gpu or 0.0) >= BUSY_UTIL_PCT]
    if not busy:
        return ()
    counts: Counter = Counter(w for p in busy for w in decode_throttle(p.throttle_reasons, limiting_only=True))
    return tuple(w for w, k in counts.most_common() if k / len(busy) >= THROTTLED_SHARE)


def _hot_place(samples: Sequence[StackSample]) -> str | None:
    found = hot_place(samples)
    return found[0] if found else None


@dataclass(frozen=True)
class Straggler:
    slow: RankView
    waiting: tuple[RankView, ...]
    gap_low: float = 0.0  # the least-waiting other rank's share minus the slow one's, at its lower confidence limit
    z: float = 0.0  # the normal quantile that limit was taken at (0: the shares as seen)
    on_gpu: bool = False  # the waits were seen on the GPUs (NCCL spinning), not in the host's stacks
    polls: int = 0  # with on_gpu: the paired GPU polls the gap rests on
    # The slow rank's own work, which no other rank runs, told it (``own_work_straggler``): its
    # share's lower confidence limit. None: the gap alone did.
    own_low: float | None = None


def gap_lower(waiting: RankView, slow: RankView, z: float) -> float:
    """The lower confidence limit of ``waiting``'s collective share minus ``slow``'s, each read
    from its own main thread's samples, taken as independent counts (each rank has its own
    sampler; their dumps fall tens of ms apart, not at one instant): Newcombe's hybrid score interval
    (Statistics in Medicine 17, 1998, method 10), built from each share's Wilson interval, so it
    stays honest at shares of 0 or 1 and at a few dozen samples, where the normal approximation
    of the difference does not."""
    pw, ps = waiting.collective, slow.collective
    lw, _ = wilson_interval(pw * waiting.samples, waiting.samples, z)
    _, us = wilson_interval(ps * slow.samples, slow.samples, z)
    return (pw - ps) - math.sqrt((pw - lw) ** 2 + (us - ps) ** 2)


def pick_z(level: float | None, ranks: int) -> float:
    """The one-sided normal quantile for a gap at ``level`` when the slow rank is the
    least-waiting of ``ranks`` (picked after looking): Bonferroni over the ranks it could have
    been, so for 2 ranks at 95 % it is 1.96, not 1.64. None: no interval (0)."""
    if not level:
        return 0.0
    return NormalDist().inv_cdf(1 - (1 - level) / max(1, ranks))


def straggler(views: Sequence[RankView], others_wait_min: float, gap: float, min_samples: int = 1,
              level: float | None = 0.95, gpu_bars: tuple[float, float] | None = None) -> Straggler | None:
    """The rank the others wait for: every other rank spends at least ``others_wait_min`` of its
    samples in collectives, and this one ``gap`` less than the least-waiting of them, resolved:
    the gap to each of them at its lower confidence limit (``gap_lower``, one-sided at ``level``
    over the ranks, ``pick_z``) is at least ``gap``. Shares read from a few dozen samples wander
    by more than ``gap`` between ranks doing the same work (two ranks each waiting 45 % of the
    time, 15 samples each, are a quarter apart one look in five), so the shares as seen do not
    decide. ``level`` None: they do (no interval). ``gpu_bars``: (others' wait, gap) for the
    GPUs' paired polls where they differ from the host's."""
    seen = [v for v in views if v.samples >= min_samples]
    if len(seen) < 2:
        return None
    found = _straggler_on_host(seen, others_wait_min, gap, level)
    if found is not None:
        return found
    wait_min, gpu_gap = gpu_bars if gpu_bars is not None else (others_wait_min, gap)
    return gpu_straggler(seen, wait_min, gpu_gap, level) or own_work_straggler(seen, wait_min, gpu_gap, level)


def own_work_straggler(views: Sequence[RankView], others_wait_min: float, gap: float,
                       level: float | None = 0.95) -> Straggler | None:
    """The straggler told by what it runs, not only by the gap: one rank runs a function of the
    user's that no other rank runs (``only_here``) in at least OWN_WORK_MIN_SHARE of its samples at
    the share's lower confidence limit, while every other rank's GPU waits for a peer (NCCL
    spinning) and its own does not, by the gap as seen over GPU_MIN_POLLS polls at least. The GPUs'
    paired polls alone resolve a bursty wait slowly (a held-out rank 0 validating alone for ~3 s
    every ~5 s: 17 s, its peer waiting 57 % from the fourth second); the rank's own work is a
    second, independent measurement that the two ranks do not do the same thing."""
    polled = [v for v in views if len(v.gpu_waits) >= GPU_MIN_POLLS and v.gpu_wait is not None]
    if len(views) < 2 or len(polled) < len(views):
        return None
    z = pick_z(level, len(views)) or 1.96
    own = [v for v in views if v.only_here and v.samples
           and wilson_interval(v.only_here_share * v.samples, v.samples, z)[0] >= OWN_WORK_MIN_SHARE]
    if len(own) != 1:
        return None
    slow = own[0]
    others = tuple(v for v in views if v is not slow)
    least = min(v.gpu_wait or 0.0 for v in others)
    if least < others_wait_min or least - (slow.gpu_wait or 0.0) < gap or not _does_something(slow):
        return None
    if not all(v.works for v in others):
        # A waiting rank standing still now is a hang forming, not a step's wait: a straggler's
        # peers go on stepping between their waits (a held-out rank spinning for ever in its own
        # rejection sampler was "the straggler" for 3 s this way before the hang was weighed).
        return None
    low = wilson_interval(slow.only_here_share * slow.samples, slow.samples, z)[0]
    return Straggler(slow, others, least - (slow.gpu_wait or 0.0), z, on_gpu=True,
                     polls=min(len(v.gpu_waits) for v in views), own_low=low)


# The GPU path needs this many paired polls: a mean and a spread (Student's t at 2 is 4.3).
GPU_MIN_POLLS = IntThreshold(
    3, "polls", JUDGEMENT,
    "The straggler's GPU path needs this many paired polls: a mean and a spread (Student's t at 2 degrees of "
    "freedom is 4.3).")
# A straggler's GPU busy this share of the window does something even while its host waits.
# Judgement: half.
STRAGGLER_BUSY_MIN = Threshold(
    0.5, "share", JUDGEMENT,
    "A straggler's GPU busy this share of the window does something even while its host waits: half.")


def gpu_straggler(views: Sequence[RankView], others_wait_min: float, gap: float,
                  level: float | None = 0.95) -> Straggler | None:
    """The straggler as the GPUs show it: every other rank's GPU waits (spinning in a NCCL
    kernel, ``analysis.spin``) at least ``others_wait_min`` of the window, and this one's ``gap``
    less than each of them at the paired polls' lower confidence limit. NCCL does not block the
    host in the collective, so the waiting ranks' stacks show their next step's launches, not a
    wait; their GPUs show it."""
    seen = [v for v in views if len(v.gpu_waits) >= GPU_MIN_POLLS and v.gpu_wait is not None]
    if len(seen) < 2 or len(seen) < len(views):
        return None
    i = min(range(len(seen)), key=lambda k: seen[k].gpu_wait or 0.0)
    slow, others = seen[i], tuple(seen[:i] + seen[i + 1:])
    if min(v.gpu_wait or 0.0 for v in others) < others_wait_min:
        return None
    if not _does_something(slow):
        return None
    z = pick_z(level, len(seen)) or 1.96
    lows = [paired_gap(v.gpu_waits, slow.gpu_waits, z) for v in others]
    if min(n for _, _, n in lows) < GPU_MIN_POLLS:
        return None
    low = min(lo for _, lo, _ in lows)
    if low < gap:
        return None
    return Straggler(slow, others, low, z, on_gpu=True, polls=min(n for _, _, n in lows))


# A rank whose GPU waited for a peer at least this share of the window is not the one the others
# wait for: a straggler arrives last, so its collective's kernel barely waits. Judgement: half.
STRAGGLER_SPIN_MAX = Threshold(
    0.5, "share", JUDGEMENT,
    "A rank whose GPU waited for a peer (spinning in a collective) at least this share of the window is not the "
    "straggler: the slowest rank arrives last, so its collective's kernel barely waits.")


def _does_something(slow: RankView) -> bool:
    """The rank the others wait for does something: its host thread works, or its GPU computes.
    One blocked in one place with its GPU idle never arrives at all: a hang, the stuck verdict's
    to name (a straggler named for the first seconds of a hang is a false warning)."""
    if (slow.gpu_wait or 0.0) >= STRAGGLER_SPIN_MAX:
        # Its GPU spins in a collective for a peer most of the window: whatever its host thread
        # runs (launches into a queue full behind that kernel), it waits too (a held-out job's
        # rank 1, blocked so in a Linear's launch while rank 0 sat in a barrier it never called,
        # was named the straggler).
        return False
    return slow.works or (slow.gpu_util or 0.0) >= STRAGGLER_BUSY_MIN * 100


def _straggler_on_host(seen: Sequence[RankView], others_wait_min: float, gap: float,
                       level: float | None) -> Straggler | None:
    i = min(range(len(seen)), key=lambda k: seen[k].collective)
    slow, others = seen[i], tuple(seen[:i] + seen[i + 1:])
    if not _does_something(slow):
        return None
    if min(v.collective for v in others) < others_wait_min:
        return None
    if min(v.collective for v in others) - slow.collective < gap:
        return None
    z = pick_z(level, len(seen))
    low = min(gap_lower(v, slow, z) for v in others)
    if low < gap:
        return None
    return Straggler(slow, others, low, z)


def moving_ranks(ranks: Mapping[int, int], stacks: Sequence[StackSample], since: float, target: int | None,
                 spin_pids: frozenset[int] = frozenset(),
                 works_between: Callable[[int, Sequence[StackSample]], bool] | None = None) -> list[int]:
    """The ranks (other than ``target``) that work since ``since`` and still do: gone from one
    function to another within their last MOVING_RECENT_S, or on a CPU outside collectives then.
    A rank that waits in the same all_reduce line at every sample is not hung while another rank
    works: each step it waits again, for a straggler. One that moved when the target stopped and
    has stood still since (a desync: each rank in its own collective) does not work. A rank whose
    GPU spins now (``spin_pids``) does not work, whatever its host thread runs: the CUDA driver
    yields in a loop while it waits, or it launches into a queue that waits behind the collective.
    ``works_between(pid, samples)``: whether the OS shows a rank whose sparse samples sit at one
    place working between them (a straggler asleep most of each step in its own
    code: at ~1 stack/s its last few samples can all land in the sleep)."""
    by_pid: dict[int, list[StackSample]] = {}
    for s in stacks:
        if s.is_main and s.pid in ranks and s.pid != target and s.ts >= since:
            by_pid.setdefault(s.pid, []).append(s)
    out = []
    for p, ss in by_pid.items():
        if p in spin_pids:
            # Its GPU spins in a collective now: whatever its host thread runs (the next step's
            # launches into the queue, the driver yielding) waits for a peer. A held-out job's rank
            # waiting so for a rank blocked on a dead thread's queue read as "moves: a straggler".
            continue
        ss.sort(key=lambda s: s.ts)
        newest = ss[-1].ts
        recent = [s for s in ss if s.ts >= newest - MOVING_RECENT_S]
        # Functions, not lines: a hung rank's polling loop moves between its lines.
        keys = {tuple(f.name for f in s.frames) for s in recent}
        working = p not in spin_pids and any(
            s.active and s.category not in (Category.COLLECTIVE, Category.IDLE) for s in recent)
        if len(keys) > 1 or working or _just_arrived(ss) or (works_between is not None and works_between(p, ss)):
            out.append(ranks[p])
    return sorted(out)


def _just_arrived(ss: Sequence[StackSample]) -> bool:
    """A rank (samples since the wait began, time order) seen working and, at its newest sample
    only, in a collective: with samples seconds apart (a starved host rotating py-spy over the
    ranks) its stand there is not seen to last at all, and a straggler's wait each step is brief.
    Seen in it twice, MOVING_RECENT_S apart or more, it is known to stand (a desync)."""
    newest = ss[-1]
    if newest.category is not Category.COLLECTIVE:
        return False
    key = tuple(f.name for f in newest.frames)
    run_start = newest.ts
    for s in reversed(ss[:-1]):
        if tuple(f.name for f in s.frames) != key:
            # It was elsewhere at ``s``, working there: arrived since, and not seen standing long.
            return (s.active and s.category not in (Category.COLLECTIVE, Category.IDLE)
                    and newest.ts - run_start < MOVING_RECENT_S)
        run_start = s.ts
    return False


# A rank moves if it changed function (or ran outside collectives) within this long of its newest
# sample. Judgement: a training step changes function many times a second; a straggler's slowest
# call (a batch built in Python) takes a fraction of a step.
MOVING_RECENT_S = Threshold(
    3.0, "s", JUDGEMENT,
    "A rank moves if it changed function (or ran outside collectives) within this of its newest sample: a step "
    "changes function many times a second; a straggler's slowest call takes a fraction of a step.")


# --------------------------------------------------------------------------- links between GPUs

TOPOLOGY_SOURCE = "topology"  # the NVML source's event (sources.nvml.TOPOLOGY_SOURCE)
_PAIR = re.compile(r"(\d+)-(\d+) ([^,;|]+), P2P ([^;|]+)")
_LINKS_UP = re.compile(r"GPU (\d+) (\d+)")


@dataclass(frozen=True)
class Topology:
    pairs: Mapping[tuple[int, int], tuple[str, str]]  # (i, j), i < j -> (link, P2P status)
    nvlinks: Mapping[int, int]  # GPU -> NVLinks up

    def between(self, a: int, b: int) -> tuple[str, str] | None:
        return self.pairs.get((min(a, b), max(a, b)))


def topology(events: Sequence[Event]) -> Topology | None:
    """The GPUs' links as the NVML source described them (its newest topology event)."""
    for e in reversed(events):
        if e.source == TOPOLOGY_SOURCE:
            pairs = {(int(a), int(b)): (link.strip(), p2p.strip()) for a, b, link, p2p in _PAIR.findall(e.message)}
            up = e.message.split("NVLinks up:", 1)[1] if "NVLinks up:" in e.message else ""
            return Topology(pairs, {int(g): int(n) for g, n in _LINKS_UP.findall(up)})
    return None


# --------------------------------------------------------------------------- the job, for the panes

# What a rank's time went to, in the groups the ranks view and the report show (each a set of
# stack categories): compute on the GPU or for it, input, communication, saving, the rest.
GROUPS: tuple[tuple[str, frozenset[Category]], ...] = (
    ("compute", frozenset({Category.FORWARD, Category.BACKWARD, Category.OPTIMIZER, Category.HOST_SYNC,
                           Category.H2D_COPY})),
    ("data", frozenset({Category.DATA_WAIT, Category.DATA_FETCH})),
    ("comm", frozenset({Category.COLLECTIVE})),
    ("ckpt", frozenset({Category.CHECKPOINT_IO})),
    ("other", frozenset({Category.GC, Category.IDLE, Category.OTHER})),
)


def group_shares(shares: Sequence[tuple[Category, float]]) -> tuple[tuple[str, float], ...]:
    d = dict(shares)
    return tuple((name, sum(d.get(c, 0.0) for c in cats)) for name, cats in GROUPS)


def doing_now(v: RankView) -> str:
    """What a rank does at its newest sample: 'waits in all_reduce', 'load_batch (train.py:40)'."""
    s = v.latest
    if s is None:
        return "no stacks yet"
    if s.category is Category.COLLECTIVE:
        return f"waits in {collective_fn(s) or 'a collective'}"
    f = project_frame(s.frames) or (s.frames[0] if s.frames else None)
    if v.gpu_waits and v.gpu_waits[-1].wait >= SPINS_NOW:
        # NCCL waits on the GPU: the host thread is caught wherever the full launch queue or the
        # next sync stopped it (a rank behind a barrier it never called read "Attention.forward").
        return "GPU waits in NCCL" + (f"; host at {f.name}" if f is not None else "")
    if f is None:
        return s.category.value
    return f"{f.name} ({short_path(f.filename)}:{f.line})"


# A rank's GPU whose newest poll waited (spinning in a collective) at least this share of it waits
# now. Judgement: nearly all of the poll, as a spin reads 100 % busy throughout.
SPINS_NOW = Threshold(
    0.9, "share", JUDGEMENT,
    "A rank's GPU whose newest poll waited for a peer at least this share of it waits now: a spin reads busy "
    "throughout.")


@dataclass(frozen=True)
class JobView:
    launcher: int | None
    ranks: tuple[RankView, ...]
    window_s: float
    topology: Topology | None = None


_LAUNCHER = re.compile(r"\(launcher (\d+)\)")


def job_view_of(events: Sequence[Event], views: Sequence[RankView], window_s: float) -> JobView:
    """The attached multi-rank job as the ranks pane shows it: its ranks' views over the window
    (analysis.window), its launcher and its GPUs' links as the events name them."""
    launcher = next((int(m.group(1)) for e in reversed(events) if e.source == RANKS_SOURCE
                     for m in [_LAUNCHER.search(e.message)] if m), None)
    return JobView(launcher, tuple(views), window_s, topology(events))
