import pytest

from gputop.model import GpuProcess, ProcSample
from gputop.present.process_table import build_rows, sort_rows


def data():
    gp = [
        GpuProcess(ts=100, gpu_index=0, pid=10, used_memory=5 * 2**30, sm_util=90),
        GpuProcess(ts=100, gpu_index=1, pid=20, used_memory=9 * 2**30, sm_util=None),
        GpuProcess(ts=100, gpu_index=1, pid=30, used_memory=None, sm_util=10),
    ]
    procs = {
        10: ProcSample(ts=100, pid=10, user="alice", cmdline="python train.py", cpu_percent=150, rss=2**30, create_time=40),
        20: ProcSample(ts=100, pid=20, user="bob", cmdline="python eval.py", cpu_percent=20, rss=2**31, create_time=90),
    }
    return gp, procs


def test_join_and_default_sort_by_gpu_memory():
    rows = build_rows(*data(), now=100)
    assert [r.pid for r in rows] == [20, 10, 30]  # missing memory sorts last
    r10 = next(r for r in rows if r.pid == 10)
    assert r10.user == "alice" and r10.cpu == 150 and r10.elapsed == 60
    r30 = next(r for r in rows if r.pid == 30)
    assert r30.user is None and "not visible" in r30.command


def test_sort_directions_and_missing_last():
    rows = build_rows(*data(), now=100)
    assert [r.pid for r in sort_rows(rows, "pid")] == [10, 20, 30]
    assert [r.pid for r in sort_rows(rows, "pid", reverse=True)] == [30, 20, 10]
    assert [r.pid for r in sort_rows(rows, "sm")] == [10, 30, 20]
    assert [r.pid for r in sort_rows(rows, "sm", reverse=True)] == [30, 10, 20]
    assert [r.pid for r in sort_rows(rows, "command")] == [30, 20, 10]  # "(not visible…" sorts before letters
    with pytest.raises(ValueError):
        sort_rows(rows, "nope")


def test_filter_matches_pid_user_gpu_and_command():
    gp, procs = data()
    assert [r.pid for r in build_rows(gp, procs, 100, query="TRAIN")] == [10]
    assert [r.pid for r in build_rows(gp, procs, 100, query="bob")] == [20]
    assert {r.pid for r in build_rows(gp, procs, 100, query="gpu1")} == {20, 30}
    assert build_rows(gp, procs, 100, query="zzz") == []


def test_target_and_busy_cpu_processes_get_rows_without_a_gpu():
    gp, procs = data()
    procs = dict(procs)
    procs[40] = ProcSample(ts=100, pid=40, cmdline="python prep.py", cpu_percent=99, role="target")
    procs[50] = ProcSample(ts=100, pid=50, cmdline="ffmpeg", cpu_percent=300, role="cpu")
    procs[60] = ProcSample(ts=10, pid=60, cmdline="gone", cpu_percent=300, role="cpu")  # stale
    procs[70] = ProcSample(ts=100, pid=70, cmdline="worker", cpu_percent=300, role="worker")
    rows = build_rows(gp, procs, now=100, sort="cpu")
    assert [r.pid for r in rows] == [50, 10, 40, 20, 30]
    assert next(r for r in rows if r.pid == 40).gpu is None
    assert [r.pid for r in build_rows(gp, procs, 100, query="gpu1")] == [20, 30]
