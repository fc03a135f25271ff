"""Across every rank of a job: the rank the others wait for (the straggler), the rank that never
arrives (stuck outside a collective while the others wait), and ranks no exporter reports. Pure:
a ``model.Job`` in, the verdicts out.

The thresholds are the advisor's own rank-straggler rule's (``advisor``: the others wait at least
OTHERS_WAIT_MIN, the straggler STRAGGLER_GAP less than the least-waiting of them, at
STRAGGLER_LEVEL confidence over the ranks), so one host's Ranks tab and the job view agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from statistics import NormalDist, mean
from typing import Mapping, Sequence

from ..advisor import MIN_MAIN_SAMPLES, OTHERS_WAIT_MIN, STRAGGLER_GAP, STRAGGLER_LEVEL
from ..analysis import wilson_interval
from .hold import Held, HoldRule, Key
from .model import Job, RankState
from .ras import RasFinding


@dataclass(frozen=True)
class Straggler:
    slow: RankState
    waiting: int  # ranks that wait for it
    others_wait: float  # their mean share of the window spent waiting: what it costs them
    collective: str  # the collective they wait in, most often ('' unknown)
    evidence: tuple[str, ...] = ()  # beyond the shares: NCCL's counts


@dataclass(frozen=True)
class NeverArrives:
    rank: RankState
    waiting: int  # ranks stuck in (or waiting at) a collective meanwhile
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True)
class Judgement:
    """One evaluation's findings (``judge``), or the findings on show after the hold rule
    (``memory.Memory.judgement``): then ``held`` says since when each holds and ``weighing``
    what is seen but not yet held long enough to be named."""

    straggler: Straggler | None
    never_arrives: tuple[NeverArrives, ...]
    stuck: tuple[RankState, ...]  # every stuck rank
    missing: tuple[int, ...]  # rank numbers below the world size nobody reports
    # Ranks not judged: still starting (importing, joining the process group, first steps) or
    # too little seen of them; what each does is its ``starting_of``.
    starting: tuple[RankState, ...] = ()
    # Ranks whose GPU's clocks are held down (power, heat, a hardware slowdown): a cause of a
    # straggler where it is one, and a fact worth knowing where it is not.
    throttled: tuple[RankState, ...] = ()
    held: Mapping[Key, Held] = field(default_factory=dict)
    weighing: tuple[Held, ...] = ()
    rule: HoldRule | None = None
    at: float | None = None  # the newest evaluation's time (the view's "now")
    step_s: float | None = None  # how often it is evaluated

    def found(self) -> dict[Key, object]:
        """Each finding by its key, to follow it from one evaluation to the next."""
        out: dict[Key, object] = {}
        if self.straggler is not None:
            out[key("slow", self.straggler.slow)] = self.straggler
        for n in self.never_arrives:
            out[key("never", n.rank)] = n
        for r in self.stuck:
            # Said once, as the rank that never arrives; and the ranks stuck in a collective
            # while one never arrives wait for it (the view says so: they are its victims).
            if not self.never_arrives:
                out[key("stuck", r)] = r
        for k in self.missing:
            out[("missing", "", k)] = k
        return out


def key(kind: str, r: RankState) -> Key:
    return (kind, r.host, r.rank)


def _z(level: float, ranks: int) -> float:
    # One-sided, Bonferroni over the ranks the straggler could have been (picked after looking).
    return NormalDist().inv_cdf(1 - (1 - level) / max(1, ranks))


def _gap_low(waiting: RankState, slow: RankState, z: float) -> float:
    """Lower confidence limit of waiting.wait - slow.wait (Newcombe's hybrid score interval from
    each share's Wilson interval, as analysis.ranks does for one host's ranks)."""
    pw, ps = waiting.wait, slow.wait
    lw, _ = wilson_interval(pw * waiting.samples, waiting.samples, z)
    _, us = wilson_interval(ps * slow.samples, slow.samples, z)
    return (pw - ps) - ((pw - lw) ** 2 + (us - ps) ** 2) ** 0.5


# An exporter older than the starting series says nothing of start-up: a rank with fewer samples
# than the straggler test reads is not judged either way.
FEW_SAMPLES = "too few stack samples yet"


def starting_of(r: RankState) -> str:
    """What a rank does before its steps ('' once it runs them): its exporter's word, or too
    few samples to judge it."""
    return r.starting or (FEW_SAMPLES if r.samples < MIN_MAIN_SAMPLES else "")


def waiting_on_a_mover(ranks: Sequence[RankState]) -> frozenset[int]:
    """The ids of ranks that look stuck only because they wait in a collective for a peer that
    moves. A rank whose every sample lands in the same all_reduce (its peer takes the whole step
    to arrive) has an unchanged stack, which is how a hang looks from its stacks alone; while
    another rank of the job still moves, the job is slow, not hung, and the waiters are its
    straggler's victims."""
    if not any(not r.stuck and r.samples >= MIN_MAIN_SAMPLES for r in ranks):
        return frozenset()
    return frozenset(id(r) for r in ranks if r.stuck and _in_collective(r))


