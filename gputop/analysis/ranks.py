"""The local ranks of a multi-rank job, each seen from its own main thread's stacks, and the rank
the others wait for. Pure: stack samples and events in.

The session names the ranks once, in an event (``ranks_message``): the advisor, a replay and the
report read the same map back (``rank_map``), so no new sample type is needed.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from ..model import Category, Event, GpuProcess, ProcSample, StackSample
from .classify import project_frame, short_path
from .hang import collective_fn
from .stacks_summary import category_shares

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

    def share(self, cat: Category) -> float:
        return dict(self.shares).get(cat, 0.0)


def rank_view(rank: int, pid: int, main: Sequence[StackSample], gpu: int | None = None) -> RankView:
    n = len(main)
    coll = [s for s in main if s.category is Category.COLLECTIVE]
    fns = Counter(f for f in (collective_fn(s) for s in coll) if f)
    places: Counter = Counter()
    lines: dict[tuple, Counter] = {}
    for s in main:
        if s.category in (Category.COLLECTIVE, Category.IDLE):
            continue
        f = project_frame(s.frames)
        if f is None:
            continue
        key = (f.name, short_path(f.filename))
        places[key] += 1
        lines.setdefault(key, Counter())[f.line] += 1
    hot, hot_share = None, 0.0
    if places:
        (name, path), k = places.most_common(1)[0]
        hot = f"{name} ({path}:{lines[(name, path)].most_common(1)[0][0]})"
        hot_share = k / n
    return RankView(rank, pid, gpu, n, category_shares(main), len(coll) / n if n else 0.0,
                    fns.most_common(1)[0][0] if fns else None, hot, hot_share, main[-1] if main else None)


def rank_views(ranks: Mapping[int, int], stacks: Sequence[StackSample], t0: float,
               gpu_processes: Sequence[GpuProcess] = (),
               procs: Mapping[int, Sequence[ProcSample]] | None = None) -> tuple[RankView, ...]:
    """One view per rank (``ranks``: pid -> rank) over its main thread's samples since ``t0``;
    ``procs`` (pid -> samples, time order) gives each rank's environment."""
    gpu = {p.pid: p.gpu_index for p in gpu_processes}
    by_pid: dict[int, list[StackSample]] = {p: [] for p in ranks}
    for s in stacks:
        if s.is_main and s.pid in by_pid and s.ts >= t0:
            by_pid[s.pid].append(s)
    envs = {p: next((x.env for x in reversed(ss) if x.env), ()) for p, ss in (procs or {}).items()}
    views = [replace(rank_view(r, p, sorted(by_pid[p], key=lambda s: s.ts), gpu.get(p)), env=envs.get(p, ()))
             for p, r in ranks.items()]
    return tuple(sorted(views, key=lambda v: v.rank))


@dataclass(frozen=True)
class Straggler:
    slow: RankView
    waiting: tuple[RankView, ...]


def straggler(views: Sequence[RankView], others_wait_min: float, gap: float, min_samples: int = 1) -> Straggler | None:
    """The rank the others wait for: every other rank spends at least ``others_wait_min`` of its
    samples in collectives, and this one ``gap`` less than the least-waiting of them."""
    seen = [v for v in views if v.samples >= min_samples]
    if len(seen) < 2:
        return None
    i = min(range(len(seen)), key=lambda k: seen[k].collective)
    slow, others = seen[i], tuple(seen[:i] + seen[i + 1:])
    if min(v.collective for v in others) < others_wait_min:
        return None
    if min(v.collective for v in others) - slow.collective < gap:
        return None
    return Straggler(slow, others)


def moving_ranks(ranks: Mapping[int, int], stacks: Sequence[StackSample], since: float, target: int | None) -> list[int]:
    """The ranks (other than ``target``) that work since ``since``: on a CPU outside collectives,
    or gone from one function to another. A rank that waits in the same all_reduce line at every
    sample is not hung while another rank works: each step it waits again, for a straggler."""
    seen: dict[int, set] = {}
    working: set[int] = set()
    for s in stacks:
        if s.is_main and s.pid in ranks and s.pid != target and s.ts >= since:
            # Functions, not lines: a hung rank's polling loop moves between its lines.
            seen.setdefault(s.pid, set()).add(tuple(f.name for f in s.frames))
            if s.active and s.category not in (Category.COLLECTIVE, Category.IDLE):
                working.add(s.pid)
    return sorted(ranks[p] for p, keys in seen.items() if len(keys) > 1 or p in working)


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
