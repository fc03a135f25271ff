"""NCCL's collective counts across evaluations (``gputop_rank_nccl_*``, from each host's RAS
service): the rank whose count stands still while another rank is ahead (it never arrives), and
the rank that stays far behind while its count moves (the straggler). Pure: the ranks' counts at
each evaluation in, the ranks named out.

Counts tell the two apart without stacks: NCCL's own wait is on the GPU, where a rank's host
stacks do not show it. Each exporter publishes its ranks' counts only while a communicator's
ranks differ (NCCL prints none while they agree), so an evaluation without a count is no evidence
either way. The thresholds are ``analysis.nccl_ras``'s, so one host's view and the job view agree.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

from ..units import fmt_duration
from .model import Job

# NCCL's own RAS waits 5 s (RAS_COLLECTIVE_LEG_TIMEOUT_SEC) before calling a peer unresponsive;
# a count that has stood this long with another rank ahead is a rank that does not arrive
# (analysis.nccl_ras.HANG_MIN_FROZEN_S).
FROZEN_S = 5.0
# Behind by more than a step's worth of DDP's gradient buckets in flight (a healthy 2-rank job
# was 7 apart, a straggler 84): analysis.nccl_ras.STRAGGLER_MIN_GAP_OPS.
BEHIND_OPS = 32
# ... and so in every evaluation over at least this long, moving meanwhile: persistently behind.
BEHIND_FOR_S = 5.0
# The history kept per count: the view's look-back.
KEEP_S = 60.0

CountKey = tuple[str, int, str, str]  # host, rank, communicator, collective


@dataclass(frozen=True)
class RasFinding:
    kind: str  # "frozen" | "behind"
    host: str
    rank: int
    comm: str
    collective: str
    ops: float
    behind: float
    span_s: float  # frozen: how long the count has stood; behind: how long it has been behind
    moved: float = 0.0  # behind: operations launched over that span

    def line(self) -> str:
        """One evidence line, in NCCL's words where it has them."""
        if self.kind == "frozen":
            return (f"NCCL: {self.collective} launched up to {self.ops:.0f}, {self.behind:.0f} behind, "
                    f"not moved in {fmt_duration(self.span_s)}")
        return (f"NCCL: {self.collective} at {self.ops:.0f}, {self.behind:.0f} behind, moving "
                f"(+{self.moved:.0f} in {fmt_duration(self.span_s)})")


class CountHistory:
    """The ranks' counts at each evaluation fed (``add``), kept ``KEEP_S``."""

    def __init__(self, keep_s: float = KEEP_S) -> None:
        self.keep_s = keep_s
        self._h: dict[CountKey, deque[tuple[float, float, float]]] = defaultdict(deque)

    def add(self, ts: float, job: Job) -> None:
        for r in job.ranks:
            for (comm, coll), (ops, behind) in r.nccl.items():
                self._h[(r.host, r.rank, comm, coll)].append((ts, ops, behind))
        for k in list(self._h):
            q = self._h[k]
            while q and q[0][0] < ts - self.keep_s:
                q.popleft()
            if not q:
                del self._h[k]

    def findings(self, ts: float) -> list[RasFinding]:
        """What the counts say at ``ts`` (an evaluation fed): per rank, its worst count."""
        out: dict[tuple[str, int], RasFinding] = {}
        for (host, rank, comm, coll), q in self._h.items():
            if not q or q[-1][0] != ts:
                continue  # not counted now: nothing to say of it now
            f = _frozen(q) or _behind(q)
            if f is None:
                continue
            f = RasFinding(f[0], host, rank, comm, coll, q[-1][1], q[-1][2], f[1], f[2])
            old = out.get((host, rank))
            if old is None or (old.kind, old.behind) < (f.kind, f.behind):  # "frozen" > "behind"
                out[(host, rank)] = f
        return sorted(out.values(), key=lambda f: (f.host, f.rank))


def _frozen(q: deque) -> tuple[str, float, float] | None:
    ts, ops, behind = q[-1]
    if behind <= 0:
        return None
    since = ts
    for t, o, _ in reversed(q):
        if o != ops:
            break
        since = t
    return ("frozen", ts - since, 0.0) if ts - since >= FROZEN_S else None


def _behind(q: deque) -> tuple[str, float, float] | None:
    ts, ops, _ = q[-1]
    since = None
    first_ops = ops
    for t, o, b in reversed(q):
        if b < BEHIND_OPS:
            break
        since, first_ops = t, o
    if since is None or ts - since < BEHIND_FOR_S or ops <= first_ops:
        return None
    return ("behind", ts - since, ops - first_ops)
