"""The process table's rows: GPU processes joined with what the OS says about them. Pure."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..model import GpuProcess, ProcSample

# (key, column title, width); width 0 = takes the rest.
COLUMNS = (
    ("pid", "PID", 7),
    ("user", "USER", 8),
    ("gpu", "GPU", 5),  # titles leave room for the sort arrow
    ("gpu_mem", "GPU-MEM", 9),
    ("sm", "SM%", 6),
    ("cpu", "CPU%", 6),
    ("rss", "RSS", 6),
    ("time", "TIME", 8),
    ("command", "COMMAND", 0),
)
SORT_KEYS = tuple(c[0] for c in COLUMNS)
# A process not reported for this long has gone: its row goes too.
STALE_S = 5.0
# Numeric columns sort largest first, like htop; text columns A→Z.
DESCENDING_BY_DEFAULT = {"gpu_mem", "sm", "cpu", "rss", "time"}


@dataclass(frozen=True)
class ProcRow:
    pid: int
    gpu: int | None  # None: a process with no GPU context (the target, or a busy CPU process)
    user: str | None
    gpu_mem: int | None
    sm: float | None
    cpu: float | None
    rss: int | None
    elapsed: float | None
    command: str
    kind: str = "C"
    # The attached job's rows: "job" (the target), "rank N", "worker" (a process it started);
    # drawn first, each of its processes under it.
    job: str = ""

    @property
    def key(self) -> str:
        return f"{self.pid}:{'-' if self.gpu is None else self.gpu}"


def build_rows(
    gpu_procs: list[GpuProcess],
    procs: dict[int, ProcSample],
    now: float,
    sort: str = "gpu_mem",
    reverse: bool = False,
    query: str = "",
    target: int | None = None,
    ranks: dict[int, int] | None = None,
) -> list[ProcRow]:
    rows = []
    for gp in gpu_procs:
        ps = procs.get(gp.pid)
        rows.append(
            ProcRow(
                pid=gp.pid,
                gpu=gp.gpu_index,
                user=ps.user if ps else None,
                gpu_mem=gp.used_memory,
                sm=gp.sm_util,
                cpu=ps.cpu_percent if ps else None,
                rss=ps.rss if ps else None,
                elapsed=(now - ps.create_time) if ps and ps.create_time else None,
                command=shown_command(ps.cmdline or ps.name) if ps else "(process not visible: other namespace or exited)",
                kind=gp.kind,
            )
        )
    # Processes the OS source watches for other reasons (the attach target before it touches a
    # GPU, the busiest CPU processes when there is no NVML) get a row of their own.
    on_gpu = {gp.pid for gp in gpu_procs}
    for pid, ps in procs.items():
        if pid in on_gpu or ps.role not in ("target", "cpu") or ps.ts < now - STALE_S:
            continue
        rows.append(
            ProcRow(
                pid=pid,
                gpu=None,
                user=ps.user,
                gpu_mem=None,
                sm=None,
                cpu=ps.cpu_percent,
                rss=ps.rss,
                elapsed=(now - ps.create_time) if ps.create_time else None,
                command=shown_command(ps.cmdline or ps.name),
                kind="-",
            )
        )
    if target is not None:
        _add_workers(rows, procs, now, target)
    if query:
        q = query.lower()
        rows = [r for r in rows if q in _haystack(r)]
    return group_job(sort_rows(rows, sort, reverse), procs, target, ranks or {})


def shown_command(cmdline: str) -> str:
    """The command as the table shows it: the program by its name, not its path, so the script
    after it is in sight at 80 columns (``/opt/venv/bin/python3 train.py`` -> ``python3 train.py``)."""
    head, sep, rest = cmdline.partition(" ")
    if "/" in head:
        head = head.rsplit("/", 1)[1] or head
    return head + sep + rest


def _add_workers(rows: list[ProcRow], procs: dict[int, ProcSample], now: float, target: int) -> None:
    """The target's workers (DataLoader workers, ranks it launched) that hold no GPU: rows too,
    so the job shows whole."""
    shown = {r.pid for r in rows}
    for pid, ps in procs.items():
        if pid in shown or ps.ts < now - STALE_S or not (ps.role == "worker" or ps.ppid == target):
            continue
        rows.append(ProcRow(pid=pid, gpu=None, user=ps.user, gpu_mem=None, sm=None, cpu=ps.cpu_percent, rss=ps.rss,
                            elapsed=(now - ps.create_time) if ps.create_time else None,
                            command=shown_command(ps.cmdline or ps.name), kind="-"))


def group_job(rows: list[ProcRow], procs: dict[int, ProcSample], target: int | None,
              ranks: dict[int, int]) -> list[ProcRow]:
    """The attached job first: the target's rows, then each process it started (by parent PID)
    under its parent, ranks named, in the order the sort gave; the other rows after, as sorted."""
    if target is None or not any(r.pid == target for r in rows):
        return rows
    parent = {pid: ps.ppid for pid, ps in procs.items()}
    children: dict[int, list[ProcRow]] = {}
    for r in rows:
        if r.pid != target and parent.get(r.pid) is not None:
            children.setdefault(parent[r.pid], []).append(r)

    def tag(r: ProcRow, default: str) -> ProcRow:
        return replace(r, job=f"rank {ranks[r.pid]}" if r.pid in ranks else default)

    job = [tag(r, "job") for r in rows if r.pid == target]
    keys = {r.key for r in job}

    def walk(pid: int, depth: int) -> None:
        for c in children.get(pid, ()):
            if c.key in keys:
                continue  # a parent loop in stale samples must not repeat rows
            job.append(tag(c, "worker"))
            keys.add(c.key)
            if depth < 4:
                walk(c.pid, depth + 1)

    walk(target, 0)
    return job + [r for r in rows if r.key not in keys]


def attachable(r: ProcRow, user: str | None, root: bool, own_pid: int) -> bool:
    """Whether gputop could attach to the row's process, as far as the row tells: not init, not
    gputop itself, and (unless gputop runs as root) a process of the same user (ptrace's rule).
    Not proof it can: it may not be Python, or ptrace may be restricted."""
    if r.pid in (1, own_pid) or r.command.startswith("(process not visible"):
        return False
    return root or (user is not None and r.user == user)


def _haystack(r: ProcRow) -> str:
    gpu = f"gpu{r.gpu}" if r.gpu is not None else ""
    return f"{r.pid} {r.user or ''} {gpu} {r.command}".lower()


def sort_rows(rows: list[ProcRow], key: str, reverse: bool = False) -> list[ProcRow]:
    if key not in SORT_KEYS:
        raise ValueError(f"unknown sort key {key!r}")
    attr = {"time": "elapsed", "command": "command"}.get(key, key)
    descending = (key in DESCENDING_BY_DEFAULT) != reverse

    def k(r: ProcRow):
        v = getattr(r, attr)
        return v.lower() if isinstance(v, str) else v

    # Missing values always sort last, whichever the direction.
    present = [r for r in rows if getattr(r, attr) is not None]
    absent = [r for r in rows if getattr(r, attr) is None]
    present.sort(key=k, reverse=descending)
    return present + absent
