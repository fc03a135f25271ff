"""NCCL's RAS counts in the exporter: each local rank's collective counts from the report (named
by its process, or by number in a world-sized communicator), asked at most once per scrape with
a short time limit, nothing (no series, no output) where no service answers. A fake RAS service
on 127.0.0.1 serves NCCL's own reports (tests/fixtures/nccl, NCCL 2.28.9)."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from gputop.export.job_collector import JobCollector  # noqa: E402
from gputop.export.ras_counts import Counts, Group, Named, parse_counts, rank_ops  # noqa: E402
from gputop.export.ras_probe import QUERY_TIMEOUT_S, RasProbe, asks_no_resolver  # noqa: E402

from ras_fake import FakeRas, fixture  # noqa: E402
from test_export_job import PIDS, four_ranks, identify_on  # noqa: E402

NODE = frozenset({"192.0.2.2"})
HOSTS = {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}


def ours(text: str, pids: dict[int, int]) -> str:
    """A report with its processes renamed to this test's ranks' pids."""
    for old, new in pids.items():
        text = text.replace(f"managed by process {old} ", f"managed by process {new} ")
    return text


HANG = ours(fixture("hang"), {1233: PIDS[0], 1234: PIDS[1]})  # rank 1 at 77, rank 0 at 161

# A 4-rank world: rank 1 named, behind; the other three counted only.
WORLD = """\
NCCL version 2.28.9 compiled with CUDA 13.0

Warnings
========

#0-0 (51dfef6fa39775b2) MISMATCH
  Communicator ranks have different AllReduce operation counts
  3 ranks have launched up to operation 977
  Rank 1 has launched up to operation 893 -- GPU 1 managed by process {pid} on node 192.0.2.2
  Communicator ranks have different Broadcast operation counts
  3 ranks have launched up to operation 2
  Rank 1 has not launched any operations -- GPU 1 managed by process {pid} on node 192.0.2.2
  Communicator ranks have different status
  2 ranks have status RUNNING
  Rank 0 -- GPU 0 managed by process 1 on node 192.0.2.2
