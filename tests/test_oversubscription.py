"""cpu-oversubscribed counts the loader threads that compete for a CPU (the procfs source's
per-thread readings), not every thread a worker holds; it never asks for a thread count already
set; its gain is bounded by the time the workers' threads wait for a CPU."""

import pytest

from gputop.advisor.context import build_context
from gputop.advisor.engine import Advisor
from gputop.model import Category as C
from gputop.model import TaskSample, ThreadState

from synth import T0, TARGET, Job, phases


def job_on(cores, workers, held, main_wait=0.4, **kw):
    """A loader job whose main thread waits for data ``main_wait`` of each second, on a full host."""
    kw.setdefault("host_cpu", lambda t: 100.0)
    return Job(util=None, main=phases(1.0, 1.0 - main_wait, C.FORWARD, C.DATA_WAIT), cores=cores,
               workers=workers, worker_threads=held, worker_cpu=kw.pop("worker_cpu", 90.0), **kw)


def with_threads(job, threads):
    """``job``'s store plus /proc readings, each second, of every worker's threads: ``threads`` is
    a list of (name, runnable share, CPU share of one core) per worker thread."""
    st = job.store()
    for sec in range(1, int(job.seconds) + 1):
        ts = T0 + sec
        batch = []
        for w in range(job.workers):
            pid = TARGET + 1 + w
            states = []
            for k, (name, runnable, cpu) in enumerate(threads):
                # R in the readings where the running count of R readings falls short of the share
                state = "R" if int(sec * runnable) > int((sec - 1) * runnable) else "S"
                states.append(ThreadState(tid=pid * 100 + k, name=name, state=state, cpu_ns=int(sec * cpu * 1e9)))
            batch.append(TaskSample(ts=ts, pid=pid, ppid=TARGET, threads=tuple(states)))
        batch.append(TaskSample(ts=ts, pid=TARGET, ppid=1, threads=(
            ThreadState(tid=TARGET, name="python", state="S", cpu_ns=int(sec * 0.05e9)),)))
        st.add(batch)
    return st


def rules_on(store):
    ctx = build_context(store, window_s=60.0, stuck_after_s=30.0)
    adv = Advisor()
    found = {f.id: f for f in adv.run_rules(ctx)}
    assert adv.errors == {}
    return found, ctx


# What `ps -L` showed of the user's workers: one thread computing the sample, two idle helpers.
ONE_BUSY_TWO_HELPERS = [("pt_data_worker", 1.0, 0.75), ("QueueFeederThr", 0.0, 0.01), ("python", 0.0, 0.01)]


@pytest.mark.parametrize("env", [(), (("OMP_NUM_THREADS", "1"), ("MKL_NUM_THREADS", "1"))])
def test_idle_helper_threads_do_not_oversubscribe_two_cores(env):
    job = job_on(cores=2, workers=2, held=3, main_wait=0.9, env=env)
    found, ctx = rules_on(with_threads(job, ONE_BUSY_TWO_HELPERS))
    assert len(ctx.threads) == 2 * 3 + 1
    assert "cpu-oversubscribed" not in found
    # Two workers, each a full core's demand, on two full cores: the pool is the limit.
    assert "workers-saturated" in found


def test_held_threads_without_readings_are_no_evidence_when_omp_is_one():
    env = (("OMP_NUM_THREADS", "1"), ("MKL_NUM_THREADS", "1"))
    found, ctx = rules_on(job_on(cores=2, workers=2, held=3, main_wait=0.9, env=env).store())
    assert ctx.threads == ()
    assert "cpu-oversubscribed" not in found


def test_threads_that_compete_are_named_and_the_gain_bounded_by_their_wait_for_a_cpu():
    # 16 workers, each running 17 threads of a pool that all want a CPU, on 16 cores: each gets
    # 16/272 of a core.
    pool = [("pt_data_worker", 1.0, 16 / 272)] + [(f"omp{k}", 1.0, 16 / 272) for k in range(16)]
    job = job_on(cores=16, workers=16, held=19, main_wait=0.4)
    found, _ = rules_on(with_threads(job, pool + [("QueueFeederThr", 0.0, 0.0), ("python", 0.0, 0.0)]))
    f = found["cpu-oversubscribed"]
    assert "workers-saturated" not in found
    assert any("~272 threads that want a CPU" in e and "of 304 they hold" in e for e in f.evidence)
    assert "OMP_NUM_THREADS=1 MKL_NUM_THREADS=1" in f.action and "torch.set_num_threads(1)" in f.action


def test_gain_is_the_wait_for_a_cpu_not_the_loops_whole_wait():
    # The loop waits 90 % (1/(1 - 0.9) = 10x if all came back); the workers' threads are runnable
    # always and on a CPU 60 % of the time: fewer threads give back at most the 40 % queued.
    pool = [("pt_data_worker", 1.0, 0.6), ("omp1", 1.0, 0.6)]
    job = job_on(cores=4, workers=4, held=2, main_wait=0.9)
    found, _ = rules_on(with_threads(job, pool))
    f = found["cpu-oversubscribed"]
    assert f.gain_predicted == pytest.approx(1 / 0.6, rel=0.02)
    assert "40 % of their runnable time" in f.expected_gain


def test_thread_counts_already_set_are_not_asked_for_again():
    # OMP_NUM_THREADS=1 set, yet each worker runs 4 threads that want a CPU (torch.set_num_threads
    # raised in the workers): only the worker_init_fn is the change.
    env = (("OMP_NUM_THREADS", "1"), ("MKL_NUM_THREADS", "1"))
    pool = [("pt_data_worker", 1.0, 0.5)] + [(f"omp{k}", 1.0, 0.5) for k in range(3)]
    job = job_on(cores=4, workers=2, held=6, main_wait=0.6, env=env)
    found, _ = rules_on(with_threads(job, pool))
    f = found["cpu-oversubscribed"]
    assert "OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 in the job's environment" not in f.action
    assert "torch.set_num_threads(1)" in f.action
    assert any("OMP_NUM_THREADS=1 in the target's environment" in e for e in f.evidence)


def test_threads_that_always_get_a_cpu_are_not_oversubscribed():
    # Many threads runnable but each on a CPU whenever it is: no queue, nothing fewer can give.
    pool = [("pt_data_worker", 1.0, 1.0), ("omp1", 1.0, 1.0)]
    job = job_on(cores=2, workers=2, held=2, main_wait=0.6)
    found, _ = rules_on(with_threads(job, pool))
    assert "cpu-oversubscribed" not in found


def test_a_recordings_main_thread_only_readings_count_the_other_threads_as_held():
    # A recording keeps each process's main thread's reading only: replayed, one calm reading per
    # worker is not "every thread measured", or a pool of 8 busy threads a worker would vanish.
    job = job_on(cores=4, workers=2, held=8, main_wait=0.6)
    recorded = with_threads(job, [("pt_data_worker", 0.5, 0.5)])
    found, _ = rules_on(recorded)
    f = found["cpu-oversubscribed"]
    assert any("16" in e for e in f.evidence), f.evidence  # the threads the workers hold, 2 x 8
