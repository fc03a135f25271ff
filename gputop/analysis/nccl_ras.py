"""NCCL's RAS status report, read, and two reports compared. Pure: text in, typed values out.

``parse`` reads the text report that NCCL's RAS service sends (``gputop.sources.nccl_ras``): the
NCCL and CUDA versions, the job summary, the table of communicator groups (status, errors), and
the blocks under Errors and Warnings. The wording is NCCL's (``src/ras/client_support.cc``,
releases 2.24 to 2.30):

- ``#<group>-<comm> (<hash>) MISMATCH``: ranks disagree. Per collective type (2.26 and later;
  2.24 and 2.25 lump all types: "different collective operation counts") the ranks are grouped
  by how many operations they have launched: ``N ranks have launched up to operation K`` (or
  ``have not launched any operations``), and each group that is an outlier (one rank, or at most
  10 ranks and 25 % of the communicator; 50 % when verbose) has its members named, ``Rank R --
  GPU G managed by process P on node H``; a lone rank reads ``Rank R has launched up to
  operation K -- GPU ...``. Or ranks disagree on status (NOCOMM/UNKNOWN, INIT, RUNNING,
  FINALIZE, ABORT), in the same shape.
- ``#... INCOMPLETE``: ranks that gave no data for the communicator (``Missing communicator
  data from N ranks``, then ``Rank R -- GPU ...``, or in 2.24/2.25 ``The missing ranks: 3,5``).
- ``#... ERROR``: initialization or asynchronous errors, ``Rank R reported <error> -- GPU ...``.
- Job-wide ``INCOMPLETE`` (processes that did not answer) and ``DEAD`` (processes the RAS
  network gave up on after 60 s), each ``Process P on node H managing GPU G``; ``TIMEOUT``
  (communication timeouts while gathering).

A communicator is named by its hash, which stays the same from one report to the next (the
``#g-c`` label follows the report's own sorting). NCCL prints a communicator's counts only when
its ranks disagree: a communicator absent from the blocks had equal counts.

``compare(older, newer, dt_s)`` says per communicator what the two reports, ``dt_s`` apart, show:

- ``hang``: a rank's count has not moved in ``dt_s`` (at least ``min_frozen_s``) while another
  rank is ahead: the rank named is the one that never arrives (the others have launched past it
  and wait for it in the collective).
- ``straggler``: counts move, and the same rank is behind in both reports by more than the
  collectives a healthy job has in flight.
- ``desync``: two ranks each ahead in a different collective type (rank A more AllReduces,
  rank B more Broadcasts), in both reports. Ranks that run the same program can be ahead or
  behind, but one that is ahead has launched at least as many of every type; crossed counts mean
  the ranks are not calling the same collectives in the same order.
- ``ok``: counts agree now, or differ by work in flight while moving.
- ``unknown``: the reports cannot tell yet (the communicator's counts appear in one report only;
  not frozen for long enough; counts that went backwards, i.e. another job).

The verdict is about the counts; what else the newer report says of the communicator (ranks
that gave no data, errors ranks reported, ranks in different states) is in its ``notes``, and
the job-wide missing and dead processes are the report's own (``RasReport.dead_processes``).

A hang where every rank waits in the same collective (counts equal) does not show here: NCCL
prints no counts for such a communicator.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

from ..model import Event
from .threshold import DOCUMENTED, IntThreshold, JUDGEMENT, Threshold

OK = "ok"
STRAGGLER = "straggler"
HANG = "hang"
DESYNC = "desync"
UNKNOWN = "unknown"
_RANK_OF = {OK: 0, UNKNOWN: 1, STRAGGLER: 2, HANG: 3, DESYNC: 4}

# A gap between ranks that is work in flight, not a straggler: DDP launches one AllReduce per
# gradient bucket as backward produces them, so a rank can be a step's worth of buckets ahead
# of another for a moment (the healthy 2-rank fixture: 7 apart). 32 is over four times that; the
# straggler fixture is 84 apart. Judgement, per communicator, tunable by the caller.
STRAGGLER_MIN_GAP_OPS = IntThreshold(
    32, "operations", JUDGEMENT,
    "A gap between ranks' collective counts under this is work in flight, not a straggler: DDP launches one "
    "AllReduce per bucket (the healthy 2-rank report: 7 apart; the straggler's: 84).",
    "tests/fixtures/nccl (ras-healthy.txt, ras-straggler.txt)")
# How long a count must stay still before the rank behind is called hung: NCCL's own RAS waits
# 5 s (RAS_COLLECTIVE_LEG_TIMEOUT_SEC) before calling a peer unresponsive.
HANG_MIN_FROZEN_S = Threshold(
    5.0, "s", DOCUMENTED,
    "How long a count must stay still before the rank behind is called hung: NCCL's own RAS waits this long before"
    " calling a peer unresponsive.",
    "NCCL's RAS_COLLECTIVE_LEG_TIMEOUT_SEC default (5 s)")


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True, slots=True)
class RankInfo:
    """A rank as NCCL names it: its GPU ("0", or "0 (NVML 2)" when CUDA and NVML numbers
    differ), the process that manages it, and the node's address. None where NCCL printed
    "[process information not found]" or named only the rank."""

    rank: int
    gpu: str | None = None
    pid: int | None = None
    node: str | None = None


@dataclass(frozen=True, slots=True)
class RankCount:
    """A rank and how many operations of one collective type it has launched (0: none)."""

    rank: int
    op_count: int
    gpu: str | None = None
    pid: int | None = None
    node: str | None = None

    def describe(self) -> str:
        return describe_rank(self)


def describe_rank(r: RankInfo | RankCount) -> str:
    """"rank 1 (pid 1234, GPU 1, node 192.0.2.2)", with what NCCL gave."""
    where = [f"pid {r.pid}" if r.pid is not None else None,
             f"GPU {r.gpu}" if r.gpu is not None else None,
             f"node {r.node}" if r.node else None]
    inner = ", ".join(w for w in where if w)
    return f"rank {r.rank}" + (f" ({inner})" if inner else "")


@dataclass(frozen=True, slots=True)
class CountGroup:
    """Ranks that have launched the same number of operations: all ``n_ranks`` of them, of which
    NCCL named ``ranks`` (all of an outlier group, none of a majority)."""

    op_count: int
    n_ranks: int
    ranks: tuple[RankCount, ...] = ()

    @property
    def unnamed(self) -> int:
        return self.n_ranks - len(self.ranks)


@dataclass(frozen=True, slots=True)
class OpCounts:
    """One collective type's counts in a MISMATCH block. ``collective`` is NCCL's name
    (Broadcast, Reduce, AllGather, ReduceScatter, AllReduce), None before NCCL 2.26."""

    collective: str | None
    groups: tuple[CountGroup, ...]

    @property
    def ranks(self) -> tuple[RankCount, ...]:
        return tuple(sorted((r for g in self.groups for r in g.ranks), key=lambda r: r.rank))

    @property
    def lead(self) -> int:
        return max(g.op_count for g in self.groups)

    @property
    def lag(self) -> int:
        return min(g.op_count for g in self.groups)

    def count_of(self, rank: int) -> int | None:
        """The rank's count: named, or the count of the one group with unnamed members."""
        for g in self.groups:
            for r in g.ranks:
                if r.rank == rank:
                    return r.op_count
        open_groups = [g for g in self.groups if g.unnamed > 0]
        return open_groups[0].op_count if len(open_groups) == 1 else None