"""


def test_the_counts_of_a_report():
    (c,) = parse_counts(HANG)
    assert (c.comm, c.collective, c.lead, c.size) == ("033a4b669bbea7d8", "AllReduce", 161, 2)
    assert [(g.ops, g.n_ranks, [n.pid for n in g.named]) for g in c.groups] == [(161, 1, [PIDS[0]]), (77, 1, [PIDS[1]])]
    # the status block's named rank is not taken for a count
    counts = parse_counts(WORLD.format(pid=PIDS[1]))
    assert [(c.collective, c.lead, c.size) for c in counts] == [("AllReduce", 977, 4), ("Broadcast", 2, 4)]
    assert counts[0].groups[1].named == (Named(1, PIDS[1], "192.0.2.2"),)
    assert parse_counts("") == [] and parse_counts("garbage\n  Rank 1 has launched up to operation 3\n") == []


def test_a_rank_is_ours_by_its_process_on_this_host_or_by_number_in_the_world():
    counts = parse_counts(WORLD.format(pid=PIDS[1]))
    got = {r: rank_ops(counts, r, PIDS[r], 4, NODE) for r in range(4)}
    assert [(o.collective, o.ops, o.behind) for o in got[1]] == [("AllReduce", 893, 84), ("Broadcast", 0, 2)]
    # counted, not named: found by number in a world-sized communicator
    assert [(o.collective, o.ops, o.behind) for o in got[0]] == [("AllReduce", 977, 0), ("Broadcast", 2, 0)]
    assert got[2] == got[3] == got[0]
    # The same pid on another host is not ours (and its number is then taken by another
    # process, so rank 1 is not read by number either); a communicator smaller than the world is
    # not read by number.
    other = parse_counts(WORLD.format(pid=PIDS[1]).replace("192.0.2.2", "10.9.9.9"))
    assert rank_ops(other, 1, PIDS[1], 4, NODE) == []
    assert rank_ops(parse_counts(HANG), 2, PIDS[2], 4, NODE) == []
    assert rank_ops(parse_counts(HANG), 1, PIDS[1], 4, None)[0].behind == 84  # no node list: the pid
    small = [Counts("c", "AllReduce", (Group(5, 3), Group(4, 1, (Named(1, 999, None),))))]
    assert rank_ops(small, 0, PIDS[0], 8, NODE) == []


def test_addresses_that_need_no_resolver():
    assert asks_no_resolver("localhost:28028") and asks_no_resolver("127.0.0.1:1") and asks_no_resolver("[::1]:28028")
    assert not asks_no_resolver("ras.example:28028")


@pytest.fixture
def ras():
    made: list[FakeRas] = []

    def make(report: str = HANG, mode: str = "ras") -> FakeRas:
        made.append(FakeRas(report, mode))
        return made[-1]

    yield make
    for f in made:
        f.close()


def scrape(store, probe: RasProbe | None) -> dict[str, list]:
    col = JobCollector(store, attached=lambda: list(PIDS.values()), identify=identify_on(HOSTS), window=20.0,
                       stuck_after=5.0, clock=lambda: store.now, ras=probe)
    reg = CollectorRegistry()
    reg.register(col)
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def probe_for(addr: str, clock=None) -> RasProbe:
    kw = {"clock": clock} if clock is not None else {}
    return RasProbe(environ=lambda pid: {"NCCL_RAS_ADDR": addr, "HF_TOKEN": "x"}, nodes=lambda: NODE, **kw)


def test_the_exporter_publishes_each_local_ranks_counts_one_query_a_scrape(ras):
    srv = ras(HANG)
    probe = probe_for(srv.addr)
    m = scrape(four_ranks(), probe)
    ops = {(s.labels["rank"], s.labels["comm"], s.labels["collective"]): s.value
           for s in m["gputop_rank_nccl_operations_total"]}
    assert ops == {("0", "033a4b669bbea7d8", "AllReduce"): 161, ("1", "033a4b669bbea7d8", "AllReduce"): 77}
    behind = {s.labels["rank"]: s.value for s in m["gputop_rank_nccl_behind_operations"]}
    assert behind == {"0": 0, "1": 84}
    assert {s.labels["job_id"] for s in m["gputop_rank_nccl_operations_total"]} == {"node-a:29500"}
    assert srv.connections == 1 and probe.queries == 1
    assert srv.commands[:3] == ["CLIENT PROTOCOL 2", "TIMEOUT 1", "STATUS"]
    # the counts move between scrapes: the next scrape asks once more and says so
    srv.report = HANG.replace("operation 77 ", "operation 90 ")
    m = scrape(four_ranks(), probe)
    assert {s.labels["rank"]: s.value for s in m["gputop_rank_nccl_behind_operations"]} == {"0": 0, "1": 71}
    assert srv.connections == 2 and probe.queries == 2


def test_no_service_no_series_no_output_and_asked_again_only_after_the_back_off(ras, capsys, clock):
    srv = ras(mode="silent")  # accepts, never answers: the query gives up at its time limit
    assert QUERY_TIMEOUT_S <= 0.2
    probe = probe_for(srv.addr, clock=clock)
    threads = threading.active_count()
    m = scrape(four_ranks(), probe)
    assert "gputop_rank_nccl_operations_total" not in m and "gputop_rank_nccl_behind_operations" not in m
    assert "gputop_rank_info" in m  # the rank series are there as ever
    assert srv.connections == 1
    scrape(four_ranks(), probe)
    clock.advance(10)
    scrape(four_ranks(), probe)
    assert srv.connections == 1 and probe.queries == 1  # backing off: not asked again
    clock.advance(25)
    scrape(four_ranks(), probe)
    assert srv.connections == 2
    assert threading.active_count() == threads  # the query left no thread behind
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_nothing_listening_and_a_name_that_needs_a_resolver_are_no_series(ras):
    srv = ras()
    port = srv.addr.rsplit(":", 1)[1]
    srv.close()  # nothing listens there now
    m = scrape(four_ranks(), probe_for(f"127.0.0.1:{port}"))
    assert "gputop_rank_nccl_operations_total" not in m
    threads = threading.active_count()
    probe = probe_for(f"ras.invalid:{port}")
    m = scrape(four_ranks(), probe)
    assert "gputop_rank_nccl_operations_total" not in m and probe.queries == 0
    assert threading.active_count() == threads
    # a rank whose environment turns RAS off is not asked either
    off = RasProbe(environ=lambda pid: {"NCCL_RAS_ENABLE": "0"}, nodes=lambda: NODE)
    scrape(four_ranks(), off)
    assert off.queries == 0


def test_only_the_ras_keys_of_an_environment_are_read(ras):
    srv = ras(HANG)
    seen: list[dict] = []

    def source(env, **kw):
        seen.append(dict(env))
        from gputop.sources import NcclRasSource

        return NcclRasSource.for_environment(env, **kw)

    probe = RasProbe(environ=lambda pid: {"NCCL_RAS_ADDR": srv.addr, "HF_TOKEN": "hf_secret", "PATH": "/bin"},
                     source=source, nodes=lambda: NODE)
    scrape(four_ranks(), probe)
    assert seen and all(set(e) == {"NCCL_RAS_ADDR"} for e in seen)
    assert len(seen) == 4  # once per process, not once per scrape
    scrape(four_ranks(), probe)
    assert len(seen) == 4
