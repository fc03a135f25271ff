"""The recording file: encoding of every sample type, dedup, redaction, file safety, faults."""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import stat
import threading
import time

import pytest

from gputop.errors import UserError
from gputop.model import (
    Category,
    CoreTimes,
    Event,
    Finding,
    Frame,
    GpuInfo,
    GpuProcess,
    GpuSample,
    HostSample,
    ProcSample,
    Severity,
    StackSample,
    SystemInfo,
    UtilPoint,
)
from gputop.record import schema
from gputop.record.blocks import pack_rows, pack_rows_json, unpack_rows
from gputop.record.navigate import Navigator
from gputop.record.reader import Reader
from synth_recording import SyntheticSession
from gputop.record.recorder import Recorder
from gputop.record.writer import RecordWriter, SessionMeta

T0 = 1_767_225_600.0  # 2026-01-01, an arbitrary fixed clock


def write(path, batches, finish=True, meta=None):
    w = RecordWriter.create(path)
    w.start_session(meta or SessionMeta(mode="fake", host="testhost"))
    for b in batches:
        w.flush(b)
    if finish:
        w.finish()
    return w


def frames(*names):
    return tuple(Frame(n, f"/src/{n}.py", i + 1, "mod") for i, n in enumerate(names))


def full_gpu_sample(ts, index=0):
    return GpuSample(
        ts=ts, index=index, util_gpu=87.0, util_mem=33.5, mem_used=61 * 2**30 + 12345, mem_total=80 * 2**30,
        temperature_c=71.0, power_w=512.345, power_limit_w=700.0, fan_pct=41.25, sm_clock_mhz=1980,
        mem_clock_mhz=2619, sm_clock_max_mhz=1980, throttle_reasons=0x24, pcie_gen=5, pcie_width=16,
        pcie_max_gen=5, pcie_max_width=16, pcie_rx_bps=2.1e9 + 0.4, pcie_tx_bps=1.5e7, ecc_corrected=3,
        ecc_uncorrected=0, sm_active=91.27, sm_occupancy=36.04, tensor_active=0.03, dram_active=52.5,
        fp32_active=7.7, fp16_active=29.1, error=None,
    )


def approx_equal(a, b, rel=1e-4, abs_=0.006):
    """Dataclasses equal field by field; floats to the stored resolution (0.01 %, 1 mW, 1 B/s)."""
    assert type(a) is type(b)
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, float) and isinstance(y, float):
            assert y == pytest.approx(x, rel=rel, abs=abs_), f.name
        elif isinstance(x, tuple) and x and isinstance(x[0], CoreTimes):
            assert len(x) == len(y)
            for c, d in zip(x, y):
                for k in ("user", "system", "iowait", "steal"):
                    assert getattr(d, k) == pytest.approx(getattr(c, k), abs=0.25), k
        else:
            assert x == y, f.name


# --------------------------------------------------------------------------- blocks


@pytest.mark.parametrize("pack", [pack_rows, pack_rows_json])
def test_blocks_round_trip_exact_timestamps_nulls_negatives_bytes(pack):
    rows = [
        (T0 + i * 0.2 + i * 1e-7, i % 3, None if i % 7 == 0 else -(i**3), b"\x01\x02" * (i % 4), 2**40 + i)
        for i in range(500)
    ]
    out = unpack_rows(pack(rows, "tiiyi"), "tiiyi", len(rows))
    assert out == rows  # timestamps compared exactly, not approximately


@pytest.mark.parametrize(
    "blob",
    [b"", b"\x07garbage", b"\x01not zlib at all", b"\x00\x03", pack_rows([(T0, 1)], "ti")[:-2],
     b'\x02{"a": 1}', b"\x02[[1]]", b'\x02[["x", 1]]', b"\x02[[1e999, 1]]", b"\x02[[1.5, true]]", b"\x02[[1.5, 2]",
     b"\x02[[1.5, 99999999999999999999999]]"],
)
def test_blocks_reject_malformed_data_with_valueerror(blob):
    with pytest.raises(ValueError):
        unpack_rows(blob, "ti", 1)


def test_blocks_refuse_to_inflate_beyond_their_row_count():
    import zlib

    bomb = bytes([1]) + zlib.compress(b"\x00" * 10_000_000)
    with pytest.raises(ValueError):
        unpack_rows(bomb, "ti", 2)


# --------------------------------------------------------------------------- schema vs model


