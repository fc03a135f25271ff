"""The exporter disagreed with the Ranks tab and `advise` on a gloo straggler: rank 1 sleeping in
`load_batch` 95 % of the time was exported hot in the loop's line at 2 %; the advisor, not told
the attached processes were ranks of one job, called the waiting rank 0 stuck in a finding that
named no job; a rank on no GPU got no gputop_rank_finding. Now the exporter's rows, the pane and
the straggler finding name one place, the advisor learns the ranks (the ranks event a --pid
session publishes) and judges the job's rank 0, and its findings carry that job."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from gputop.analysis import RANKS_SOURCE, hot_line, rank_map, read_window  # noqa: E402
from gputop.export.attach import RankNamer  # noqa: E402
from gputop.export.collector import GputopCollector  # noqa: E402
from gputop.export.job_collector import JobCollector  # noqa: E402
from gputop.model import Category, Finding, Frame, ProcSample, Severity, StackSample, Verdict  # noqa: E402
from gputop.present.ranks import rank_line  # noqa: E402
from gputop.sources.job_identity import JobIdentity  # noqa: E402
from gputop.store import Store  # noqa: E402

from synth import T0  # noqa: E402

PIDS = {0: 6100, 1: 6101}
JOB = "vm/127.0.0.1:29677"
LOOP = Frame("<module>", "/home/u/ddp.py", 14, code="loss.backward(); opt.step()")
SLEEP = (Frame("load_batch", "/home/u/ddp.py", 9, code="if rank==1: time.sleep(0.1)"), Frame("<module>", "/home/u/ddp.py", 12))
REDUCE = (Frame("all_reduce", "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", 2000), LOOP)
BACKWARD = (Frame("_engine_run_backward", "/usr/lib/python3/site-packages/torch/autograd/graph.py", 768), LOOP)


def _sample(t: float, pid: int, cat: Category, frames, active: bool) -> StackSample:
    return StackSample(ts=t, pid=pid, thread_id=pid, thread_name="MainThread", frames=frames, active=active,
                       is_main=True, category=cat)


def ddp_store(seconds: float = 20.0) -> Store:
    """Two CPU ranks (gloo, no GPU): rank 1 sleeps in load_batch 19 samples in 20 and runs its
    backward in the 20th; rank 0 waits in all_reduce at every sample."""
    store = Store()
    out: list[object] = []
    for k in range(int(seconds * 5)):
        t = T0 + k * 0.2
        out.append(_sample(t, PIDS[0], Category.COLLECTIVE, REDUCE, False))
        busy = k % 20 == 19
        out.append(_sample(t, PIDS[1], Category.BACKWARD if busy else Category.IDLE, BACKWARD if busy else SLEEP, busy))
        for pid in PIDS.values():
            out.append(ProcSample(t, pid, ppid=6000, name="python", cmdline="python ddp.py"))
    store.add(out)
    return store


def identities() -> dict[int, JobIdentity]:
    return {p: JobIdentity(JOB, "master", r, r, 2, "vm") for r, p in PIDS.items()}


def scrape(*collectors) -> dict[str, list]:
    reg = CollectorRegistry()
    for c in collectors:
        reg.register(c)
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def test_the_rank_namer_tells_the_advisor_the_job_and_its_rank_0():
    store = ddp_store(2.0)
    ids = {**identities(), 7000: JobIdentity("other/job", "master", 0, 0, 1, "vm")}  # a job of one rank
    judged: list[int] = []
    namer = RankNamer(store, lambda: ids, judge=judged.append)
    first = namer.poll()
    assert [e.source for e in first] == [RANKS_SOURCE]
    store.add(first)
    assert rank_map(store.events()) == {PIDS[0]: 0, PIDS[1]: 1}
    assert judged == [PIDS[0]]  # the job's rank 0, as --pid of its launcher judges
    assert namer.poll() == []  # said once while it holds
    del ids[PIDS[1]]  # rank 1 gone: one rank is no multi-rank job, and what was named stays
    assert namer.poll() == []


def test_exported_hot_line_is_the_panes_and_the_waiting_rank_is_not_stuck():
    store = ddp_store()
    store.add(RankNamer(store, identities).poll())
    finding = Finding("rank-straggler", "rank 1 is the straggler", Severity.WARNING, 0.9, ("e",), "x",
                      cost_s=19.0, gpu_index=-1)
    store.add([Verdict(store.now, (finding,), target_pid=PIDS[0])])
    col = JobCollector(store, attached=lambda: list(PIDS.values()), identify=identities().get, window=20.0,
                       stuck_after=5.0, clock=lambda: store.now, judged_job=lambda: JOB)
    m = scrape(col)
    hot = {s.labels["rank"]: (s.labels["place"], s.value) for s in m["gputop_rank_hot_line"]}
    assert hot["1"][0] == "load_batch (u/ddp.py:9)" and hot["1"][1] == pytest.approx(0.95, abs=0.02)
    # The Ranks pane's row of the same rank, from the evidence window the advisor reads, names it too.
    views = {v.rank: v for v in read_window(store, PIDS[0], 5.0, 20.0).rank_views}
    assert hot_line(views[1])[0] == "load_batch (u/ddp.py:9)"
    assert "load_batch (u/ddp.py:9)" in "".join(text for text, _ in rank_line(views[1], 10, 40))
    # Rank 0 waits for rank 1 at every sample: a straggler's peer, not a hang.
    assert {s.labels["rank"]: s.value for s in m["gputop_rank_stuck"]} == {"0": 0, "1": 0}
    # A job on no GPU: the advisor's finding on its job is its ranks' finding.
    got = {(s.labels["rank"], s.labels["id"]) for s in m["gputop_rank_finding"]}
    assert got == {("0", "rank-straggler"), ("1", "rank-straggler")}
    # Another job's ranks get none of it.
    other = JobCollector(store, attached=lambda: list(PIDS.values()), identify=identities().get, window=20.0,
                         stuck_after=5.0, clock=lambda: store.now, judged_job=lambda: "other/job")
    assert "gputop_rank_finding" not in scrape(other)


def test_a_finding_names_the_process_and_job_it_was_judged_on():
    store = ddp_store(2.0)
    f = Finding("stuck", "Job stuck", Severity.CRITICAL, 0.6, ("e",), "x", cost_s=10.0)
    store.add([Verdict(store.now, (f,))])
    col = GputopCollector(store, clock=lambda: store.now, judged=lambda: (str(PIDS[0]), JOB))
    m = scrape(col)
    [s] = m["gputop_finding"]
    assert s.labels["pid"] == str(PIDS[0]) and s.labels["job_id"] == JOB and s.value == 10.0
    assert m["gputop_finding_confidence"][0].labels["job_id"] == JOB


def test_the_findings_of_a_judged_process_that_has_ended_are_not_exported():
    """A new user killed the target of `export --pid`: its `workers-blocked` finding stayed in the
    metrics, its value growing, while its gputop_job_info line was gone."""
    store = ddp_store(2.0)
    f = Finding("workers-blocked", "Workers blocked", Severity.WARNING, 0.6, ("e",), "x", cost_s=10.0)
    store.add([Verdict(store.now, (f,))])
    running = GputopCollector(store, clock=lambda: store.now, judged=lambda: (str(PIDS[0]), JOB),
                              alive=lambda pid: True)
    assert [s.labels["id"] for s in scrape(running)["gputop_finding"]] == ["workers-blocked"]
    ended = GputopCollector(store, clock=lambda: store.now, judged=lambda: (str(PIDS[0]), JOB),
                            alive=lambda pid: pid != PIDS[0])
    assert "gputop_finding" not in scrape(ended) or not scrape(ended)["gputop_finding"]


def test_a_zombie_or_a_missing_process_is_not_alive():
    import subprocess
    import sys

    from gputop.export.server import _alive

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    import time

    deadline = time.monotonic() + 20
    while _alive(child.pid) and time.monotonic() < deadline:  # ended, not reaped: a zombie
        time.sleep(0.05)
    assert not _alive(child.pid)
    child.wait()
    assert not _alive(child.pid) and _alive(os.getpid())
