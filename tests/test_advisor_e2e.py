"""End to end on CPU: a real workload, real py-spy and psutil, the real pipeline and advisor.

Without a GPU the training thread's own time line stands in for the device, so the scenarios
that a CPU shows are diagnosed here exactly as on a GPU machine (bench/advisor_bench.py runs all
of them on CUDA).
"""

import importlib.util
import time

import pytest

from gputop.errors import UserError
from gputop.model import Severity

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the workloads need torch"),
]


def watch(scenario: str, seconds: float, stuck_after: float = 30.0, past_warmup: bool = False):
    import psutil

    from gputop.advisor.context import WARMUP_AGE_S
    from gputop.commands.demo import start_workload
    from gputop.session import Config, open_live

    work = start_workload(scenario, "cpu")
    session = None
    try:
        work.wait_ready(120)
        if past_warmup:
            # Throughput findings wait out a job's first seconds: attach once they are over.
            age = time.time() - psutil.Process(work.pid).create_time()
            time.sleep(max(0.0, WARMUP_AGE_S + 0.5 - age))
        try:
            session = open_live(Config(pid=work.pid, stuck_after=stuck_after, window=60.0))
        except UserError as exc:  # no ptrace permission here
            pytest.skip(f"cannot attach py-spy: {exc}")
        advisor = session.advisor
        session.pipeline.start()
        time.sleep(seconds)
        session.pipeline.stop()
        return session.store.findings(), advisor
    finally:
        if session is not None:
            session.pipeline.stop()
        work.stop()


def blocking(findings):
    return [f for f in findings if f.severity is not Severity.INFO]


@pytest.mark.timeout(90)
def test_dataloader_starved_is_diagnosed():
    # 10 s: the sampler takes fewer stacks when py-spy costs more CPU (a loaded 2-core machine)
    findings, advisor = watch("dataloader-starved", 10.0, past_warmup=True)
    assert findings and findings[0].id == "data-starved", [f.id for f in findings]
    f = findings[0]
    assert "num_workers=" in f.action
    assert any("__getitem__" in e or "data.py" in e for e in f.evidence)
    assert advisor.history["data-starved"][0] - advisor.store.now < 0


@pytest.mark.timeout(90)
def test_stuck_job_is_diagnosed():
    # the CPU variant stalls 1 s after it is ready
    findings, _ = watch("stuck", 8.0, stuck_after=3.0)
    assert findings and findings[0].id == "stuck", [f.id for f in findings]
    assert findings[0].severity is Severity.CRITICAL
    assert "timeout=" in findings[0].action


@pytest.mark.timeout(90)
def test_healthy_job_raises_no_warning():
    findings, advisor = watch("healthy", 9.0)  # 4+ evaluations at the 2 s cadence
    assert blocking(findings) == [], [(f.id, f.evidence) for f in findings]
    assert advisor.evaluations >= 4