def test_every_model_field_is_recorded_somewhere():
    for cls, fields in (
        (GpuSample, schema.GPU_FIELDS),
        (HostSample, schema.HOST_FIELDS),
        (ProcSample, schema.PROC_FIELDS),
        (GpuProcess, schema.GPU_PROC_FIELDS),
    ):
        names = [f.name for f in dataclasses.fields(cls)]
        stored = {f.name for f in fields} | schema.STORED_ELSEWHERE[cls.__name__]
        missing = set(names) - stored
        assert not missing, f"{cls.__name__} fields not recorded: {missing} (add them and bump SCHEMA_VERSION)"
    # The GPU decoder builds GpuSample positionally: the order must match the dataclass.
    assert [f.name for f in dataclasses.fields(GpuSample)][2:] == [f.name for f in schema.GPU_FIELDS]
    # keeps, loop, freed, accum, shard and cudnn_off are the frames table's keeps column (JSON:
    # codec.keeps_text)
    assert [f.name for f in dataclasses.fields(Frame)] == ["name", "filename", "line", "module", "code", "keeps", "loop",
                                                           "freed", "accum", "shard", "cudnn_off"]
    assert {f.name for f in dataclasses.fields(StackSample)} == {
        "ts", "pid", "thread_id", "thread_name", "frames", "active", "owns_gil", "is_main", "category", "os_thread_id"
    }


def test_category_codes_cover_every_category():
    assert set(schema.CATEGORY_CODES) == set(Category)
    assert len(schema.CATEGORY_CODES) <= 63  # fits the flags byte after two flag bits


# --------------------------------------------------------------------------- round trip


def test_every_sample_type_round_trips(tmp_path):
    p = tmp_path / "all.gputop"
    sysinfo = SystemInfo(ts=T0, hostname="h1", driver_version="580.1", cuda_driver_version="13.0",
                         nvml_version="13.5", gpu_count=2, cpu_count=16, source="live")
    ginfo = GpuInfo(ts=T0, index=1, name="NVIDIA H100", uuid="GPU-1", memory_total=80 * 2**30, power_limit_w=700.0,
                    pcie_max_gen=5, pcie_max_width=16, compute_capability=(9, 0), sm_count=132, gpm_supported=True,
                    persistence_mode=True, numa_cpus="0-15")
    g = full_gpu_sample(T0 + 1.0, index=1)
    g_err = GpuSample(ts=T0 + 1.0, index=0, error="GPU is lost")
    pts = [UtilPoint(T0 + 0.2 * k, 1, float(k * 7 % 101) + 0.25) for k in range(1, 6)]
    gp = GpuProcess(ts=T0 + 1.0, gpu_index=1, pid=4242, used_memory=12 * 2**30, sm_util=55.0, mem_util=12.5, kind="C+G")
    cores = (CoreTimes(50.0, 10.5, 2.0, 0.5), CoreTimes(0.0, 0.0, 0.0, 0.0), CoreTimes(99.5, 0.5, 0.0, 0.0))
    host = HostSample(ts=T0 + 1.0, cpu_percent=50.123, cores=cores, iowait_percent=0.83, steal_percent=0.17,
                      load1=5.25, load5=4.0, load15=3.5, mem_total=128 * 2**30, mem_used=40 * 2**30,
                      mem_available=88 * 2**30, swap_total=0, swap_used=0, disk_read_bps=1.5e8, disk_write_bps=2e6,
                      net_rx_bps=1000.0, net_tx_bps=None, shm_total=64 * 2**30, shm_used=2**30)
    proc = ProcSample(ts=T0 + 1.0, pid=4242, ppid=1, name="python", user="me", cmdline="python train.py --bs 64",
                      cpu_percent=101.3, rss=9 * 2**30, num_threads=41, status="disk-sleep", create_time=T0 - 100.0,
                      io_read_bps=3e7, io_write_bps=0.0, role="target", env=(("OMP_NUM_THREADS", "8"),))
    st = StackSample(ts=T0 + 1.1, pid=4242, thread_id=1401234567890, thread_name="MainThread",
                     frames=frames("train", "step", "__next__"), active=False, owns_gil=True, is_main=True,
                     category=Category.DATA_WAIT, os_thread_id=4243)
    ev = Event(ts=T0 + 1.2, source="host", message="process 4242 has exited", level="warning")
    fi = Finding(id="data-stall", title="GPU waits for data", severity=Severity.CRITICAL, confidence=0.8,
                 evidence=("71% of idle samples in __next__", "3 workers at 92% CPU"),
                 action="DataLoader(num_workers=8)", expected_gain="+12% steps/s", cost_s=7.5, gpu_index=1,
                 ts=T0 + 1.3, first_seen=T0 + 0.5)
    write(p, [[sysinfo, ginfo, g, g_err, *pts, gp, host, proc, st, ev, fi]])

    r = Reader(p)
    assert r.damage is None
    assert r.system_info() == sysinfo
    assert r.gpu_infos() == [ginfo]
    got = {s.index: s for s in r.gpu_samples(T0, T0 + 2)}
    approx_equal(g, got[1])
    assert got[0] == g_err
    for a, b in zip(pts, r.util_points(T0, T0 + 2)):
        approx_equal(a, b)
        assert a.ts == b.ts  # exact
    assert r.gpu_processes(T0, T0 + 2) == [gp]
    approx_equal(host, r.host_samples(T0, T0 + 2)[0])
    approx_equal(proc, r.proc_samples(T0, T0 + 2)[0])
    assert r.stack_samples(T0, T0 + 2) == [st]
    assert r.events(T0, T0 + 2) == [ev]
    assert r.findings() == [fi]
    assert r.sessions[0]["host"] == "testhost"