@dataclass(frozen=True, slots=True)
class StatusGroup:
    """Ranks that share a status in a "different status" MISMATCH."""

    status: str
    n_ranks: int
    ranks: tuple[RankInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class ErrorGroup:
    """Ranks that reported the same error; ``phase`` is "init" or "async"."""

    phase: str | None
    error: str
    n_ranks: int
    ranks: tuple[RankInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """A job process in the job-wide INCOMPLETE and DEAD blocks."""

    pid: int
    node: str
    gpus: str


@dataclass(frozen=True, slots=True)
class Block:
    """One block under Errors or Warnings."""

    section: str  # "errors" | "warnings"
    kind: str  # MISMATCH | INCOMPLETE | ERROR (per communicator); INCOMPLETE | DEAD | TIMEOUT (job)
    comm_id: str | None = None  # "#0-0"; None for the job-wide blocks
    comm_hash: str | None = None  # "fee1471d24076fd2"
    counts: tuple[OpCounts, ...] = ()
    statuses: tuple[StatusGroup, ...] = ()
    errors: tuple[ErrorGroup, ...] = ()
    missing: tuple[RankInfo, ...] = ()  # INCOMPLETE (communicator): ranks that gave no data
    processes: tuple[ProcessInfo, ...] = ()  # INCOMPLETE/DEAD (job): the processes
    count: int | None = None  # what the block counts: missing ranks/processes, dead processes, timeouts
    lines: tuple[str, ...] = ()

    @property
    def collective(self) -> str | None:
        """The first collective type whose counts differ (None: none, or NCCL before 2.26)."""
        return self.counts[0].collective if self.counts else None

    @property
    def ranks(self) -> tuple[RankCount, ...]:
        """The named ranks of the first collective type's counts."""
        return self.counts[0].ranks if self.counts else ()


@dataclass(frozen=True, slots=True)
class CommGroupRow:
    """A row of the communicators table: ``comms`` communicators alike in size and state."""

    group: int
    comms: int
    nodes: int
    ranks_per_node: str  # "2", or "1-2"
    ranks_per_comm: int
    ranks_in_group: int
    status: str  # RUNNING, INIT, FINALIZE, ABORT, NOCOMM
    errors: tuple[str, ...]  # () for OK; MISMATCH, ERROR, INCOMPLETE


@dataclass(frozen=True, slots=True)
class RasReport:
    nccl_version: str | None = None  # "2.28.9"
    cuda_version: str | None = None  # NCCL compiled with, "13.0"
    cuda_runtime: int | None = None
    cuda_driver: int | None = None
    nodes: int | None = None  # the job summary, when NCCL prints it as one row
    processes_per_node: int | None = None
    gpus_per_process: int | None = None
    processes: int | None = None
    gpus: int | None = None
    collection_s: float | None = None  # how long NCCL took to gather the communicators' data
    groups: tuple[CommGroupRow, ...] = ()
    blocks: tuple[Block, ...] = ()

    def comm_blocks(self, comm: str) -> tuple[Block, ...]:
        """The blocks of one communicator, by hash (or by ``#g-c`` label)."""
        return tuple(b for b in self.blocks if comm in (b.comm_hash, b.comm_id))

    @property
    def comms(self) -> tuple[str, ...]:
        """The communicators the blocks speak of, by hash, in report order."""
        out: list[str] = []
        for b in self.blocks:
            key = b.comm_hash or b.comm_id
            if key and key not in out:
                out.append(key)
        return tuple(out)

    def counts(self, comm: str) -> tuple[OpCounts, ...]:
        return tuple(c for b in self.comm_blocks(comm) for c in b.counts)

    def _job(self, kind: str) -> Block | None:
        for b in self.blocks:
            if b.comm_id is None and b.kind == kind:
                return b
        return None

    @property
    def missing_processes(self) -> tuple[ProcessInfo, ...]:
        b = self._job("INCOMPLETE")
        return b.processes if b else ()

    @property
    def dead_processes(self) -> tuple[ProcessInfo, ...]:
        b = self._job("DEAD")
        return b.processes if b else ()

    @property
    def timeouts(self) -> int:
        b = self._job("TIMEOUT")
        return (b.count or 0) if b else 0


# --------------------------------------------------------------------------- parsing

_VERSION = re.compile(r"^NCCL version (\S+) compiled with CUDA (\S+)")
_CUDA = re.compile(r"^CUDA runtime version (-?\d+), driver version (-?\d+)")
_SUMMARY_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*$")
_COMMUNICATORS = re.compile(r"^Communicators\.\.\.(?: \((\d+(?:\.\d+)?)s\))?")
_GROUP_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+(?:-\d+)?)\s+(\d+)\s+(\d+)\s+([A-Z]+)\s+([A-Z,]+)\s*$")
_COMM_HEAD = re.compile(r"^#(\d+)-(\d+) \(([0-9a-fA-F]+)\) ([A-Z]+)\s*$")
_JOB_HEAD = re.compile(r"^(INCOMPLETE|DEAD|TIMEOUT)\s*$")

_WHERE = (r"(?: -- (?:GPU (?P<gpu>.+?) managed by process (?P<pid>\d+) on node (?P<node>\S*)"
          r"|\[process information not found\]))?")
_DIFF_COUNTS = re.compile(r"^Communicator ranks have different (\S+) operation counts$")
_DIFF_STATUS = re.compile(r"^Communicator ranks have different status$")
_N_LAUNCHED = re.compile(r"^(\d+) ranks have launched up to operation (\d+)$")
_N_NONE = re.compile(r"^(\d+) ranks have not launched any operations$")
_R_LAUNCHED = re.compile(r"^Rank (\d+) has launched up to operation (\d+)" + _WHERE + "$")
_R_NONE = re.compile(r"^Rank (\d+) has not launched any operations" + _WHERE + "$")
_N_STATUS = re.compile(r"^(\d+) ranks have status (\S+)$")
_R_STATUS = re.compile(r"^Rank (\d+) has status (\S+)" + _WHERE + "$")
_R_LIST_STATUS = re.compile(r"^Rank ([\d,]+) has status (\S+)$")  # 2.24/2.25: the unknown ranks
_N_REPORTED = re.compile(r"^(\d+) ranks reported (.+)$")
_R_REPORTED = re.compile(r"^Rank (\d+) reported (.+?)" + _WHERE + "$")
_R_PLAIN = re.compile(r"^Rank (\d+)" + _WHERE + "$")
_ERRORS_ON = re.compile(r"^(Initialization|Asynchronous) errors? on (\d+) ranks?$")
_MISSING_DATA = re.compile(r"^Missing communicator data from (\d+) (?:ranks?|job process(?:es)?)$")
_MISSING_LIST = re.compile(r"^The (?:missing|unknown) ranks?: ([\d,]*)$")
_PROCESS = re.compile(r"^Process (\d+) on node (\S*) managing GPUs? (.+)$")
_DEAD_N = re.compile(r"^(\d+) job process(?:es are| is) considered dead")
_TIMEOUTS = re.compile(r"^Encountered (\d+) communication timeouts?")


def _info(m: re.Match, rank: int) -> RankInfo:
    pid = m.group("pid")
    return RankInfo(rank, m.group("gpu"), int(pid) if pid else None, m.group("node") or None)


def _count(m: re.Match, rank: int, value: int) -> RankCount:
    i = _info(m, rank)
    return RankCount(rank, value, i.gpu, i.pid, i.node)


class _BlockBuilder:
    def __init__(self, section: str, kind: str, comm_id: str | None, comm_hash: str | None) -> None:
        self.section, self.kind, self.comm_id, self.comm_hash = section, kind, comm_id, comm_hash
        self.counts: list[tuple[str | None, list[list]]] = []  # (collective, [[value, n, [RankCount]]])
        self.statuses: list[list] = []  # [status, n, [RankInfo]]
        self.errors: list[list] = []  # [phase, error, n, [RankInfo]]
        self.missing: list[RankInfo] = []
        self.processes: list[ProcessInfo] = []
        self.count: int | None = None
        self.lines: list[str] = []
        self.ctx: str | None = None  # what a bare "Rank R -- GPU ..." line belongs to
        self.phase: str | None = None

    def _group(self, value: int, n: int) -> list:
        g = [value, n, []]
        self.counts[-1][1].append(g)
        self.ctx = "counts"
        return g

    def feed(self, s: str) -> None:
        self.lines.append(s)
        if m := _DIFF_COUNTS.match(s):
            coll = m.group(1)
            self.counts.append((None if coll == "collective" else coll, []))
            self.ctx = None
        elif _DIFF_STATUS.match(s):
            self.ctx = None
        elif (m := _N_LAUNCHED.match(s)) and self.counts:
            self._group(int(m.group(2)), int(m.group(1)))
        elif (m := _N_NONE.match(s)) and self.counts:
            self._group(0, int(m.group(1)))
        elif (m := _R_LAUNCHED.match(s)) and self.counts:
            r = int(m.group(1))
            self._group(int(m.group(2)), 1)[2].append(_count(m, r, int(m.group(2))))
            self.ctx = None
        elif (m := _R_NONE.match(s)) and self.counts:
            r = int(m.group(1))
            self._group(0, 1)[2].append(_count(m, r, 0))
            self.ctx = None
        elif m := _N_STATUS.match(s):
            self.statuses.append([m.group(2), int(m.group(1)), []])
            self.ctx = "status"
        elif m := _R_STATUS.match(s):
            r = int(m.group(1))
            self.statuses.append([m.group(2), 1, [_info(m, r)]])
            self.ctx = None
        elif m := _R_LIST_STATUS.match(s):
            ranks = [RankInfo(int(x)) for x in re.findall(r"\d+", m.group(1))]
            self.statuses.append([m.group(2), len(ranks), ranks])
            self.ctx = None
        elif m := _ERRORS_ON.match(s):
            self.phase = "init" if m.group(1) == "Initialization" else "async"
            self.ctx = None
        elif m := _N_REPORTED.match(s):
            self.errors.append([self.phase, m.group(2), int(m.group(1)), []])
            self.ctx = "error"
        elif m := _R_REPORTED.match(s):
            r = int(m.group(1))
            self.errors.append([self.phase, m.group(2), 1, [_info(m, r)]])
            self.ctx = None
        elif m := _MISSING_DATA.match(s):
            self.count = int(m.group(1))
            self.ctx = "missing"
        elif m := _MISSING_LIST.match(s):
            ranks = [RankInfo(int(x)) for x in re.findall(r"\d+", m.group(1))]
            if s.startswith("The unknown") and self.ctx == "status" and self.statuses:
                self.statuses[-1][2].extend(ranks)  # 2.24/2.25: the ranks of status UNKNOWN, by number
            else:
                self.missing.extend(ranks)
        elif m := _R_PLAIN.match(s):
            info = _info(m, int(m.group(1)))
            if self.ctx == "counts" and self.counts and self.counts[-1][1]:
                g = self.counts[-1][1][-1]
                g[2].append(RankCount(info.rank, g[0], info.gpu, info.pid, info.node))
            elif self.ctx == "status" and self.statuses:
                self.statuses[-1][2].append(info)
            elif self.ctx == "error" and self.errors:
                self.errors[-1][3].append(info)
            elif self.ctx == "missing" or self.kind == "INCOMPLETE":
                self.missing.append(info)
        elif m := _PROCESS.match(s):
            self.processes.append(ProcessInfo(int(m.group(1)), m.group(2), m.group(3).strip()))
        elif m := _DEAD_N.match(s):
            self.count = int(m.group(1))
        elif m := _TIMEOUTS.match(s):
            self.count = int(m.group(1))

    def build(self) -> Block:
        counts = tuple(
            OpCounts(coll, tuple(CountGroup(v, n, tuple(sorted(rs, key=lambda r: r.rank))) for v, n, rs in groups))
            for coll, groups in self.counts if groups
        )
        return Block(
            section=self.section, kind=self.kind, comm_id=self.comm_id, comm_hash=self.comm_hash,
            counts=counts,
            statuses=tuple(StatusGroup(st, n, tuple(rs)) for st, n, rs in self.statuses),
            errors=tuple(ErrorGroup(ph, err, n, tuple(rs)) for ph, err, n, rs in self.errors),
            missing=tuple(self.missing), processes=tuple(self.processes), count=self.count,
            lines=tuple(self.lines),
        )


def parse(text: str) -> RasReport:
    """The report's facts. Never raises: lines it does not know are kept in their block's
    ``lines`` and otherwise ignored, and a field the text does not give stays None."""
    head: dict = {}
    groups: list[CommGroupRow] = []
    blocks: list[Block] = []
    section: str | None = None  # "summary", "communicators", "errors", "warnings"
    cur: _BlockBuilder | None = None

    def close() -> None:
        nonlocal cur
        if cur is not None:
            blocks.append(cur.build())
            cur = None

    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or set(line.strip()) == {"="}:
            continue
        indented = line.startswith(" ")
        s = line.strip()
        if not indented or section in (None, "summary", "communicators"):
            if m := _VERSION.match(s):
                head["nccl_version"], head["cuda_version"] = m.group(1), m.group(2)
                continue
            if m := _CUDA.match(s):
                head["cuda_runtime"], head["cuda_driver"] = int(m.group(1)), int(m.group(2))
                continue
            if s == "Job summary":
                close()
                section = "summary"
                continue
            if m := _COMMUNICATORS.match(s):
                close()
                section = "communicators"
                if m.group(1):
                    head["collection_s"] = float(m.group(1))
                continue
            if s in ("Errors", "Warnings"):
                close()
                section = s.lower()
                continue
            if section == "summary" and (m := _SUMMARY_ROW.match(s)):
                (head["nodes"], head["processes_per_node"], head["gpus_per_process"], head["processes"],
                 head["gpus"]) = (int(x) for x in m.groups())
                continue
            if section == "communicators" and (m := _GROUP_ROW.match(s)):
                errs = () if m.group(8) == "OK" else tuple(m.group(8).split(","))
                groups.append(CommGroupRow(int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4),
                                           int(m.group(5)), int(m.group(6)), m.group(7), errs))
                continue
            if section in ("errors", "warnings"):
                if m := _COMM_HEAD.match(s):
                    close()
                    cur = _BlockBuilder(section, m.group(4), f"#{m.group(1)}-{m.group(2)}", m.group(3).lower())
                    continue
                if m := _JOB_HEAD.match(s):
                    close()
                    cur = _BlockBuilder(section, m.group(1), None, None)
                    continue
            if not indented:
                continue
        if cur is not None:
            cur.feed(s)
    close()
    return RasReport(groups=tuple(groups), blocks=tuple(blocks), **head)


