"""Each local rank's collective counts in an NCCL RAS status report: how many operations of each
collective type it has launched, and how far behind the most any rank of its communicator has
launched. Pure: the report's text and this host's ranks in, counts per rank out.

NCCL prints counts only where the ranks of a communicator disagree (a ``MISMATCH`` block under
Errors or Warnings, NCCL 2.24 to 2.30, ``src/ras/client_support.cc``): per collective type (one
lumped "collective" count before 2.26), groups of ranks by how many operations they have launched,
with the members of the small groups named (``Rank R -- GPU G managed by process P on node H``)
and the large ones only counted. Where the ranks agree there is no block, so there are no counts
to export: a series appears while the ranks differ (in-flight work of a healthy job, a rank
behind, a rank stopped) and is absent while they agree.

Only the few lines of those blocks are read here; ``analysis.nccl_ras`` reads the whole report
for one host's job, and its face does not give the per-group counts this needs.

A rank of the report is this host's rank when the report names its process (the pid, on one of
this host's addresses when the report gives the node: pids repeat across hosts). A rank NCCL
counts without naming (the majority of a large communicator) is found by number, and only in a
communicator as large as the job's world, whose rank numbers are then the global ranks, and only
where NCCL did not name that number as another process.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

# The types a report can count (NCCL's names), and the lumped count of 2.24/2.25.
LUMPED = "collective"

_HEAD = re.compile(r"^#\d+-\d+ \(([0-9a-fA-F]+)\) ([A-Z]+)\s*$")
_DIFF = re.compile(r"^Communicator ranks have different (\S+) operation counts$")
_N_UP_TO = re.compile(r"^(\d+) ranks have launched up to operation (\d+)$")
_N_NONE = re.compile(r"^(\d+) ranks have not launched any operations$")
_WHERE = r"(?: -- (?:GPU .+? managed by process (?P<pid>\d+) on node (?P<node>\S*)|\[process information not found\]))?"
_R_UP_TO = re.compile(r"^Rank (\d+) has launched up to operation (\d+)" + _WHERE + "$")
_R_NONE = re.compile(r"^Rank (\d+) has not launched any operations" + _WHERE + "$")
_R_NAMED = re.compile(r"^Rank (\d+)" + _WHERE + "$")


@dataclass(frozen=True)
class Named:
    rank: int  # in the communicator
    pid: int | None
    node: str | None


@dataclass(frozen=True)
class Group:
    ops: int
    n_ranks: int
    named: tuple[Named, ...] = ()


@dataclass(frozen=True)
class Counts:
    """One collective type's counts in one communicator (named by its hash, which stays the
    same from report to report)."""

    comm: str
    collective: str
    groups: tuple[Group, ...]

    @property
    def lead(self) -> int:
        return max(g.ops for g in self.groups)

    @property
    def size(self) -> int:
        return sum(g.n_ranks for g in self.groups)


def parse_counts(text: str) -> list[Counts]:
    """Every count in the report's MISMATCH blocks. Never raises: other lines are skipped."""
    out: list[Counts] = []
    comm: str | None = None
    coll: str | None = None
    groups: list[list] = []  # [ops, n, [Named]]

    def close() -> None:
        nonlocal coll, groups
        if comm is not None and coll is not None and groups:
            out.append(Counts(comm, coll, tuple(Group(o, n, tuple(rs)) for o, n, rs in groups)))
        coll, groups = None, []

    for raw in text.splitlines():
        if not raw.strip():
            continue
        if not raw.startswith(" "):
            close()
            m = _HEAD.match(raw.strip())
            comm = m.group(1).lower() if m and m.group(2) == "MISMATCH" else None
            continue
        if comm is None:
            continue
        s = raw.strip()
        if m := _DIFF.match(s):
            close()
            coll = m.group(1)
        elif coll is None:
            continue
        elif m := _N_UP_TO.match(s):
            groups.append([int(m.group(2)), int(m.group(1)), []])
        elif m := _N_NONE.match(s):
            groups.append([0, int(m.group(1)), []])
        elif (m := _R_UP_TO.match(s)) or (m := _R_NONE.match(s)):
            ops = int(m.group(2)) if m.re is _R_UP_TO else 0
            groups.append([ops, 1, [_named(m)]])
        elif (m := _R_NAMED.match(s)) and groups:
            groups[-1][2].append(_named(m))
        else:
            close()  # another kind of mismatch (status) or an unknown line: the counts end here
    close()
    return out


def _named(m: re.Match) -> Named:
    pid = m.group("pid")
    return Named(int(m.group(1)), int(pid) if pid else None, m.group("node") or None)


@dataclass(frozen=True)
class RankOps:
    comm: str
    collective: str
    ops: int  # operations of this type the rank has launched
    behind: int  # the most any rank of the communicator has launched, less ``ops``


def rank_ops(counts: Iterable[Counts], rank: int, pid: int, world_size: int | None,
             local_nodes: frozenset[str] | None) -> list[RankOps]:
    """This host's rank ``rank`` (process ``pid``) in every count that includes it.
    ``local_nodes``: this host's addresses (None: unknown, then a pid alone identifies)."""
    out = []
    for c in counts:
        ops = _ops_of(c, rank, pid, world_size, local_nodes)
        if ops is not None:
            out.append(RankOps(c.comm, c.collective, ops, c.lead - ops))
    return out


def _here(n: Named, pid: int, local_nodes: frozenset[str] | None) -> bool:
    return n.pid == pid and (n.node is None or local_nodes is None or n.node in local_nodes)


def _ops_of(c: Counts, rank: int, pid: int, world_size: int | None, local_nodes: frozenset[str] | None) -> int | None:
    for g in c.groups:
        if any(_here(n, pid, local_nodes) for n in g.named):
            return g.ops
    # Not named: one of the counted-only, by number, in a communicator of the whole world only.
    if not world_size or c.size != world_size:
        return None
    if any(n.rank == rank for g in c.groups for n in g.named):
        return None  # that number is another process here: the numbering is not the world's
    unnamed = [g for g in c.groups if g.n_ranks > len(g.named)]
    return unnamed[0].ops if len(unnamed) == 1 else None
