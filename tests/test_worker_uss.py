"""The workers' private memory (USS/PSS): read by the host source only for the target's workers
(real child processes here), paced, spread, backed off by its cost, and skipped with one note
where the kernel has no smaps_rollup or permission is denied."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gputop.model import Event, ProcSample
from gputop.sources.host import USS_READS_PER_POLL, HostSource, PrivateMemory, _smaps_rollup


# --------------------------------------------------------------------------- the source


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def children():
    """Three real children of this process (the 'target' below): idle Pythons."""
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(3)]
    yield [p.pid for p in procs]
    for p in procs:
        p.kill()
        p.wait()


def _identity(pid, proc, created, now):
    return ("python", "me", "python -c ...")


def _polls(pm: PrivateMemory, clock: Clock, seconds: int, not_workers=frozenset()) -> list[tuple[float, object]]:
    out = []
    for _ in range(seconds):
        for s in pm.poll(clock.t, os.getpid(), set(not_workers), _identity):
            out.append((clock.t, s))
        clock.t += 1.0
    return out


def test_smaps_rollup_sums_as_psutil_does():
    import psutil

    got = _smaps_rollup(f"/proc/{os.getpid()}/smaps_rollup")
    full = psutil.Process().memory_full_info()
    # Two reads of a live process: its memory moves a little between them.
    assert got["uss"] == pytest.approx(full.uss, rel=0.05)
    assert got["pss"] == pytest.approx(full.pss, rel=0.05)
    assert got["rss"] == pytest.approx(full.rss, rel=0.05)


def test_only_the_workers_are_read_paced_and_spread(children):
    clock = Clock()
    pm = PrivateMemory(clock=clock, monotonic=clock)
    kept_out = children[0]  # say, a rank or a process holding a GPU: it trains, it is never read
    got = _polls(pm, clock, 60, not_workers={kept_out})
    samples = [(t, s) for t, s in got if isinstance(s, ProcSample)]
    pids = {s.pid for _, s in samples}
    assert pids == set(children[1:])  # never the target, never what the caller keeps out
    assert all(s.role == "worker" and s.uss and s.pss and s.rss and s.uss <= s.rss for _, s in samples)
    for pid in pids:
        times = [t for t, s in samples if s.pid == pid]
        # Every 12 s, not more often: 5 reads in 60 s.
        assert len(times) == 5 and all(b - a >= 12.0 for a, b in zip(times, times[1:]))
    # Spread: the two workers that came together are not read on the same poll.
    first = {s.pid: t for t, s in reversed(samples)}
    assert len(set(first.values())) == 2
    per_poll = {}
    for t, _ in samples:
        per_poll[t] = per_poll.get(t, 0) + 1
    assert max(per_poll.values()) <= USS_READS_PER_POLL
    # The first reading of a process has no CPU baseline: unknown, not 0 %.
    firsts = [s for t, s in samples if t == first[s.pid]]
    assert all(s.cpu_percent is None for s in firsts)
    assert all(s.cpu_percent is not None for t, s in samples if t != first[s.pid])


def test_a_slow_read_backs_off_and_is_said_once(children):
    clock = Clock()
    tick = [0.0]

    def timer() -> float:  # called before and after each read: each read costs 500 ms
        tick[0] += 0.5
        return tick[0]

    pm = PrivateMemory(clock=clock, monotonic=clock, timer=timer)
    got = _polls(pm, clock, 300)
    reads = [s for _, s in got if isinstance(s, ProcSample)]
    # 500 ms / 0.5 % = a read every 100 s, not every 12 s: 3 per worker in 300 s.
    assert len(reads) == 3 * 3
    said = [s for _, s in got if isinstance(s, Event)]
    assert len(said) == 1 and "took 500 ms" in said[0].message and "every 100 s" in said[0].message


def test_a_read_of_tens_of_milliseconds_keeps_the_period(children):
    """A 900 MB worker's read took 40-60 ms on a loaded 2-core host: at a thousandth of its time
    it was read every 40-120 s, too seldom to judge copy-on-read in minutes. At half a percent a
    60 ms read keeps the 12 s period."""
    clock = Clock()
    tick = [0.0]

    def timer() -> float:
        tick[0] += 0.06
        return tick[0]

    pm = PrivateMemory(clock=clock, monotonic=clock, timer=timer)
    got = _polls(pm, clock, 120)
    reads = [s for _, s in got if isinstance(s, ProcSample)]
    assert len(reads) >= 3 * 9  # every 12 s for each of the three workers


def test_no_rollup_means_no_reads_and_one_note(children, tmp_path):
    # A kernel before 4.14: /proc/PID has smaps but no smaps_rollup.
    for pid in children:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "smaps").write_text("")
    clock = Clock()
    pm = PrivateMemory(clock=clock, monotonic=clock, proc_root=str(tmp_path))
    got = _polls(pm, clock, 40)
    assert not [s for _, s in got if isinstance(s, ProcSample)]
    notes = [s for _, s in got if isinstance(s, Event)]
    assert len(notes) == 1 and "smaps_rollup" in notes[0].message


def test_permission_denied_is_said_once_and_reads_go_on_at_the_pace(children):
    calls = []

    def denied(path):
        calls.append(path)
        raise PermissionError(path)

    clock = Clock()
    pm = PrivateMemory(clock=clock, monotonic=clock, read=denied)
    got = _polls(pm, clock, 36)
    notes = [s for _, s in got if isinstance(s, Event)]
    assert len(notes) == 1 and "permission denied" in notes[0].message
    assert not [s for _, s in got if isinstance(s, ProcSample)]
    assert len(calls) == 3 * 3  # each worker tried once a period, not each poll


def test_the_host_source_reads_the_targets_workers_not_the_target(children):
    clock = Clock()
    pm = PrivateMemory(monotonic=clock)
    src = HostSource(pids=lambda: [os.getpid()], target_pid=os.getpid(), private=pm)
    seen = []
    for _ in range(13):
        seen += src.poll()
        clock.t += 1.0
    target = [s for s in seen if isinstance(s, ProcSample) and s.pid == os.getpid()]
    assert target and all(s.uss is None and s.pss is None for s in target)
    workers = [s for s in seen if isinstance(s, ProcSample) and s.pid in children]
    assert {s.pid for s in workers} == set(children) and all(s.uss for s in workers)


def test_without_nvml_busy_workers_listed_among_the_busiest_are_still_read(children, monkeypatch):
    # A host without NVML lists the busiest processes too; the workers are often among them, and
    # being busy does not make them the training process.
    clock = Clock()
    src = HostSource(pids=lambda: [os.getpid()], target_pid=os.getpid(), top_cpu=3,
                     private=PrivateMemory(monotonic=clock))
    monkeypatch.setattr(src, "_busiest", lambda n: set(children))
    seen = []
    for _ in range(13):
        seen += src.poll()
        clock.t += 1.0
    assert {s.pid for s in seen if isinstance(s, ProcSample) and s.uss} == set(children)
