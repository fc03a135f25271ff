"""The trainer waits for data while its loader workers wait too, off the CPU inside their fetch in
the Dataset's own code (a sleep, a remote read): more workers overlap the waits.

The new user's starved.py with num_workers=2 (each __getitem__ sleeps 4 ms) waited for data
95-100 % of the time and got "No findings"; with 4 workers it measured 2.0x (29 -> 56.6-58.4
steps/s). io-bound did not count a sleeping worker as blocked, workers-saturated wants workers at
a full core, data-starved wants none."""

from __future__ import annotations

from synth import Job, rule_findings, stack

from gputop.advisor.rules.base import bounded, wait_bound
from gputop.model import Category as C
from gputop.model import Frame

LIB = "/usr/lib/python3.11/site-packages/torch/utils/data"
FETCH = (Frame("DS.__getitem__", "/home/u/starved.py", 8, code="time.sleep(0.004)"),
         Frame("_MapDatasetFetcher.fetch", f"{LIB}/_utils/fetch.py", 54),
         Frame("_worker_loop", f"{LIB}/_utils/worker.py", 374))
LOCKED = (Frame("wait", "/usr/lib/python3.11/threading.py", 331),
          Frame("DS.__getitem__", "/home/u/starved.py", 8, code="with LOCK: row = db.fetch(i)"),
          Frame("_MapDatasetFetcher.fetch", f"{LIB}/_utils/fetch.py", 54))


def _job(frames=FETCH, worker_cpu=4.5, host_cpu=11.0, util=None, **kw) -> Job:
    return Job(seconds=30.0, util=util, main=lambda t: C.DATA_WAIT, workers=2, worker_cpu=worker_cpu, cores=2,
               host_cpu=lambda t: host_cpu,
               worker_stack=lambda t: stack(0, C.DATA_FETCH, main=True, active=False, frames=frames), **kw)


def test_workers_sleeping_in_their_fetch_are_named_with_more_workers_and_a_bound():
    found, ctx = rule_findings(_job())
    assert set(found) & {"data-starved", "workers-saturated", "io-bound", "cpu-oversubscribed"} == set()
    f = found["workers-blocked"]
    assert "`DS.__getitem__`" in f.title and "not computing" in f.title
    assert "time.sleep(0.004)" in " ".join(f.evidence)
    assert "num_workers=" in f.action and "was 2" in f.action
    assert "pin_memory" not in f.action  # no GPU: pinning speeds only host-to-GPU copies
    # The pool delivers in proportion to its workers: n workers instead of 2 give at most n / 2;
    # the wait (all of the time) alone bounds nothing. The user's 4 workers measured 2.0x: the
    # bound for 4 would be 2.0x, and the text's number is the one kept.
    n = int(f.action.split("num_workers=")[1].split(",")[0])
    assert n > 2 and f.gain_predicted == round(n / 2, 2)
    assert f.gain_predicted == round(bounded(1.0, n / 2), 2)
    assert f"at most {f.gain_predicted:.0f}x steps/s" in f.expected_gain or f"at most {f.gain_predicted:.1f}x" in f.expected_gain


def test_the_pools_own_cpu_caps_the_workers_named():
    # Workers at 40 % of a core each on a host with ~0.3 cores spare: the pool can grow its rate at
    # most (0.8 + 0.3) / 0.8 = 1.4x on these CPUs, so it is not told to go to 32 workers.
    found, _ = rule_findings(_job(worker_cpu=40.0, host_cpu=85.0 - 0.1))
    f = found["workers-blocked"]
    n = int(f.action.split("num_workers=")[1].split(",")[0])
    assert n == 3 and f.gain_predicted == 1.5


def test_not_when_the_workers_compute():
    found, _ = rule_findings(_job(worker_cpu=100.0))
    assert "workers-blocked" not in found


def test_not_when_the_workers_queue_behind_a_shared_lock():
    found, _ = rule_findings(_job(frames=LOCKED))
    assert "workers-blocked" not in found


def test_not_on_a_saturated_host_without_readings_that_say_the_workers_are_not_queued():
    found, _ = rule_findings(_job(host_cpu=99.0))
    assert "workers-blocked" not in found


def test_not_when_storage_is_the_wait():
    # iowait of 1.4 cores and 1.9 GB/s of disk reads: the io-bound workload's signals.
    found, _ = rule_findings(_job(iowait=lambda t: 70.0, disk_read=1.9e9))
    assert "workers-blocked" not in found and "io-bound" in found


def test_on_a_gpu_the_same_wait_is_named_and_pinning_offered():
    found, _ = rule_findings(_job(util=lambda t: 0.0))
    f = found["workers-blocked"]
    assert f.title.startswith("GPU 0 waits for data") and "pin_memory=True" in f.action
    assert wait_bound(1.0) > f.gain_predicted > 1.1
