"""Copy-on-read told from a leak in the main process: the analysis (memory_view's workers' USS
growth, the main process's RSS) on synthetic series, and the memory-growth rule's evidence and
action on synthetic jobs (tests/synth.py) whose workers' USS is read every 12 s as live."""

from __future__ import annotations

import pytest

from gputop.analysis import COPY_ON_READ, MAIN_LEAK, memory_view
from gputop.model import HostSample, ProcSample

from synth import GiB, T0, TARGET, Job, rule_findings

MiB = 2**20



def _worker_series(pid: int, uss_rate: float, rss_rate: float = 0.0, seconds: int = 300) -> list[ProcSample]:
    out = []
    for k in range(seconds):
        read = k % 12 == 0
        out.append(ProcSample(ts=T0 + k, pid=pid, ppid=TARGET, name="pt_data_worker", role="worker",
                              rss=int(400 * MiB + rss_rate * k),
                              uss=int(10 * MiB + uss_rate * k) if read else None))
    return out


def _view(uss_rates, main_rate: float, rss_rate: float = 0.0):
    procs = {TARGET + 1 + i: _worker_series(TARGET + 1 + i, r, rss_rate) for i, r in enumerate(uss_rates)}
    procs[TARGET] = [ProcSample(ts=T0 + k, pid=TARGET, rss=int(2 * GiB + main_rate * k)) for k in range(300)]
    host = [HostSample(ts=T0 + k, cpu_percent=10.0, mem_total=64 * GiB, mem_available=int(40 * GiB - 2 * MiB * k))
            for k in range(300)]
    workers = set(procs) - {TARGET}
    return memory_view((), {}, [], host, procs, {TARGET} | workers, workers)


def test_workers_uss_growing_with_the_main_flat_is_copy_on_read():
    v = _view([0.7 * MiB] * 4, main_rate=0.0)
    assert v.host_cause == COPY_ON_READ
    assert len(v.uss_growing) == 4 and all(w.uss.rate == pytest.approx(0.7 * MiB, rel=0.01) for w in v.workers)
    assert not any(w.growth.growing for w in v.workers)  # RSS flat: invisible there
    assert not any(w.rss_alike for w in v.workers)


def test_main_growing_with_the_workers_uss_flat_is_a_leak_in_the_main_process():
    v = _view([0.0] * 4, main_rate=3 * MiB)
    assert v.host_cause == MAIN_LEAK
    assert v.main is not None and v.main.growing and not v.uss_growing


def test_one_growing_worker_of_four_or_both_growing_names_neither():
    assert _view([0.7 * MiB, 0, 0, 0], main_rate=0.0).host_cause is None
    assert _view([0.7 * MiB] * 4, main_rate=3 * MiB).host_cause is None


def test_workers_whose_rss_grows_with_their_uss_are_told():
    v = _view([0.7 * MiB] * 2, main_rate=0.0, rss_rate=0.7 * MiB)
    assert v.host_cause == COPY_ON_READ and all(w.rss_alike for w in v.workers)


def test_no_uss_read_judges_nothing():
    procs = {TARGET + 1: [ProcSample(ts=T0 + k, pid=TARGET + 1, rss=400 * MiB) for k in range(300)]}
    v = memory_view((), {}, [], [], procs, {TARGET, TARGET + 1}, {TARGET + 1})
    assert v.workers[0].uss is None and v.host_cause is None


# --------------------------------------------------------------------------- the rule


def _job(**kw) -> Job:
    return Job(seconds=200, workers=4, host_mem_total=64 * GiB, host_available=lambda t: 40 * GiB - 100 * MiB * t,
               worker_rss=lambda t: 2 * GiB, **kw)


def test_copy_on_read_named_from_the_workers_uss():
    f = rule_findings(_job(worker_uss=lambda t: 100 * MiB + 40 * MiB * t / 60, target_rss=lambda t: 3 * GiB))[0]
    f = f["memory-growth"]
    assert any(e.startswith("4 of 4 DataLoader workers' private memory (USS) grows 40 MB/min each (median): the "
                            "Dataset's Python objects are copied into each worker as their refcounts are touched "
                            "(copy-on-read)") for e in f.evidence), f.evidence
    assert any("RSS stays flat" in e for e in f.evidence)
    assert "the main process's RSS is flat" in f.evidence
    assert "numpy array or an Arrow table" in f.action
    assert not any("does not read" in e for e in f.evidence)


def test_a_main_process_leak_is_not_called_copy_on_read():
    f = rule_findings(_job(worker_uss=lambda t: 100 * MiB, target_rss=lambda t: 3 * GiB + 100 * MiB * t))[0]
    f = f["memory-growth"]
    assert "the 4 DataLoader workers' private memory (USS) is flat: no copy-on-read" in f.evidence
    assert any(e.startswith("the main process's RSS grows") and "not the workers" in e for e in f.evidence)
    assert "tracemalloc" in f.action and "numpy" not in f.action
