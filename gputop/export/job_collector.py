"""The exporter's series for distributed jobs: one set per attached rank, labelled so that one
PromQL selector gathers every rank of a job across its hosts (``{job_id="..."}``).

The job label is ``job_id``, not ``job``: Prometheus puts its own ``job`` label (the scrape job's
name) on every series it scrapes, and would rename ours ``exported_job``.

Cardinality, per attached rank (at most ``--max-attach`` per host), bounded:
- ``gputop_rank_info``: 1 series; ``gputop_rank_phase_ratio``: one per phase (5, fixed);
  ``gputop_rank_wait_ratio``, ``_stack_samples``, ``_stuck``, ``_stuck_seconds``, ``_starting``:
  1 each (``_starting``'s ``what`` is one of a few fixed phrases, export.rank_start).
- ``gputop_rank_hot_line``: exactly 1 series at a time (the rank's single hottest line; a new one
  replaces the old, which goes stale), its text cut to 120 characters and redacted.
- ``gputop_rank_finding``: at most 3 (its costliest findings; ids come from the finite rule set).
So a rank is at most 14 live series, and a 1,024-rank job about 14,000.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from ..sources import JobIdentity
from .job_rows import RankRow, rank_rows

RANK_LABELS = ("job_id", "host", "rank")


def _ids(r: RankRow) -> list[str]:
    return [r.identity.job, r.identity.host, str(r.identity.rank)]


def _opt(v: int | None) -> str:
    return "" if v is None else str(v)


class JobCollector:
    """A prometheus_client collector over the store's attached ranks.

    ``attached``: the sampled PIDs; ``identify``: a PID's job identity (its environment), None
    for a process that is no rank; it is asked once per process (an environment is fixed at
    exec)."""

    def __init__(self, store, attached: Callable[[], Iterable[int]], identify: Callable[[int], JobIdentity | None],
                 window: float = 60.0, stuck_after: float = 30.0, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.attached = attached
        self.identify = identify
        self.window = window
        self.stuck_after = stuck_after
        self.clock = clock
        self._known: dict[tuple[int, float | None], JobIdentity | None] = {}

    def describe(self) -> list[Metric]:
        return []

    def identities(self) -> dict[int, JobIdentity]:
        procs = self.store.procs_latest()
        out = {}
        for pid in self.attached():
            ps = procs.get(pid)
            key = (pid, ps.create_time if ps else None)
            if key not in self._known:
                if len(self._known) > 1024:
                    self._known.clear()  # bounded; re-read at the next scrape
                self._known[key] = self.identify(pid)
            if self._known[key] is not None:
                out[pid] = self._known[key]
        return out

    def collect(self) -> Iterator[Metric]:
        rows = rank_rows(self.store, self.identities(), self.clock(), self.window, self.stuck_after)
        yield from families(rows)


def families(rows: Iterable[RankRow]) -> list[Metric]:
    rows = list(rows)
    info = GaugeMetricFamily("gputop_rank_info", "An attached rank of a distributed job and who it is (always 1)",
                             labels=[*RANK_LABELS, "job_source", "local_rank", "world_size", "pid", "gpu"])
    phase = GaugeMetricFamily("gputop_rank_phase_ratio",
                              "Share of the rank's main-thread stack samples in each phase of its step "
                              "over the advisor's window", labels=[*RANK_LABELS, "phase"])
    wait = GaugeMetricFamily("gputop_rank_wait_ratio",
                             "Share of the window the rank waited for its peers (a collective in its "
                             "stacks, or its GPU spinning in NCCL's kernel)", labels=list(RANK_LABELS))
    samples = GaugeMetricFamily("gputop_rank_stack_samples", "Main-thread stack samples the shares rest on",
                                labels=list(RANK_LABELS))
    hot = GaugeMetricFamily("gputop_rank_hot_line",
                            "The rank's hottest line of its own code (redacted); the value is its share "
                            "of the samples", labels=[*RANK_LABELS, "place", "code", "collective"])
    stuck = GaugeMetricFamily("gputop_rank_stuck", "1 while the rank makes no progress, else 0",
                              labels=[*RANK_LABELS, "where"])
    stuck_s = GaugeMetricFamily("gputop_rank_stuck_seconds", "How long a stuck rank has stood still (0: it moves)",
                                labels=list(RANK_LABELS))
    start = GaugeMetricFamily("gputop_rank_starting",
                              "1 while the rank is still starting (importing, joining its process group, "
                              "compiling, its first samples): its shares say nothing of its steps yet; "
                              "past it, they are read from the samples after its start-up",
                              labels=[*RANK_LABELS, "what"])
    finding = GaugeMetricFamily("gputop_rank_finding",
                                "An active finding on the rank's GPU (its costliest 3); the value is "
                                "the GPU-seconds its cause cost over the advisor's window",
                                labels=[*RANK_LABELS, "id", "severity"])
    for r in rows:
        ids = _ids(r)
        i = r.identity
        info.add_metric([*ids, i.source, _opt(i.local_rank), _opt(i.world_size), str(r.pid), _opt(r.gpu)], 1)
        for name, share in r.phases:
            phase.add_metric([*ids, name], share)
        wait.add_metric(ids, r.wait)
        samples.add_metric(ids, r.samples)
        hot.add_metric([*ids, r.hot, r.hot_code, r.collective], r.hot_share)
        stuck.add_metric([*ids, r.stuck_where], 1 if r.stuck else 0)
        stuck_s.add_metric(ids, r.stuck_s)
        start.add_metric([*ids, r.starting], 1 if r.starting else 0)
        for f in r.findings:
            finding.add_metric([*ids, f.id, getattr(f.severity, "value", str(f.severity))], float(f.cost_s))
    return [info, phase, wait, samples, hot, stuck, stuck_s, start, finding]
