"""Which local processes are ranks of a distributed job that runs without a GPU (gloo on CPU), and
which processes lie under a given one: the two questions ``--attach all`` asks the process table
besides NVML's list.

A CPU rank holds no GPU, so NVML never lists it; what marks it is its launcher's environment:
torchrun, ``torch.multiprocessing`` launchers, mpirun and Slurm set ``RANK`` and ``WORLD_SIZE`` in
every rank (the launcher itself has neither). Only the presence of those two keys is read here;
no value leaves this module (``sources.job_identity`` reads the identity, redacted, once attached).
Each process is looked at once (an environment is fixed at exec), so a scan costs one directory
listing of /proc plus two small reads per new Python process.
"""

from __future__ import annotations

import os
from typing import Callable, Iterable

RANK_KEYS = (b"RANK", b"WORLD_SIZE")


def names_a_rank(environ: bytes) -> bool:
    """A raw ``/proc/PID/environ`` (NUL-separated KEY=VALUE) sets both RANK and WORLD_SIZE."""
    keys = {item.split(b"=", 1)[0] for item in environ.split(b"\0") if b"=" in item}
    return all(k in keys for k in RANK_KEYS)


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:  # gone, or another user's process without ptrace rights
        return b""


def _pids() -> list[int]:
    try:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []


class RankScanner:
    """Callable: the PIDs of this host's Python processes whose environment names a rank.

    Remembers what it has seen (pruned to the live PIDs at each scan, so memory follows the
    process table), and reads each new process's environment at most once."""

    def __init__(self, python: Callable[[int], bool], pids: Callable[[], Iterable[int]] = _pids,
                 environ: Callable[[int], bytes] = _environ) -> None:
        self._python = python
        self._list = pids
        self._environ = environ
        self._seen: dict[int, bool] = {}
        self._me = os.getpid()

    def __call__(self) -> list[int]:
        live = set(self._list())
        self._seen = {p: r for p, r in self._seen.items() if p in live}
        for pid in live - self._seen.keys():
            self._seen[pid] = pid != self._me and self._python(pid) and names_a_rank(self._environ(pid))
        return sorted(p for p, is_rank in self._seen.items() if is_rank)


def parent_of(pid: int) -> int | None:
    """The parent PID from ``/proc/PID/stat`` (the field after the parenthesised name, which may
    itself hold spaces and parentheses), None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def is_under(pid: int, root: int, parent: Callable[[int], int | None] = parent_of, limit: int = 64) -> bool:
    """``pid`` is ``root`` or descends from it. The walk is bounded (a process tree deeper than
    ``limit`` is not a launcher's), and stops at PID 1 or a vanished parent."""
    for _ in range(limit):
        if pid == root:
            return True
        if pid <= 1:
            return False
        up = parent(pid)
        if up is None:
            return False
        pid = up
    return False