def test_windows_are_half_open_and_ordered(tmp_path):
    p = tmp_path / "w.gputop"
    write(p, [[GpuSample(ts=T0 + k, index=i, util_gpu=float(k)) for i in (1, 0)] for k in range(1, 200)])
    r = Reader(p)
    got = r.gpu_samples(T0 + 10, T0 + 20)
    assert [s.ts - T0 for s in got if s.index == 0] == list(range(11, 21))
    assert [s.ts for s in got] == sorted(s.ts for s in got)
    assert [s.index for s in r.gpu_samples(T0 + 10, T0 + 20, gpu=1)] == [1] * 10


def test_stacks_and_frames_are_stored_once(tmp_path):
    p = tmp_path / "s.gputop"
    a, b, c = frames("main", "fwd"), frames("main", "bwd"), frames("main", "fwd", "linear")
    batches = []
    for k in range(300):
        batches.append([
            StackSample(ts=T0 + k * 0.2, pid=7, thread_id=1, thread_name="MainThread", frames=(a, b, c)[k % 3],
                        is_main=True, category=Category.FORWARD),
            StackSample(ts=T0 + k * 0.2, pid=7, thread_id=2, thread_name="pin", frames=a, category=Category.IDLE),
        ])
    write(p, batches)
    conn = sqlite3.connect(p)
    assert conn.execute("SELECT count(*) FROM stacks").fetchone()[0] == 3
    assert conn.execute("SELECT count(*) FROM frames").fetchone()[0] == 4  # main, fwd, bwd, linear
    assert conn.execute("SELECT count(*) FROM threads").fetchone()[0] == 2
    r = Reader(p)
    got = r.stack_samples(T0 - 1, T0 + 100)
    assert len(got) == 600
    assert {s.frames for s in got} == {a, b, c}
    assert [s.thread_id for s in r.stack_samples(T0 - 1, T0 + 100, main_only=True)] == [1] * 300


def test_process_identity_stored_once_and_small_per_sample(tmp_path):
    p = tmp_path / "p.gputop"
    batches = [[ProcSample(ts=T0 + k, pid=9, ppid=1, name="python", cmdline="python train.py " + "x" * 300,
                           cpu_percent=100.0 + k % 7, rss=2**33, env=(("OMP_NUM_THREADS", "8"),))]
               for k in range(600)]
    write(p, batches)
    conn = sqlite3.connect(p)
    assert conn.execute("SELECT count(*) FROM processes").fetchone()[0] == 1
    # 600 samples with a 300-character command line: far smaller than 600 copies of it.
    assert conn.execute("SELECT sum(length(data)) FROM proc_samples").fetchone()[0] < 600 * 30
    assert len(Reader(p).proc_samples(T0 - 1, T0 + 1000)) == 600


def test_minutes_are_compacted_without_changing_the_data(tmp_path):
    p = tmp_path / "c.gputop"
    ss = SyntheticSession(t0=T0)
    batches = list(ss.seconds(300))
    w = write(p, batches, finish=False)
    before = Reader(p)
    want = (before.gpu_samples(T0, T0 + 400), before.stack_samples(T0, T0 + 400), before.proc_samples(T0, T0 + 400))
    before.close()
    w.finish()
    conn = sqlite3.connect(p)
    for table in schema.SERIES_TABLES:
        n = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        assert n <= 7, (table, n)  # five minutes and a bit: one block a minute, not one per flush
    after = Reader(p)
    assert (after.gpu_samples(T0, T0 + 400), after.stack_samples(T0, T0 + 400), after.proc_samples(T0, T0 + 400)) == want