# --------------------------------------------------------------------------- comparing


@dataclass(frozen=True, slots=True)
class CommVerdict:
    """What two reports say of one communicator."""

    comm_hash: str | None
    comm_id: str | None  # the newer report's "#g-c"
    verdict: str  # ok | straggler | hang | desync | unknown
    collective: str | None = None  # the collective type the verdict is about ("AllReduce/Broadcast": desync)
    # hang/straggler: the named rank(s) behind; desync: the crossed pair, each with its count of
    # the type it is ahead in
    ranks: tuple[RankCount, ...] = ()
    n_behind: int = 0  # ranks behind, named or not (NCCL names only outliers)
    behind_count: int | None = None  # the behind ranks' count in the newer report
    lead_count: int | None = None  # the most any rank has launched
    gap_ops: int | None = None  # lead_count - behind_count
    frozen_s: float | None = None  # hang: how long the behind count has not moved (dt_s)
    rate_ops_s: float | None = None  # straggler: the behind ranks' launches per second
    behind_s: float | None = None  # straggler: gap_ops at that rate
    detail: str = ""
    notes: tuple[str, ...] = field(default=())  # missing ranks, errors, status mismatches in the newer report


def _behind_group(oc: OpCounts) -> CountGroup:
    return min(oc.groups, key=lambda g: g.op_count)


