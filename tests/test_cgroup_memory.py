"""A container's memory limit (cgroup memory.max) binds before the host's total: the job's group
is read, recorded with the host's samples (schema 3), and the host forecast is made against it."""

from __future__ import annotations

import sqlite3

from gputop.model import HostSample
from gputop.sources.cgroup_memory import job_cgroup_memory

from synth import GiB, T0, Job, rule_findings

MiB = 2**20


def _proc(tmp_path, text, pid=42):
    d = tmp_path / "proc" / str(pid)
    d.mkdir(parents=True)
    (d / "cgroup").write_text(text)
    return str(tmp_path / "proc")


def _files(root, rel, **values):
    d = root / rel
    d.mkdir(parents=True, exist_ok=True)
    for name, v in values.items():
        (d / name.replace("_", ".", 1) if name.startswith("memory_") else d / name).write_text(str(v) + "\n")


def test_cgroup_v2_the_group_with_the_least_room_binds(tmp_path):
    proc = _proc(tmp_path, "0::/kubepods/pod1/ctr\n")
    cg = tmp_path / "cg"
    _files(cg, "kubepods/pod1/ctr", memory_max="max", memory_current=3 * GiB)
    _files(cg, "kubepods/pod1", memory_max=8 * GiB, memory_current=6 * GiB)  # the pod's limit binds
    _files(cg, "kubepods", memory_max=64 * GiB, memory_current=40 * GiB)
    got = job_cgroup_memory(42, proc, str(cg))
    assert (got.limit, got.used, got.path) == (8 * GiB, 6 * GiB, "/kubepods/pod1")


def test_the_page_cache_the_kernel_would_drop_is_not_the_jobs_memory(tmp_path):
    # A job reading its dataset from disk: the usage counter holds the files' cache, which the
    # kernel drops before any OOM kill; the working set is what the forecast and the exit read.
    proc = _proc(tmp_path, "0::/job\n")
    cg = tmp_path / "cg"
    _files(cg, "job", memory_max=8 * GiB, memory_current=int(7.8 * GiB))
    (cg / "job" / "memory.stat").write_text(f"anon {2 * GiB}\nfile {int(5.8 * GiB)}\ninactive_file {5 * GiB}\n")
    assert job_cgroup_memory(42, proc, str(cg)).used == int(2.8 * GiB)
    v1 = _proc(tmp_path / "v1", "4:memory:/docker/abc\n")
    d = tmp_path / "cg1" / "memory" / "docker" / "abc"
    d.mkdir(parents=True)
    (d / "memory.limit_in_bytes").write_text(str(16 * GiB))
    (d / "memory.usage_in_bytes").write_text(str(15 * GiB))
    (d / "memory.stat").write_text(f"cache {12 * GiB}\ninactive_file {3 * GiB}\ntotal_inactive_file {10 * GiB}\n")
    assert job_cgroup_memory(42, v1, str(tmp_path / "cg1")).used == 5 * GiB  # the hierarchy's total, v1


def test_a_job_ended_at_its_cgroups_limit_is_likely_the_oom_killer_while_the_host_has_room():
    from gputop.analysis import exit_cause

    def host(used):
        return [HostSample(ts=T0 + k, cpu_percent=0, mem_total=24 * GiB, mem_available=18 * GiB,
                           cgroup_limit=2 * GiB, cgroup_used=used) for k in range(5)]

    why = exit_cause(T0 + 5, "signal SIGKILL", {}, host(int(1.99 * GiB)))
    assert why.startswith("likely the OOM killer: the job's cgroup used 2038 MiB of its 2048 MiB limit"), why
    # A worker killed in the group ends the main with an error: said as such.
    why = exit_cause(T0 + 5, "code 1", {}, host(int(1.99 * GiB)))
    assert why is not None and "exited with code 1" in why and "DataLoader worker" in why
    assert exit_cause(T0 + 5, "code 0", {}, host(int(1.99 * GiB))) is None  # it finished
    assert exit_cause(T0 + 5, "signal SIGKILL", {}, host(1 * GiB)) is None  # room in the group and the host


