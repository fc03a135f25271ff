"""The job view's memory across evaluations: a finding is named once it has held, kept through a
dip, cleared once gone long enough; `--once` applies the same rule to the past minute (a
subquery's steps), and the live view's refreshes feed one memory. Times are the evaluations'
own (synthetic), never the test's clock."""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from gputop.cli import main
from gputop.commands.job import JobWatch, fetch_job
from gputop.fleet import HoldRule, Memory, build_job, build_jobs, judge, judged, parse_matrix, parse_vector
from gputop.present.job import job_lines, plain

from job_series import TS, job_matrix, job_payload


def job(**kw):
    return build_job("exp-42", parse_vector(job_payload(4, per_host=2, **kw)))


SLOW, EVEN = job(straggler=3), job()


def feed(mem: Memory, pattern: str, t0: float = TS, step: float = 5.0) -> float:
    """'S' an evaluation with rank 3 the straggler, '.' one without; returns the last time."""
    t = t0
    for k, c in enumerate(pattern):
        t = t0 + k * step
        mem.feed(t, SLOW if c == "S" else EVEN)
    return t


def test_each_evaluation_alone_flickers_the_memory_does_not():
    # What a refresh that judges one instant shows, evaluation by evaluation:
    assert [judge(j).straggler is not None for j in (SLOW, EVEN, SLOW)] == [True, False, True]
    mem = Memory(HoldRule(appear_s=10, clear_s=20), step_s=5)
    shown = []
    for k, c in enumerate("SSSS.SS.SS"):
        mem.feed(TS + 5 * k, SLOW if c == "S" else EVEN)
        j = mem.judgement()
        shown.append(j.straggler.slow.rank if j.straggler else None)
    # named at the third evaluation (held 10 s), then kept through each one-evaluation dip
    assert shown == [None, None, 3, 3, 3, 3, 3, 3, 3, 3]


def test_named_after_it_has_held_and_with_how_long():
    mem = Memory(HoldRule(appear_s=10, clear_s=20), step_s=5)
    feed(mem, "SS")
    j = mem.judgement()
    assert j.straggler is None and [h.key for h in j.weighing] == [("slow", "node-001", 3)]
    text = plain(job_lines(mem.job, j, 100, "now", 5))
    assert "Weighing: rank 3 on node-001 slow 5s of 10s" in text
    assert "No rank holds the others up" not in text  # something is seen: not "all clear"
    assert "named once held 10s, cleared after 20s without, judged every 5 s" in text
    t = feed(mem, "SSSSSSSSS", t0=TS + 10)  # 8 more evaluations: held 50 s
    j = mem.judgement()
    assert j.straggler is not None and j.straggler.slow.rank == 3 and not j.weighing
    assert j.at == t and t - j.held[("slow", "node-001", 3)].since == 50
    text = plain(job_lines(mem.job, j, 100, "now", 5))
    assert "Straggler: rank 3 on node-001 for 50s · data 61%" in text
    assert " SLOW " in text


def test_a_dip_says_so_and_a_long_absence_clears_it():
    mem = Memory(HoldRule(appear_s=10, clear_s=20), step_s=5)
    t = feed(mem, "SSSS...")  # named, then three evaluations (15 s) without it
    j = mem.judgement()
    assert j.straggler is not None and j.at == t
    assert "rank 3 on node-001 for 30s · not seen for 15s" in plain(job_lines(mem.job, j, 100, "now", 5))
    mem.feed(t + 5, EVEN)  # 20 s without it: cleared
    j = mem.judgement()
    assert j.straggler is None and not j.weighing
    assert "No rank holds the others up" in plain(job_lines(mem.job, j, 100, "now", 5))


def test_a_finding_not_yet_named_starts_over_after_a_break():
    mem = Memory(HoldRule(appear_s=10, clear_s=20), step_s=5)
    feed(mem, "SS.SS")  # never three in a row
    assert mem.judgement().straggler is None
    assert mem.judgement().weighing[0].since == TS + 15


def test_a_straggler_that_stands_still_for_an_evaluation_is_still_the_straggler():
    # Its exporter calls it stuck for a moment (a batch that takes longer than --stuck-after),
    # and that evaluation names it "never arrives": the same rank holds the others up, so the
    # straggler's run is neither held nor broken by it, and the other reading is only weighed.
    still = build_job("exp-42", parse_vector(job_payload(4, per_host=2, stuck=3)))
    assert [n.rank.rank for n in judge(still).never_arrives] == [3]
    mem = Memory(HoldRule(appear_s=10, clear_s=20), step_s=5)
    for k, j in enumerate((SLOW, SLOW, still, SLOW)):
        mem.feed(TS + 5 * k, j)
    j = mem.judgement()
    assert j.straggler is not None and j.straggler.slow.rank == 3  # held 15 s, with 3 evaluations
    assert not j.never_arrives and not j.stuck and not j.weighing  # the waiters are not "stuck"
    mem = Memory(HoldRule(appear_s=10, clear_s=20), step_s=5)
    for k, j in enumerate((SLOW, SLOW, still)):
        mem.feed(TS + 5 * k, j)
    j = mem.judgement()
    assert j.straggler is None and [h.key for h in j.weighing] == [("slow", "node-001", 3), ("never", "node-001", 3)]
    assert "rank 3 on node-001 slow 5s of 10s" in plain(job_lines(mem.job, j, 120, "now", 5))
    # A straggler that really stops: its reading as the rank that never arrives is named in
    # turn, and the straggler being weighed is dropped once the other reading has lasted.
    for k in range(3, 6):
        mem.feed(TS + 5 * k, still)
    j = mem.judgement()
    assert j.straggler is None and [n.rank.rank for n in j.never_arrives] == [3] and not j.weighing