def test_findings_repeated_update_one_row_changes_add_one(tmp_path):
    p = tmp_path / "f.gputop"
    f = Finding(id="x", title="t", severity=Severity.WARNING, confidence=0.5, evidence=("e",), action="a",
                ts=T0, first_seen=T0)
    batches = [[dataclasses.replace(f, ts=T0 + k, cost_s=float(k))] for k in range(10)]
    batches.append([dataclasses.replace(f, ts=T0 + 20, evidence=("new evidence",))])
    write(p, batches)
    rows = Reader(p).finding_rows()
    assert len(rows) == 2
    assert rows[0][1] == T0 + 9  # last seen
    assert rows[0][0].cost_s == 9.0
    assert rows[1][0].evidence == ("new evidence",)


# --------------------------------------------------------------------------- security


def test_files_are_private(tmp_path):
    p = tmp_path / "m.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta())
    w.flush([GpuSample(ts=T0 + 1, index=0, util_gpu=1.0)])
    for f in (p, tmp_path / "m.gputop-wal", tmp_path / "m.gputop-shm"):
        assert f.exists()
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    w.finish()
    assert stat.S_IMODE(p.stat().st_mode) == 0o600


def test_secrets_never_reach_the_file(tmp_path):
    p = tmp_path / "sec.gputop"
    token = "hf_" + "A1b2C3d4E5f6G7h8I9j0K1l2"
    s = ProcSample(ts=T0 + 1, pid=5, name="python",
                   cmdline=f"python train.py --api-key {token} --password=hunter22 HF_TOKEN={token}",
                   env=(("WANDB_API_KEY", "0123456789abcdef"), ("NCCL_DEBUG", "INFO")))
    ev = Event(ts=T0 + 1, source="host", message=f"target started: python x.py --token {token}")
    meta = SessionMeta(argv=("gputop", "record", "--token", token), target_cmdline=f"python x.py {token}")
    w = write(p, [[s, ev]], finish=False, meta=meta)
    raw = p.read_bytes() + (tmp_path / "sec.gputop-wal").read_bytes()
    w.finish()
    raw += p.read_bytes()
    for secret in (token, "hunter22", "0123456789abcdef"):
        assert secret.encode() not in raw
    got = Reader(p).proc_samples(T0, T0 + 2)[0]
    assert "***" in got.cmdline and dict(got.env)["NCCL_DEBUG"] == "INFO"


def test_text_from_a_file_cannot_carry_terminal_escapes(tmp_path):
    p = tmp_path / "esc.gputop"
    bad = "evil\x1b[2J\x1b]0;pwned\x07name"
    write(p, [[StackSample(ts=T0 + 1, pid=1, thread_id=1, thread_name=bad, frames=(Frame(bad, bad, 1),)),
               Event(ts=T0 + 1, source="x", message=bad)]])
    r = Reader(p)
    s = r.stack_samples(T0, T0 + 2)[0]
    for text in (s.thread_name, s.frames[0].name, s.frames[0].filename, r.events(T0, T0 + 2)[0].message):
        assert "\x1b" not in text and "\x07" not in text


# --------------------------------------------------------------------------- paths


def test_existing_output_is_refused_without_force(tmp_path):
    p = tmp_path / "exists.gputop"
    write(p, [[GpuSample(ts=T0 + 1, index=0)]])
    with pytest.raises(UserError, match="already exists.*--force"):
        RecordWriter.create(p)


def test_force_replaces_a_recording_but_not_another_file(tmp_path):
    p = tmp_path / "old.gputop"
    write(p, [[GpuSample(ts=T0 + 1, index=0, util_gpu=5.0)]])
    write_forced = RecordWriter.create(p, force=True)
    write_forced.start_session(SessionMeta())
    write_forced.flush([GpuSample(ts=T0 + 50, index=0, util_gpu=7.0)])
    write_forced.finish()
    assert [s.util_gpu for s in Reader(p).gpu_samples(0, 2e9)] == [7.0]
    other = tmp_path / "notes.txt"
    other.write_text("precious")
    with pytest.raises(UserError, match="not a gputop recording"):
        RecordWriter.create(other, force=True)
    assert other.read_text() == "precious"


def test_append_adds_a_session(tmp_path):
    p = tmp_path / "app.gputop"
    write(p, [[StackSample(ts=T0 + 1, pid=1, thread_id=1, frames=frames("a"))]])
    w = RecordWriter.create(p, append=True)
    w.start_session(SessionMeta(host="second"))
    w.flush([StackSample(ts=T0 + 100, pid=1, thread_id=1, frames=frames("a"))])
    w.finish()
    r = Reader(p)
    assert [s["host"] for s in r.sessions] == ["testhost", "second"]
    assert len(r.stack_samples(0, 2e9)) == 2
    assert sqlite3.connect(p).execute("SELECT count(*) FROM stacks").fetchone()[0] == 1  # reused