def _older_lag(older: OpCounts, behind: CountGroup) -> tuple[int | None, bool]:
    """The behind ranks' count in the older report, and whether they were the ones behind then."""
    if behind.ranks:
        vals = {older.count_of(r.rank) for r in behind.ranks}
        if len(vals) != 1 or None in vals:
            return None, False
        val = vals.pop()
        return val, val == older.lag
    # A majority that NCCL does not name: follow it by its size.
    old = _behind_group(older)
    if old.n_ranks == behind.n_ranks and not old.ranks:
        return old.op_count, True
    return None, False


def _crossing(counts: tuple[OpCounts, ...]) -> tuple[str, RankCount, RankCount, str] | None:
    """Two ranks each ahead in a different collective type: (A, r1 ahead in A, r2 ahead in B, B)."""
    typed = [oc for oc in counts if oc.collective]
    for i, a in enumerate(typed):
        for b in typed[i + 1:]:
            ranks = sorted({r.rank for r in a.ranks} | {r.rank for r in b.ranks})
            info = {r.rank: r for oc in (a, b) for r in oc.ranks}
            for x in ranks:
                for y in ranks:
                    if x == y:
                        continue
                    ax, ay, bx, by = a.count_of(x), a.count_of(y), b.count_of(x), b.count_of(y)
                    if None in (ax, ay, bx, by):
                        continue
                    if ax > ay and by > bx:  # type: ignore[operator]
                        rx, ry = info[x], info[y]
                        return (a.collective, RankCount(x, ax, rx.gpu, rx.pid, rx.node),  # type: ignore[return-value]
                                RankCount(y, by, ry.gpu, ry.pid, ry.node), b.collective)
    return None


