"""Stack sampling that stays within its budgets: thread ids and on-CPU flags where
``--nonblocking`` loses them, blocking dumps only where a consistent stack matters, the cost
measured and shown; and the attach-cost benchmark's statistics.

py-spy is replaced by recorded dump records (``dump_json``), so these run anywhere; the live
tests (tests/test_stacks_live.py) run the real py-spy with the same defaults.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time

import pytest

pytest.importorskip("psutil")

from gputop.analysis.classify import classify, is_library  # noqa: E402
from gputop.model import Category, Event, SamplingCost, StackSample  # noqa: E402
from gputop.sources import stacks as stacks_mod  # noqa: E402
from gputop.sources.host_cpu import HostCpu  # noqa: E402
from gputop.sources.stacks import PySpySource, job_cost_pct, thread_on_cpu  # noqa: E402

QUEUE_WAIT = [
    {"name": "wait", "filename": "/usr/lib/python3/threading.py", "line": 331},
    {"name": "get", "filename": "/usr/lib/python3/queue.py", "line": 180},
    {"name": "_MultiProcessingDataLoaderIter._get_data", "filename": "/x/torch/utils/data/dataloader.py",
     "line": 1300},
    {"name": "_BaseDataLoaderIter.__next__", "filename": "/x/torch/utils/data/dataloader.py", "line": 700},
    {"name": "train", "filename": "/job/train.py", "line": 42},
]


def record(pid: int, thread_id: int, frames, os_tid=None, active=True, name="MainThread") -> dict:
    r = {"pid": pid, "thread_id": thread_id, "thread_name": name, "frames": frames, "active": active,
         "owns_gil": False}
    if os_tid is not None:
        r["os_thread_id"] = os_tid
    return r


class FakePySpy:
    """Stands in for ``dump_json``: returns the next recorded dump and remembers the mode."""

    def __init__(self, dumps, cpu_s: float = 0.004, wall_s: float = 0.01) -> None:
        self.dumps = dumps
        self.calls: list[bool] = []  # nonblocking flag per call
        self.nice: list[int] = []  # how far below gputop's priority py-spy ran, per call
        self.cpu_s, self.wall_s = cpu_s, wall_s

    def __call__(self, pid, pyspy=None, nonblocking=False, meter=None, nice=0):
        self.calls.append(nonblocking)
        self.nice.append(nice)
        if meter is not None:
            meter(self.wall_s, self.cpu_s)
        d = self.dumps(len(self.calls) - 1, nonblocking)
        return [dict(r) for r in d]


@pytest.fixture
def me():
    return os.getpid()


def source(monkeypatch, fake, pid, **kw) -> PySpySource:
    monkeypatch.setattr(stacks_mod, "dump_json", fake)
    # A host with CPUs to spare unless a test says otherwise: these runs must not depend on how
    # busy the machine running them is (tests/test_newuser4_sampler_load.py covers a busy one).
    kw.setdefault("host_cpu", lambda: HostCpu(cpus=16, load1=0.5))
    return PySpySource(pid, classify=classify, is_library=is_library, pyspy="py-spy", **kw)


def test_nonblocking_dumps_keep_thread_ids_and_take_the_on_cpu_flag_from_proc(monkeypatch, me):
    # The first (blocking) dump names the kernel thread; later nonblocking ones lose it.
    tid = threading.get_native_id()
    def dumps(i, nonblocking):
        return [record(me, 7, QUEUE_WAIT, os_tid=None if nonblocking else tid, active=True)]

    fake = FakePySpy(dumps)
    src = source(monkeypatch, fake, me, rate=100.0)
    first = [s for s in src.poll() if isinstance(s, StackSample)]
    second = [s for s in src.poll() if isinstance(s, StackSample)]
    assert fake.calls == [False, True]  # a blocking first look, then nonblocking
    assert first[0].os_thread_id == second[0].os_thread_id == tid
    assert second[0].is_main is (tid == me)
    # This thread is running now (state R), so py-spy's "active" stands, and the category is the
    # blocking dump's.
    assert thread_on_cpu(me, tid) is True
    assert second[0].active and first[0].category is second[0].category is Category.DATA_WAIT


def test_a_sleeping_thread_is_idle_when_the_flag_comes_from_proc(monkeypatch, me):
    stop = threading.Event()
    ids = {}

    def sleeper():
        ids["tid"] = threading.get_native_id()
        stop.wait()

    t = threading.Thread(target=sleeper, daemon=True)
    t.start()
    while "tid" not in ids:
        time.sleep(0.01)
    time.sleep(0.05)
    try:
        def dumps(i, nonblocking):
            return [record(me, 9, QUEUE_WAIT, os_tid=None if nonblocking else ids["tid"], active=True,
                           name="Thread-1")]

        src = source(monkeypatch, FakePySpy(dumps), me, rate=100.0)
        src.poll()
        s = [x for x in src.poll() if isinstance(x, StackSample)][0]
        assert s.os_thread_id == ids["tid"]
        assert s.active is False  # blocked in a wait: idle, as py-spy would have said
        assert s.category is Category.DATA_WAIT
    finally:
        stop.set()


def test_an_unknown_thread_gets_one_blocking_dump_then_nonblocking_again(monkeypatch, me):
    def dumps(i, nonblocking):
        rows = [record(me, 1, QUEUE_WAIT, os_tid=None if nonblocking else me)]
        if i >= 2:  # a new thread appears, py-spy cannot name its kernel id without blocking
            rows.append(record(me, 2, QUEUE_WAIT, os_tid=None if nonblocking else me + 1, name="pin"))
        return rows

    fake = FakePySpy(dumps)
    src = source(monkeypatch, fake, me, rate=100.0)
    for _ in range(5):
        src.poll()
    assert fake.calls == [False, True, True, False, True]


def test_an_unchanged_main_stack_is_confirmed_with_a_blocking_dump(monkeypatch, me):
    clock = [1000.0]
    monkeypatch.setattr(stacks_mod.time, "monotonic", lambda: clock[0])
    # The first look (blocking) sees one stack; from the second dump on the stack holds.
    fake = FakePySpy(lambda i, nb: [record(me, 1, QUEUE_WAIT[1:] if i == 0 else QUEUE_WAIT, os_tid=me)])
    src = source(monkeypatch, fake, me, rate=100.0)
    for _ in range(10):
        src.poll()
        clock[0] += 0.5
    # One confirmation, once the new stack held CONFIRM_AFTER_S; nonblocking otherwise.
    assert fake.calls.count(False) == 2 and fake.calls[0] is False
    assert (fake.calls.index(False, 1) - 1) * 0.5 >= stacks_mod.CONFIRM_AFTER_S


def test_the_cpu_budget_sets_the_rate_and_the_cost_is_measured_and_said(monkeypatch, me):
    clock = [1000.0]
    monkeypatch.setattr(stacks_mod.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(stacks_mod.time, "thread_time", lambda: 0.0)  # only py-spy's CPU counts
    fake = FakePySpy(lambda i, nb: [record(me, 1, QUEUE_WAIT[i % 2:], os_tid=me)], cpu_s=0.010)
    # A busy host, not saturated, with no CPU to spare: the budget as given.
    src = source(monkeypatch, fake, me, rate=5.0, cpu_budget=0.015, host_cpu=lambda: HostCpu(cpus=16, load1=15.0))
    events = []
    for _ in range(600):  # 120 s of polls every 0.2 s
        events += [e for e in src.poll() if isinstance(e, Event)]
        clock[0] += 0.2
    cost = src.cost
    assert isinstance(cost, SamplingCost)
    # Steady state: 1.5 % of a core at 10 ms a dump is 1.5 dumps/s, whatever the asked rate.
    assert cost.sampler_cpu_pct == pytest.approx(1.5, abs=0.4)
    assert cost.stacks_per_s == pytest.approx(1.5, abs=0.4)
    assert cost.job_cost_pct == pytest.approx(job_cost_pct(cost.sampler_cpu_pct, cost.pause_pct))
    said = [e for e in events if "costs the job about" in e.message]
    assert len(said) == 1 and said[0].level == "info"


def test_a_host_with_cpus_to_spare_gets_the_rate_asked_for(monkeypatch, me):
    """Nonblocking dumps on an idle CPU take nothing from the job: there the budget grows
    (SPARE_BUDGET_FACTOR) and the asked 5/s comes instead of the busy host's 1.5/s; when the
    host fills up the budget falls back."""
    clock = [1000.0]
    monkeypatch.setattr(stacks_mod.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(stacks_mod.time, "thread_time", lambda: 0.0)
    fake = FakePySpy(lambda i, nb: [record(me, 1, QUEUE_WAIT[i % 2:], os_tid=me)], cpu_s=0.010)
    host = [HostCpu(cpus=16, load1=0.5)]
    src = source(monkeypatch, fake, me, rate=5.0, cpu_budget=0.015, host_cpu=lambda: host[0])

    def run(seconds: float) -> int:
        # As the pipeline drives a source: the next poll after the interval it asks for.
        before, end = len(fake.calls), clock[0] + seconds
        while clock[0] < end:
            src.poll()
            clock[0] += src.interval
        return len(fake.calls) - before

    run(10.0)  # past the attach burst
    assert run(60.0) / 60.0 == pytest.approx(5.0, abs=0.5)  # the rate asked for, not the budget's 1.5
    host[0] = HostCpu(cpus=16, load1=15.0)  # the job's workers take the CPUs
    run(10.0)
    assert run(60.0) / 60.0 == pytest.approx(1.5, abs=0.4)


def test_job_cost_is_the_pause_plus_the_samplers_share_of_the_cores():
    assert job_cost_pct(2.0, 0.1, cpus=16) == pytest.approx(0.225)
    assert job_cost_pct(0.0, 0.0, cpus=1) == 0.0


def test_advise_and_the_status_line_say_what_sampling_costs():
    from gputop.commands.advise import sampling_cost_text

    c = SamplingCost(ts=0.0, pid=1, window_s=30.0, stacks_per_s=1.4, sampler_cpu_pct=1.5, pause_pct=0.02,
                     job_cost_pct=0.114)
    text = sampling_cost_text(c)
    assert text.startswith("sampling costs the job about 0.11 %") and "1.5 % of a core" in text
    import inspect

    from gputop.present import sampling_text
    from gputop.ui import app

    assert sampling_text(c) == "sampling costs the job about 0.11 %"
    assert "sampling_text(cost)" in inspect.getsource(app.GputopApp._update_status)


def test_sample_rate_option_reaches_the_sampler(monkeypatch):
    from gputop.cli import main as cli_main  # noqa: F401  (the parser is built there)
    from gputop.commands.options import sample_rate_arg
    import argparse

    assert sample_rate_arg("2.5") == 2.5
    for bad in ("0", "nan", "100", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            sample_rate_arg(bad)
    from gputop import session

    seen = {}
    monkeypatch.setattr(session, "stack_sampler", lambda pid, **kw: seen.update(kw) or object())
    monkeypatch.setattr("gputop.sources.check_attachable", lambda pid, pyspy=None: "py-spy")  # the face session imports it from
    s = session.open_live(session.Config(fake=1, pid=os.getpid(), sample_rate=0.5))
    try:
        assert seen.get("rate") == 0.5
    finally:
        s.pipeline.stop()


# --------------------------------------------------------------------------- the benchmark's statistics


def _bench():
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench", "attach_cost.py")
    spec = importlib.util.spec_from_file_location("attach_cost", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["attach_cost"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_bench_pairs_each_attached_window_with_its_neighbours_so_a_linear_drift_cancels():
    b = _bench()
    # Detached rates drift up by 10 per window; attached windows run 2 % below the drift line.
    rates = [100 + 10 * i if i % 2 == 0 else (100 + 10 * i) * 0.98 for i in range(9)]
    assert b.paired_slowdowns(rates) == pytest.approx([2.0] * 4)
    assert b.paired_differences([0.1, 0.5, 0.1, 0.3, 0.1]) == pytest.approx([0.4, 0.2])
    with pytest.raises(ValueError):
        b.paired_slowdowns([1.0, 2.0])


def test_bench_intervals_cover_the_mean_and_narrow_with_more_pairs():
    b = _bench()
    import random

    rng = random.Random(3)
    small = [0.3 + rng.gauss(0, 1) for _ in range(8)]
    big = [0.3 + rng.gauss(0, 1) for _ in range(200)]
    for xs in (small, big):
        lo, hi = b.bootstrap_ci(xs)
        tlo, thi = b.t_ci(xs)
        m = sum(xs) / len(xs)
        assert lo < m < hi and tlo < m < thi
    assert (b.bootstrap_ci(big)[1] - b.bootstrap_ci(big)[0]) < (b.bootstrap_ci(small)[1] - b.bootstrap_ci(small)[0])
    # The t interval for n=2 uses t(1) = 12.706.
    lo, hi = b.t_ci([0.0, 2.0])
    assert (hi - lo) / 2 == pytest.approx(12.706 * 2 ** 0.5 / 2 ** 0.5, rel=1e-3)
    s = b.summarize([100, 99, 100, 99, 100], [0.0, 0.1, 0.0, 0.1, 0.0])
    assert s["slowdown_pct"] == pytest.approx(1.0) and s["lost_pct"] == pytest.approx(0.1)
    assert s["pairs"] == 2
