"""The memory limit a job's control group sets, and what the group uses: in a container (Docker,
Kubernetes, Slurm with cgroups) the OOM killer acts when the group reaches its limit, long
before the host runs out, so a forecast against the host's total would be late by the difference.

Read from ``/proc/PID/cgroup`` (which group the job is in) and the group's files under the cgroup
mount: cgroup v2's ``memory.max`` / ``memory.current``, v1's ``memory.limit_in_bytes`` /
``memory.usage_in_bytes``, less the inactive file cache ``memory.stat`` counts. The group that
binds is the one, the job's or an ancestor's, with the least room left. Nothing is cached: three
small files a group a poll.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# cgroup v1 writes "no limit" as a page-rounded 2^63 - 1; anything this large is no limit.
_V1_UNLIMITED = 1 << 60


@dataclass(frozen=True)
class CgroupMemory:
    limit: int  # bytes the group may use
    used: int  # bytes it uses now: its working set (page cache it could drop left out)
    path: str  # the group that binds, as /proc/PID/cgroup names it


def _inactive_file(stat_path: str, key: str) -> int:
    """The group's inactive file cache (memory.stat): pages the kernel drops before it calls the
    OOM killer, so the usage counter's share of them is not memory the job needs. 0 unread."""
    try:
        with open(stat_path) as f:
            for ln in f:
                name, _, value = ln.partition(" ")
                if name == key:
                    return max(0, int(value))
    except (OSError, ValueError):
        pass
    return 0


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if not text or text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _groups(pid: int, proc_root: str) -> list[tuple[str, str]]:
    """(version, path) of the memory controller's group: ("2", "/a/b") or ("1", "/a/b")."""
    try:
        with open(os.path.join(proc_root, str(pid), "cgroup")) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for ln in lines:
        parts = ln.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            out.append(("2", path))
        elif "memory" in controllers.split(","):
            out.append(("1", path))
    return out


def _ancestors(path: str) -> list[str]:
    """'/a/b' -> ['/a/b', '/a', '/']."""
    out = []
    p = path.rstrip("/") or "/"
    while True:
        out.append(p)
        if p == "/":
            return out
        p = p.rsplit("/", 1)[0] or "/"


def job_cgroup_memory(pid: int, proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> CgroupMemory | None:
    """The job's binding memory limit and the group's use; None: no limit (or none readable)."""
    best: CgroupMemory | None = None
    for version, path in _groups(pid, proc_root):
        for p in _ancestors(path):
            rel = p.lstrip("/")
            if version == "2":
                d = os.path.join(cgroup_root, rel)
                limit, used = _read_int(os.path.join(d, "memory.max")), _read_int(os.path.join(d, "memory.current"))
                stat_key = "inactive_file"
            else:
                d = os.path.join(cgroup_root, "memory", rel)
                limit, used = (_read_int(os.path.join(d, "memory.limit_in_bytes")),
                               _read_int(os.path.join(d, "memory.usage_in_bytes")))
                if limit is not None and limit >= _V1_UNLIMITED:
                    limit = None
                stat_key = "total_inactive_file"
            if limit is None or used is None or limit <= 0:
                continue
            # The working set, as the kubelet's eviction reads it: the usage counter counts the page
            # cache of every file the job read, which the kernel drops before any OOM kill (a job
            # reading its dataset from disk sits at its limit while using a fraction of it).
            used = max(0, used - _inactive_file(os.path.join(d, "memory.stat"), stat_key))
            if best is None or limit - used < best.limit - best.used:
                best = CgroupMemory(limit, used, p)
    return best
