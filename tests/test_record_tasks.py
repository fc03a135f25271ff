"""The processes' /proc readings are recorded (each process's counters and its main thread's
reading), so a replay and a report judge stuck and IO from what the live advisor read: before, a
live verdict that leaned on a main thread's wakes or on the file it sleeps on could not be had from
the recording. A file made before them has no table for them and reads as it did."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from gputop.model import GpuSample, TaskSample, ThreadState
from gputop.record.reader import Reader
from gputop.record.writer import RecordWriter, SessionMeta

from test_record import T0, write

FIXTURES = Path(__file__).parent / "fixtures" / "recordings"


def task(ts, pid=4242, wakes=10, fd_path=None):
    main = ThreadState(tid=pid, name="python3", state="S", cpu_ns=1_234_567_890_123, runs=77, wakes=wakes,
                       wchan="pipe_read", syscall="read", fd_path=fd_path, fs="ext4 on /")
    pool = ThreadState(tid=pid + 1, name="pt_autograd_0", state="S", cpu_ns=5, runs=1, syscall="futex")
    return TaskSample(ts=ts, pid=pid, ppid=1, threads=(pool, main), rchar=10_000, wchar=2_000)


def test_a_task_sample_round_trips_with_its_main_thread(tmp_path):
    p = tmp_path / "t.gputop"
    write(p, [[GpuSample(ts=T0 + k, index=0, util_gpu=50.0), task(T0 + k, wakes=10 + k)] for k in range(1, 5)])
    with Reader(p) as r:
        got = r.task_samples(T0, T0 + 10)
    assert [t.ts for t in got] == [T0 + k for k in range(1, 5)]
    t = got[-1]
    assert (t.pid, t.ppid, t.rchar, t.wchar) == (4242, 1, 10_000, 2_000)
    # The main thread only: the other threads stay live-only (their number would outweigh the file).
    assert len(t.threads) == 1
    m = t.threads[0]
    assert (m.tid, m.name, m.state, m.cpu_ns, m.runs, m.wakes) == (4242, "python3", "S", 1_234_567_890_123, 77, 14)
    assert (m.wchan, m.syscall, m.fs) == ("pipe_read", "read", "ext4 on /")


def test_a_path_the_main_thread_waits_on_is_redacted(tmp_path):
    p = tmp_path / "t.gputop"
    secret = "hf_" + "a" * 34
    write(p, [[GpuSample(ts=T0 + 1, index=0, util_gpu=50.0), task(T0 + 1, fd_path=f"/tmp/upload?token={secret}")]])
    with Reader(p) as r:
        (t,) = r.task_samples(T0, T0 + 10)
    assert secret not in (t.threads[0].fd_path or "")
    assert secret.encode() not in p.read_bytes()


def test_a_replay_is_fed_the_task_samples(tmp_path):
    p = tmp_path / "t.gputop"
    write(p, [[GpuSample(ts=T0 + k, index=0, util_gpu=50.0), task(T0 + k)] for k in range(1, 4)])
    with Reader(p) as r:
        assert sum(isinstance(s, TaskSample) for s in r.samples(T0, T0 + 10)) == 3
        from gputop.record.replay import HistoryWindows

        assert sum(isinstance(s, TaskSample) for s in r.history(T0 + 3, HistoryWindows())) == 3


def test_a_file_from_before_the_tasks_reads_as_before_and_an_append_adds_them(tmp_path):
    old = tmp_path / "old.gputop"
    shutil.copyfile(FIXTURES / "cpu-evalstep.gputop", old)
    old.chmod(0o600)
    with sqlite3.connect(old) as c:
        assert not c.execute("SELECT name FROM sqlite_master WHERE name = 'task_samples'").fetchall()
    with Reader(old) as r:
        assert r.damage is None and r.task_samples(float("-inf"), float("inf")) == []
        end = r.end_ts
        counts = r.counts()
    assert "task_samples" not in counts
    w = RecordWriter.create(old, append=True)
    w.start_session(SessionMeta(mode="fake", host="testhost"))
    w.flush([GpuSample(ts=end + 5, index=0, util_gpu=1.0), task(end + 5)])
    w.finish()
    with Reader(old) as r:
        assert r.damage is None
        assert [t.ts for t in r.task_samples(end, end + 10)] == [end + 5]


def test_the_mount_a_waited_on_file_sits_on_is_redacted_too(tmp_path):
    # The file system is named by its mount point, which is as much a path as fd_path: a tmpfs
    # mounted at /mnt/token=SECRET kept the secret in the file while fd_path was redacted.
    p = tmp_path / "t.gputop"
    secret = "SECRETMOUNTVALUE"
    main = ThreadState(tid=4242, name="python3", state="S", wchan="pipe_read", syscall="read",
                       fd_path=f"/mnt/token={secret}/data", fs=f"tmpfs on /mnt/token={secret}")
    write(p, [[GpuSample(ts=T0 + 1, index=0, util_gpu=50.0), TaskSample(ts=T0 + 1, pid=4242, ppid=1, threads=(main,))]])
    with Reader(p) as r:
        (t,) = r.task_samples(T0, T0 + 10)
    assert t.threads[0].fs and t.threads[0].fs.startswith("tmpfs on /mnt/")
    assert secret not in t.threads[0].fs
    assert secret.encode() not in p.read_bytes()


def test_a_mount_point_written_unredacted_by_an_older_gputop_is_redacted_on_reading(tmp_path):
    # Files recorded before the mount point was redacted hold it raw: a report or replay that
    # judges the readings again would print it.
    p = tmp_path / "t.gputop"
    write(p, [[GpuSample(ts=T0 + 1, index=0, util_gpu=50.0), task(T0 + 1)]])
    with sqlite3.connect(p) as c:
        c.execute("UPDATE strings SET text = 'tmpfs on /mnt/token=SECRETMOUNTVALUE' WHERE text = 'ext4 on /'")
    with Reader(p) as r:
        (t,) = r.task_samples(T0, T0 + 10)
    assert t.threads[0].fs.startswith("tmpfs on /mnt/") and "SECRETMOUNTVALUE" not in t.threads[0].fs


def test_info_says_the_proc_readings_a_cut_took_were_lost_not_that_there_were_none(tmp_path, capsys):
    # "0 /proc" beside "0 stack (lost in the cut)" read as "none recorded" for a table the cut took.
    import argparse

    from gputop.commands import info

    p = tmp_path / "t.gputop"
    write(p, [[GpuSample(ts=T0 + k, index=0, util_gpu=50.0), task(T0 + k)] for k in range(1, 5)])
    with sqlite3.connect(p) as c:
        (root,) = c.execute("SELECT rootpage FROM sqlite_master WHERE name = 'task_samples'").fetchone()
        (page,) = c.execute("PRAGMA page_size").fetchone()
        (gpu_root,) = c.execute("SELECT rootpage FROM sqlite_master WHERE name = 'gpu_samples'").fetchone()
    assert gpu_root < root  # the cut keeps the GPU samples, so the file is still read
    cut = tmp_path / "cut.gputop"
    cut.write_bytes(p.read_bytes()[: (root - 1) * page])
    cut.chmod(0o600)
    info.run(argparse.Namespace(file=str(cut), json=False, check=False))
    out = capsys.readouterr().out
    assert "0 /proc (lost in the cut)" in out
    # The processes' rows went with it (the tables after it): their samples are not "none recorded" either.
    assert "0 process (lost in the cut)" in out and "4 GPU polls," in out
