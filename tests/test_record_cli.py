"""`gputop record`, `info` and the recorder's fault cases end to end, SIGKILL included."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gputop.cli import main
from gputop.errors import UserError
from gputop.commands.record import parse_duration, parse_size
from gputop.record.reader import Reader
from synth_recording import SyntheticSession
from gputop.record.writer import RecordWriter, SessionMeta

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_767_225_600.0


def start_recorder(out: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", "gputop", "record", "-o", str(out), "--fake", "1", "--interval", "0.2", *extra],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def wait_for_data(out: Path, seconds: float, proc: subprocess.Popen) -> None:
    """Until the file holds ``seconds`` of GPU polls (or the process died)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            with Reader(out) as r:
                got = r.gpu_samples(0, 2e10)
            if len(got) >= 2 and got[-1].ts - got[0].ts >= seconds:
                return
        except Exception:
            pass
        time.sleep(0.2)
    raise AssertionError("the recorder wrote nothing")


def _killed_by(sig: int, folder: Path) -> dict:
    """A recorder stopped by ``sig`` once it has written a while: what the tests below read."""
    out = folder / ("killed.gputop" if sig == signal.SIGKILL else "stopped.gputop")
    proc = start_recorder(out)
    try:
        if sig == signal.SIGKILL:
            wait_for_data(out, 2.0, proc)
            time.sleep(1.0)
            killed_at = time.time()
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            return {"out": out, "returncode": proc.returncode, "killed_at": killed_at}
        wait_for_data(out, 1.0, proc)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        return {"out": out, "returncode": proc.returncode, "stderr": err}
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """Recorders stopped by SIGKILL, SIGTERM and SIGINT, run side by side (each mostly waits on
    its fake GPU's polls): signal -> a future of ``_killed_by``. Started by the first test that
    has no timing of its own to keep (``test_bad_paths_are_one_line_errors``), so they run while
    the tests after it do; read by the last tests of the module."""
    sigs = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)
    pool = ThreadPoolExecutor(max_workers=len(sigs))
    try:
        yield {sig: pool.submit(_killed_by, sig, tmp_path_factory.mktemp(f"sig{int(sig)}")) for sig in sigs}
    finally:
        pool.shutdown(wait=True)


def test_duration_stops_and_the_file_is_complete(tmp_path, capsys):
    out = tmp_path / "d.gputop"
    assert main(["record", "-o", str(out), "--fake", "2", "--interval", "0.1", "--duration", "1.5s"]) == 0
    err = capsys.readouterr().err
    assert "duration reached" in err
    with Reader(out) as r:
        assert r.gpu_indices() == [0, 1]
        assert len(r.gpu_samples(0, 2e10)) >= 10
        assert r.sessions[0]["mode"] == "fake"
        assert r.sessions[0]["interval"] == 0.1
    assert oct(out.stat().st_mode & 0o777) == "0o600"


