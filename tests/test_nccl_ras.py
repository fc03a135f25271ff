"""NCCL's RAS service: the report parser and comparison on real reports (NCCL 2.28.9, 2-rank DDP
jobs), the client against a local server that speaks the protocol as NCCL's does, and the
source's change-only events. Network traffic goes to 127.0.0.1 only."""

from __future__ import annotations

import socket
import time

import pytest

from gputop.analysis.nccl_ras import (
    DESYNC, HANG, OK, STRAGGLER, UNKNOWN, CountGroup, RankCount, RankInfo, compare, parse,
)
from gputop.model import Event
from gputop.sources import nccl_ras as ras
from gputop.sources.nccl_ras import (
    DEFAULT_ADDR, NcclRasSource, RasReply, comparable, query, query_status, ras_address, ras_enabled,
    split_address,
)

from ras_fake import FakeRas, fixture

HEALTHY, STRAGGLING, HUNG = fixture("healthy"), fixture("straggler"), fixture("hang")


def with_counts(text: str, old0: int, old1: int, new0: int, new1: int) -> str:
    """The report with rank 0's and rank 1's AllReduce counts changed (a later report of the job)."""
    a = f"Rank 0 has launched up to operation {old0} "
    b = f"Rank 1 has launched up to operation {old1} "
    assert a in text and b in text
    return text.replace(a, f"Rank 0 has launched up to operation {new0} ").replace(
        b, f"Rank 1 has launched up to operation {new1} ")


# --------------------------------------------------------------------------- the parser


@pytest.mark.parametrize("name, hash_, r0, r1", [
    ("healthy", "fee1471d24076fd2", (33189, 1610), (33182, 1611)),
    ("straggler", "51dfef6fa39775b2", (977, 653), (893, 654)),
    ("hang", "033a4b669bbea7d8", (161, 1233), (77, 1234)),
])
def test_parse_real_reports(name, hash_, r0, r1):
    rep = parse(fixture(name))
    assert (rep.nccl_version, rep.cuda_version, rep.cuda_runtime, rep.cuda_driver) == ("2.28.9", "13.0", 13000, 13000)
    assert (rep.nodes, rep.processes_per_node, rep.gpus_per_process, rep.processes, rep.gpus) == (1, 2, 1, 2, 2)
    assert rep.collection_s == 0.0
    (row,) = rep.groups
    assert (row.group, row.comms, row.nodes, row.ranks_per_node, row.ranks_per_comm, row.ranks_in_group) == \
        (0, 1, 1, "2", 2, 2)
    assert (row.status, row.errors) == ("RUNNING", ("MISMATCH",))
    (block,) = rep.blocks
    assert (block.section, block.kind, block.comm_id, block.comm_hash) == ("warnings", "MISMATCH", "#0-0", hash_)
    assert block.collective == "AllReduce"
    assert block.ranks == (
        RankCount(0, r0[0], "0", r0[1], "192.0.2.2"),
        RankCount(1, r1[0], "1", r1[1], "192.0.2.2"),
    )
    (oc,) = block.counts
    assert (oc.lead, oc.lag) == (r0[0], r1[0])
    assert rep.comms == (hash_,)
    assert rep.missing_processes == () and rep.dead_processes == () and rep.timeouts == 0