@pytest.mark.parametrize("name", ["missing/dir/x.gputop"])
def test_missing_directory_is_a_user_error(tmp_path, name):
    with pytest.raises(UserError, match="does not exist"):
        RecordWriter.create(tmp_path / name)


# --------------------------------------------------------------------------- reading faults


def test_reader_refuses_bad_inputs_with_one_line(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        Reader(tmp_path / "nope.gputop")
    text = tmp_path / "t.txt"
    text.write_text("hello\n" * 100)
    with pytest.raises(UserError, match="not a gputop recording"):
        Reader(text)
    empty = tmp_path / "e.gputop"
    empty.write_bytes(b"")
    with pytest.raises(UserError, match="empty"):
        Reader(empty)
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t(x)").connection.commit()
    with pytest.raises(UserError, match="not a gputop recording"):
        Reader(other)
    with pytest.raises(UserError, match="directory"):
        Reader(tmp_path)


def test_newer_schema_is_refused(tmp_path):
    p = tmp_path / "new.gputop"
    write(p, [[GpuSample(ts=T0 + 1, index=0)]])
    c = sqlite3.connect(p)
    c.execute(f"PRAGMA user_version={schema.SCHEMA_VERSION + 1}")
    c.commit()
    c.close()
    with pytest.raises(UserError, match="newer gputop") as exc:
        Reader(p)
    assert "\n" not in str(exc.value)


def _ten_minutes(path):
    ss = SyntheticSession(t0=T0)
    write(path, ss.seconds(600))
    return ss


def test_truncated_file_replays_what_is_readable_and_says_where_it_ends(tmp_path):
    p = tmp_path / "trunc.gputop"
    _ten_minutes(p)
    full = Reader(p)
    full_end = full.end_ts
    full.close()
    data = p.read_bytes()
    # Half: a cut through every series. Where a cut falls depends on the layout (at 0.6 the wider
    # process rows of version 2 leave the GPU series whole, and the readable data ends at the end).
    p.write_bytes(data[: int(len(data) * 0.5)])
    r = Reader(p)  # must not raise
    assert r.damage is not None and "ends at" in r.damage
    assert r.end_ts < full_end
    got = r.gpu_samples(r.start_ts - 1, r.end_ts + 1000)
    assert got, "the readable part must be there"
    assert r.stack_samples(r.start_ts - 1, r.end_ts + 1000) is not None


def test_corrupted_pages_do_not_raise(tmp_path):
    p = tmp_path / "corrupt.gputop"
    _ten_minutes(p)
    data = bytearray(p.read_bytes())
    page = schema_page = 4096
    for off in range(3 * schema_page, len(data) - page, 5 * page):  # every fifth page after the schema
        data[off + 100 : off + 2000] = os.urandom(1900)
    p.write_bytes(bytes(data))
    try:
        r = Reader(p)
    except UserError as exc:  # acceptable: one line, no traceback
        assert "\n" not in str(exc)
        return
    for fn in (r.gpu_samples, r.util_points, r.host_samples, r.proc_samples, r.stack_samples, r.gpu_processes):
        fn(r.start_ts - 1, r.end_ts + 1)  # partial results, never an exception
    r.overview()
    Navigator(r).idle_periods()
    r.describe()


# --------------------------------------------------------------------------- overview


def test_overview_finds_the_checkpoint_idle_periods(tmp_path):
    p = tmp_path / "ov.gputop"
    ss = SyntheticSession(t0=T0, checkpoint_every_s=300, checkpoint_len_s=60)
    write(p, ss.seconds(620))
    r = Reader(p)
    periods = Navigator(r).idle_periods()
    # The synthetic job idles 60 s at the end of every 5 minutes.
    assert len(periods) == 2
    for per, minute in zip(periods, (4, 9)):
        assert abs(per.start - (T0 + minute * 60)) <= 10
        assert 50 <= per.duration <= 70
    busy = sum(o.busy_s for o in r.overview())
    covered = sum(o.covered_s for o in r.overview())
    assert 0.7 < busy / covered < 0.95


def test_overview_tail_is_rebuilt_when_the_writer_died(tmp_path):
    p = tmp_path / "tail.gputop"
    ss = SyntheticSession(t0=T0)
    write(p, ss.seconds(120), finish=False)  # never finished: like a killed recorder
    r = Reader(p)
    rows = r.overview()
    assert rows and max(o.ts + o.span for o in rows) >= T0 + 115


# --------------------------------------------------------------------------- the Recorder


def test_recorder_writes_from_its_own_thread_and_close_flushes(tmp_path):
    p = tmp_path / "rec.gputop"
    rec = Recorder.open(p, flush_interval=0.05)
    callers = set()
    ss = SyntheticSession(t0=T0)
    for batch in ss.seconds(30):
        callers.add(threading.current_thread().name)
        rec.on_batch(batch)
    rec.close()
    assert rec.error is None
    r = Reader(p)
    assert len(r.gpu_samples(0, 2e9)) == 30
    assert not (tmp_path / "rec.gputop-wal").exists() or (tmp_path / "rec.gputop-wal").stat().st_size == 0


def test_recorder_seeds_static_info_from_a_running_store(tmp_path):
    from gputop.store import Store

    store = Store()
    store.add([SystemInfo(ts=T0, hostname="seeded"), GpuInfo(ts=T0, index=0, name="H100")])
    rec = Recorder.open(tmp_path / "seed.gputop", store=store)
    rec.on_batch([GpuSample(ts=T0 + 5, index=0)])
    rec.close()
    r = Reader(tmp_path / "seed.gputop")
    assert r.system_info().hostname == "seeded"
    assert [g.name for g in r.gpu_infos()] == ["H100"]


def _feed_until_it_stops(rec) -> None:
    """Synthetic seconds into ``rec`` until its writer stops taking them (a cap, a full disk)."""
    for batch in SyntheticSession(t0=T0).seconds(3000):
        rec.on_batch(batch)
        if not rec.active:
            break
        time.sleep(0.001)
    deadline = time.monotonic() + 20
    while rec.active and time.monotonic() < deadline:
        time.sleep(0.02)


def test_the_max_size_cap_closes_the_recording_cleanly_and_says_so(tmp_path):
    """A recording stopped by --max-size is an end the user asked for: the file closed like any
    other (no 'not closed cleanly'), within the cap plus its closing reserve, no error."""
    from gputop.record import looks_like_recording
    from gputop.record.reader import Reader as R

    p = tmp_path / "capped.gputop"
    notes = []
    cap = 512 * 1024
    rec = Recorder.open(p, max_bytes=cap, notify=notes.extend, flush_interval=0.01)
    _feed_until_it_stops(rec)
    rec.close()
    assert not rec.active and rec.error is None
    assert rec.capped and "the --max-size limit of 512 KB reached" in rec.capped
    assert notes and notes[0].level == "warning" and "monitoring continues" in notes[0].message
    assert looks_like_recording(p) and os.path.getsize(p) <= cap * 1.02 + 256 * 1024
    with R(p) as r:
        assert r.gpu_samples(0, 2e9)
        assert not r.unclosed_sessions  # closed, not left open as a killed recording is


def test_disk_full_stops_recording_says_so_and_keeps_the_file(tmp_path):
    p = tmp_path / "full.gputop"
    notes = []
    rec = Recorder.open(p, notify=notes.extend, flush_interval=0.01)
    # The disk, not a --max-size cap, runs out: the file may grow by 160 KB only.
    used = rec.writer.conn.execute("PRAGMA page_count").fetchone()[0]
    rec.writer.conn.execute(f"PRAGMA max_page_count={used + 40}")
    _feed_until_it_stops(rec)
    assert not rec.active
    assert rec.error and "disk full" in rec.error and "--max-size" not in rec.error
    assert notes and isinstance(notes[0], Event) and notes[0].level == "error"
    assert "monitoring continues" in notes[0].message
    rec.on_batch([GpuSample(ts=T0 + 9999, index=0)])  # ignored, no exception
    rec.close()
    r = Reader(p)  # what was committed is readable
    assert r.gpu_samples(0, 2e9)


def test_on_batch_never_blocks_when_the_writer_is_stuck(tmp_path):
    p = tmp_path / "slow.gputop"
    rec = Recorder.open(p)
    gate = threading.Event()
    real = rec.writer.flush

    def slow_flush(samples):
        gate.wait(10)
        real(samples)

    rec.writer.flush = slow_flush  # type: ignore[method-assign]
    rec._q.maxsize = 5  # type: ignore[attr-defined]

    def feed():
        for k in range(50):
            rec.on_batch([GpuSample(ts=T0 + k, index=0)])

    caller = threading.Thread(target=feed)
    caller.start()
    caller.join(30)  # a deadlock check, not a speed check: the writer is held the whole time
    assert not caller.is_alive() and not gate.is_set()
    assert rec.dropped > 0
    gate.set()
    rec.close()


def test_derived_verdicts_are_not_recorded(tmp_path):
    from gputop.model import Finding, Severity, Verdict
    from gputop.record.reader import Reader
    from gputop.record.writer import RecordWriter, SessionMeta

    f = Finding("data-starved", "t", Severity.WARNING, 0.9, ("e",), "a", ts=T0 + 1)
    w = RecordWriter.create(tmp_path / "v.gputop")
    w.start_session(SessionMeta(mode="fake"))
    w.flush([GpuSample(ts=T0, index=0, util_gpu=5.0), Verdict(T0 + 1, (f,)), f])
    assert w.samples == 2  # the GPU sample and the finding; the verdict is derived state
    w.finish()
    with Reader(tmp_path / "v.gputop") as r:
        assert [x.id for x in r.findings()] == ["data-starved"]


def test_a_recording_started_mid_session_keeps_the_findings_already_showing(tmp_path):
    """The advisor sends a finding when it appears (and again every 10 s): one already showing
    when recording starts must be in the file from the start, however short the recording."""
    from gputop.model import Verdict
    from gputop.store import Store

    shown = Finding("tensor-idle", "GPU 1 busy but tensor cores idle", Severity.WARNING, 0.8, ("e",), "use bf16",
                    gpu_index=1, ts=T0 + 29, first_seen=T0 + 10)
    store = Store()
    store.add([GpuSample(ts=T0 + 30, index=1), Verdict(T0 + 29, (shown,))])
    rec = Recorder.open(tmp_path / "mid.gputop", store=store)
    rec.on_batch([GpuSample(ts=T0 + 31, index=1), GpuSample(ts=T0 + 33, index=1)])
    rec.close()
    with Reader(tmp_path / "mid.gputop") as r:
        got = r.findings()
        marks = Navigator(r).finding_marks()
    assert [(f.id, f.gpu_index, f.title) for f in got] == [("tensor-idle", 1, "GPU 1 busy but tensor cores idle")]
    # Stamped with the recording's start (the store's now); first shown when the advisor showed it.
    assert got[0].ts == T0 + 30 and got[0].first_seen == T0 + 10
    assert len(marks) == 1


def test_a_mid_session_finding_sent_again_is_one_finding(tmp_path):
    from gputop.model import Verdict
    from gputop.store import Store

    shown = Finding("x", "t", Severity.WARNING, 0.5, ("e",), "a", gpu_index=0, ts=T0 + 9)
    store = Store()
    store.add([GpuSample(ts=T0 + 9, index=0), Verdict(T0 + 9, (shown,))])
    rec = Recorder.open(tmp_path / "again.gputop", store=store)
    rec.on_batch([GpuSample(ts=T0 + 11, index=0), dataclasses.replace(shown, ts=T0 + 19)])  # the advisor's refresh
    rec.close()
    with Reader(tmp_path / "again.gputop") as r:
        assert len({(m.finding_id, m.gpu) for m in Navigator(r).finding_marks()}) == 1
        assert len(r.findings()) == 1


def _cpu_only(path, pid=4242):
    w = RecordWriter.create(path)
    w.start_session(SessionMeta(mode="live", target_pid=pid, target_cmdline="python train.py"))
    w.flush([SystemInfo(ts=T0, hostname="h", nvml_error="NVML Shared Library Not Found"),
             HostSample(ts=T0 + 1, cpu_percent=50.0), HostSample(ts=T0 + 3, cpu_percent=50.0)])
    w.finish()


def _fake(path, gpus=1):
    info = [SystemInfo(ts=T0, hostname="h", driver_version="fake", source="fake")]
    info += [GpuInfo(ts=T0, index=i, name="Fake H100", uuid=f"GPU-fake-{i:04d}") for i in range(gpus)]
    w = RecordWriter.create(path)
    w.start_session(SessionMeta(mode="fake"))
    w.flush(info + [GpuSample(ts=T0 + 1, index=i) for i in range(gpus)])
    w.finish()


def test_appending_another_source_kind_or_other_gpus_is_refused_and_the_file_left_alone(tmp_path):
    from gputop.record.writer import Identity

    fake_one = Identity.of([SystemInfo(ts=T0, source="fake"), GpuInfo(ts=T0, index=0, name="F", uuid="GPU-fake-0000")])
    nvml = Identity.of([SystemInfo(ts=T0, source="live"), GpuInfo(ts=T0, index=0, name="H100", uuid="GPU-aaaa")])
    cpu = Identity.of([SystemInfo(ts=T0, source="live", nvml_error="no driver")])
    cases = [
        (_cpu_only, fake_one, "recorded from no GPU (CPU only), this session watches the fake GPU source"),
        (_cpu_only, nvml, "recorded from no GPU (CPU only), this session watches real GPUs (NVML)"),
        (_fake, nvml, "recorded from the fake GPU source (--fake), this session watches real GPUs (NVML)"),
        (_fake, cpu, "this session watches no GPU (CPU only)"),
        (lambda p: _fake(p, gpus=2), fake_one, "it holds GPUs GPU-fake-0000, GPU-fake-0001, this session watches GPU-fake-0000"),
    ]
    for k, (make, new, said) in enumerate(cases):
        p = tmp_path / f"r{k}.gputop"
        make(p)
        before = p.read_bytes()
        with pytest.raises(UserError) as exc:
            RecordWriter.create(p, append=True, identity=new)
        msg = str(exc.value)
        assert msg.startswith(f"cannot append to {p}: ") and said in msg and "\n" not in msg, msg
        assert p.read_bytes() == before and not (tmp_path / f"r{k}.gputop-wal").exists()
    # The same kind and GPUs (or not known yet) append as before.
    for make, new in ((_cpu_only, cpu), (_fake, fake_one), (_fake, Identity(None))):
        p = tmp_path / "same.gputop"
        p.unlink(missing_ok=True)
        make(p)
        w = RecordWriter.create(p, append=True, identity=new)
        w.start_session(SessionMeta(mode="live"))
        w.finish()
        with Reader(p) as r:
            assert len(r.sessions) == 2


def test_recorder_open_refuses_an_append_from_its_store(tmp_path):
    """Recorder.open checks the running session's static info (and a first poll not stored yet)."""
    from gputop.store import Store

    p = tmp_path / "cpu.gputop"
    _cpu_only(p)
    before = p.read_bytes()
    first_poll = [SystemInfo(ts=T0 + 50, source="fake"), GpuInfo(ts=T0 + 50, index=0, name="F", uuid="GPU-fake-0000")]
    with pytest.raises(UserError, match="this session watches the fake GPU source"):
        Recorder.open(p, append=True, store=Store(), identify=first_poll)
    assert p.read_bytes() == before
    with Reader(p) as r:
        assert len(r.sessions) == 1 and r.sessions[0]["target_pid"] == 4242


def test_the_writer_span_is_the_one_info_shows(tmp_path):
    """The recorder's closing line counts what `info` counts: from the first sample recorded as
    it happened, the utilisation buffer's history (backfill) apart; static info and findings
    with earlier times do not stretch it."""
    p = tmp_path / "span.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta(mode="fake"))
    history = [UtilPoint(ts=T0 - 14 + 0.2 * k, index=0, util=50.0) for k in range(75)]
    w.flush([SystemInfo(ts=T0 - 100, source="fake"), *history, GpuSample(ts=T0, index=0), HostSample(ts=T0 + 0.1, cpu_percent=1.0),
             Finding("x", "t", Severity.WARNING, 0.5, ("e",), "a", ts=T0 - 50)])
    w.flush([UtilPoint(ts=T0 + 4.8, index=0, util=50.0), GpuSample(ts=T0 + 4, index=0), HostSample(ts=T0 + 4.1, cpu_percent=1.0)])
    span = w.span()
    w.finish()
    with Reader(p) as r:
        assert span.start == r.start_ts == T0
        assert span.duration == pytest.approx(r.duration) == pytest.approx(4.8)
        assert span.backfill_s == pytest.approx(r.span.backfill_s) == pytest.approx(14.0)


def test_settle_waits_for_a_poll_at_or_after_the_stop(tmp_path):
    rec = Recorder.open(tmp_path / "settle.gputop")
    rec.on_batch([GpuSample(ts=T0, index=0), HostSample(ts=T0, cpu_percent=1.0)])
    assert not rec.settle(T0 + 1, timeout=0.05)  # nothing newer: gives up at the timeout
    threading.Timer(0.1, rec.on_batch, ([GpuSample(ts=T0 + 1.5, index=0)],)).start()
    threading.Timer(0.2, rec.on_batch, ([HostSample(ts=T0 + 1.6, cpu_percent=1.0)],)).start()
    started = time.monotonic()
    assert rec.settle(T0 + 1, timeout=5.0)
    assert time.monotonic() - started < 2.0
    assert not rec.settle(T0 + 9, timeout=5.0, alive=lambda: False)  # collection stopped: no wait
    rec.close()
    with Reader(tmp_path / "settle.gputop") as r:
        assert r.end_ts == T0 + 1.6  # what came before close was written
