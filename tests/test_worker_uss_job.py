"""The host source on real CPU jobs (tests/cow_job.py): two forked DataLoader workers reading a
Dataset of 8M Python ints copy it page by page, and their USS grows while their RSS stays flat;
the same numbers in a numpy array leave their USS flat. The main process is never read."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gputop.analysis import theil_sen
from gputop.model import ProcSample
from gputop.sources.host import HostSource, PrivateMemory

MiB = 2**20
JOB = Path(__file__).parent / "cow_job.py"
WATCH_S = 10.0

pytestmark = pytest.mark.slow


def _start(kind: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(JOB), kind], stdout=subprocess.PIPE, text=True)


def _ready(p: subprocess.Popen, timeout: float = 90.0) -> None:
    got: list[str] = []
    t = threading.Thread(target=lambda: got.append(p.stdout.readline()), daemon=True)
    t.start()
    t.join(timeout)
    assert got and got[0].strip() == "ready", f"the job did not start ({p.poll()})"


def test_list_dataset_workers_uss_grows_numpy_stays_flat():
    jobs = {kind: _start(kind) for kind in ("list", "numpy")}
    try:
        for p in jobs.values():
            _ready(p)
        # A shorter period than live (12 s) so 10 s hold enough reads; the lock share still
        # bounds it by each read's cost (a read of ~12 ms: once a second at most; one slowed to
        # 50 ms by a loaded machine: every 2.5 s, as 0.01 and 2 s periods over 20 s gave).
        readers = {k: PrivateMemory(period_s=1.0, lock_share=0.02) for k in jobs}
        sources = {k: HostSource(pids=lambda p=p: [p.pid], target_pid=p.pid, private=readers[k])
                   for k, p in jobs.items()}
        seen: dict[str, list[ProcSample]] = {k: [] for k in jobs}
        end = time.monotonic() + WATCH_S
        while time.monotonic() < end:
            for k, src in sources.items():
                seen[k] += [s for s in src.poll() if isinstance(s, ProcSample)]
            time.sleep(0.5)
    finally:
        for p in jobs.values():
            p.kill()
            p.wait()
    growth: dict[str, list[float]] = {}
    for kind, samples in seen.items():
        target = jobs[kind].pid
        assert all(s.uss is None for s in samples if s.pid == target)  # the training process: never read
        by_pid: dict[int, list[ProcSample]] = {}
        for s in samples:
            if s.uss is not None:
                by_pid.setdefault(s.pid, []).append(s)
        assert len(by_pid) == 2, by_pid.keys()  # num_workers=2
        growth[kind] = []
        for pid, ss in by_pid.items():
            assert len(ss) >= 5 and all(s.ppid == target and s.role == "worker" for s in ss)
            fit = theil_sen([(s.ts, float(s.uss)) for s in ss])
            d_uss = ss[-1].uss - ss[0].uss
            d_rss = ss[-1].rss - ss[0].rss
            print(f"{kind} worker {pid}: USS {ss[0].uss / MiB:.1f} -> {ss[-1].uss / MiB:.1f} MiB "
                  f"({fit.rate * 60 / MiB:.0f} MiB/min), RSS {ss[0].rss / MiB:.1f} -> {ss[-1].rss / MiB:.1f} MiB, "
                  f"PSS {ss[0].pss / MiB:.1f} -> {ss[-1].pss / MiB:.1f} MiB over {ss[-1].ts - ss[0].ts:.0f} s; "
                  f"last read {readers[kind].cost.get(pid, 0) * 1e3:.1f} ms")
            growth[kind].append(fit.rate)
            if kind == "list":
                assert d_uss > 15 * MiB and fit.low > 0.5 * MiB  # copy-on-read: MB a second
                assert abs(d_rss) < 0.25 * d_uss  # ... that RSS does not show
            else:
                assert d_uss < 5 * MiB
    assert min(growth["list"]) > 10 * max(max(growth["numpy"]), 0.05 * MiB)
