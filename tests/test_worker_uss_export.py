"""`gputop export` on the DataLoader workers' private memory (USS): per attached job, with the
labels of the exporter's other per-job series, never a series per worker; the sum of the job's
workers' USS, and the median growth of a worker while the workers' memory is judged growing (0
otherwise, absent until there is history). Synthetic samples in a store; no sleeps."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")

from gputop.analysis import jobs_private  # noqa: E402
from gputop.export.account import TimeAccount  # noqa: E402
from gputop.export.collector import JOB_LABELS, GputopCollector  # noqa: E402
from gputop.export.jobs import Placement  # noqa: E402
from gputop.model import GpuProcess, GpuSample, ProcSample  # noqa: E402
from gputop.store import Store  # noqa: E402

from test_export import scrape, value  # noqa: E402

MiB, GiB = 2**20, 2**30
T0 = 1_767_225_600.0
JOB, OTHER = 4_194_300, 4_194_500
TOTAL = "gputop_workers_private_memory_bytes"
RATE = "gputop_workers_private_memory_growth_bytes_per_second"


def _store(seconds: int = 300, rates=(40, 40, 40, 0), main_rate: float = 0.0, other_job: bool = False,
           gone_at: int | None = None) -> Store:
    """The attached job on GPU 0 with its DataLoader workers (one leaves at ``gone_at``); their
    details each second, their USS every 12 s, spread; ``other_job``: a second attached job
    whose workers' USS is not read (the host source reads the session's target's alone)."""
    st = Store()
    for k in range(seconds):
        ts = T0 + k
        batch: list[object] = [
            GpuSample(ts=ts, index=0, mem_used=30 * GiB, mem_total=80 * GiB),
            GpuProcess(ts=ts, gpu_index=0, pid=JOB, used_memory=20 * GiB),
            ProcSample(ts=ts, pid=JOB, ppid=1, name="python", user="alice", cmdline="python train.py --bs 64",
                       role="target", rss=int(3 * GiB + main_rate * k), create_time=T0 - 60),
        ]
        for w, rate in enumerate(rates):
            if gone_at is not None and w == 0 and k >= gone_at:
                continue
            batch.append(ProcSample(ts=ts, pid=JOB + 1 + w, ppid=JOB, name="pt_data_worker", user="alice",
                                    role="worker", rss=int(1.9 * GiB), create_time=T0 - 50,
                                    uss=int(300 * MiB + rate * MiB / 60 * k) if k % 12 == 3 * w % 12 else None))
        if other_job:
            batch += [GpuProcess(ts=ts, gpu_index=0, pid=OTHER, used_memory=5 * GiB),
                      ProcSample(ts=ts, pid=OTHER, ppid=1, name="python", user="bob", cmdline="python eval.py"),
                      ProcSample(ts=ts, pid=OTHER + 1, ppid=OTHER, name="pt_data_worker", user="bob",
                                 rss=GiB)]
        st.add(batch)
    return st


def _scrape(st: Store, attached, at: float):
    c = GputopCollector(st, interval=1.0, clock=lambda: at, account=TimeAccount(T0), placement=lambda pid: Placement(),
                        attached=lambda: list(attached))
    return scrape(c)


def test_the_sum_and_the_median_growth_per_attached_job_with_the_job_labels():
    st = _store(other_job=True)
    got = _scrape(st, [JOB, OTHER], T0 + 299)
    total, rate = got[TOTAL], got[RATE]
    assert [s.labels["pid"] for s in total] == [str(JOB)]  # one series for the job, none for the other
    assert set(total[0].labels) == set(JOB_LABELS)
    assert total[0].labels["script"] == "train.py" and total[0].labels["user"] == "alice"
    # each worker's latest reading: 300 MB plus what it copied by then (three at 40 MB/min)
    assert value(total, pid=str(JOB)) == pytest.approx(4 * 300 * MiB + 3 * 40 * MiB / 60 * 290, rel=0.02)
    assert value(rate, pid=str(JOB)) == pytest.approx(40 * MiB / 60, rel=0.01)
    # the same label values as the job's other per-job series
    info = next(s for s in got["gputop_job_info"] if s.labels["pid"] == str(JOB))
    assert {k: info.labels[k] for k in JOB_LABELS} == dict(total[0].labels)


