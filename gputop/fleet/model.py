"""One distributed job as its exporters describe it: a rank per ``gputop_rank_*`` label set,
grouped by host. Pure: parsed series in (``api.Series``), the job out.

Each rank is identified by (host, rank): two exporters that report the same rank number for one
job (a restarted rank on a new host) stay two rows rather than one overwriting the other.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from .api import Series

PHASES = ("compute", "data", "comm", "ckpt", "other")


@dataclass
class RankState:
    rank: int
    host: str
    job: str = ""
    world_size: int | None = None
    local_rank: int | None = None
    pid: int | None = None
    gpu: str = ""
    phases: dict[str, float] = field(default_factory=dict)
    wait: float = 0.0
    samples: int = 0
    hot: str = ""
    code: str = ""
    hot_share: float = 0.0
    collective: str = ""
    stuck: bool = False
    stuck_s: float = 0.0
    stuck_where: str = ""
    findings: list[tuple[str, str, float]] = field(default_factory=list)  # (id, severity, cost s), costliest first
    starting: str = ""  # what it still does before its steps ("importing", ...), '' once it runs them
    # Why its GPU's clocks are held down ("power cap", "hw thermal"), per its exporter: the same
    # work takes it longer
    throttled: list[str] = field(default_factory=list)
    # NCCL's RAS counts, where its exporter had them: (communicator, collective) -> (operations
    # launched, behind the communicator's lead)
    nccl: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

    @property
    def top_finding(self) -> tuple[str, str, float] | None:
        return self.findings[0] if self.findings else None

    def main_phase(self) -> tuple[str, float]:
        """Its largest phase outside waiting for peers: what it spends its step on."""
        rest = {k: v for k, v in self.phases.items() if k != "comm"}
        if not rest:
            return ("", 0.0)
        k = max(rest, key=lambda n: rest[n])
        return k, rest[k]


@dataclass(frozen=True)
class Job:
    job: str
    ranks: tuple[RankState, ...]  # by host, then rank
    world_size: int | None  # the largest any rank reports

    @property
    def hosts(self) -> list[str]:
        return sorted({r.host for r in self.ranks})

    def by_host(self) -> list[tuple[str, list[RankState]]]:
        groups: dict[str, list[RankState]] = defaultdict(list)
        for r in self.ranks:
            groups[r.host].append(r)
        return sorted(groups.items())

    def missing(self) -> list[int]:
        """Rank numbers below the world size that no exporter reports."""
        if not self.world_size:
            return []
        seen = {r.rank for r in self.ranks}
        return [k for k in range(self.world_size) if k not in seen]


@dataclass(frozen=True)
class JobSummary:
    job: str
    ranks: int
    hosts: int
    world_size: int | None
    stuck: int = 0


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v not in (None, "") else None
    except ValueError:
        return None


RankKey = tuple[str, int]  # host, rank


def _rank_key(job: str, labels: Mapping[str, str]) -> RankKey | None:
    if labels.get("job_id") != job:
        return None
    rank = _int(labels.get("rank"))
    return None if rank is None else (labels.get("host", ""), rank)


def _assemble(job: str, keyed: Iterable[tuple[RankKey, Series]]) -> Job:
    ranks: dict[RankKey, RankState] = {}
    for k, s in keyed:
        r = ranks.get(k)
        if r is None:
            r = ranks[k] = RankState(k[1], k[0], job)
        _apply(r, s)
    for r in ranks.values():
        r.findings.sort(key=lambda f: -f[2])
    ordered = tuple(sorted(ranks.values(), key=lambda r: (r.host, r.rank)))
    sizes = [r.world_size for r in ordered if r.world_size]
    return Job(job, ordered, max(sizes) if sizes else None)


def build_job(job: str, series: Iterable[Series]) -> Job:
    return _assemble(job, ((k, s) for s in series if (k := _rank_key(job, s.labels)) is not None))


def build_jobs(job: str, series: Iterable[Series]) -> list[tuple[float, Job]]:
    """The job at each evaluation time of a range answer (``api.parse_matrix``), oldest first.
    A time at which no series of the job had a value is not an evaluation (the job had not
    started, or every exporter was gone): it is left out, not judged as empty."""
    by_ts: dict[float, list[tuple[RankKey, Series]]] = defaultdict(list)
    # A series' steps share one labels mapping (parse_matrix): its rank is read once, not per step.
    keys: dict[int, tuple[Mapping[str, str], RankKey | None]] = {}
    for s in series:
        got = keys.get(id(s.labels))
        if got is None or got[0] is not s.labels:  # (the mapping is kept, so its id is not reused)
            got = keys[id(s.labels)] = (s.labels, _rank_key(job, s.labels))
        k = got[1]
        if k is not None:
            by_ts[s.ts].append((k, s))
    return [(ts, _assemble(job, by_ts[ts])) for ts in sorted(by_ts)]


def _apply(r: RankState, s: Series) -> None:
    lab = s.labels
    name = s.name
    if name == "gputop_rank_info":
        r.world_size = _int(lab.get("world_size"))
        r.local_rank = _int(lab.get("local_rank"))
        r.pid = _int(lab.get("pid"))
        r.gpu = lab.get("gpu", "")
    elif name == "gputop_rank_phase_ratio":
        r.phases[lab.get("phase", "other")] = s.value
    elif name == "gputop_rank_wait_ratio":
        r.wait = s.value
    elif name == "gputop_rank_stack_samples":
        r.samples = int(s.value)
    elif name == "gputop_rank_hot_line":
        r.hot, r.code, r.collective, r.hot_share = lab.get("place", ""), lab.get("code", ""), lab.get("collective", ""), s.value
    elif name == "gputop_rank_stuck":
        r.stuck = s.value >= 1
        r.stuck_where = lab.get("where", "") if r.stuck else ""
    elif name == "gputop_rank_stuck_seconds":
        r.stuck_s = s.value
    elif name == "gputop_rank_starting":
        r.starting = (lab.get("what", "") or "starting") if s.value >= 1 else ""
    elif name == "gputop_rank_gpu_throttled":
        if s.value >= 1:
            r.throttled.append(lab.get("reason", "").replace("_", " ") or "throttled")
    elif name in ("gputop_rank_nccl_operations_total", "gputop_rank_nccl_behind_operations"):
        k = (lab.get("comm", ""), lab.get("collective", ""))
        ops, behind = r.nccl.get(k, (0.0, 0.0))
        r.nccl[k] = (s.value, behind) if name.endswith("_total") else (ops, s.value)
    elif name == "gputop_rank_finding":
        r.findings.append((lab.get("id", ""), lab.get("severity", ""), s.value))


def job_summaries(series: Sequence[Series]) -> list[JobSummary]:
    """The jobs in sight, from ``gputop_rank_info`` (and ``gputop_rank_stuck`` where given)."""
    ranks: dict[str, set[tuple[str, str]]] = defaultdict(set)
    hosts: dict[str, set[str]] = defaultdict(set)
    world: dict[str, int] = {}
    stuck: dict[str, int] = defaultdict(int)
    for s in series:
        job = s.labels.get("job_id")
        if not job:
            continue
        if s.name == "gputop_rank_info" or not s.name:
            ranks[job].add((s.labels.get("host", ""), s.labels.get("rank", "")))
            hosts[job].add(s.labels.get("host", ""))
            w = _int(s.labels.get("world_size"))
            if w:
                world[job] = max(world.get(job, 0), w)
        elif s.name == "gputop_rank_stuck" and s.value >= 1:
            stuck[job] += 1
    return [JobSummary(j, len(ranks[j]), len(hosts[j]), world.get(j), stuck[j]) for j in sorted(ranks)]
