"""The job view's rule for when a finding is said and when it is taken back, and what a finding
on show carries (since when it holds, when it was last seen). Pure data; ``memory`` applies it.

Why a rule at all: each evaluation judges the ranks' shares over the exporters' window, and near
the straggler test's confidence limit one evaluation names a rank and the next does not. A view
that follows each evaluation flickers ("rank 3" / "no straggler" / "rank 3"), and a reader cannot
tell a flicker from a change. So a finding is named once it has held in every evaluation for
``appear_s`` (at least ``min_evals`` of them), and taken back once it has been absent from every
evaluation for ``clear_s`` (again at least ``min_evals``). Clearing takes longer than appearing:
a slow rank that drops under the test for one evaluation is still the slow rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..units import fmt_duration

# Judgement: two evaluations at the default 5 s refresh (three in all: 0, 5 and 10 s) is long
# enough that one evaluation's noise is not named, short enough that a straggler is named within
# a quarter of the exporters' 60 s window.
APPEAR_S = 10.0
# Judgement: twice the time to appear, so a finding that dips under the test for an evaluation
# or three stays named; a rank that really caught up is cleared within half a minute.
CLEAR_S = 20.0
MIN_EVALS = 2
# How far back a one-shot view (`--once`) and the live view's first refresh look: the exporters'
# own window (export.config.DEFAULT_WINDOW_S), so "slow for 60 s" is the most it can say.
LOOK_BACK_S = 60.0

# A finding's identity across evaluations: (kind, host, rank). Kinds: "slow" (the straggler),
# "never" (never arrives), "stuck", "missing" (host '').
Key = tuple[str, str, int]


@dataclass(frozen=True)
class HoldRule:
    appear_s: float = APPEAR_S
    clear_s: float = CLEAR_S
    min_evals: int = MIN_EVALS

    def describe(self, step_s: float | None = None) -> str:
        every = f", judged every {step_s:g} s" if step_s else ""
        return (f"named once held {fmt_duration(self.appear_s)}, cleared after "
                f"{fmt_duration(self.clear_s)} without{every}")


@dataclass(frozen=True)
class Held:
    """A finding across evaluations: ``since`` the first evaluation of the run that made it
    (kept through short absences once on show), ``last_seen`` the newest evaluation that had
    it, ``value`` that evaluation's finding (a ``judge.Straggler``, ``NeverArrives``, the stuck
    ``RankState``, or the missing rank's number)."""

    key: Key
    since: float
    last_seen: float
    value: object
    evals: int = 1  # consecutive evaluations that had it, in its current run
