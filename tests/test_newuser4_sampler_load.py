"""The stack sampler on a saturated host (load 4-8 on 2 cores): it throttled to 0.2-0.5 stacks/s
without a word, and its blocking dumps stopped the job while py-spy waited for a CPU (a dump's
10 ms of CPU took hundreds of ms of wall time, the job stopped throughout: 6-14 % of a 30 s
window). Now it takes no blocking dump there, runs py-spy at idle priority, and says that it is
held back, and why, beside the rate asked for.

py-spy is replaced by recorded dumps (as in tests/test_sampling_cost.py), so these run anywhere."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from gputop.analysis.classify import classify, is_library
from gputop.commands.advise import sampling_cost_text
from gputop.model import SamplingCost
from gputop.present import sampling_text
from gputop.sources import pyspy_binary
from gputop.sources import stacks as stacks_mod
from gputop.sources.host_cpu import HostCpu, parse_loadavg, parse_pressure
from gputop.sources.stacks import PySpySource

BUSY = HostCpu(cpus=2, load1=7.9, pressure_pct=45.0)
IDLE = HostCpu(cpus=2, load1=0.3, pressure_pct=0.0)
FRAMES = [{"name": "step", "filename": "/job/train.py", "line": 12}, {"name": "main", "filename": "/job/train.py",
                                                                      "line": 40}]


class SlowPySpy:
    """py-spy on a loaded host: each dump costs ``cpu_s`` of CPU and takes ``wall_s`` (the job
    stopped all that time when the dump is blocking)."""

    def __init__(self, pid: int, cpu_s: float, wall_s: float) -> None:
        self.pid, self.cpu_s, self.wall_s = pid, cpu_s, wall_s
        self.calls: list[tuple[bool, int]] = []  # (nonblocking, nice) per dump
        self.at: list[float] = []  # when, on the sampler's monotonic clock

    def __call__(self, pid, pyspy=None, nonblocking=False, meter=None, nice=0):
        self.calls.append((nonblocking, nice))
        self.at.append(stacks_mod.time.monotonic())
        if meter is not None:
            meter(self.wall_s, self.cpu_s)
        return [{"pid": pid, "thread_id": 1, "thread_name": "MainThread", "active": True, "owns_gil": True,
                 "os_thread_id": pid, "frames": FRAMES[len(self.calls) % 2:]}]


def run(monkeypatch, host: HostCpu, cpu_s: float, wall_s: float, seconds: float = 60.0):
    """The sampler polled as the pipeline polls it, on a monotonic clock of its own."""
    clock = [5000.0]
    monkeypatch.setattr(stacks_mod.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(stacks_mod.time, "thread_time", lambda: 0.0)  # only py-spy's CPU counts
    fake = SlowPySpy(os.getpid(), cpu_s, wall_s)
    monkeypatch.setattr(stacks_mod, "dump_json", fake)
    src = PySpySource(os.getpid(), classify=classify, is_library=is_library, pyspy="py-spy", host_cpu=lambda: host)
    while clock[0] < 5000.0 + seconds:
        src.poll()
        clock[0] += max(src.interval, wall_s)
    return src, fake


def test_a_saturated_host_gets_no_blocking_dump_and_idle_priority_py_spy(monkeypatch):
    src, fake = run(monkeypatch, BUSY, cpu_s=0.05, wall_s=0.4)
    assert fake.calls and all(nonblocking for nonblocking, _ in fake.calls)  # not even the first look
    # Past the attach burst (its CPU bounded, once: it buys the first verdict) py-spy yields the CPU.
    after = [nice for (_, nice), t in zip(fake.calls, fake.at) if t - 5000.0 >= stacks_mod.ATTACH_BURST_S]
    assert after and all(nice == pyspy_binary.NONBLOCKING_NICE for nice in after)
    cost = src.cost
    assert cost.pause_pct == 0 and cost.blocking == 0  # the job was never stopped
    assert cost.job_cpu_pct is not None  # what the sampler is weighed against
    # Its own CPU stays within its budget however slow py-spy is here.
    assert cost.sampler_cpu_pct <= 100 * stacks_mod.DEFAULT_CPU_BUDGET * 1.5
    # Held back, and why: what was asked, what came, the host's load.
    assert cost.asked_per_s == stacks_mod.DEFAULT_RATE and cost.stacks_per_s < 1.0
    assert cost.held_back == "host-busy" and cost.load1 == 7.9 and cost.cpus == 2


def test_the_same_costly_py_spy_on_an_idle_host_says_the_budget_holds_it_back(monkeypatch):
    src, fake = run(monkeypatch, IDLE, cpu_s=0.05, wall_s=0.02)
    assert not fake.calls[0][0]  # the first look is blocking: a consistent stack, no one waits
    assert all(nice == 0 for _, nice in fake.calls)
    assert src.cost.held_back == "cpu-budget"


def test_an_unhampered_sampler_is_not_called_held_back(monkeypatch):
    src, _ = run(monkeypatch, IDLE, cpu_s=0.008, wall_s=0.01)
    assert src.cost.held_back is None and src.cost.stacks_per_s >= 1.0


def test_the_status_line_and_advise_say_sampling_is_held_back_and_why():
    cost = SamplingCost(ts=0.0, pid=1, window_s=30.0, stacks_per_s=0.3, sampler_cpu_pct=0.8, pause_pct=0.0,
                        job_cost_pct=0.4, asked_per_s=5.0, held_back="host-busy", load1=7.9, cpus=2,
                        cpu_pressure_pct=45.0, job_cpu_pct=20.0)
    line = sampling_text(cost)
    assert line.startswith("sampling held back to 0.3 of 5 stacks/s (host CPUs saturated: load 7.9 on 2 CPUs)")
    note = sampling_cost_text(cost)
    assert "held back to 0.3 of 5 stacks/s asked" in note and "tasks waited for a CPU 45 % of the time" in note
    assert "idle priority" in note and "no blocking dump" in note
    assert "0.8 % of a core (4 % of the CPU the job itself used)" in note  # the job got a fifth of a core


def test_the_host_reading_is_parsed_from_proc():
    assert parse_loadavg("7.91 5.02 3.10 9/812 4242\n") == 7.91
    assert parse_pressure("some avg10=45.10 avg60=30.00 avg300=20.00 total=1\nfull avg10=0.00 avg60=0.00 "
                          "avg300=0.00 total=0\n") == 45.1
    assert HostCpu(cpus=2, load1=7.9).saturated and not HostCpu(cpus=2, load1=1.5).saturated
    # Pressure, where the kernel has it, says it better than the load (blocked IO counts in the load).
    assert not HostCpu(cpus=2, load1=7.9, pressure_pct=3.0).saturated
    assert HostCpu(cpus=16, load1=2.0, pressure_pct=40.0).saturated


def test_cpus_to_spare_need_two_idle_by_the_load_and_no_waiting():
    # Spare (the sampler may take the rate asked for): two CPUs idle by the load...
    assert HostCpu(cpus=16, load1=3.0).spare and HostCpu(cpus=16, load1=3.0, pressure_pct=1.0).spare
    assert not HostCpu(cpus=2, load1=0.3, pressure_pct=0.0).spare  # a 2-core host never has two idle
    assert not HostCpu(cpus=16, load1=14.5).spare
    # ...and, where the kernel says, tasks seldom waiting for a CPU (a job's bursts can).
    assert not HostCpu(cpus=16, load1=3.0, pressure_pct=12.0).spare
    assert not HostCpu(cpus=16).spare  # no load reading: not known to be spare


def test_attaching_checks_the_job_with_a_nonblocking_dump(monkeypatch):
    calls = []

    def fake(pid, pyspy=None, nonblocking=False, meter=None, nice=0):
        calls.append(nonblocking)
        return []

    monkeypatch.setattr(pyspy_binary, "dump_json", fake)
    pyspy_binary.check_attachable(os.getpid(), pyspy="py-spy")
    assert calls == [True]  # the job is not stopped just to see whether it can be read


def test_an_idle_priority_dump_really_runs_below_gputop(tmp_path):
    # A stand-in for py-spy that says the priority it runs at (once lowered: that comes just after
    # it starts).
    exe = tmp_path / "py-spy"
    exe.write_text(f"#!{sys.executable}\n"
                   "import json, os, time\n"
                   "for _ in range(500):\n"
                   "    if os.getpriority(os.PRIO_PROCESS, 0) > 0: break\n"
                   "    time.sleep(0.01)\n"
                   "print(json.dumps([{'nice': os.getpriority(os.PRIO_PROCESS, 0)}]))\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    base = os.getpriority(os.PRIO_PROCESS, 0)
    got = pyspy_binary.dump_json(os.getpid(), str(exe), nonblocking=True, nice=pyspy_binary.NONBLOCKING_NICE)
    assert got[0]["nice"] == min(19, base + pyspy_binary.NONBLOCKING_NICE)
    if base < 19:
        # A blocking dump keeps gputop's priority: the job is stopped until it ends.
        exe.write_text(f"#!{sys.executable}\nimport json, os\nprint(json.dumps([{{'nice': os.getpriority(os.PRIO_PROCESS, 0)}}]))\n")
        assert pyspy_binary.dump_json(os.getpid(), str(exe), nonblocking=False, nice=19)[0]["nice"] == base


@pytest.mark.parametrize("host", [BUSY, IDLE])
def test_the_cost_event_is_said_once_whatever_the_host(monkeypatch, host):
    from gputop.model import Event

    clock = [5000.0]
    monkeypatch.setattr(stacks_mod.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(stacks_mod.time, "thread_time", lambda: 0.0)
    monkeypatch.setattr(stacks_mod, "dump_json", SlowPySpy(os.getpid(), 0.01, 0.01))
    src = PySpySource(os.getpid(), classify=classify, is_library=is_library, pyspy="py-spy", host_cpu=lambda: host)
    said = []
    while clock[0] < 5030.0:
        said += [e for e in src.poll() if isinstance(e, Event) and "costs the job" in e.message]
        clock[0] += src.interval
    assert len(said) == 1


class _Times:
    def __init__(self, user):
        self.user, self.system = user, 0.0


class _Proc:
    def __init__(self, cpu):
        self.cpu = cpu

    def cpu_times(self):
        if self.cpu is None:
            raise ProcessLookupError
        return _Times(self.cpu)


def test_the_job_the_sampler_is_weighed_against_is_the_whole_family():
    # A torchrun launcher uses 3 % of a core, its ranks 9 % and 62 %: the launcher alone made
    # gputop's sampler "51 % of the CPU the job itself used".
    import os

    src = stacks_mod.PySpySource(os.getpid(), pyspy="/bin/true")
    launcher, r0, r1 = _Proc(1.0), _Proc(10.0), _Proc(50.0)
    src._proc, src._procs = launcher, {src.pid: launcher, 101: r0, 102: r1}
    src._cpu_seen, src._cpu_gone = {}, 0.0  # what the source read of this process at its start
    assert src._job_cpu() == 61.0
    r1.cpu = 60.0
    assert src._job_cpu() == 71.0
    # a rank that ends keeps what it used: the total never goes back
    del src._procs[102]
    r0.cpu = 12.0
    assert src._job_cpu() == 73.0
    r0.cpu = None  # one failed read of a rank still in the family: its last figure stands
    assert src._job_cpu() == 73.0
    r0.cpu = 13.0  # read again: counted once
    assert src._job_cpu() == 74.0
    launcher.cpu = None  # the target gone: nothing to weigh against
    assert src._job_cpu() is None


def test_workers_are_sampled_on_their_turn_when_the_budget_paces_the_main_thread(monkeypatch):
    # The main thread's dumps are paced to spend the CPU budget; a worker dumped after one found
    # it spent at every turn: a job's workers were sampled once at attach, never again, and a
    # worker that hung later was explained with the stack it had at attach.
    clock = [5000.0]
    monkeypatch.setattr(stacks_mod.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(stacks_mod.time, "thread_time", lambda: 0.0)
    fake = SlowPySpy(os.getpid(), cpu_s=0.05, wall_s=0.02)  # costly dumps: the budget holds the rate back
    monkeypatch.setattr(stacks_mod, "dump_json", fake)
    src = PySpySource(os.getpid(), clock=lambda: clock[0], classify=classify, is_library=is_library,
                      pyspy="py-spy", host_cpu=lambda: IDLE)
    workers = [os.getpid() + 100_001, os.getpid() + 100_002]
    monkeypatch.setattr(src, "_proc_samples", lambda now: [])
    src._workers = list(workers)
    dumped: list[int] = []
    real = fake.__call__

    def counting(pid, *args, **kw):
        dumped.append(pid)
        return real(pid, *args, **kw)

    monkeypatch.setattr(stacks_mod, "dump_json", counting)
    while clock[0] < 5060.0:
        src.poll()
        clock[0] += max(src.interval, 0.02)
    per_worker = [dumped.count(w) for w in workers]
    # one worker every 3 s in turn: ~10 each over a minute (not 1 each at attach)
    assert all(n >= 8 for n in per_worker), per_worker
    assert src.cost is not None and src.cost.held_back == "cpu-budget"  # the budget did pace it


def test_workers_are_dumped_every_second_over_the_first_verdicts_window_then_every_three(monkeypatch):
    # Four workers fetching rows one by one were told "add workers" for 10 s: the finding that
    # reads their stacks needs two, and one came every 3 s.
    clock = [5000.0]
    monkeypatch.setattr(stacks_mod.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(stacks_mod.time, "thread_time", lambda: 0.0)
    monkeypatch.setattr(stacks_mod, "dump_json", SlowPySpy(os.getpid(), 0.001, 0.001))
    src = PySpySource(os.getpid(), classify=classify, is_library=is_library, pyspy="py-spy", host_cpu=lambda: IDLE,
                      clock=lambda: clock[0])
    dumped: list[float] = []
    monkeypatch.setattr(src, "_proc_samples", lambda now, first=False: [])
    monkeypatch.setattr(src, "_sample_worker", lambda wpid: dumped.append(clock[0] - 5000.0) or [])
    src._workers = [11, 12, 13, 14]
    while clock[0] < 5030.0:
        src.poll()
        clock[0] += src.interval
    early = [t for t in dumped if t < stacks_mod.ATTACH_WORKERS_S]
    late = [t for t in dumped if t >= stacks_mod.ATTACH_WORKERS_S + 1]
    assert len(early) >= 8, dumped  # every second, all four workers twice
    gaps = [b - a for a, b in zip(late, late[1:])]
    assert gaps and min(gaps) >= stacks_mod.WORKER_INTERVAL_S - 0.01, dumped