# A 32-rank job as NCCL 2.24/2.25 print it (all collective types in one count), with a majority
# that NCCL does not name, and every other kind of block.
BIG = """\
NCCL version 2.25.1+cuda12.8 compiled with CUDA 12.8
CUDA runtime version 12080, driver version 12080

Job summary
===========

  Nodes  Processes         GPUs  Processes     GPUs
(total)   per node  per process    (total)  (total)
      4          8            1         32       32

Communicators... (2.05s)
=============

Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
    #  in group  per comm  per node  per comm  in group
    0         1         4       7-8        32        32   RUNNING  INCOMPLETE,ERROR,MISMATCH
    1         8         4         1         4        32   RUNNING      OK

Errors
======

INCOMPLETE
  Missing communicator data from 1 job process
  Process 4242 on node 10.0.0.3 managing GPU 5

DEAD
  1 job process is considered dead (unreachable via the RAS network)
  Process 4243 on node 10.0.0.3 managing GPUs 6,7 (NVML 0,1)

#0-0 (00c0ffee00c0ffee) INCOMPLETE
  Missing communicator data from 2 ranks
  The missing ranks: 21,22

#0-0 (00c0ffee00c0ffee) ERROR
  Asynchronous error on 1 rank
  Rank 9 reported Remote process error -- GPU 1 (NVML 3) managed by process 5009 on node 10.0.0.2

Warnings
========

TIMEOUT
  Encountered 2 communication timeouts while gathering communicator data

#0-0 (00c0ffee00c0ffee) MISMATCH
  Communicator ranks have different collective operation counts
  26 ranks have launched up to operation 6650
  4 ranks have launched up to operation 6649
  Rank 0 -- GPU 0 managed by process 5000 on node 10.0.0.1
  Rank 2 -- GPU 2 managed by process 5002 on node 10.0.0.1
  Rank 3 -- [process information not found]
  Rank 4 -- GPU 4 managed by process 5004 on node 10.0.0.1
"""


def test_parse_big_job_every_block():
    rep = parse(BIG)
    assert (rep.nccl_version, rep.cuda_version, rep.collection_s) == ("2.25.1+cuda12.8", "12.8", 2.05)
    assert (rep.nodes, rep.processes, rep.gpus) == (4, 32, 32)
    assert [(g.group, g.comms, g.ranks_per_node, g.errors) for g in rep.groups] == [
        (0, 1, "7-8", ("INCOMPLETE", "ERROR", "MISMATCH")), (1, 8, "1", ())]
    assert [(b.section, b.kind, b.comm_id) for b in rep.blocks] == [
        ("errors", "INCOMPLETE", None), ("errors", "DEAD", None), ("errors", "INCOMPLETE", "#0-0"),
        ("errors", "ERROR", "#0-0"), ("warnings", "TIMEOUT", None), ("warnings", "MISMATCH", "#0-0")]
    assert [(p.pid, p.node, p.gpus) for p in rep.missing_processes] == [(4242, "10.0.0.3", "5")]
    assert [(p.pid, p.node, p.gpus) for p in rep.dead_processes] == [(4243, "10.0.0.3", "6,7 (NVML 0,1)")]
    assert rep.timeouts == 2
    incomplete, error, mismatch = rep.comm_blocks("00c0ffee00c0ffee")
    assert incomplete.count == 2 and incomplete.missing == (RankInfo(21), RankInfo(22))
    (err,) = error.errors
    assert (err.phase, err.error, err.n_ranks) == ("async", "Remote process error", 1)
    assert err.ranks == (RankInfo(9, "1 (NVML 3)", 5009, "10.0.0.2"),)
    (oc,) = mismatch.counts
    assert oc.collective is None  # before 2.26: all types in one count
    assert oc.groups == (
        CountGroup(6650, 26, ()),
        CountGroup(6649, 4, (RankCount(0, 6649, "0", 5000, "10.0.0.1"), RankCount(2, 6649, "2", 5002, "10.0.0.1"),
                             RankCount(3, 6649, None, None, None), RankCount(4, 6649, "4", 5004, "10.0.0.1"))),
    )
    assert oc.count_of(4) == 6649 and oc.count_of(17) == 6650  # 17 is one of the 26 not named


