"""Threads of the attached job as the kernel sees them: /proc/PID/task/TID, once a second.

For the target and each of its child processes (DataLoader workers, spawned ranks): every
thread's state (R, S, D), its CPU time and how often it was scheduled (``schedstat``; ``stat``'s
ticks where schedstat is missing), the kernel function it sleeps in (``wchan``), the syscall it
is blocked in and, when that syscall works on a file descriptor, what the descriptor is (a path
and the filesystem it is on, a socket, a pipe); and the process's IO counters (``rchar``,
``wchar``: every byte through read/write syscalls, sockets and pipes included).

This is what says, within a second or two of attaching, that a job is not moving: CPU time that
does not grow between two readings and threads that are never scheduled are the kernel's word,
and ``wchan``/``syscall`` say on what they wait. Reading it costs a few small file reads per
thread; the pages exist only on Linux (elsewhere the source emits nothing). It decides nothing:
gputop.analysis.hang and gputop.analysis.stuck read its samples from the store.
"""

from __future__ import annotations

import os
import platform
import time
from typing import Callable

from ..model import TaskSample, ThreadState

# One reading a second: two readings a second apart are the first evidence that CPU time does
# not move, and the stacks source dumps workers at the same pace.
DEFAULT_INTERVAL_S = 1.0
# Bounds on the work per poll: torch.compile can start dozens of children, and torch's thread
# pools a hundred threads per process. Judgement: beyond these, the rest adds cost, not evidence.
MAX_PROCESSES = 64
MAX_THREADS = 256

_TICK_NS = 1_000_000_000 // (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)

# Syscalls a blocked thread is commonly found in, by number (the first field of
# /proc/PID/task/TID/syscall). The ones whose first argument is a file descriptor are resolved
# to what the descriptor points at.
_SYSCALLS = {
    "x86_64": {
        0: "read", 1: "write", 7: "poll", 17: "pread64", 18: "pwrite64", 19: "readv", 20: "writev",
        23: "select", 35: "nanosleep", 42: "connect", 43: "accept", 44: "sendto", 45: "recvfrom",
        46: "sendmsg", 47: "recvmsg", 61: "wait4", 74: "fsync", 75: "fdatasync", 202: "futex",
        230: "clock_nanosleep", 232: "epoll_wait", 247: "waitid", 257: "openat", 270: "pselect6",
        271: "ppoll", 281: "epoll_pwait", 288: "accept4", 435: "clone3",
    },
    "aarch64": {
        22: "epoll_pwait", 56: "openat", 63: "read", 64: "write", 65: "readv", 66: "writev",
        67: "pread64", 68: "pwrite64", 72: "pselect6", 73: "ppoll", 82: "fsync", 83: "fdatasync",
        95: "waitid", 98: "futex", 101: "nanosleep", 115: "clock_nanosleep", 202: "accept",
        203: "connect", 206: "sendto", 207: "recvfrom", 211: "sendmsg", 212: "recvmsg",
        242: "accept4", 260: "wait4",
    },
}
_FD_SYSCALLS = {
    "read", "write", "pread64", "pwrite64", "readv", "writev", "recvfrom", "recvmsg", "sendto", "sendmsg",
    "accept", "accept4", "connect", "fsync", "fdatasync",
}


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


def _mounts(pid: int) -> list[tuple[str, str]]:
    """(mount point, filesystem type) as the process sees them, longest mount point first."""
    text = _read(f"/proc/{pid}/mountinfo") or ""
    out: list[tuple[str, str]] = []
    for ln in text.splitlines():
        left, _, right = ln.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) >= 5 and rest:
            out.append((fields[4].replace("\\040", " "), rest[0]))
    out.sort(key=lambda m: -len(m[0]))
    return out


def _voluntary_switches(status: str | None) -> int | None:
    """``voluntary_ctxt_switches`` of a /proc status text: the times the thread blocked (a sleep, a
    wait) and so woke; None where absent."""
    for line in (status or "").splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            v = line.split(":", 1)[1].strip()
            return int(v) if v.isdigit() else None
    return None


