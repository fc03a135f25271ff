"""End to end across two "hosts": 4-rank torchrun gloo jobs on CPU, each split over two nodes whose
exporters (`gputop export --attach all`, one per host, on 127.0.0.2 and 127.0.0.3) a real
Prometheus scrapes; `gputop job --prometheus ... --once` names the straggler rank and host with
its phase, and in a second job the rank that never arrives.

The two jobs run side by side (starting torch is most of their cost): the straggler is rank 3
(node-b), building its batch in slow Python while the others wait in all_reduce; in the other job
rank 1 (node-a) sleeps instead of reaching the all_reduce. Needs torch and the `prometheus`
binary (Debian's package; `.ci/run` installs both); skipped without them. Marked ``e2e``
(``-m 'not e2e'`` leaves it out).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("prometheus_client")

from two_hosts import PROMETHEUS, TwoHosts, verdict, view  # noqa: E402

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(PROMETHEUS is None,
                       reason="no `prometheus` binary on PATH (apt-get install prometheus; CI installs it)"),
]

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "gputop-job.json"
JOBS = {"e2e-straggler": ("straggler", 3), "e2e-hang": ("hang", 1)}
DEADLINE_S = 150  # a loaded 2-core CI machine named the hang at 68 s; an idle one names both in about 30 s


def _named(api: str) -> dict[str, object]:
    out = {}
    got = verdict(api, "e2e-straggler")
    # Named once all three others are sampled enough to count (the judge may speak earlier, on fewer).
    if got is not None and got[1].straggler is not None and got[1].straggler.waiting == 3:
        out["straggler"] = got
    got = verdict(api, "e2e-hang")
    if got is not None and got[1].never_arrives:
        out["hang"] = got
    return out


def _dashboard_answers(api: str, job: str) -> dict[str, int]:
    """Every query of the job dashboard against the real server: panel title -> series answered
    (a query that does not parse fails here)."""
    out = {}
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for t in panel.get("targets", []):
            expr = t["expr"].replace("$job_id", job)
            url = f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
            with urllib.request.urlopen(url, timeout=5) as r:
                body = json.load(r)
            assert body["status"] == "success", (expr, body)
            out[f"{panel['title']}/{t['refId']}"] = len(body["data"]["result"])
    return out


def test_job_view_names_the_straggler_and_the_rank_that_never_arrives_across_two_hosts(tmp_path):
    with TwoHosts(tmp_path, JOBS, stuck_after=3.0) as hosts:
        named: dict[str, object] = {}
        while len(named) < 2:
            hosts.check_alive()
            assert time.monotonic() - hosts.t0 < DEADLINE_S, (named, view(hosts.api, "e2e-straggler")[0],
                                                              view(hosts.api, "e2e-hang")[0])
            for k, v in _named(hosts.api).items():
                if k not in named:
                    named[k] = v
                    print(f"{k} named {time.monotonic() - hosts.t0:.1f} s after the jobs started")
            time.sleep(1.0)
        took = time.monotonic() - hosts.t0
        # The command's own text, once: it judges the same past minute through the same hold
        # rule, and a finding on show is cleared only after 20 s without it, so the run a moment
        # after the in-process verdict says the same (no polling for it). The two runs go side by
        # side (each is mostly a fresh interpreter starting).
        with ThreadPoolExecutor(max_workers=2) as pool:
            slow_view = pool.submit(view, hosts.api, "e2e-straggler")
            hang_view = pool.submit(view, hosts.api, "e2e-hang")
            (slow_text, _), (hang_text, _) = slow_view.result(), hang_view.result()
        dash_slow = _dashboard_answers(hosts.api, "e2e-straggler")
        dash_hang = _dashboard_answers(hosts.api, "e2e-hang")

    # The job dashboard's panels answer for the job: 4 ranks x 5 phases, the straggler's hot line,
    # the hung job's stuck ranks with where they stand.
    assert dash_slow["Ranks × phases/A"] == 20 and dash_slow["Ranks reported/A"] == 1, dash_slow
    assert dash_slow["The straggler candidate: the least-waiting rank and its hot line/A"] == 1, dash_slow
    assert dash_hang["Stuck ranks, where they stand/B"] >= 1, dash_hang
    # the panels of the newer series parse and answer (gloo on CPU: no throttling, no NCCL counts)
    assert dash_slow["Ranks still starting/A"] == 1, dash_slow
    assert dash_slow["Throttled GPUs, by rank/A"] == 0 and dash_slow["NCCL: operations behind the lead, by rank/A"] == 0

    job, judgement = named["straggler"]
    assert {r.rank: r.host for r in job.ranks} == {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}
    s = judgement.straggler
    assert (s.slow.rank, s.slow.host) == (3, "node-b") and s.waiting == 3
    assert s.slow.main_phase()[0] == "data" or "load_batch" in s.slow.hot, (s.slow.main_phase(), s.slow.hot)
    # The command's own text says the same, with the phase and line.
    assert "Straggler: rank 3 on node-b for " in slow_text, slow_text
    assert "load_batch (tests/rank_job.py:" in slow_text and "all_reduce" in slow_text, slow_text
    # The host lines count the ranks as the verdict has them (their exporters call the waiters stuck).
    assert "node-a · 2 ranks · 2 waiting" in slow_text and "node-b · 2 ranks · 1 slow · 1 waiting" in slow_text

    job, judgement = named["hang"]
    assert [(n.rank.rank, n.rank.host) for n in judgement.never_arrives] == [(1, "node-a")]
    assert "Never arrives: rank 1 on node-b" not in hang_text
    assert "Never arrives: rank 1 on node-a" in hang_text and "never_arrives" in hang_text, hang_text
    assert "3 ranks wait for it" in hang_text, hang_text
    assert "node-a · 2 ranks · 1 never arrives · 1 waiting" in hang_text, hang_text
    assert "node-b · 2 ranks · 2 waiting" in hang_text, hang_text
    print(f"both named {took:.1f} s after the jobs started")
