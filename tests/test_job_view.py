"""The job view's pure half on Prometheus's API answers: parsing, the job model, the judgement
across ranks (straggler, never-arrives, unreported ranks), the text; and the command's failures."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from gputop.cli import main
from gputop.fleet import ApiError, build_job, job_query, job_summaries, judge, parse_vector, quote
from gputop.present.job import job_lines, jobs_lines, plain

from job_series import TS, job_matrix, job_payload

FIX = Path(__file__).parent / "fixtures" / "prometheus"


def load(name: str) -> dict:
    return json.loads((FIX / name).read_text())


def test_the_straggler_on_its_host_with_phase_line_and_cost():
    job = build_job("exp-42", parse_vector(load("job_straggler.json")))
    assert [(r.host, r.rank) for r in job.ranks] == [("node-a", 0), ("node-a", 1), ("node-b", 2), ("node-b", 3)]
    assert job.world_size == 4 and job.hosts == ["node-a", "node-b"] and job.missing() == []
    r3 = job.ranks[3]
    assert r3.phases["data"] == 0.61 and r3.hot == "decode (u/data.py:88)" and r3.samples == 300
    assert r3.top_finding == ("data-starved", "critical", 36.6)  # costliest first
    j = judge(job)
    assert j.straggler is not None and j.straggler.slow is r3
    assert j.straggler.waiting == 3 and j.straggler.collective == "all_reduce"
    assert j.straggler.others_wait == pytest.approx((0.52 + 0.49 + 0.5) / 3)
    text = plain(job_lines(job, j, 78, "as of 12:00:00", 5))
    assert "Straggler: rank 3 on node-b · data 61%, decode (u/data.py:88)" in text
    assert "3 ranks wait 50% of their time in all_reduce" in text
    assert "node-a · 2 ranks" in text and "data-starved" in text
    assert max(len(line) for line in text.splitlines()) <= 78


def test_a_rank_that_never_arrives_while_63_wait_in_all_reduce():
    job = build_job("exp-42", parse_vector(job_payload(64, stuck=13)))
    j = judge(job)
    assert j.straggler is None  # the waiting ranks wait for a hang, not a slow rank
    assert [n.rank.rank for n in j.never_arrives] == [13] and j.never_arrives[0].waiting == 63
    assert j.never_arrives[0].rank.host == "node-001"
    text = plain(job_lines(job, j, 100, "now", 5))
    assert "Never arrives: rank 13 on node-001 · still 1:35 at wait_forever (u/train.py:66)" in text


def test_ranks_that_look_stuck_waiting_for_a_moving_straggler_are_its_victims():
    # CPU ranks whose every sample lands in the same all_reduce: their exporters say stuck, yet the
    # straggler moves, so the job is slow, not hung.
    job = build_job("exp-42", parse_vector(job_payload(8, straggler=6, waiters_stuck=True)))
    assert sum(r.stuck for r in job.ranks) == 7
    j = judge(job)
    assert j.straggler is not None and j.straggler.slow.rank == 6 and j.straggler.waiting == 7
    assert not j.stuck and not j.never_arrives
    text = plain(job_lines(job, j, 100, "now", 5))
    assert "Straggler: rank 6 on node-000" in text and "STUCK" not in text and "Stuck:" not in text


def test_ranks_stuck_in_a_collective_with_no_rank_moving_stay_stuck():
    job = build_job("exp-42", parse_vector(job_payload(8, straggler=6, waiters_stuck=True)))
    frozen = build_job("exp-42", parse_vector(job_payload(8, stuck=6)))
    assert judge(frozen).straggler is None and len(judge(frozen).stuck) == 8
    # the same waiters without their mover (its exporter gone): stuck, and rank 6 unreported
    alone = build_job("exp-42", parse_vector(job_payload(8, straggler=6, waiters_stuck=True, missing=(6,))))
    j = judge(alone)
    assert j.straggler is None and len(j.stuck) == 7 and j.missing == (6,)
    assert judge(job).straggler is not None


def test_ranks_nobody_reports_are_named():
    job = build_job("exp-42", parse_vector(job_payload(16, missing=(5, 6, 7, 12))))
    assert judge(job).missing == (5, 6, 7, 12)
    assert "Not reported: ranks 5-7, 12 of 16" in plain(job_lines(job, judge(job), 100, "now", 5))


def test_even_ranks_no_straggler():
    job = build_job("exp-42", parse_vector(job_payload(32)))
    j = judge(job)
    assert j.straggler is None and not j.never_arrives and not j.stuck
    assert "No rank holds the others up" in plain(job_lines(job, j, 78, "now", 5))


def test_the_jobs_in_sight():
    jobs = job_summaries(parse_vector(load("jobs_list.json")))
    assert [(s.job, s.ranks, s.hosts, s.world_size, s.stuck) for s in jobs] == [
        ("10.0.0.7:29500", 1, 1, 2, 1), ("exp-42", 2, 2, 4, 0)]
    assert "exp-42" in plain(jobs_lines(jobs, "http://prom:9090"))


@pytest.mark.parametrize("name, why", [("error_bad_data.json", "bad_data: invalid parameter"),
                                       ("matrix.json", "expected an instant vector")])
def test_api_errors_are_one_line(name, why):
    with pytest.raises(ApiError, match=why):
        parse_vector(load(name))
    with pytest.raises(ApiError, match="not Prometheus"):
        parse_vector({"data": []})


def test_queries_quote_the_job():
    assert job_query('a"b\\c') == '{__name__=~"gputop_rank_.*",job_id="a\\"b\\\\c"}'
    assert quote("x\ny") == '"x\\ny"'


class _Prom(BaseHTTPRequestHandler):
    payloads: dict[str, dict] = {}

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        import urllib.parse

        q = urllib.parse.parse_qs(body)["query"][0]
        payload = self.payloads["job" if "job_id=" in q else "list"]
        if q.endswith("]") and payload.get("data", {}).get("resultType") == "vector":
            # a subquery: the same answer at every step of the last minute, as a steady job's
            payload = job_matrix([(TS - 60 + 5 * k, payload) for k in range(13)])
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


@pytest.fixture
def prom():
    _Prom.payloads = {"job": load("job_straggler.json"), "list": load("jobs_list.json")}
    srv = HTTPServer(("127.0.0.1", 0), _Prom)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()
    srv.server_close()


def test_the_command_once_and_the_list(prom, capsys):
    assert main(["job", "--prometheus", prom, "exp-42", "--once"]) == 0
    out = capsys.readouterr().out
    assert "Straggler: rank 3 on node-b" in out
    assert main(["job", "--prometheus", prom]) == 0
    assert "10.0.0.7:29500" in capsys.readouterr().out


def test_no_such_job_bad_url_unreachable_are_one_line_and_fail(prom, capsys):
    _Prom.payloads["job"] = {"status": "success", "data": {"resultType": "vector", "result": []}}
    assert main(["job", "--prometheus", prom, "nope", "--once"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no job 'nope'" in err and "exp-42" in err
    assert main(["job", "--prometheus", "ftp://x", "j"]) != 0
    assert "http(s) URL" in capsys.readouterr().err
    # a port nothing listens on (the fixture's server, shut down)
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    assert main(["job", "--prometheus", f"http://user:pw@127.0.0.1:{port}", "j", "--once"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot reach" in err and ":pw@" not in err