def _notes(report: RasReport, comm: str) -> tuple[str, ...]:
    out: list[str] = []
    for b in report.comm_blocks(comm):
        if b.kind == "INCOMPLETE":
            named = ", ".join(describe_rank(r) for r in b.missing)
            n = b.count if b.count is not None else len(b.missing)
            out.append(f"no data from {n} rank{'s' if n != 1 else ''}" + (f": {named}" if named else ""))
        for e in b.errors:
            who = ", ".join(f"rank {r.rank}" for r in e.ranks) or f"{e.n_ranks} ranks"
            out.append(f"{who} reported {e.error}" + (f" ({e.phase})" if e.phase else ""))
        if len(b.statuses) > 1:
            out.append("ranks differ in status: " + ", ".join(f"{s.n_ranks} {s.status}" for s in b.statuses))
    return tuple(out)


def _one(older: OpCounts | None, newer: OpCounts, dt_s: float, min_gap_ops: int,
         min_frozen_s: float) -> dict:
    coll = newer.collective
    name = coll or "collective"
    behind = _behind_group(newer)
    lead, lag = newer.lead, newer.lag
    gap = lead - lag
    base = dict(collective=coll, ranks=behind.ranks, n_behind=behind.n_ranks, behind_count=lag,
                lead_count=lead, gap_ops=gap)
    who = ", ".join(describe_rank(r) for r in behind.ranks) or f"{behind.n_ranks} ranks NCCL does not name"
    if older is None:
        return dict(base, verdict=UNKNOWN,
                    detail=f"{name} counts differ ({who} at {lag}, lead {lead}); the earlier report had them "
                           f"equal or absent, so whether they move is not known yet")
    old_lag, same = _older_lag(older, behind)
    if old_lag is None:
        return dict(base, verdict=UNKNOWN, detail=f"{name}: the ranks behind now ({who}) cannot be followed "
                                                  f"from the earlier report")
    if old_lag > lag or older.lead > lead:
        return dict(base, verdict=UNKNOWN, detail=f"{name} counts went back ({old_lag} -> {lag}): another job "
                                                  f"or a new communicator with the same hash")
    if old_lag == lag and gap > 0:
        if dt_s < min_frozen_s:
            return dict(base, verdict=UNKNOWN, frozen_s=dt_s,
                        detail=f"{who} has not moved from {name} {lag} in {dt_s:.3g} s, {gap} behind; "
                               f"under {min_frozen_s:g} s is too short to call it hung")
        return dict(base, verdict=HANG, frozen_s=dt_s,
                    detail=f"{who} has launched {name} up to {lag} and not moved in {dt_s:.3g} s, {gap} behind "
                           f"the lead ({lead}): the other ranks wait for it in that collective")
    rate = (lag - old_lag) / dt_s if dt_s > 0 else None
    old_gap = older.lead - old_lag
    if same and gap >= min_gap_ops and old_gap >= min_gap_ops and lag > old_lag:
        behind_s = gap / rate if rate else None
        return dict(base, verdict=STRAGGLER, rate_ops_s=rate, behind_s=behind_s,
                    detail=f"{who} is behind in {name} in both reports ({old_gap}, then {gap} operations"
                           + (f", about {behind_s:.2g} s at its {rate:.3g} per second" if behind_s else "")
                           + "): the others wait for it at every collective")
    if gap < min_gap_ops:
        why = f"{gap} apart is work in flight"
    elif not same:
        why = "the rank behind was not behind in the earlier report"
    else:
        why = f"{gap} behind now, {old_gap} before: not persistently behind"
    return dict(base, verdict=OK, rate_ops_s=rate,
                detail=f"{name} counts move ({who}: {old_lag} -> {lag}, lead {lead}); {why}")


