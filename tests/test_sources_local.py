"""The host (real psutil) and fake sources."""

import os
import subprocess
import sys
import time

from gputop.model import Event, GpuInfo, GpuProcess, GpuSample, HostSample, ProcSample, SystemInfo, UtilPoint
from gputop.sources.fake import SAMPLE_PERIOD, FakeGpuSource
from gputop.sources.host import HostSource


def test_host_sample_is_sane():
    src = HostSource(pids=lambda: [os.getpid()])
    time.sleep(0.2)
    batch = src.poll()
    host = [s for s in batch if isinstance(s, HostSample)][0]
    assert 0 <= host.cpu_percent <= 100
    assert len(host.cores) == os.cpu_count()
    assert host.mem_total > host.mem_used > 0
    me = [s for s in batch if isinstance(s, ProcSample)][0]
    assert me.pid == os.getpid() and me.rss > 0 and "python" in me.cmdline.lower()
    assert me.io_read_bps is None  # a rate needs two polls
    time.sleep(0.1)
    me2 = [s for s in src.poll() if isinstance(s, ProcSample)][0]
    assert me2.io_read_bps is not None


def test_target_env_is_redacted_and_its_exit_is_reported():
    env = dict(os.environ, HF_TOKEN="hf_" + "x" * 30, OMP_NUM_THREADS="3")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "--api-key", "sekrit"], env=env)
    try:
        src = HostSource(target_pid=child.pid)
        time.sleep(0.2)
        target = [s for s in src.poll() if isinstance(s, ProcSample)][0]
        assert target.role == "target"
        assert ("OMP_NUM_THREADS", "3") in target.env
        assert all(k != "HF_TOKEN" for k, _ in target.env)  # not a performance key
        assert "sekrit" not in target.cmdline and "--api-key ***" in target.cmdline
    finally:
        child.kill()
        child.wait()
    events = [s for s in src.poll() if isinstance(s, Event)]
    assert events and f"process {child.pid} has exited" in events[0].message
    assert not [s for s in src.poll() if isinstance(s, Event)]  # said once


def test_fake_source_emits_system_info_once_and_every_gpu():
    t = [1000.0]
    src = FakeGpuSource(gpus=3, clock=lambda: t[0])
    first = src.poll()
    assert sum(isinstance(s, SystemInfo) for s in first) == 1
    assert [s.index for s in first if isinstance(s, GpuInfo)] == [0, 1, 2]
    assert next(s for s in first if isinstance(s, SystemInfo)).source == "fake"
    t[0] += 1.0
    second = src.poll()
    assert not any(isinstance(s, (SystemInfo, GpuInfo)) for s in second)
    assert sorted(s.index for s in second if isinstance(s, GpuSample)) == [0, 1, 2]
    # GPU 2 is scripted idle: no processes on it.
    assert {p.gpu_index for p in second if isinstance(p, GpuProcess)} == {0, 1}


def test_fake_util_points_have_history_no_duplicates_and_idle_gaps():
    t = [1000.0]
    src = FakeGpuSource(gpus=1, clock=lambda: t[0])
    pts = [p for p in src.poll() if isinstance(p, UtilPoint)]
    assert len(pts) >= 60  # ~14 s of history at 200 ms, like NVML's buffer
    t[0] += 1.0
    more = [p for p in src.poll() if isinstance(p, UtilPoint)]
    assert 4 <= len(more) <= 6
    assert more[0].ts > pts[-1].ts
    spacing = {round(b.ts - a.ts, 6) for a, b in zip(more, more[1:])}
    assert spacing == {SAMPLE_PERIOD}
    utils = [p.util for p in pts]
    assert min(utils) == 0.0 and max(utils) > 90  # the data-stall script has sub-second gaps


def test_process_identity_is_reused_until_its_ttl_or_a_new_start_time(monkeypatch):
    import psutil

    import gputop.sources.host as host_mod

    reads = []
    real_cmdline = psutil.Process.cmdline
    monkeypatch.setattr(psutil.Process, "cmdline", lambda self: reads.append(self.pid) or real_cmdline(self))
    src = HostSource(pids=lambda: [os.getpid()])
    first = [s for s in src.poll() if isinstance(s, ProcSample)][0]
    second = [s for s in src.poll() if isinstance(s, ProcSample)][0]
    assert reads == [os.getpid()]  # read once, reused by the second poll
    assert second.cmdline == first.cmdline and second.user == first.user and second.name == first.name
    # A different start time under the same PID (the PID was reused) reads the identity again.
    expiry, created, ident = src._identity_cache[os.getpid()]
    src._identity_cache[os.getpid()] = (expiry, created - 100.0, ("old", "nobody", "old command"))
    third = [s for s in src.poll() if isinstance(s, ProcSample)][0]
    assert third.cmdline == first.cmdline and len(reads) == 2
    # And so does the end of the TTL.
    monkeypatch.setattr(host_mod, "IDENTITY_TTL_S", 0.0)
    src._identity_cache.clear()
    src.poll()
    src.poll()
    assert len(reads) == 4