STATUS_BLOCKS = """\
Warnings
========

#1-0 (0000000000000abc) MISMATCH
  Communicator ranks have different status
  2 ranks have status RUNNING
  Rank 0 -- GPU 0 managed by process 10 on node 10.0.0.1
  Rank 1 -- GPU 1 managed by process 11 on node 10.0.0.1
  Rank 2 has status FINALIZE -- GPU 2 managed by process 12 on node 10.0.0.1
  Communicator ranks have different Broadcast operation counts
  Rank 0 has not launched any operations -- GPU 0 managed by process 10 on node 10.0.0.1
  2 ranks have launched up to operation 3

#2-0 (0000000000000def) MISMATCH
  Communicator ranks have different status
  3 ranks have status UNKNOWN
  The unknown ranks: 1,2,3
  Rank 0 has status RUNNING
"""


def test_parse_status_mismatch_and_no_launches():
    rep = parse(STATUS_BLOCKS)
    a, b = rep.blocks
    assert [(s.status, s.n_ranks, [r.rank for r in s.ranks]) for s in a.statuses] == [
        ("RUNNING", 2, [0, 1]), ("FINALIZE", 1, [2])]
    (oc,) = a.counts
    assert oc.collective == "Broadcast"
    assert oc.groups == (CountGroup(0, 1, (RankCount(0, 0, "0", 10, "10.0.0.1"),)), CountGroup(3, 2, ()))
    assert [(s.status, s.n_ranks, [r.rank for r in s.ranks]) for s in b.statuses] == [
        ("UNKNOWN", 3, [1, 2, 3]), ("RUNNING", 1, [0])]
    assert b.missing == ()


