"""The process table's rows: GPU processes joined with what the OS says about them, and the
columns that fit the table's width. Pure."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from ..analysis import MemoryView
from ..model import GpuProcess, ProcSample
from ..units import fmt_bytes, fmt_duration, fmt_growth, fmt_pct, truncate

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
# The attached job's DataLoader workers' private memory (USS), after RSS: only while a row has a
# reading (the host source reads the workers' alone), and with each growing worker's rate beside
# it ("   1.2G +40M/min"). Copy-on-read shows there, never in a forked worker's RSS.
USS_COLUMN = ("uss", "USS", 6)
# The command keeps at least this many cells (17 at 80 columns with the fixed columns): where it
# would get fewer (a narrow terminal, or the USS column shown), these columns give way, in order.
MIN_COMMAND = 16
DROP_ORDER = ("time", "user")
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
    # The attached job's rows: "job" (the target), "launcher" (a multi-rank job's: its ranks'
    # parent), "rank N", "worker" (a process one of them started); drawn first, each of its
    # processes under it, ``depth`` levels down (0: a head of the job).
    job: str = ""
    depth: int = 0
    # A DataLoader worker's private memory (USS, bytes) as the memory view last read it, and its
    # growth (bytes/s) while the view judges it growing; None: not read (not a worker, no reading yet).
    uss: float | None = None
    uss_rate: float | None = None

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
    memory: MemoryView | None = None,
) -> list[ProcRow]:
    """``memory``: the attached job's memory view (its workers' USS and growth), None: none."""
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
        _add_job(rows, procs, now, target, ranks or {})
    if query:
        q = query.lower()
        rows = [r for r in rows if q in _haystack(r)]
    return with_private(group_job(sort_rows(rows, sort, reverse), procs, target, ranks or {}), memory)


def with_private(rows: list[ProcRow], memory: MemoryView | None) -> list[ProcRow]:
    """The rows with each DataLoader worker's private memory from the memory view: its latest
    USS, and its rate while the view judges it growing (the same verdict the advisor reads)."""
    if memory is None or not memory.workers:
        return rows
    out = []
    for r in rows:
        w = memory.worker(r.pid)
        if w is not None and w.uss is not None:
            r = replace(r, uss=w.uss.used, uss_rate=w.uss.rate if w.uss.growing else None)
        out.append(r)
    return out


def shown_command(cmdline: str) -> str:
    """The command as the table shows it: the program by its name, not its path, so the script
    after it is in sight at 80 columns (``/opt/venv/bin/python3 train.py`` -> ``python3 train.py``)."""
    head, sep, rest = cmdline.partition(" ")
    if "/" in head:
        head = head.rsplit("/", 1)[1] or head
    return head + sep + rest


def _add_job(rows: list[ProcRow], procs: dict[int, ProcSample], now: float, target: int,
             ranks: dict[int, int]) -> None:
    """The attached job's processes that hold no GPU (its ranks and their launcher, DataLoader
    workers, ranks it launched): rows too, so the job shows whole. On a host without GPUs the
    ranks were rows only among the busiest processes, and the launcher 11th or not at all."""
    shown = {r.pid for r in rows}
    heads = {target} | _job_ranks(procs, target, ranks)
    launcher = job_launcher(procs, target, ranks)
    if launcher is not None:
        heads.add(launcher)
    for pid, ps in procs.items():
        if pid in shown or ps.ts < now - STALE_S or not (pid in heads or ps.role == "worker" or ps.ppid in heads):
            continue
        rows.append(ProcRow(pid=pid, gpu=None, user=ps.user, gpu_mem=None, sm=None, cpu=ps.cpu_percent, rss=ps.rss,
                            elapsed=(now - ps.create_time) if ps.create_time else None,
                            command=shown_command(ps.cmdline or ps.name), kind="-"))


def _job_ranks(procs: dict[int, ProcSample], target: int, ranks: dict[int, int]) -> set[int]:
    """The ranks of the target's job (the ranks event names the job attached to): all of them
    when the target is one of them or their launcher, none otherwise."""
    if target in ranks or any(procs[p].ppid == target for p in ranks if p in procs):
        return set(ranks)
    return set()


def job_launcher(procs: dict[int, ProcSample], target: int, ranks: dict[int, int]) -> int | None:
    """The launcher of the target's multi-rank job: its ranks' one parent (as ``sources.ranks``
    finds it), None for one process or ranks whose parents differ or are not read."""
    parents = {procs[p].ppid for p in _job_ranks(procs, target, ranks) if p in procs}
    if len(parents) != 1:
        return None
    (launcher,) = parents
    return None if launcher is None or launcher in ranks else launcher


def group_job(rows: list[ProcRow], procs: dict[int, ProcSample], target: int | None,
              ranks: dict[int, int]) -> list[ProcRow]:
    """The attached job first: a multi-rank job's launcher, then each rank in rank order (the
    target is one of them), else the target; each process one started (by parent PID) under it,
    ranks named, in the order the sort gave; the other rows after, as sorted. Attached to a
    torchrun launcher, rank 0 led, unrelated processes came next, then rank 1 (unnamed) and the
    launcher 11th."""
    if target is None:
        return rows
    by_pid: dict[int, list[ProcRow]] = {}
    for r in rows:
        by_pid.setdefault(r.pid, []).append(r)
    job_ranks = _job_ranks(procs, target, ranks)
    launcher = job_launcher(procs, target, ranks)
    heads = [p for p in ([launcher] if launcher is not None else []) + sorted(job_ranks, key=ranks.__getitem__)
             + [target] if p in by_pid]
    if not heads:
        return rows
    parent = {pid: ps.ppid for pid, ps in procs.items()}
    children: dict[int, list[int]] = {}
    for pid in by_pid:
        if parent.get(pid) is not None:
            children.setdefault(parent[pid], []).append(pid)
    for kids in children.values():
        # Ranks in rank order, first; the others as sorted.
        kids.sort(key=lambda p: (p not in job_ranks, ranks.get(p, 0)))

    def label(pid: int) -> str:
        if pid in job_ranks:
            return f"rank {ranks[pid]}"
        return "launcher" if pid == launcher else "job" if pid == target else "worker"

    job: list[ProcRow] = []
    placed: set[int] = set()

    def walk(pid: int, depth: int) -> None:
        if pid in placed:
            return  # a parent loop in stale samples, or a rank already under its launcher
        placed.add(pid)
        job.extend(replace(r, job=label(pid), depth=depth) for r in by_pid[pid])
        if depth < 4:
            for c in children.get(pid, ()):
                walk(c, depth + 1)

    for h in heads:
        walk(h, 0)
    return job + [r for r in rows if r.pid not in placed]


def uss_cell(r: ProcRow, growth_w: int = 0) -> str:
    """A worker's USS as the table shows it: the figure right-aligned as RSS's, then its growth
    in ``growth_w`` cells where the column has room for one ("  1.2G +40M/min"); "" without a reading."""
    if r.uss is None:
        return ""
    cell = fmt_bytes(r.uss).rjust(USS_COLUMN[2])
    if growth_w:
        cell += " " + (fmt_growth(r.uss_rate) if r.uss_rate is not None else "").ljust(growth_w)
    return cell


Column = tuple[str, str, int]


def table_columns(rows: Sequence[ProcRow], width: int) -> tuple[Column, ...]:
    """The columns drawn at ``width``: the fixed ones, the USS column after RSS while a row has a
    reading (as wide as its growth figures need), then ``fit_columns``."""
    cols: list[Column] = list(COLUMNS)
    if any(r.uss is not None for r in rows):
        growth_w = max((len(fmt_growth(r.uss_rate)) for r in rows if r.uss is not None and r.uss_rate is not None),
                       default=0)
        key, _title, w = USS_COLUMN
        # Titled over the figure, as RSS is (the growth beside it reads as one: "+40M/min").
        cols.insert(SORT_KEYS.index("rss") + 1, (key, "USS".rjust(w), w + (growth_w + 1 if growth_w else 0)))
    return fit_columns(cols, width)


def command_room(cols: Sequence[Column], width: int) -> int:
    """The cells the command (the column of width 0) gets at ``width``, a space between columns."""
    return width - sum(w for _, _, w in cols if w) - (len(cols) - 1)


def fit_columns(cols: Sequence[Column], width: int) -> tuple[Column, ...]:
    """Drop the columns of DROP_ORDER, in order, while the command would get fewer than
    MIN_COMMAND cells (at 80 columns the fixed ones leave it 17: nothing is dropped)."""
    out = list(cols)
    for key in DROP_ORDER:
        if command_room(out, width) >= MIN_COMMAND:
            break
        out = [c for c in out if c[0] != key]
    return tuple(out)


def row_cells(r: ProcRow, columns: Sequence[Column]) -> tuple[str, ...]:
    """The row's text in each of ``columns``: the attached job's processes marked (● a head of
    the job: the target, or a multi-rank job's launcher; └ each process under it, indented by
    its depth, with its rank, "launcher" or "worker")."""
    command = r.command
    if r.job:
        label = "" if r.job == "job" else f"{r.job}  "
        command = ("● " if r.depth == 0 else "  " * (r.depth - 1) + "└ ") + label + command
    cells = {
        "pid": str(r.pid),
        "user": truncate(r.user or "?", 10),
        "gpu": "-" if r.gpu is None else str(r.gpu),
        "gpu_mem": fmt_bytes(r.gpu_mem),
        "sm": fmt_pct(r.sm),
        "cpu": "n/a" if r.cpu is None else f"{r.cpu:.0f}",
        "rss": fmt_bytes(r.rss),
        "time": fmt_duration(r.elapsed),
        "command": command,
    }
    out = []
    for key, _title, w in columns:
        if key == "uss":
            out.append(uss_cell(r, w - USS_COLUMN[2] - 1 if w > USS_COLUMN[2] else 0))
        else:
            out.append(cells[key])
    return tuple(out)


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
