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
    its fake GPU's polls): signal -> a future of ``_killed_by``."""
    sigs = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)
    pool = ThreadPoolExecutor(max_workers=len(sigs))
    try:
        yield {sig: pool.submit(_killed_by, sig, tmp_path_factory.mktemp(f"sig{int(sig)}")) for sig in sigs}
    finally:
        pool.shutdown(wait=True)


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
    assert got["returncode"] == 0, err
    assert "Traceback" not in err
    assert "recorded" in err.splitlines()[-1]
    assert not Path(f"{out}-wal").exists()  # closed, checkpointed
    with Reader(out) as r:
        assert r.gpu_samples(0, 2e10) and r.damage is None


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
    assert main(["record", "-o", str(out), "--fake", "1", "--duration", "1s"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"gputop: error: {out} already exists: use --force to overwrite it or --append to add to it"
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


def test_bad_paths_are_one_line_errors(tmp_path, capsys):
    for args in (["record", "-o", str(tmp_path / "no" / "dir.gputop"), "--fake", "1"],
                 ["record", "-o", str(tmp_path), "--fake", "1"],
                 ["record", "--fake", "1"]):
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("gputop: error:") and "\n" not in err


def test_disk_full_while_recording_stops_and_says_so(tmp_path, capsys, monkeypatch):
    real = RecordWriter._set_max_bytes

    def tiny(self, max_bytes):
        # The file may grow by 160 KB only: the disk is "full" a moment after the start.
        page_count = self.conn.execute("PRAGMA page_count").fetchone()[0]
        self.conn.execute(f"PRAGMA max_page_count={page_count + 40}")

    monkeypatch.setattr(RecordWriter, "_set_max_bytes", tiny)
    out = tmp_path / "full.gputop"
    rc = main(["record", "-o", str(out), "--fake", "4", "--interval", "0.01", "--duration", "60s"])
    monkeypatch.setattr(RecordWriter, "_set_max_bytes", real)
    assert rc == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("gputop: error: recording to") and "disk full" in err[-1]
    with Reader(out) as r:  # what was committed is there
        assert r.gpu_samples(0, 2e10)


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


def test_info_bad_inputs(tmp_path, capsys):
    assert main(["info", str(tmp_path / "missing.gputop")]) == 2
    assert capsys.readouterr().err.strip() == f"gputop: error: {tmp_path / 'missing.gputop'}: no such file"


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
