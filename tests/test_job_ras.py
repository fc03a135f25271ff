"""The job view reads NCCL's counts (gputop_rank_nccl_*) over its evaluations: a count that stands
still while another rank is ahead names the rank that never arrives, one that stays far behind
while it moves names the straggler, and in-flight differences name nobody. The ranks' stacks here
show nothing (NCCL waits on the GPU), so the counts alone decide."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from gputop.export.job_collector import JobCollector  # noqa: E402
from gputop.export.ras_probe import RasProbe  # noqa: E402
from gputop.fleet import Memory, Series, build_job, judge, parse_vector  # noqa: E402
from gputop.fleet.ras import CountHistory  # noqa: E402
from gputop.present.job import job_lines, plain  # noqa: E402

from job_series import TS, job_payload  # noqa: E402
from ras_fake import FakeRas  # noqa: E402
from test_export_job import PIDS, four_ranks, identify_on  # noqa: E402
from test_export_ras import HANG, NODE  # noqa: E402


def run(counts_at, steps: int = 5, step: float = 5.0) -> Memory:
    """``counts_at(k)``: rank -> (ops, behind) at evaluation k (8 ranks, 4 per host)."""
    mem = Memory(step_s=step)
    for k in range(steps):
        mem.feed(TS + k * step, build_job("exp-42", parse_vector(job_payload(8, per_host=4, nccl=counts_at(k)))))
    return mem


def test_a_count_that_stands_still_while_the_others_are_ahead_never_arrives():
    def counts(k):
        return {5: (77, 84), **{r: (161, 0) for r in range(8) if r != 5}}

    mem = run(counts)
    assert judge(mem.job).never_arrives == ()  # the stacks alone see nothing
    j = mem.judgement()
    assert [(n.rank.rank, n.rank.host) for n in j.never_arrives] == [(5, "node-001")] and j.straggler is None
    text = plain(job_lines(mem.job, j, 120, "now", 5))
    assert "Never arrives: rank 5 on node-001" in text and "7 ranks wait for it" in text
    assert "NCCL: AllReduce launched up to 77, 84 behind, not moved in 20s" in text
    assert " NEVER " in text


def test_a_count_far_behind_that_moves_is_the_straggler():
    def counts(k):
        return {2: (893 + 40 * k, 84), **{r: (977 + 40 * k, 0) for r in range(8) if r != 2}}

    mem = run(counts)
    j = mem.judgement()
    assert j.straggler is not None and j.straggler.slow.rank == 2 and not j.never_arrives
    text = plain(job_lines(mem.job, j, 120, "now", 5))
    assert "Straggler: rank 2 on node-000 for 15s" in text  # behind 5 s to count, then held
    assert "NCCL: AllReduce at 1053, 84 behind, moving (+160 in 20s)" in text


def test_in_flight_differences_and_agreeing_counts_name_nobody():
    mem = run(lambda k: {r: (33182 + 50 * k + (7 if r == 0 else 0), 0 if r == 0 else 7) for r in range(8)})
    assert mem.judgement().straggler is None and not mem.judgement().never_arrives
    assert "No rank holds the others up" in plain(job_lines(mem.job, mem.judgement(), 100, "now", 5))
    # counts published at some evaluations only (NCCL prints none while the ranks agree): a gap
    # says nothing, and the count that moved across it did not stand still
    mem = run(lambda k: {} if k % 2 else {5: (77 + 40 * k, 84), 0: (161 + 40 * k, 0)})
    assert not mem.judgement().never_arrives


def test_a_short_stop_is_weighed_not_named():
    h = CountHistory()
    for k in range(2):  # standing 4 s: under NCCL's own 5 s
        h.add(TS + 4 * k, build_job("exp-42", parse_vector(job_payload(4, per_host=2, nccl={1: (77, 84), 0: (161, 0)}))))
    assert h.findings(TS + 4) == []
    h.add(TS + 8, build_job("exp-42", parse_vector(job_payload(4, per_host=2, nccl={1: (77, 84), 0: (161, 0)}))))
    (f,) = h.findings(TS + 8)
    assert (f.kind, f.rank, f.span_s) == ("frozen", 1, 8)


def test_the_exporters_counts_are_what_the_view_reads():
    # The exporter's own series, scraped through the exposition format, read by the view's model.
    srv = FakeRas(HANG)
    try:
        col = JobCollector(four_ranks(), attached=lambda: list(PIDS.values()),
                           identify=identify_on({0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}),
                           window=20.0, stuck_after=5.0, clock=lambda: TS,
                           ras=RasProbe(environ=lambda pid: {"NCCL_RAS_ADDR": srv.addr}, nodes=lambda: NODE))
        reg = CollectorRegistry()
        reg.register(col)
        series = [Series(s.name, dict(s.labels), s.value, TS)
                  for fam in text_string_to_metric_families(generate_latest(reg).decode()) for s in fam.samples]
    finally:
        srv.close()
    job = build_job("node-a:29500", series)
    nccl = {r.rank: r.nccl for r in job.ranks}
    assert nccl[0] == {("033a4b669bbea7d8", "AllReduce"): (161.0, 0.0)}
    assert nccl[1] == {("033a4b669bbea7d8", "AllReduce"): (77.0, 84.0)}
    assert nccl[2] == nccl[3] == {}