def straggler(ranks: Sequence[RankState]) -> Straggler | None:
    waiters = waiting_on_a_mover(ranks)
    seen = [r for r in ranks if r.samples >= MIN_MAIN_SAMPLES and (not r.stuck or id(r) in waiters)]
    if len(seen) < 2:
        return None
    slow = min(seen, key=lambda r: r.wait)
    others = [r for r in seen if r is not slow]
    if min(r.wait for r in others) < OTHERS_WAIT_MIN:
        return None
    z = _z(STRAGGLER_LEVEL, len(seen))
    # The least-waiting other rank bounds the gap; checking it alone is enough since the lower
    # limit falls with the share. For 1,024 ranks this keeps a refresh linear.
    nearest = min(others, key=lambda r: r.wait)
    if nearest.wait - slow.wait < STRAGGLER_GAP or _gap_low(nearest, slow, z) < STRAGGLER_GAP:
        return None
    colls: dict[str, int] = {}
    for r in others:
        if r.collective:
            colls[r.collective] = colls.get(r.collective, 0) + 1
    coll = max(colls, key=lambda c: colls[c]) if colls else ""
    return Straggler(slow, len(others), mean(r.wait for r in others), coll)


def never_arrives(ranks: Sequence[RankState]) -> tuple[NeverArrives, ...]:
    """Stuck ranks that do not wait for peers while the others do (stuck in a collective, or
    waiting most of the window): the ones the job waits for. When every stuck rank waits in a
    collective, none is named here: the rank it waits for is then missing or unsampled."""
    stuck = [r for r in ranks if r.stuck]
    if not stuck:
        return ()
    waiting = [r for r in ranks if (r.stuck and _in_collective(r)) or (not r.stuck and r.wait >= OTHERS_WAIT_MIN)]
    culprits = [r for r in stuck if not _in_collective(r)]
    if not waiting or not culprits:
        return ()
    return tuple(NeverArrives(r, len(waiting)) for r in culprits)


def _in_collective(r: RankState) -> bool:
    where = r.stuck_where.lower()
    return r.wait >= OTHERS_WAIT_MIN or "distributed" in where or (bool(r.collective) and r.collective in where)


def judge(job: Job, ras: Sequence[RasFinding] = ()) -> Judgement:
    """One evaluation. Ranks still starting are left out of every test: their shares are their
    imports' and rendezvous', and the ranks stuck in a collective meanwhile wait for them.
    ``ras``: what NCCL's counts say now (``ras.CountHistory``), direct evidence of who has not
    launched the collectives the others have."""
    start = tuple(r for r in job.ranks if starting_of(r))
    ranks = [r for r in job.ranks if not starting_of(r)]
    slow = straggler(ranks)
    never = list(never_arrives(ranks))
    slow, never = _with_counts(ranks, slow, never, ras)
    # With a straggler named, the ranks stuck in a collective are waiting for it, not hung; so
    # are they while a rank is still starting.
    waiters = waiting_on_a_mover(ranks) if slow is not None else frozenset()
    if start:
        waiters = waiters | {id(r) for r in ranks if r.stuck and _in_collective(r)}
    return Judgement(slow, tuple(never), tuple(r for r in ranks if r.stuck and id(r) not in waiters),
                     tuple(job.missing()), starting=start, throttled=tuple(r for r in job.ranks if r.throttled))


def _with_counts(ranks: Sequence[RankState], slow: Straggler | None, never: list[NeverArrives],
                 ras: Sequence[RasFinding]) -> tuple[Straggler | None, list[NeverArrives]]:
    """The stacks' verdict with NCCL's counts: a count that stands still while another rank is
    ahead names the rank that never arrives; one that stays far behind while it moves names the
    straggler (the counts are what the collectives did; the shares are sampled). Where both
    name the same rank, the counts are its evidence."""
    by = {(r.host, r.rank): r for r in ranks}
    for f in sorted(ras, key=lambda f: (f.kind != "frozen", -f.behind)):
        r = by.get((f.host, f.rank))
        if r is None:
            continue  # still starting, or gone
        others = [o for o in ranks if o is not r]
        if f.kind == "frozen":
            known = next((n for n in never if n.rank is r), None)
            if known is not None:
                never[never.index(known)] = replace(known, evidence=(*known.evidence, f.line()))
            else:
                never.append(NeverArrives(r, len(others), (f.line(),)))
            if slow is not None and slow.slow is r:
                slow = None  # it has launched nothing for a while: not moving slowly
        elif slow is not None and slow.slow is r:
            slow = replace(slow, evidence=(*slow.evidence, f.line()))
        elif not any(n.rank is r for n in never) and (slow is None or not slow.evidence):
            wait = mean(o.wait for o in others) if others else 0.0
            slow = Straggler(r, len(others), wait, f.collective, (f.line(),))
    never.sort(key=lambda n: (n.rank.host, n.rank.rank))
    return slow, never