def test_flat_or_one_worker_growing_reads_zero_and_too_little_history_reads_nothing():
    got = _scrape(_store(rates=(0, 0, 0, 0), main_rate=3 * MiB), [JOB], T0 + 299)
    assert value(got[RATE], pid=str(JOB)) == 0.0 and value(got[TOTAL], pid=str(JOB)) == pytest.approx(1200 * MiB)
    one = _scrape(_store(rates=(40, 0, 0, 0)), [JOB], T0 + 299)
    assert value(one[RATE], pid=str(JOB)) == 0.0  # one worker of four is its own affair
    young = _scrape(_store(seconds=40), [JOB], T0 + 39)
    assert TOTAL in young and RATE not in young  # read, not yet judged
    assert TOTAL not in _scrape(_store(), [], T0 + 299)  # nothing attached: no series


def test_a_worker_gone_no_longer_counts():
    st = _store(gone_at=200)
    got = _scrape(st, [JOB], T0 + 299)
    assert value(got[TOTAL], pid=str(JOB)) == pytest.approx(3 * 300 * MiB + 2 * 40 * MiB / 60 * 290, rel=0.02)


def test_workers_count_for_the_nearest_attached_job():
    """Under a launcher attached with its rank, the rank's workers are the rank's."""
    launcher = JOB - 1
    procs = {
        launcher: [ProcSample(ts=T0 + 10, pid=launcher, ppid=1)],
        JOB: [ProcSample(ts=T0 + 10, pid=JOB, ppid=launcher)],
        JOB + 1: [ProcSample(ts=T0 + 10, pid=JOB + 1, ppid=JOB, rss=GiB, uss=100 * MiB)],
        JOB + 2: [ProcSample(ts=T0 + 10, pid=JOB + 2, ppid=JOB)],  # never read: not counted
    }
    latest = {pid: ss[-1] for pid, ss in procs.items()}
    got = jobs_private([launcher, JOB], latest, lambda pid: procs.get(pid, []), T0 + 10)
    assert list(got) == [JOB] and got[JOB].read == 1 and got[JOB].total == 100 * MiB
    assert list(jobs_private([launcher], latest, lambda pid: procs.get(pid, []), T0 + 10)) == [launcher]
    assert jobs_private([], latest, lambda pid: procs.get(pid, []), T0 + 10) == {}


def test_the_memory_series_say_what_the_advisors_own_view_says():
    """The advisor judges the job's memory with its workers (a host forecast bounded by their
    shared pages); the exporter's own view knows no workers. Where the advisor has judged a job,
    its view is what the growth and time-to-limit series export: one forecast, the finding's."""
    from gputop.analysis import GpuMemory, MemoryView
    from gputop.analysis.memory_growth import GROWING, Growth

    st = _store()
    at = T0 + 299
    base = scrape(GputopCollector(st, interval=1.0, clock=lambda: at, account=TimeAccount(T0),
                                  placement=lambda pid: Placement(), attached=lambda: [JOB]))
    host = Growth(GROWING, rate=2e6, used=40 * GiB, limit=64 * GiB, span_s=290.0, eta_s=1234.0, ceiling=10 * GiB)
    gpu = GpuMemory(0, Growth(GROWING, rate=5e6, used=20 * GiB, limit=80 * GiB, span_s=290.0, eta_s=4321.0), "process")
    judged = MemoryView(gpus=(gpu,), host=host)
    got = scrape(GputopCollector(st, interval=1.0, clock=lambda: at, account=TimeAccount(T0),
                                 placement=lambda pid: Placement(), attached=lambda: [JOB],
                                 judged_memory=lambda: judged))
    assert value(got["gputop_host_memory_time_to_limit_seconds"]) == 1234.0
    assert value(got["gputop_host_memory_growth_bytes_per_second"]) == 2e6
    assert value(got["gputop_gpu_memory_time_to_limit_seconds"]) == 4321.0
    # Without the advisor's view the exporter's own (flat GPU memory here: no time to the limit).
    assert "gputop_gpu_memory_time_to_limit_seconds" not in base or not base["gputop_gpu_memory_time_to_limit_seconds"]