def compare(older: RasReport, newer: RasReport, dt_s: float, *, min_gap_ops: int = STRAGGLER_MIN_GAP_OPS,
            min_frozen_s: float = HANG_MIN_FROZEN_S) -> tuple[CommVerdict, ...]:
    """Per communicator that either report speaks of, what ``dt_s`` seconds between them show.
    The same text twice (the source sends a report only when it changes) is the frozen case."""
    out: list[CommVerdict] = []
    comms = list(newer.comms) + [c for c in older.comms if c not in newer.comms]
    for comm in comms:
        new_counts = newer.counts(comm)
        old_counts = older.counts(comm)
        blocks = newer.comm_blocks(comm) or older.comm_blocks(comm)
        comm_id = blocks[0].comm_id if blocks else None
        notes = _notes(newer, comm)
        if not new_counts:
            detail = ("counts agree now" if old_counts else "no count mismatch in either report")
            out.append(CommVerdict(comm, comm_id, OK, detail=detail, notes=notes))
            continue
        cross = _crossing(new_counts)
        if cross is not None and _crossing(old_counts) is None:
            # NCCL reads one rank's counts type by type while it may still launch: one report's
            # crossing could in principle be that; a desync stays (the job stops on it).
            a, rx, ry, b = cross
            out.append(CommVerdict(
                comm, comm_id, UNKNOWN, collective=f"{a}/{b}", ranks=(rx, ry),
                detail=f"{describe_rank(rx)} has launched more {a}, {describe_rank(ry)} more {b}; "
                       f"not so in the earlier report: the next report will tell a desync",
                notes=notes))
            continue
        if cross is not None:
            a, rx, ry, b = cross
            out.append(CommVerdict(
                comm, comm_id, DESYNC, collective=f"{a}/{b}", ranks=(rx, ry), n_behind=0,
                detail=f"{describe_rank(rx)} has launched more {a} than {describe_rank(ry)}, which has launched "
                       f"more {b}: the ranks are not calling the same collectives in the same order",
                notes=notes))
            continue
        best: dict | None = None
        for oc in new_counts:
            old = next((o for o in old_counts if o.collective == oc.collective), None)
            res = _one(old, oc, dt_s, min_gap_ops, min_frozen_s)
            if best is None or _RANK_OF[res["verdict"]] > _RANK_OF[best["verdict"]]:
                best = res
        assert best is not None
        verdict = best.pop("verdict")
        out.append(CommVerdict(comm, comm_id, verdict, notes=notes, **best))
    return tuple(out)


