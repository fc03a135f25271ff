"""A recording's sessions: ``record --append`` adds one per run, each with its own target. Pure:
session rows in, spans and text out; `info`, `report` and `record` use these alone, so that they
say the same of every session.
"""

from __future__ import annotations

from typing import Sequence

# (target PID, its command line): what a session followed; (None, None) without --pid.
Target = tuple[int | None, str | None]


def session_spans(sessions: Sequence[dict], start: float, end: float) -> list[tuple[float, float]]:
    """(start, end) of each recording session; the first starts where the recording does (it
    holds everything from there: backfill, seeded state), the last ends where the recording does,
    one never closed (killed) where the next began."""
    out: list[tuple[float, float]] = []
    for k, x in enumerate(sessions):
        st = start if k == 0 else (x.get("started") or start)
        if k == len(sessions) - 1:
            e = end
        else:
            nxt = sessions[k + 1].get("started") or end
            e = min(x.get("ended") or nxt, nxt)
        out.append((st, max(st, e)))
    return out or [(start, end)]


def target_of(session: dict) -> Target:
    return session.get("target_pid"), session.get("target_cmdline")


def target_text(target: Target) -> str:
    """'PID 1787 (python evalstep.py)', 'PID 1787', or 'no process' (recorded without --pid)."""
    pid, cmd = target
    if _none(target):
        return "no process"
    return f"PID {pid if pid is not None else '?'}" + (f" ({cmd})" if cmd else "")


def target_change(before: Target | None, now: Target, path: str = "the recording") -> str | None:
    """What to tell the person appending a session that follows ``now`` to ``path``, whose last
    session followed ``before`` (None: a new file, nothing before it). None when it is the same
    process: the same PID, and the same command line where both were read. A restarted job (a new
    PID) is another process: its stacks are another run's."""
    if before is None:
        return None
    same_pid = before[0] == now[0]
    same_cmd = not before[1] or not now[1] or before[1] == now[1]
    if same_pid and same_cmd:
        return None
    adding = ("a session that follows no process (no --pid)" if _none(now) else target_text(now))
    followed = "no process (no --pid)" if _none(before) else target_text(before)
    return (f"appending {adding} to {path}, whose last session followed {followed}: each session keeps its "
            "own target; gputop info and report describe each session apart")


def _none(target: Target) -> bool:
    return target[0] is None and not target[1]