def test_existing_output_needs_force(tmp_path, capsys):
    out = tmp_path / "exists.gputop"
    out.write_text("something else")
    # A file that is not a recording: neither --force nor --append would write over it, so the
    # message offers neither (it used to, then refused both).
    assert main(["record", "-o", str(out), "--fake", "1", "--duration", "1s"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"gputop record: error: {out} exists and is not a gputop recording: record will not write over it; "
                   "choose another file name")
    # An existing recording needs --force (or --append).
    rec = tmp_path / "rec.gputop"
    assert main(["record", "-o", str(rec), "--fake", "1", "--interval", "0.1", "--duration", "0.3s"]) == 0
    capsys.readouterr()
    assert main(["record", "-o", str(rec), "--fake", "1", "--duration", "1s"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"gputop record: error: {rec} already exists: use --force to overwrite it or --append to add to it")
    # --force refuses a file that is not a recording, rather than destroying it.
    assert main(["record", "-o", str(out), "--fake", "1", "--duration", "1s", "--force"]) == 2
    assert "not a gputop recording" in capsys.readouterr().err
    assert out.read_text() == "something else"


def test_append_adds_a_second_session(tmp_path, capsys):
    out = tmp_path / "a.gputop"
    assert main(["record", "-o", str(out), "--fake", "1", "--interval", "0.1", "--duration", "0.5s"]) == 0
    assert main(["record", "-o", str(out), "--fake", "1", "--interval", "0.1", "--duration", "0.5s", "--append"]) == 0
    with Reader(out) as r:
        assert len(r.sessions) == 2


def test_appending_to_a_recording_made_readable_makes_it_private_again(tmp_path):
    """A recording copied or chmod-ed to 0644 kept that mode while new command lines and stacks
    were appended to it (a new user's report): every recording is 0600."""
    import stat

    out = tmp_path / "open.gputop"
    assert main(["record", "-o", str(out), "--fake", "1", "--interval", "0.1", "--duration", "0.3s"]) == 0
    out.chmod(0o644)
    assert main(["record", "-o", str(out), "--fake", "1", "--interval", "0.1", "--duration", "0.3s", "--append"]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


def test_a_recording_being_written_is_neither_overwritten_nor_appended_to(tmp_path, capsys):
    # A second `record --force` deleted the file under a live recorder (its data gone, and it then
    # said the file "keeps data up to" a time it no longer held); a second `--append` added a
    # session that took over the live recorder's samples.
    out = tmp_path / "live.gputop"
    proc = start_recorder(out)
    try:
        wait_for_data(out, 1.0, proc)
        with Reader(out) as r:
            first = r.gpu_samples(0, 2e10)[0].ts
        for how in ("--force", "--append"):
            assert main(["record", "-o", str(out), "--fake", "1", "--duration", "1s", how]) == 2, how
            err = capsys.readouterr().err.strip()
            assert err == (f"gputop record: error: cannot {'overwrite' if how == '--force' else 'append to'} {out}: another "
                           f"gputop (pid {proc.pid}) is recording to it; stop that recording first, or record to a "
                           "new file"), err
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
    with Reader(out) as r:
        assert len(r.sessions) == 1 and r.gpu_samples(0, 2e10)[0].ts == first
    # Once that recorder has closed it, the file is an old recording like any other.
    assert main(["record", "-o", str(out), "--fake", "1", "--interval", "0.1", "--duration", "0.3s", "--append"]) == 0
    with Reader(out) as r:
        assert len(r.sessions) == 2


def test_a_writer_holds_its_file_until_it_closes(tmp_path):
    out = tmp_path / "w.gputop"
    w = RecordWriter.create(out)
    with pytest.raises(UserError, match=f"another gputop \\(pid {os.getpid()}\\) is recording to it"):
        RecordWriter.create(out, force=True)
    with pytest.raises(UserError, match="cannot append to"):
        RecordWriter.create(out, append=True)
    assert out.exists()
    w.finish()
    RecordWriter.create(out, append=True).finish()
    RecordWriter.create(out, force=True).abort()


def test_bad_paths_are_one_line_errors(tmp_path, capsys, stopped):
    # stopped: the recorders the signal tests at the end read start here (see there).
    for args in (["record", "-o", str(tmp_path / "no" / "dir.gputop"), "--fake", "1"],
                 ["record", "-o", str(tmp_path), "--fake", "1"],
                 ["record", "--fake", "1"]):
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("gputop record: error:") and "\n" not in err


def test_disk_full_while_recording_stops_and_says_so(tmp_path, capsys, monkeypatch):
    real = RecordWriter._set_max_bytes

    def tiny(self, max_bytes):
        # The file may grow by 80 KB only: the disk is "full" a moment after the start.
        page_count = self.conn.execute("PRAGMA page_count").fetchone()[0]
        self.conn.execute(f"PRAGMA max_page_count={page_count + 20}")

    monkeypatch.setattr(RecordWriter, "_set_max_bytes", tiny)
    out = tmp_path / "full.gputop"
    rc = main(["record", "-o", str(out), "--fake", "8", "--interval", "0.1", "--duration", "60s"])
    monkeypatch.setattr(RecordWriter, "_set_max_bytes", real)
    assert rc == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("gputop record: error: recording to") and "disk full" in err[-1]
    with Reader(out) as r:  # what was committed is there
        assert r.gpu_samples(0, 2e10)


def test_a_max_size_stop_is_a_clean_end_not_an_error(tmp_path, capsys, monkeypatch):
    real = RecordWriter._set_max_bytes

    def small(self, max_bytes):
        # --max-size given, with room for a moment only past what the file holds already (its
        # closing reserve is 64 pages).
        self.max_bytes = max_bytes
        page_count = self.conn.execute("PRAGMA page_count").fetchone()[0]
        self.conn.execute(f"PRAGMA max_page_count={page_count + 72}")

    monkeypatch.setattr(RecordWriter, "_set_max_bytes", small)
    out = tmp_path / "capped.gputop"
    rc = main(["record", "-o", str(out), "--fake", "8", "--interval", "0.1", "--duration", "60s", "--max-size", "1M"])
    monkeypatch.setattr(RecordWriter, "_set_max_bytes", real)
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "(--max-size reached)" in err and "error" not in err
    with Reader(out) as r:
        assert r.gpu_samples(0, 2e10) and not r.unclosed_sessions


def test_list_with_an_output_says_it_records_nothing(tmp_path, capsys):
    """`record -l -o x.gputop` listed and ignored -o without a word (a new user's report)."""
    out = tmp_path / "x.gputop"
    assert main(["record", "--list", str(tmp_path), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--list records nothing" in err and len(err.strip().splitlines()) == 1 and not out.exists()


def test_list_and_info(tmp_path, capsys):
    p = tmp_path / "one.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta(mode="fake", target_pid=42, target_cmdline="python train.py"))
    for b in SyntheticSession(t0=T0).seconds(120):
        w.flush(b)
    w.finish()
    (tmp_path / "notes.txt").write_text("hello")
    assert main(["record", "--list", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "one.gputop" in out and "synthetic-host" in out and "notes.txt" not in out
    assert main(["info", str(p)]) == 0
    out = capsys.readouterr().out
    assert "synthetic-host" in out and "NVIDIA H100" in out and "PID 42" in out and "per GPU-hour" in out
    assert main(["info", str(p), "--json", "--check"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["bad_blocks"] == 0 and d["counts"]["gpu_samples"] == 120 and d["gpu_indices"] == [0]


def test_list_shows_each_jobs_script_not_the_shared_interpreter_path(tmp_path, capsys):
    # Two jobs of one virtualenv: the first 40 characters of their command lines were the same
    # interpreter path, so the list could not tell them apart.
    venv = "/root/.pyenv/versions/3.11.7/bin/python"
    for name, cmd in (("a.gputop", f"{venv} plain.py --api-key ***"),
                      ("b.gputop", f"{venv} loader.py --data /datasets/imagenet/train --workers 8 --epochs 90")):
        w = RecordWriter.create(tmp_path / name)
        w.start_session(SessionMeta(mode="fake", target_pid=42, target_cmdline=cmd))
        for b in SyntheticSession(t0=T0).seconds(5):
            w.flush(b)
        w.finish()
    assert main(["record", "--list", str(tmp_path)]) == 0
    rows = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()[1:]}
    assert rows["a.gputop"].endswith("  python plain.py --api-key ***")
    # cut at the end, to the column's 40 characters: the script and the first arguments stay
    cut = "python loader.py --data /datasets/image…"
    assert len(cut) == 40 and rows["b.gputop"].endswith("  " + cut)
    assert venv not in rows["a.gputop"] + rows["b.gputop"]


def test_info_bad_inputs(tmp_path, capsys):
    assert main(["info", str(tmp_path / "missing.gputop")]) == 2
    assert capsys.readouterr().err.strip() == f"gputop info: error: {tmp_path / 'missing.gputop'}: no such file"


@pytest.mark.parametrize("text, want", [("90s", 90), ("30m", 1800), ("8h", 28800), ("1h30m", 5400), ("45", 45)])
def test_parse_duration(text, want):
    assert parse_duration(text) == want


@pytest.mark.parametrize("text", ["soon", "0", "-5m", "5x", "1h 3q"])
def test_parse_duration_rejects(text):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration(text)


def test_parse_size():
    import argparse

    assert parse_size("2G") == 2 * 1024**3 and parse_size("500MB") == 500 * 1024**2
    for bad in ("lots", "10K"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_size(bad)


def test_record_status_names_the_target_and_calls_its_own_pid_the_recorder(tmp_path, capsys):
    from gputop.commands.record import _Status

    class Rec:
        samples, dropped = 10, 0
        writer = type("Writer", (), {"gpus": set()})()

        def bytes_on_disk(self):
            return 4096

    st = _Status(tmp_path / "x.gputop", Rec(), 60.0, target=31337)
    st.tty = False
    assert "PID 31337" in st.line(5.0)
    assert str(os.getpid()) not in st.line(5.0)
    st.start_line()
    err = capsys.readouterr().err
    assert "attached to PID 31337" in err and f"recorder (PID {os.getpid()})" in err


def test_the_closing_line_says_the_span_info_shows(tmp_path, capsys):
    """Not the utilisation buffer's history from before the recorder started: that is said apart."""
    from gputop.commands.info import format_info
    from gputop.units import fmt_length

    out = tmp_path / "len.gputop"
    assert main(["record", "-o", str(out), "--fake", "1", "--interval", "0.5", "--duration", "2s"]) == 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    with Reader(out) as r:
        length, backfill = r.duration, r.span.backfill_s
        d = r.describe()
    assert backfill > 5  # the fake GPU's buffer reaches ~14 s back, as NVML's does
    assert last.startswith(f"gputop record: recorded {fmt_length(length)} to {out} (duration reached)"), last
    assert 1.75 <= length <= 2.0 + 1e-3  # the duration, to within a 200 ms utilisation point
    assert f"plus {backfill:.0f} s of GPU utilisation history" in last
    d["findings"], d["idle_periods"] = 0, 0
    assert f"({fmt_length(length)};" in format_info(d)


def _cpu_only_recording(path: Path, pid: int = 4242) -> None:
    from gputop.model import HostSample, SystemInfo

    w = RecordWriter.create(path)
    w.start_session(SessionMeta(mode="live", target_pid=pid, target_cmdline="python train.py"))
    w.flush([SystemInfo(ts=T0, hostname="cpu-box", nvml_error="NVML Shared Library Not Found"),
             HostSample(ts=T0 + 1, cpu_percent=50.0), HostSample(ts=T0 + 3, cpu_percent=50.0)])
    w.finish()


def test_append_refuses_another_source_kind_and_keeps_the_first_session(tmp_path, capsys):
    out = tmp_path / "job.gputop"
    _cpu_only_recording(out)
    before = out.read_bytes()
    assert main(["info", str(out)]) == 0
    info_before = capsys.readouterr().out
    assert main(["record", "-o", str(out), "-a", "--fake", "1", "--interval", "0.2", "-d", "1s"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"gputop record: error: cannot append to {out}: it was recorded from no GPU (CPU only), this session "
                   "watches the fake GPU source (--fake); record to a new file")
    assert out.read_bytes() == before
    assert main(["info", str(out)]) == 0
    info_after = capsys.readouterr().out
    assert info_after == info_before and "PID 4242" in info_after and "fake" not in info_after


def test_append_refuses_other_gpus_and_accepts_the_same(tmp_path, capsys):
    out = tmp_path / "two.gputop"
    assert main(["record", "-o", str(out), "--fake", "2", "--interval", "0.2", "-d", "0.5s"]) == 0
    capsys.readouterr()
    before = out.read_bytes()
    assert main(["record", "-o", str(out), "-a", "--fake", "1", "--interval", "0.2", "-d", "0.5s"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "it holds GPUs GPU-fake-0000, GPU-fake-0001, this session watches GPU-fake-0000" in err
    assert out.read_bytes() == before
    assert main(["record", "-o", str(out), "-a", "--fake", "2", "--interval", "0.2", "-d", "0.5s"]) == 0
    with Reader(out) as r:
        assert len(r.sessions) == 2
        # The appended session's first poll (taken to know its GPUs) is recorded too.
        second = r.sessions[1]["started"]
        assert [s for s in r.gpu_samples(second - 1, 2e10) if s.ts >= second][0].ts - second < 0.3


def test_list_skips_entries_it_cannot_read(tmp_path, capsys, monkeypatch):
    """`record -l /proc/1`: entries such as /proc/1/cwd cannot even be stat'ed by a user."""
    import pathlib

    one = tmp_path / "one.gputop"
    assert main(["record", "-o", str(one), "--fake", "1", "--interval", "0.2", "-d", "0.3s"]) == 0
    (tmp_path / "cwd").write_text("x")
    capsys.readouterr()
    real_is_file = pathlib.Path.is_file

    def is_file(self):
        if self.name == "cwd":
            raise PermissionError(13, "Permission denied", str(self))
        return real_is_file(self)

    monkeypatch.setattr(pathlib.Path, "is_file", is_file)
    assert main(["record", "--list", str(tmp_path)]) == 0
    cap = capsys.readouterr()
    assert "one.gputop" in cap.out and "cwd" not in cap.out and "Traceback" not in cap.err


def test_list_of_a_directory_it_cannot_read_is_one_line(tmp_path, capsys, monkeypatch):
    import pathlib

    def iterdir(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(pathlib.Path, "iterdir", iterdir)
    assert main(["record", "--list", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip() == f"gputop record: error: cannot list {tmp_path}: permission denied"


def test_list_of_proc_1_never_raises(capsys):
    if not Path("/proc/1").is_dir():
        pytest.skip("no /proc")
    assert main(["record", "--list", "/proc/1"]) in (0, 1)
    assert "Traceback" not in capsys.readouterr().err


def test_stopping_a_recording_keeps_what_happened_up_to_the_stop(tmp_path):
    """The sources say what happened since their last poll only at their next one: stopping
    waits for it (at most a poll interval), so the file reaches the stop, not a poll before it."""
    from gputop.session import Config, open_live

    session = open_live(Config(fake=1, interval=0.5, advisor=False))
    session.start()
    try:
        time.sleep(0.3)
        session.start_recording(tmp_path / "stop.gputop")
        time.sleep(1.2)
        stopped = time.time()
        session.stop_recording()
        closed = time.time()
    finally:
        session.stop()
    assert closed - stopped < 1.5  # one poll interval and the last flush
    with Reader(tmp_path / "stop.gputop") as r:
        assert r.end_ts >= stopped
        assert max(s.ts for s in r.gpu_samples(0, 2e10)) >= stopped
        assert max(s.ts for s in r.host_samples(0, 2e10)) >= stopped
        assert r.state == "closed"


def test_quitting_while_a_recording_is_being_stopped_closes_it(tmp_path):
    """The UI stops a recording on a worker thread; `q` at that moment must still leave one
    complete file (session.stop closes it before returning)."""
    import threading

    from gputop.session import Config, open_live

    session = open_live(Config(fake=1, interval=4.0, advisor=False))
    session.start()
    path = tmp_path / "quit.gputop"
    try:
        session.start_recording(path)
        time.sleep(0.3)
        worker = threading.Thread(target=session.stop_recording)
        worker.start()
        time.sleep(0.3)  # the worker waits for the next poll, 4 s away
        assert worker.is_alive()
    finally:
        started = time.monotonic()
        session.stop()
    assert time.monotonic() - started < 3.0
    assert not Path(f"{path}-wal").exists()
    with Reader(path) as r:
        assert r.state == "closed" and r.system_info() is not None
    worker.join(5)
    assert not worker.is_alive()


async def test_the_record_key_records_the_findings_already_showing(tmp_path, monkeypatch, clock):
    """The user's case: the Advisor shows a finding, `r` starts a recording, `r` stops it before
    the advisor sends that finding again: the recording has it."""
    from gputop.model import Finding, Severity, Verdict
    from gputop.pipeline import Pipeline
    from gputop.record.navigate import Navigator
    from gputop.session import Session
    from gputop.sources.fake import FakeGpuSource
    from gputop.store import Store
    from gputop.ui.app import GputopApp

    monkeypatch.chdir(tmp_path)
    store = Store()
    src = FakeGpuSource(gpus=2, clock=clock)
    session = Session(store=store, pipeline=Pipeline(store, [src], clock=clock), gpu=src, mode="fake")
    for _ in range(3):
        clock.advance(1.0)
        session.pipeline.poll_once()
    tensor = Finding("tensor-idle", "GPU 1 busy but tensor cores idle: fp32 math", Severity.WARNING, 0.9, ("e",),
                     "use bf16", gpu_index=1, ts=clock(), first_seen=clock() - 2)
    session.pipeline.publish([Verdict(clock(), (tensor,))])
    app = GputopApp(session, interval=1.0, refresh=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("r")
        assert session.recorder is not None
        for _ in range(3):
            clock.advance(1.0)
            session.pipeline.poll_once()
        await pilot.press("r")
        await app.workers.wait_for_complete()
        assert session.recorder is None
    (path,) = tmp_path.glob("gputop-*.gputop")
    with Reader(path) as r:
        assert {(m.finding_id, m.gpu) for m in Navigator(r).finding_marks()} == {("tensor-idle", 1)}
        assert r.state == "closed"


def test_duration_stops_at_the_duration_not_a_poll_later(tmp_path, capsys):
    """`record -d 12s` recorded 14 s: the loop looked at the clock once a second and the stop then
    waited for the poll after it. It ends at the duration's end: the poll that covers it gives its
    utilisation points up to the end (200 ms apart), nothing stamped after it."""
    out = tmp_path / "d.gputop"
    assert main(["record", "-o", str(out), "--fake", "1", "--interval", "1", "-d", "2s"]) == 0
    with Reader(out) as r:
        assert 1.75 <= r.duration <= 2.0 + 1e-3, r.duration


@pytest.mark.slow
def test_recording_a_pid_stops_within_a_poll_of_its_exit(tmp_path):
    from gputop.sources.stacks import find_pyspy

    if find_pyspy() is None:
        pytest.skip("py-spy not installed")
    out = tmp_path / "exit.gputop"
    stop = tmp_path / "stop"
    # The job ends when told, not after a fixed time: on a loaded 2-core machine the recorder's own
    # start-up outlasted a 2.5 s job ("no process with PID").
    job = subprocess.Popen([sys.executable, "-c", "import os, sys, time; print('ready', flush=True)\n"
                            "t = time.time()\nwhile not os.path.exists(sys.argv[1]) and time.time() - t < 60:\n"
                            "    time.sleep(0.05)", str(stop)], stdout=subprocess.PIPE, text=True)
    assert job.stdout is not None and job.stdout.readline().strip() == "ready"
    time.sleep(0.3)  # py-spy needs the interpreter initialised
    rec = start_recorder(out, "--pid", str(job.pid))
    try:
        deadline = time.monotonic() + 30
        while not out.exists() and time.monotonic() < deadline and rec.poll() is None:
            time.sleep(0.05)
        time.sleep(1.0)  # a few polls of the live job recorded before it ends
        stop.touch()
        job.wait(30)
        exited = time.monotonic()
        _, err = rec.communicate(timeout=30)
        done = time.monotonic()
    finally:
        if rec.poll() is None:
            rec.kill()
    assert rec.returncode == 0, err
    assert f"process {job.pid} exited" in err
    # A 0.2 s poll, the check for the exit, the file's close; it went on ~7 s after the exit.
    assert done - exited < 1.5, done - exited
    # The file keeps the exit itself, which the report says (a recording cut at the last time the
    # job was seen alive lost it, and the report said nothing of how the job ended).
    from gputop.record.reader import Reader

    with Reader(out) as r:
        said = [e.message for e in r.events(r.start_ts - 1, r.end_ts + 1)]
    assert f"process {job.pid} has exited" in said, said


def test_list_says_cpu_only_and_lists_a_recording_it_cannot_read_with_why(tmp_path, capsys, monkeypatch):
    """'0× -' for a CPU-only recording; a .gputop file that cannot be read was left out silently."""
    import pathlib

    _cpu_only_recording(tmp_path / "cpu.gputop")
    (tmp_path / "locked.gputop").write_bytes(b"x" * 2048)
    (tmp_path / "empty.gputop").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("not ours")
    real_open = pathlib.Path.open

    def no_read(self, *a, **kw):
        if self.name == "locked.gputop":
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *a, **kw)

    monkeypatch.setattr(pathlib.Path, "open", no_read)
    assert main(["record", "--list", str(tmp_path)]) == 0
    out = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()[1:]}
    assert "CPU only" in out["cpu.gputop"] and "0×" not in out["cpu.gputop"]
    assert out["locked.gputop"].endswith("cannot be read: permission denied")
    assert out["empty.gputop"].endswith("empty: nothing written yet")
    assert "notes.txt" not in out


def test_quitting_the_ui_while_recording_says_where_the_file_is(tmp_path, capsys, monkeypatch):
    from gputop.session import Config, open_live
    from gputop.ui import app as app_mod

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(app_mod.GputopApp, "run", lambda self: None)  # the user quits at once
    session = open_live(Config(fake=1, interval=0.2, advisor=False))
    session.start_recording("ui.gputop")
    assert app_mod.run_app(session) == 0
    assert capsys.readouterr().err.strip() == f"gputop: recording saved: {(tmp_path / 'ui.gputop').resolve()}"
    with Reader(tmp_path / "ui.gputop") as r:
        assert r.gpu_indices() == [0]
    # Not recording: nothing to say.
    session = open_live(Config(fake=1, interval=0.2, advisor=False))
    assert app_mod.run_app(session) == 0
    assert capsys.readouterr().err == ""


def test_info_says_cpu_only_for_a_recording_without_a_gpu(tmp_path, capsys):
    _cpu_only_recording(tmp_path / "cpu.gputop")
    assert main(["info", str(tmp_path / "cpu.gputop")]) == 0
    out = capsys.readouterr().out
    assert "CPU only (no NVIDIA GPU or driver seen)" in out
    assert "driver ?" not in out and "CUDA ?" not in out and "no device details" not in out


def test_list_gives_an_unreadable_recordings_reason_whole(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    _cpu_only_recording(src / "full.gputop")
    data = (src / "full.gputop").read_bytes()
    (tmp_path / "cut.gputop").write_bytes(data[:4096])
    assert main(["record", "--list", str(tmp_path)]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("cut.gputop"))
    assert "unreadable: is truncated" in row and "nothing readable survived" in row, row


def test_record_over_a_file_that_is_not_a_recording_says_so_without_a_hint_it_would_refuse(tmp_path, capsys):
    page = tmp_path / "r.html"
    page.write_text("<html>a report</html>")
    for extra in ([], ["--force"], ["--append"]):
        assert main(["record", "-o", str(page), "--fake", "1", "-d", "1s", *extra]) == 2
        err = capsys.readouterr().err
        assert "is not a gputop recording" in err and "--force" not in err and "Traceback" not in err
    assert page.read_text() == "<html>a report</html>"


def test_a_directory_that_takes_no_files_is_said_as_such(capsys):
    """/proc exists: 'directory /proc does not exist' was wrong."""
    from gputop.cli import main

    assert main(["record", "--fake", "1", "--duration", "1s", "-o", "/proc/x.gputop"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "gputop record: error: cannot create /proc/x.gputop: /proc does not take new files"


def test_sigkill_loses_at_most_about_a_second(stopped):
    got = stopped[signal.SIGKILL].result()
    assert got["returncode"] == -signal.SIGKILL
    r = Reader(got["out"])  # still opens
    samples = r.gpu_samples(0, 2e10)
    assert samples, "samples survived"
    # Commits every 0.5 s, polls every 0.2 s: the newest sample is at most ~1 s old.
    assert got["killed_at"] - samples[-1].ts <= 1.3
    assert r.damage is None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_stop_cleanly(stopped, sig):
    got = stopped[sig].result()
    out, err = got["out"], got["stderr"]
    # As advise: Ctrl-C is how it is ended (0); SIGTERM (a scheduler's limit, `timeout`) says so.
    assert got["returncode"] == (143 if sig == signal.SIGTERM else 0), err
    assert "Traceback" not in err
    assert "recorded" in err.splitlines()[-1]
    assert not Path(f"{out}-wal").exists()  # closed, checkpointed
    with Reader(out) as r:
        assert r.gpu_samples(0, 2e10) and r.damage is None
