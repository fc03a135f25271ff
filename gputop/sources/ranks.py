"""The local ranks of a multi-process job (torchrun, torch.multiprocessing, any launcher that sets
``RANK``), found from the launcher's PID or any rank's. psutil only; it decides nothing.

A launcher's rank processes are its direct children whose environment has ``RANK`` (or
``LOCAL_RANK``). Only direct children count: a rank's forked DataLoader workers inherit its
environment, so ``RANK`` alone would take them for ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil

RANK_KEYS = ("RANK", "LOCAL_RANK")


@dataclass(frozen=True)
class Rank:
    rank: int
    pid: int
    local_rank: int | None = None


@dataclass(frozen=True)
class Job:
    launcher: int | None  # the ranks' parent
    ranks: tuple[Rank, ...]  # by rank
    given_is_rank: bool  # the PID the user gave is one of the ranks (else the launcher)

    def pid_of(self, rank: int) -> int | None:
        return next((r.pid for r in self.ranks if r.rank == rank), None)


def _rank_of(proc: psutil.Process) -> Rank | None:
    try:
        env = proc.environ()
    except (psutil.Error, OSError):
        return None
    raw = env.get("RANK", env.get("LOCAL_RANK"))
    try:
        rank = int(raw) if raw is not None else None
        local = int(env["LOCAL_RANK"]) if "LOCAL_RANK" in env else None
    except ValueError:
        return None
    return None if rank is None else Rank(rank, proc.pid, local)


def find_ranks(pid: int) -> Job | None:
    """The job ``pid`` belongs to, or None when it is not a multi-rank job's launcher or rank
    (or psutil cannot read the environments: another user's processes)."""
    try:
        proc = psutil.Process(pid)
        me = _rank_of(proc)
        parent = proc.parent() if me is not None else proc
        kids = parent.children() if parent is not None else []
    except psutil.Error:
        return None
    ranks = {r.rank: r for r in (_rank_of(k) for k in kids) if r is not None}
    if me is not None:
        ranks.setdefault(me.rank, me)
    if not ranks or (me is not None and len(ranks) < 2):
        return None  # a single process that merely has RANK set is not a job of several ranks
    return Job(launcher=parent.pid if parent is not None else None,
               ranks=tuple(ranks[k] for k in sorted(ranks)), given_is_rank=me is not None)