def test_parse_never_raises_on_odd_text():
    for text in ("", "garbage\n\x00\xff", "Warnings\n========\n  Rank x has launched\n#0-0 (zz) MISMATCH\n",
                 HUNG[: len(HUNG) // 2], "Errors\n  Rank 3 -- GPU 0 managed by process 1 on node h\n"):
        rep = parse(text)
        assert isinstance(rep.blocks, tuple)
    assert parse("").nccl_version is None


# --------------------------------------------------------------------------- compare


def test_hang_the_same_report_after_10s():
    old = parse(HUNG)
    (v,) = compare(old, parse(HUNG), 10.0)
    assert v.verdict == HANG and v.collective == "AllReduce" and v.comm_hash == "033a4b669bbea7d8"
    assert v.ranks == (RankCount(1, 77, "1", 1234, "192.0.2.2"),)
    assert (v.behind_count, v.lead_count, v.gap_ops, v.frozen_s, v.n_behind) == (77, 161, 84, 10.0, 1)
    assert "rank 1 (pid 1234, GPU 1, node 192.0.2.2)" in v.detail and "10 s" in v.detail


def test_frozen_for_too_short_is_not_called_a_hang():
    (v,) = compare(parse(HUNG), parse(HUNG), 2.0)
    assert v.verdict == UNKNOWN and v.frozen_s == 2.0 and v.ranks[0].rank == 1


def test_hang_when_the_lead_still_launches():
    (v,) = compare(parse(HUNG), parse(with_counts(HUNG, 161, 77, 170, 77)), 6.0)
    assert v.verdict == HANG and v.ranks[0].rank == 1 and v.gap_ops == 93


def test_healthy_moving_is_ok():
    later = with_counts(HEALTHY, 33189, 33182, 33702, 33699)
    (v,) = compare(parse(HEALTHY), parse(later), 2.0)
    assert v.verdict == OK and v.gap_ops == 3 and v.rate_ops_s == pytest.approx((33699 - 33182) / 2.0)
    assert "in flight" in v.detail


def test_straggler_moving_with_the_same_rank_behind():
    later = with_counts(STRAGGLING, 977, 893, 1377, 1290)
    (v,) = compare(parse(STRAGGLING), parse(later), 4.0)
    assert v.verdict == STRAGGLER and v.ranks == (RankCount(1, 1290, "1", 654, "192.0.2.2"),)
    assert v.gap_ops == 87 and v.rate_ops_s == pytest.approx(99.25)
    assert v.behind_s == pytest.approx(87 / 99.25)
    assert "rank 1 (pid 654" in v.detail


def test_a_gap_that_changes_sides_is_not_a_straggler():
    later = with_counts(STRAGGLING, 977, 893, 1300, 1390)  # now rank 0 is 90 behind
    (v,) = compare(parse(STRAGGLING), parse(later), 4.0)
    assert v.verdict == OK and v.ranks[0].rank == 0


def test_caught_up_is_ok_and_first_sight_is_unknown():
    healthy = parse(HEALTHY)
    settled = parse(HEALTHY.split("#0-0")[0])  # the same job with no count differing: no block
    (v,) = compare(healthy, settled, 2.0)
    assert v.verdict == OK and v.detail == "counts agree now"
    (v,) = compare(settled, healthy, 2.0)
    assert v.verdict == UNKNOWN


def test_counts_going_back_are_another_job():
    earlier = with_counts(HEALTHY, 33189, 33182, 50000, 49990)
    (v,) = compare(parse(earlier), parse(HEALTHY), 2.0)
    assert v.verdict == UNKNOWN and "went back" in v.detail


def test_desync_crossed_counts():
    broadcast = ("  Communicator ranks have different Broadcast operation counts\n"
                 "  Rank 0 has launched up to operation 3 -- GPU 0 managed by process 1233 on node 192.0.2.2\n"
                 "  Rank 1 has launched up to operation 4 -- GPU 1 managed by process 1234 on node 192.0.2.2\n")
    text = HUNG.rstrip("\n") + "\n\n" + broadcast
    rep = parse(text)
    assert [oc.collective for oc in rep.blocks[0].counts] == ["AllReduce", "Broadcast"]
    (v,) = compare(rep, rep, 10.0)
    assert v.verdict == DESYNC and v.collective == "AllReduce/Broadcast"
    assert [(r.rank, r.op_count, r.pid) for r in v.ranks] == [(0, 161, 1233), (1, 4, 1234)]
    assert "not calling the same collectives" in v.detail
    # Crossed in one report only: told, not called.
    (v,) = compare(parse(HUNG), rep, 10.0)
    assert v.verdict == UNKNOWN and v.collective == "AllReduce/Broadcast" and "next report" in v.detail
    # Ahead in both types is being ahead, not a desync.
    same_way = text.replace("operation 3 --", "operation 5 --")
    (v,) = compare(parse(same_way), parse(same_way), 10.0)
    assert v.verdict == HANG


def test_big_job_unnamed_majority_and_notes():
    rep = parse(BIG)
    later = parse(BIG.replace("6650", "7000").replace("up to operation 6649", "up to operation 6990"))
    (v,) = compare(rep, later, 3.0)
    assert v.verdict == OK and v.gap_ops == 10 and v.n_behind == 4
    assert "no data from 2 ranks: rank 21, rank 22" in v.notes
    assert "rank 9 reported Remote process error (async)" in v.notes
    (v,) = compare(rep, rep, 30.0)
    assert v.verdict == HANG and [r.rank for r in v.ranks] == [0, 2, 3, 4] and v.n_behind == 4
    # The 26 unnamed ranks behind the 4 named ones: followed by their group's size.
    behind_many = BIG.replace("26 ranks have launched up to operation 6650",
                              "26 ranks have launched up to operation 6600")
    (v,) = compare(parse(behind_many), parse(behind_many), 30.0)
    assert v.verdict == HANG and v.ranks == () and v.n_behind == 26 and v.behind_count == 6600


# --------------------------------------------------------------------------- a local RAS server (ras_fake)


@pytest.fixture
def server():
    made: list[FakeRas] = []

    def make(report: str = HEALTHY, mode: str = "ras") -> FakeRas:
        s = FakeRas(report, mode, life_s=10.0)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def test_query_speaks_the_protocol(server):
    srv = server(HUNG)
    reply = query(srv.addr, 3.0)
    assert reply.ok and reply.text == HUNG and reply.reason is None
    assert reply.server_protocol == 2 and reply.addr == srv.addr and reply.elapsed_s < 3.0
    assert srv.commands == ["CLIENT PROTOCOL 2", "TIMEOUT 1", "STATUS"]
    assert query_status(srv.addr, 5.0, verbose=True) == HUNG
    assert srv.commands[3:] == ["CLIENT PROTOCOL 2", "TIMEOUT 2", "VERBOSE STATUS"]


def test_nothing_listening_is_none_at_once():
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))  # bound, not listening: the port is ours and refuses
    try:
        t0 = time.monotonic()
        reply = query(f"127.0.0.1:{holder.getsockname()[1]}", 3.0)
        assert time.monotonic() - t0 < 0.5
        assert reply.text is None and "nothing listening" in reply.reason
    finally:
        holder.close()


