"""A rank's throttled GPU across hosts: the exporter ties its GPU's limiting throttle reasons to
the rank (gputop_rank_gpu_throttled), and the job view shows it beside the rank, on its host line,
and in the verdict: under the straggler as its cause, or on a line of its own."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")

from gputop.fleet import build_job, judge, parse_vector  # noqa: E402
from gputop.model import GpuProcess, GpuSample  # noqa: E402
from gputop.present.job import job_lines, plain  # noqa: E402

from job_series import job_payload  # noqa: E402
from synth import T0  # noqa: E402
from test_export_job import PIDS, four_ranks, identify_on, scrape  # noqa: E402

SW_POWER_CAP, HW_THERMAL, GPU_IDLE = 0x4, 0x40, 0x1
HOSTS = {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}


def test_the_exporter_ties_a_gpus_throttling_to_its_rank():
    store = four_ranks()
    # rank 1's GPU power-capped in every busy poll, rank 2's idle-clocked (not a limit), the rest clean
    for k in range(1, 19):  # an NVML poll a second: each GPU and the rank on it
        store.add([*(GpuSample(T0 + k, g, util_gpu=100.0,
                               throttle_reasons={1: SW_POWER_CAP | HW_THERMAL, 2: GPU_IDLE}.get(g, 0)) for g in range(4)),
                   *(GpuProcess(T0 + k, g, PIDS[g], used_memory=1 << 30) for g in range(4))])
    _, m = scrape(store, identify_on(HOSTS))
    got = sorted((s.labels["rank"], s.labels["reason"], s.value) for s in m["gputop_rank_gpu_throttled"])
    assert got == [("1", "hw_thermal", 1.0), ("1", "power_cap", 1.0)]
    assert {s.labels["job_id"] for s in m["gputop_rank_gpu_throttled"]} == {"node-a:29500"}


def test_no_throttling_no_series():
    _, m = scrape(four_ranks(), identify_on(HOSTS))
    assert "gputop_rank_gpu_throttled" not in m


def view(**kw):
    job = build_job("exp-42", parse_vector(job_payload(8, per_host=4, **kw)))
    return job, judge(job), plain(job_lines(job, judge(job), 120, "now", 5))


def test_the_stragglers_throttled_gpu_is_its_evidence():
    job, j, text = view(straggler=5, throttled={5: ("power_cap",)})
    assert j.straggler.slow.rank == 5 and [r.rank for r in j.throttled] == [5]
    assert "its GPU is power-capped: the same work takes it longer (the others' are not)" in text
    assert "Throttled:" not in text  # said under the straggler, not twice
    line = next(x for x in text.splitlines() if x.lstrip().startswith("5 SLOW"))
    assert "GPU power-capped" in line
    assert "node-001 · 4 ranks · 1 slow · 3 waiting · 1 GPU throttled" in text


def test_a_throttled_gpu_that_holds_nobody_up_is_still_said():
    job, j, text = view(throttled={2: ("power_cap",), 3: ("power_cap",), 6: ("hw_thermal", "sw_thermal")})
    assert j.straggler is None
    assert "No rank holds the others up" in text
    assert ("Throttled: ranks 2-3's GPUs on node-000 are power-capped · rank 6's GPU on node-001 is "
            "thermal-throttled") in text
    assert "node-000 · 4 ranks · 4 waiting · 2 GPUs throttled" in text


def test_at_80_columns_the_throttle_beats_the_top_finding():
    job = build_job("exp-42", parse_vector(job_payload(8, per_host=4, straggler=5, throttled={5: ("power_cap",)})))
    text = plain(job_lines(job, judge(job), 77, "now", 5))
    line = next(x for x in text.splitlines() if x.lstrip().startswith("5 SLOW"))
    assert line.endswith(" · GPU power-capped") and len(line) <= 77