def test_cgroup_v1_memory_controller_and_no_limit(tmp_path):
    proc = _proc(tmp_path, "4:memory:/docker/abc\n3:cpu:/\n")
    cg = tmp_path / "cg"
    (cg / "memory" / "docker" / "abc").mkdir(parents=True)
    (cg / "memory" / "docker" / "abc" / "memory.limit_in_bytes").write_text(str(16 * GiB))
    (cg / "memory" / "docker" / "abc" / "memory.usage_in_bytes").write_text(str(5 * GiB))
    assert job_cgroup_memory(42, proc, str(cg)).limit == 16 * GiB
    (cg / "memory" / "docker" / "abc" / "memory.limit_in_bytes").write_text("9223372036854771712")
    assert job_cgroup_memory(42, proc, str(cg)) is None  # v1's "no limit"
    assert job_cgroup_memory(7, proc, str(cg)) is None  # no such process


def test_the_host_samples_keep_the_cgroup_and_older_files_still_read_and_append(tmp_path):
    from gputop.record.reader import Reader
    from gputop.record.writer import RecordWriter, SessionMeta

    h = HostSample(ts=T0 + 1, cpu_percent=5.0, mem_total=64 * GiB, mem_available=40 * GiB,
                   cgroup_limit=8 * GiB, cgroup_used=6 * GiB)
    p = tmp_path / "a.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta(host="h"))
    w.flush([h])
    w.finish()
    got = Reader(p).host_samples(0, 2e9)[0]
    assert (got.cgroup_limit, got.cgroup_used) == (8 * GiB, 6 * GiB)
    # a version 2 file: its host rows end before the cgroup; read with None, appended to in its layout
    con = sqlite3.connect(p)
    con.execute("PRAGMA user_version=2")
    con.execute("DELETE FROM host_samples")
    con.commit()
    con.close()
    w = RecordWriter.create(p, append=True)
    w.start_session(SessionMeta(host="h"))
    w.flush([h])
    w.finish()
    got = Reader(p).host_samples(0, 2e9)
    assert len(got) == 1 and got[0].cgroup_limit is None and got[0].mem_available == 40 * GiB


def test_the_host_forecast_is_against_the_containers_limit():
    # 64 GiB host with 40 GiB free (hours at this rate), but the job's container may use 8 GiB and
    # uses 5 GiB at the start, growing 10 MiB/s: ~158 s left after 150 s
    job = Job(seconds=150, workers=0, host_mem_total=64 * GiB, host_available=lambda t: 40 * GiB - 10 * MiB * t,
              cgroup_limit=8 * GiB, cgroup_used=lambda t: 5 * GiB + 10 * MiB * t,
              target_rss=lambda t: 2 * GiB + 10 * MiB * t)
    found, ctx = rule_findings(job)
    f = found["memory-growth"]
    assert ctx.memory.host_cgroup
    assert abs(ctx.memory.host.eta_s - (8 * GiB - 5 * GiB - 10 * MiB * 150) / (10 * MiB)) < 10
    assert f.title.startswith("the job's cgroup memory grows 600 MB/min: out of memory in ~")
    assert any("memory.max" in e for e in f.evidence)


def test_the_host_line_shows_the_containers_limit_beside_the_hosts():
    from dataclasses import replace

    from gputop.present.panels import host_panel

    h = HostSample(ts=T0, cpu_percent=20.0, mem_total=64 * GiB, mem_used=16 * GiB, mem_available=48 * GiB)
    assert "cgroup" not in host_panel(h, 160, 2).plain
    text = host_panel(replace(h, cgroup_limit=8 * GiB, cgroup_used=7 * GiB), 160, 2).plain
    assert "16.0G/64.0G  cgroup 7.0G/8.0G  SWP" in text