def test_a_hang_is_held_like_a_straggler_and_the_rank_lines_agree():
    hung = build_job("exp-42", parse_vector(job_payload(4, per_host=2, stuck=1)))
    mem = Memory(HoldRule(appear_s=10, clear_s=20), step_s=5)
    for k in range(3):
        mem.feed(TS + 5 * k, hung)
    j = mem.judgement()
    assert [n.rank.rank for n in j.never_arrives] == [1]
    text = plain(job_lines(mem.job, j, 100, "now", 5))
    assert "Never arrives: rank 1 on node-000" in text and " NEVER " in text


def test_an_older_evaluation_fed_again_is_ignored():
    mem = Memory(step_s=5)
    assert mem.feed(TS, SLOW) and mem.feed(TS + 5, SLOW)
    assert not mem.feed(TS + 5, EVEN) and not mem.feed(TS, EVEN)
    assert mem.judgement().weighing[0].evals == 2


def test_once_applies_the_rule_to_the_past_minute():
    # A subquery's answer: 13 steps, rank 3 slow in all but one (a dip mid-window).
    steps = [(TS - 60 + 5 * k, job_payload(4, per_host=2, straggler=None if k == 6 else 3)) for k in range(13)]
    jobs = build_jobs("exp-42", parse_matrix(job_matrix(steps)))
    assert [ts for ts, _ in jobs] == [ts for ts, _ in steps]
    assert [judge(j).straggler is not None for _, j in jobs].count(False) == 1
    got = judged(jobs, step_s=5)
    assert got is not None
    j = got[1]
    assert j.straggler is not None and j.straggler.slow.rank == 3
    assert j.at - j.held[("slow", "node-001", 3)].since == 60  # held since the window's start
    # the newest step alone would say the same here; one step of the dip alone would not
    assert judged(jobs[:7], step_s=5)[1].straggler is not None


def test_steps_without_any_series_are_not_evaluations():
    steps = [(TS, job_payload(4, per_host=2, straggler=3)), (TS + 5, {"data": {"result": []}})]
    jobs = build_jobs("exp-42", parse_matrix(job_matrix(steps)))
    assert [ts for ts, _ in jobs] == [TS]
    assert build_jobs("other", parse_matrix(job_matrix(steps))) == []


class _Prom(BaseHTTPRequestHandler):
    """A Prometheus that answers every subquery with ``steps`` (the last ``window`` of them)."""

    steps: list = []
    queries: list[str] = []

    def do_POST(self):
        q = urllib.parse.parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())["query"][0]
        type(self).queries.append(q)
        window = int(q.rsplit("[", 1)[1].split("s:", 1)[0]) if q.endswith("]") else 0
        last = self.steps[-1][0]
        data = json.dumps(job_matrix([(ts, p) for ts, p in self.steps if ts > last - window])).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


@pytest.fixture
def prom():
    _Prom.steps, _Prom.queries = [], []
    srv = HTTPServer(("127.0.0.1", 0), _Prom)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()
    srv.server_close()


def test_the_live_view_holds_across_refreshes_and_once_reads_a_range(prom, capsys):
    _Prom.steps = [(TS + 5 * k, job_payload(4, per_host=2, straggler=3)) for k in range(3)]
    watch = JobWatch(prom, "exp-42", 5.0)
    job_now, j = watch()
    assert _Prom.queries[-1] == '{__name__=~"gputop_rank_.*",job_id="exp-42"}[60s:5s]'
    assert j.straggler is not None and j.at == TS + 10
    # Later refreshes ask for the last few steps only; a dip of one evaluation keeps the name.
    _Prom.steps.append((TS + 15, job_payload(4, per_host=2)))
    job_now, j = watch()
    assert _Prom.queries[-1].endswith("[15s:5s]") and j.at == TS + 15
    assert j.straggler is not None and j.held[("slow", "node-001", 3)].last_seen == TS + 10
    assert watch.memory.latest.straggler is None  # the evaluation itself had none
    # `--once` reads the same minute and says the same, in one run
    assert fetch_job(prom, "exp-42")[1].straggler.slow.rank == 3
    assert main(["job", "--prometheus", prom, "exp-42", "--once"]) == 0
    out = capsys.readouterr().out
    assert "Straggler: rank 3 on node-001 for 15s · not seen for 5s" in out, out


def test_a_straggler_that_stops_for_good_is_shown_as_the_hang_alone():
    # The rank the others waited for stops: once its reading as never arriving is named, the
    # straggler named before is not shown beside it for its clearing time (the host line then
    # counted the rank "slow" and the verdict said both).
    still = build_job("exp-42", parse_vector(job_payload(4, per_host=2, stuck=3)))
    mem = Memory(HoldRule(appear_s=10, clear_s=20), step_s=5)
    for k, j in enumerate((SLOW,) * 4 + (still,) * 3):
        mem.feed(TS + 5 * k, j)
    j = mem.judgement()
    assert j.straggler is None and [n.rank.rank for n in j.never_arrives] == [3]
    text = plain(job_lines(mem.job, j, 120, "now", 5))
    assert "Straggler:" not in text and "Never arrives: rank 3 on node-001" in text
    assert "node-001 · 2 ranks · 1 never arrives · 1 waiting" in text, text
    # moving again: the straggler is judged afresh (weighed, then named), not resurrected
    mem.feed(TS + 35, SLOW)
    assert mem.judgement().straggler is None
