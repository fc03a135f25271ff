"""A job's findings across evaluations, with the hold rule (``hold``) applied: the view names a
finding once it has held and takes it back once it has been gone, so one noisy evaluation
neither names a rank nor clears one. Pure: evaluations (their time and the job then) in, the
findings on show out.

The live view feeds one evaluation per refresh; a one-shot view (`--once`) and the live view's
first refresh feed every evaluation of the past window at once (a subquery's steps, built by
``model.build_jobs``), so they apply the same rule to what came before them instead of judging
one instant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .hold import Held, HoldRule, Key
from .judge import Judgement, judge
from .model import Job
from .ras import CountHistory


# A finding being weighed that another reading of the same rank does not break. One way only: a
# straggler stands still for a moment, a rank that never arrives does not move for a moment.
_SIBLINGS = {"slow": ("never",)}


@dataclass
class _Track:
    since: float
    last_seen: float
    value: object
    evals: int = 1  # consecutive evaluations with it, in the current run
    absent: int = 0  # consecutive evaluations without it, since last_seen
    shown: bool = False

    def held(self, k: Key) -> Held:
        return Held(k, self.since, self.last_seen, self.value, self.evals)


class Memory:
    """Feed it evaluations in time order (``feed``); ``judgement()`` is what to show now."""

    def __init__(self, rule: HoldRule | None = None, step_s: float | None = None) -> None:
        self.rule = rule or HoldRule()
        self.step_s = step_s
        self._tracks: dict[Key, _Track] = {}
        self.counts = CountHistory()  # NCCL's counts: a count says something only over time
        self.at: float | None = None  # the newest evaluation fed
        self.job: Job | None = None  # the job then
        self.latest: Judgement | None = None  # that evaluation's own findings, before the rule

    def feed(self, ts: float, job: Job, found: Judgement | None = None) -> bool:
        """One evaluation at ``ts`` (judged here unless ``found`` is given); an evaluation not
        newer than the last one fed is ignored (a range that overlaps the previous one)."""
        if self.at is not None and ts <= self.at:
            return False
        self.counts.add(ts, job)
        found = found if found is not None else judge(job, self.counts.findings(ts))
        rule = self.rule
        now = found.found()
        for k, value in now.items():
            t = self._tracks.get(k)
            if t is None:
                t = self._tracks[k] = _Track(ts, ts, value)
            else:
                t.last_seen, t.value, t.evals, t.absent = ts, value, t.evals + 1, 0
            if not t.shown and ts - t.since >= rule.appear_s and t.evals >= rule.min_evals:
                t.shown = True
        for k in [k for k in self._tracks if k not in now]:
            t = self._tracks[k]
            if not t.shown and ts - t.last_seen < rule.appear_s and \
                    any((other, k[1], k[2]) in now for other in _SIBLINGS.get(k[0], ())):
                # The same rank read the other way for a moment (a straggler whose batch takes
                # longer than --stuck-after reads as never arriving): still the rank the others
                # wait for, so this evaluation neither holds nor breaks the straggler being
                # weighed; the other reading is weighed on its own.
                continue
            t.absent += 1
            t.evals = 0
            # Not yet named: a break starts it over. Named: it goes once gone long enough.
            if not t.shown or (ts - t.last_seen >= rule.clear_s and t.absent >= rule.min_evals):
                del self._tracks[k]
        for k, t in list(self._tracks.items()):
            # A rank named as never arriving is the job's hang: a straggler named on that rank
            # before it stopped (while it still moved, or before its exporter called it stuck)
            # is history, not a second finding shown beside the hang for its clearing time.
            if k[0] == "slow" and (never := self._tracks.get(("never", k[1], k[2]))) \
                    and never.shown and never.last_seen >= t.last_seen:
                del self._tracks[k]
        self.at, self.job, self.latest = ts, job, found
        return True

    def feed_all(self, steps: Iterable[tuple[float, Job]]) -> int:
        return sum(self.feed(ts, job) for ts, job in steps)

    def judgement(self) -> Judgement:
        """The findings on show (each with since when it holds) and those being weighed."""
        shown = {k: t for k, t in self._tracks.items() if t.shown}

        def of(kind: str) -> list[Key]:
            return sorted((k for k in shown if k[0] == kind), key=lambda k: (k[1], k[2]))

        # One straggler at a time: the one seen most recently (a new one named while the old
        # one fades), then the one held longest.
        slow = sorted(of("slow"), key=lambda k: (-shown[k].last_seen, shown[k].since))
        weighing = tuple(sorted((t.held(k) for k, t in self._tracks.items() if not t.shown),
                                key=lambda h: (h.since, h.key)))
        return Judgement(
            straggler=shown[slow[0]].value if slow else None,  # type: ignore[arg-type]
            never_arrives=tuple(shown[k].value for k in of("never")),  # type: ignore[misc]
            stuck=tuple(shown[k].value for k in of("stuck")),  # type: ignore[misc]
            missing=tuple(sorted(k[2] for k in of("missing"))),
            # A state of the ranks now, not a finding to hold: the newest evaluation's.
            starting=self.latest.starting if self.latest is not None else (),
            throttled=self.latest.throttled if self.latest is not None else (),
            held={k: t.held(k) for k, t in shown.items()},
            weighing=weighing,
            rule=self.rule,
            at=self.at,
            step_s=self.step_s,
        )


def judged(steps: Iterable[tuple[float, Job]], rule: HoldRule | None = None,
           step_s: float | None = None) -> tuple[Job, Judgement] | None:
    """A past window's evaluations through the rule: the newest job and what to show, None
    when the window holds no evaluation."""
    mem = Memory(rule, step_s)
    mem.feed_all(steps)
    if mem.job is None:
        return None
    return mem.job, mem.judgement()