class ProcfsSource:
    """/proc readings of process ``pid`` and its children: one ``TaskSample`` per process per
    poll. Never raises for routine faults: a process that exits or cannot be read is skipped."""

    name = "procfs"

    def __init__(self, pid: int, clock: Callable[[], float] = time.time, interval: float = DEFAULT_INTERVAL_S,
                 proc_root: str = "/proc") -> None:
        self.pid = pid
        self.clock = clock
        self.interval = interval
        self.root = proc_root
        self._syscalls = _SYSCALLS.get(platform.machine(), {})
        self._mounts: dict[int, list[tuple[str, str]]] = {}

    def poll(self) -> list[object]:
        if not os.path.isdir(f"{self.root}/{self.pid}/task"):
            return []
        now = self.clock()
        out: list[object] = []
        for pid in self._family()[:MAX_PROCESSES]:
            s = self._task_sample(pid, now)
            if s is not None:
                out.append(s)
        return out

    def close(self) -> None:
        self._mounts.clear()

    # ----------------------------------------------------------------- reading

    def _family(self) -> list[int]:
        """The target, then its descendants (from the kernel's children lists), breadth first."""
        out, todo, seen = [], [self.pid], set()
        while todo and len(out) < MAX_PROCESSES:
            pid = todo.pop(0)
            if pid in seen:
                continue
            seen.add(pid)
            out.append(pid)
            for tid in self._tids(pid):
                kids = _read(f"{self.root}/{pid}/task/{tid}/children")
                if kids:
                    todo.extend(int(k) for k in kids.split() if k.isdigit())
        return out

    def _tids(self, pid: int) -> list[int]:
        try:
            names = os.listdir(f"{self.root}/{pid}/task")
        except OSError:
            return []
        tids = sorted(int(n) for n in names if n.isdigit())
        # The main thread first: it is the one the verdict names.
        return ([pid] if pid in tids else []) + [t for t in tids if t != pid][: MAX_THREADS - 1]

    def _task_sample(self, pid: int, now: float) -> TaskSample | None:
        stat = _read(f"{self.root}/{pid}/stat")
        if stat is None:
            return None
        fields = stat.rsplit(")", 1)[-1].split()
        ppid = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
        threads = tuple(t for t in (self._thread(pid, tid) for tid in self._tids(pid)) if t is not None)
        io = _read(f"{self.root}/{pid}/io") or ""
        counters = dict(ln.split(":", 1) for ln in io.splitlines() if ":" in ln)

        def counter(key: str) -> int | None:
            v = counters.get(key, "").strip()
            return int(v) if v.isdigit() else None

        return TaskSample(ts=now, pid=pid, ppid=ppid, threads=threads, rchar=counter("rchar"), wchar=counter("wchar"))

    def _thread(self, pid: int, tid: int) -> ThreadState | None:
        base = f"{self.root}/{pid}/task/{tid}"
        stat = _read(f"{base}/stat")
        if stat is None:
            return None
        head, _, tail = stat.rpartition(")")
        name = head.partition("(")[2]
        fields = tail.split()
        if len(fields) < 13:
            return None
        state = fields[0]
        cpu_ns: int | None = (int(fields[11]) + int(fields[12])) * _TICK_NS
        runs: int | None = None
        sched = (_read(f"{base}/schedstat") or "").split()
        if len(sched) >= 3 and sched[0].isdigit() and sched[2].isdigit():
            cpu_ns, runs = int(sched[0]), int(sched[2])
        wchan = syscall = fd_path = fs = None
        if state in ("S", "D"):
            w = (_read(f"{base}/wchan") or "").strip()
            wchan = w if w and w != "0" else None
            syscall, fd_path = self._syscall(pid, base)
            if fd_path and fd_path.startswith("/"):
                fs = self._fs(pid, fd_path)
        wakes = _voluntary_switches(_read(f"{base}/status")) if tid == pid else None
        return ThreadState(tid=tid, name=name, state=state, cpu_ns=cpu_ns, runs=runs, wchan=wchan,
                           syscall=syscall, fd_path=fd_path, fs=fs, wakes=wakes)

    def _syscall(self, pid: int, base: str) -> tuple[str | None, str | None]:
        text = (_read(f"{base}/syscall") or "").split()
        if not text or not text[0].lstrip("-").isdigit():
            return None, None  # "running", or not readable
        nr = int(text[0])
        name = self._syscalls.get(nr, f"syscall {nr}" if nr >= 0 else None)
        if name not in _FD_SYSCALLS or len(text) < 2:
            return name, None
        try:
            fd = int(text[1], 16)
            return name, os.readlink(f"{self.root}/{pid}/fd/{fd}")
        except (ValueError, OSError):
            return name, None

    def _fs(self, pid: int, path: str) -> str | None:
        mounts = self._mounts.get(pid)
        if mounts is None:
            if len(self._mounts) > MAX_PROCESSES:
                self._mounts.clear()
            mounts = self._mounts[pid] = _mounts(pid)
        for point, fstype in mounts:
            if path == point or path.startswith(point.rstrip("/") + "/"):
                return f"{fstype} on {point}"
        return None