def test_a_server_that_never_answers_is_none_within_the_timeout(server):
    srv = server(mode="silent")
    t0 = time.monotonic()
    reply = query(srv.addr, 0.5)
    elapsed = time.monotonic() - t0
    assert reply.text is None and "timed out" in reply.reason
    assert 0.4 < elapsed < 1.0


def test_a_report_that_stops_halfway_is_none_within_the_timeout(server):
    srv = server(HEALTHY, mode="stall")
    t0 = time.monotonic()
    reply = query(srv.addr, 0.6)
    assert time.monotonic() - t0 < 1.1
    assert reply.text is None and reply.reason.startswith("timed out after ")


def test_garbage_and_refusals_are_none(server):
    reply = query(server(mode="garbage").addr, 2.0)
    assert reply.text is None and "not an NCCL RAS service" in reply.reason and "HTTP/1.1 400" in reply.reason
    reply = query(server(mode="refuse-status").addr, 2.0)
    assert reply.text is None and "ERROR: Unknown command STATUS" in reply.reason
    reply = query(server("not a report at all\n").addr, 2.0)
    assert reply.text is None and reply.reason == "no report (it said 'not a report at all')"


def test_a_line_without_end_and_a_report_past_the_cap():
    flood = FakeRas("NCCL version 2.28.9\n" + "x" * 5000, "ras")
    try:
        reply = query(flood.addr, 2.0, max_bytes=4096)
        assert reply.text is None and "larger than 4096 bytes" in reply.reason
    finally:
        flood.close()

    class NoNewline(FakeRas):
        def _serve(self, conn):
            conn.sendall(b"\x00\xff" * 2000)

    junk = NoNewline()
    try:
        reply = query(junk.addr, 2.0)
        assert reply.text is None and "no line end" in reply.reason
    finally:
        junk.close()


def test_bad_addresses_are_none_without_traffic():
    for addr in ("", "nohostport", "127.0.0.1:", "127.0.0.1:99999", "[::1]28028", "127.0.0.1:http"):
        reply = query(addr, 1.0)
        assert reply.text is None and reply.reason


def test_localhost_tries_both_loopbacks_and_numeric_needs_no_resolver():
    deadline = time.monotonic() + 1.0
    assert ras._resolve("localhost", 28028, deadline) == [
        (socket.AF_INET, ("127.0.0.1", 28028)), (socket.AF_INET6, ("::1", 28028, 0, 0))]
    assert ras._resolve("127.0.0.1", 5, deadline) == [(socket.AF_INET, ("127.0.0.1", 5))]


# --------------------------------------------------------------------------- addresses


