"""The exporter's series for distributed jobs: one set per attached rank, labelled so that one
PromQL selector gathers every rank of a job across its hosts (``{job_id="..."}``).

The job label is ``job_id``, not ``job``: Prometheus puts its own ``job`` label (the scrape job's
name) on every series it scrapes, and would rename ours ``exported_job``.

Cardinality, per attached rank (at most ``--max-attach`` per host), bounded:
- ``gputop_rank_info``: 1 series; ``gputop_rank_phase_ratio``: one per phase (5, fixed);
  ``gputop_rank_wait_ratio``, ``_stack_samples``, ``_stuck``, ``_stuck_seconds``, ``_starting``:
  1 each (``_starting``'s ``what`` is one of a few fixed phrases, export.rank_start).
- ``gputop_rank_gpu_throttled``: one per reason holding the rank's GPU's clocks down (NVML's
  limiting reasons: at most 7, in practice one or two; none while nothing does).
- ``gputop_rank_hot_line``: exactly 1 series at a time (the rank's single hottest line; a new one
  replaces the old, which goes stale), its text cut to 120 characters and redacted.
- ``gputop_rank_finding``: at most 3 (its costliest findings; ids come from the finite rule set):
  its GPU's, or for a rank on no GPU, those of its job when the advisor judged that job.
- Where NCCL's RAS service answers (NCCL 2.24+, export.ras_probe) and its ranks' counts differ:
  ``gputop_rank_nccl_operations_total`` and ``gputop_rank_nccl_behind_operations`` per
  communicator and collective type, at most ``MAX_NCCL_COUNTS_PER_RANK`` of each (the ones it
  is furthest behind in); none while the counts agree (NCCL prints none then).
So a rank is usually 14 live series (a throttled GPU adds one or two, NCCL's counts up to 8), and
a 1,024-rank job about 14,000.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..sources import JobIdentity
from .job_rows import RankRow, rank_rows
from .ras_counts import RankOps, parse_counts, rank_ops
from .ras_probe import RasProbe

RANK_LABELS = ("job_id", "host", "rank")
# A rank's NCCL counts exported: the communicators and types it is furthest behind in. A rank is
# in a few communicators (the world, its data- and tensor-parallel groups) and a report counts at
# most five types, so this bounds the rare job with many.
MAX_NCCL_COUNTS_PER_RANK = 4


def _ids(r: RankRow) -> list[str]:
    return [r.identity.job, r.identity.host, str(r.identity.rank)]


def reason_label(word: str) -> str:
    """A throttle reason as a label value, as the GPU series spell it ("power cap" -> power_cap)."""
    return word.replace(" ", "_").replace("-", "_")


def _opt(v: int | None) -> str:
    return "" if v is None else str(v)


class JobCollector:
    """A prometheus_client collector over the store's attached ranks.

    ``attached``: the sampled PIDs; ``identify``: a PID's job identity (its environment), None
    for a process that is no rank; it is asked once per process (an environment is fixed at
    exec); ``ras``: asks NCCL's RAS service for the ranks' collective counts (None: not asked)."""

    def __init__(self, store, attached: Callable[[], Iterable[int]], identify: Callable[[int], JobIdentity | None],
                 window: float = 60.0, stuck_after: float = 30.0, clock: Callable[[], float] = time.time,
                 ras: RasProbe | None = None, judged_job: Callable[[], str] = lambda: "") -> None:
        self.store = store
        # The job the advisor's findings speak of ('' none): a CPU job's findings, which are on
        # no GPU, are its ranks' findings.
        self.judged_job = judged_job
        self.ras = ras
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
        ids = self.identities()
        rows = rank_rows(self.store, ids, self.clock(), self.window, self.stuck_after, self.judged_job())
        yield from families(rows, self.nccl_counts(ids))

    def nccl_counts(self, ids: dict[int, JobIdentity]) -> dict[int, list[RankOps]]:
        """Each rank's counts in this scrape's RAS report (one query at most), by pid."""
        if self.ras is None or not ids:
            return {}
        procs = self.store.procs_latest()
        text = self.ras.report([(p, procs[p].create_time if p in procs else None) for p in sorted(ids)])
        if not text:
            return {}
        counts = parse_counts(text)
        nodes = self.ras.local_nodes()
        out = {}
        for pid, ident in ids.items():
            got = sorted(rank_ops(counts, ident.rank, pid, ident.world_size, nodes), key=lambda o: -o.behind)
            if got:
                out[pid] = got[:MAX_NCCL_COUNTS_PER_RANK]
        return out


def families(rows: Iterable[RankRow], nccl: Mapping[int, list[RankOps]] | None = None) -> list[Metric]:
    rows = list(rows)
    nccl = nccl or {}
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
                                "An active finding on the rank's GPU, or for a rank on no GPU on its job "
                                "(its costliest 3); the value is the seconds its cause cost over the "
                                "advisor's window",
                                labels=[*RANK_LABELS, "id", "severity"])
    thr = GaugeMetricFamily("gputop_rank_gpu_throttled",
                            "1 while this reason held the rank's GPU's clocks down in at least a third of its "
                            "busy polls over the window (NVML's limiting clocks-event reasons: power, heat, a "
                            "hardware slowdown); the same reasons as gputop_gpu_throttle_reason, tied to the rank",
                            labels=[*RANK_LABELS, "reason"])
    ops = CounterMetricFamily("gputop_rank_nccl_operations",
                              "Collective operations of one type the rank has launched in one communicator "
                              "(comm: its hash), from NCCL's RAS service; present while the communicator's "
                              "ranks differ (NCCL counts nothing while they agree)",
                              labels=[*RANK_LABELS, "comm", "collective"])
    behind = GaugeMetricFamily("gputop_rank_nccl_behind_operations",
                               "How many operations of that type the rank is behind the most any rank of the "
                               "communicator has launched (NCCL's RAS service)",
                               labels=[*RANK_LABELS, "comm", "collective"])
    for r in rows:
        ids = _ids(r)
        for o in nccl.get(r.pid, ()):
            ops.add_metric([*ids, o.comm, o.collective], o.ops)
            behind.add_metric([*ids, o.comm, o.collective], o.behind)
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
        for word in r.throttled:
            thr.add_metric([*ids, reason_label(word)], 1)
        for f in r.findings:
            finding.add_metric([*ids, f.id, f.severity.value], float(f.cost_s))
    return [info, phase, wait, samples, hot, stuck, stuck_s, start, thr, finding, ops, behind]