__all__ = [
    "DESYNC", "HANG", "HANG_MIN_FROZEN_S", "OK", "RAS_POLL_S", "STRAGGLER", "STRAGGLER_MIN_GAP_OPS", "UNKNOWN",
    "Block", "CommGroupRow", "CommVerdict", "CountGroup", "ErrorGroup", "OpCounts", "ProcessInfo",
    "RankCount", "RankInfo", "RasReport", "StatusGroup", "compare", "describe_rank", "parse",
]


# The source's name for its events (sources.nccl_ras.SOURCE): analysis reads them back here, live
# and in a recording alike.
RAS_SOURCE = "nccl-ras"


# How often a session asks NCCL's RAS service (session.RAS_EVERY_S): a report standing unchanged
# was last read again up to this long ago.
RAS_POLL_S = Threshold(
    5.0, "s", JUDGEMENT,
    "How often a session asks NCCL's RAS service: the source sends a report only when it changes, so one standing "
    "unchanged was last read again up to this long ago, and its counts are frozen for that much less.")


def ras_verdicts(events: Sequence[Event], now: float, poll_s: float = RAS_POLL_S) -> tuple[CommVerdict, ...]:
    """What NCCL's RAS reports among ``events`` (time order) say at ``now``: the newest report
    against the one before it, or against itself when it has stood unchanged. The source sends a
    report only when it changes and asks every ``poll_s``: a report standing ``stood`` seconds is
    known unchanged only up to the last poll, up to ``poll_s`` back (the next one, due any moment,
    may bring new counts), so counts are frozen for ``stood - poll_s``, not ``stood``."""
    reports = [e for e in events if e.source == RAS_SOURCE and e.message.startswith("NCCL version")]
    if not reports:
        return ()
    newest = reports[-1]
    new = parse(report_text(newest.message))
    stood = max(0.0, now - newest.ts)
    if len(reports) >= 2 and stood < HANG_MIN_FROZEN_S:
        older = reports[-2]
        return compare(parse(report_text(older.message)), new, max(1e-3, newest.ts - older.ts))
    return compare(new, new, max(0.0, stood - poll_s))


# The source joins a report's lines with this (sources.nccl_ras.LINE_SEP): an event is one line.
LINE_SEP = " \u23ce "


def report_text(message: str) -> str:
    """A report's text from its event's one line (a recording read back shows the control
    characters of an older multi-line event as '?', which NCCL's reports never print)."""
    if LINE_SEP in message:
        return message.replace(LINE_SEP, "\n")
    return message if "\n" in message else message.replace("?", "\n")


def ras_line(v: CommVerdict) -> str:
    """One evidence line for a verdict that names something."""
    who = ", ".join(describe_rank(r) for r in v.ranks[:3])
    return f"NCCL's RAS service (communicator {v.comm_id or v.comm_hash or '?'}): {v.verdict}: {v.detail or who}"