def test_address_from_the_rank_environment():
    assert ras_address({}) == ras_address(None) == DEFAULT_ADDR == "localhost:28028"
    assert ras_address({"NCCL_RAS_ADDR": "127.0.0.1:12345"}) == "127.0.0.1:12345"
    assert ras_address((("NCCL_DEBUG", "INFO"), ("NCCL_RAS_ADDR", "[::1]:4000"))) == "[::1]:4000"  # ProcSample.env
    assert ras_address({"NCCL_RAS_ADDR": ""}) == DEFAULT_ADDR
    assert ras_address({"NCCL_RAS_ENABLE": "0"}) is None
    assert ras_address({"NCCL_RAS_ENABLE": "0", "NCCL_RAS_ADDR": "127.0.0.1:1"}) is None
    assert ras_address({"NCCL_RAS_ADDR": "no-port"}) is None  # NCCL cannot listen there either
    assert ras_enabled({"NCCL_RAS_ENABLE": "1"}) and ras_enabled({"NCCL_RAS_ENABLE": ""})
    assert ras_enabled({"NCCL_RAS_ENABLE": "0x1"}) and ras_enabled({"NCCL_RAS_ENABLE": "99999999999999999999"})
    assert not ras_enabled({"NCCL_RAS_ENABLE": "2"}) and not ras_enabled({"NCCL_RAS_ENABLE": "off"})
    assert split_address("[fe80::1%eth0]:28028") == ("fe80::1%eth0", 28028)
    assert split_address("node7:28028:1") == ("node7", 28028)  # NCCL reads only the second field
    assert NcclRasSource.for_environment({"NCCL_RAS_ENABLE": "0"}) is None
    assert NcclRasSource.for_environment({"NCCL_RAS_ADDR": "127.0.0.1:9"}).addr == "127.0.0.1:9"


# --------------------------------------------------------------------------- the source


class Scripted:
    """query() stand-in: replies in order, the calls it had."""

    def __init__(self, *replies: RasReply) -> None:
        self.replies = list(replies)
        self.calls: list[tuple[str, float, bool]] = []

    def __call__(self, addr, timeout_s, *, verbose=False):
        self.calls.append((addr, timeout_s, verbose))
        return self.replies.pop(0)


def ok(text: str) -> RasReply:
    return RasReply(text, None, "a")


DOWN = RasReply(None, "nothing listening (127.0.0.1: Connection refused)", "a")


def test_source_sends_a_report_only_when_it_changes(clock):
    later = with_counts(HEALTHY, 33189, 33182, 33702, 33699)
    retimed = HEALTHY.replace("Communicators... (0.000s)", "Communicators... (0.004s)")
    q = Scripted(ok(HEALTHY), ok(retimed), ok(later), ok(later))
    src = NcclRasSource("127.0.0.1:7", clock=clock, query_fn=q)
    (ev,) = src.poll()
    assert isinstance(ev, Event) and (ev.source, ev.level, ev.ts, ev.message) == ("nccl-ras", "debug", clock.t, one_line(HEALTHY))
    assert src.poll() == []  # within the interval: not even asked
    assert len(q.calls) == 1
    clock.advance(2.0)
    assert src.poll() == [] and src.confirmed_at == clock.t  # only the gathering time differs
    clock.advance(2.0)
    (ev,) = src.poll()
    assert ev.message == one_line(later)
    clock.advance(2.0)
    assert src.poll() == []
    assert q.calls == [("127.0.0.1:7", 3.0, False)] * 4
    assert comparable(HEALTHY) == comparable(retimed) != comparable(later)


def test_source_says_once_that_the_service_is_unreachable_then_backs_off(clock):
    q = Scripted(DOWN, DOWN, ok(HUNG), ok(HUNG), DOWN, ok(HUNG))
    src = NcclRasSource("127.0.0.1:7", clock=clock, query_fn=q, interval=2.0, backoff_s=30.0)
    (ev,) = src.poll()
    assert ev.level == "debug" and "127.0.0.1:7 not reachable" in ev.message and "Connection refused" in ev.message
    for _ in range(14):  # 28 s: no new query
        clock.advance(2.0)
        assert src.poll() == []
    assert len(q.calls) == 1
    clock.advance(2.0)
    assert src.poll() == []  # asked again at 30 s, still down: said already
    assert len(q.calls) == 2
    clock.advance(30.0)
    (ev,) = src.poll()
    assert ev.message == one_line(HUNG)
    clock.advance(2.0)
    assert src.poll() == []  # frozen: the same report
    clock.advance(2.0)
    (ev,) = src.poll()
    assert "not reachable" in ev.message  # a new outage is told again
    clock.advance(30.0)
    (ev,) = src.poll()
    assert ev.message == one_line(HUNG)  # after an outage the report is sent again, changed or not


def test_source_redacts_and_passes_its_settings(clock):
    secret = "hf_" + "a1" * 15
    q = Scripted(ok(HEALTHY + f"  token {secret}\n"))
    src = NcclRasSource("127.0.0.1:7", clock=clock, query_fn=q, timeout_s=1.5, verbose=True)
    (ev,) = src.poll()
    assert secret not in ev.message and "Rank 1 has launched up to operation 33182" in ev.message
    assert q.calls == [("127.0.0.1:7", 1.5, True)]


def test_source_against_the_local_server(server, clock):
    srv = server(STRAGGLING)
    src = NcclRasSource(srv.addr, clock=clock, timeout_s=2.0)
    (ev,) = src.poll()
    assert ev.message == one_line(STRAGGLING) and src.last_reply.ok
    clock.advance(2.0)
    assert src.poll() == [] and srv.connections == 2
    srv.close()
    clock.advance(2.0)
    (ev,) = src.poll()
    assert "not reachable" in ev.message


def one_line(text: str) -> str:
    """A report as its event carries it: one line, read back whole by analysis.nccl_ras."""
    from gputop.sources.nccl_ras import LINE_SEP

    return LINE_SEP.join(text.splitlines())


def test_a_report_event_is_one_line_that_reads_back_whole():
    from gputop.analysis.nccl_ras import parse, report_text

    line = one_line(HUNG)
    assert "\n" not in line
    assert parse(report_text(line)) == parse(HUNG)


def test_source_asks_at_every_wake_of_the_pipeline_despite_its_jitter(clock):
    """The pipeline wakes the source every interval by its own clock; a wake a hair earlier than
    the last one skipped a whole interval (reports 10 s apart at 5 s, on 2 x H200: the analysis then
    read a straggler's counts as frozen and the job as hung)."""
    q = Scripted(*(ok(HEALTHY.replace("(0.000s)", f"(0.00{k}s)") if k % 2 else STRAGGLING) for k in range(6)))
    src = NcclRasSource("127.0.0.1:7", clock=clock, query_fn=q, interval=5.0)
    sent = []
    for dt in (0.0, 5.0002, 5.0003, 4.9997, 5.0, 4.9999):  # the recorded wakes' spacing
        clock.advance(dt)
        sent += src.poll()
    assert len(q.calls) == 6  # asked at every wake: no interval skipped
    assert len(sent) == 6  # each report differs from the one before it


def test_a_report_standing_is_frozen_only_since_it_was_last_read_again():
    """A report standing unchanged for ``stood`` seconds was read again at the last poll, up to one
    poll back: its counts are known frozen for ``stood - poll``, and a hang needs that long."""
    from gputop.analysis.nccl_ras import HANG_MIN_FROZEN_S, RAS_POLL_S, ras_verdicts

    t0 = 1000.0
    ev = [Event(t0, "nccl-ras", one_line(HUNG), "debug")]
    early = t0 + HANG_MIN_FROZEN_S + RAS_POLL_S - 0.5  # the next poll may still bring new counts
    (v,) = ras_verdicts(ev, early)
    assert v.verdict != HANG
    (v,) = ras_verdicts(ev, t0 + HANG_MIN_FROZEN_S + RAS_POLL_S + 0.5)
    assert v.verdict == HANG and v.frozen_s >= HANG_MIN_FROZEN_S
