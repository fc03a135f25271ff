"""Recordings whose writer never closed them (SIGKILL, a full disk, a lost SSH session).

A killed recorder leaves the file, its ``-wal`` and ``-shm`` as they were on disk: copying the
open writer's main file and WAL gives exactly that state, without a subprocess.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from gputop.cli import main
from gputop.model import GpuSample
from gputop.record import schema
from gputop.record.reader import Reader
from synth_recording import SyntheticSession
from gputop.record.writer import RecordWriter, SessionMeta, describe_sqlite_error, looks_like_recording

T0 = 1_767_225_600.0


def open_writer(path: Path, seconds: int = 20, checkpoint_every_s: float | None = None) -> RecordWriter:
    w = RecordWriter.create(path)
    if checkpoint_every_s is not None:
        w.checkpoint_every_s = checkpoint_every_s
    w.start_session(SessionMeta(mode="fake", host="killed-host"))
    for b in SyntheticSession(t0=T0).seconds(seconds):
        w.flush(b)
    return w


def as_killed(src: Path, folder: Path, wal: bool = True) -> Path:
    """The files a killed recorder leaves: the main file and (unless lost) its WAL."""
    folder.mkdir()
    dst = folder / src.name
    shutil.copyfile(src, dst)
    if wal:
        shutil.copyfile(f"{src}-wal", f"{dst}-wal")
    return dst


def test_the_main_file_says_what_it_is_from_the_start(tmp_path):
    w = open_writer(tmp_path / "run.gputop", seconds=3)
    try:
        alone = as_killed(tmp_path / "run.gputop", tmp_path / "copy", wal=False)
        assert looks_like_recording(alone) is True
        with Reader(alone) as r:
            assert r.schema_version == schema.SCHEMA_VERSION
    finally:
        w.finish()


def test_the_main_file_alone_is_at_most_a_checkpoint_behind(tmp_path):
    w = open_writer(tmp_path / "run.gputop", seconds=30, checkpoint_every_s=0.0)
    try:
        alone = as_killed(tmp_path / "run.gputop", tmp_path / "copy", wal=False)
        with Reader(alone) as r:
            assert len(r.gpu_samples(0, 2e10)) == 30
            assert r.state == "not closed cleanly"
        assert sorted(p.name for p in alone.parent.iterdir()) == ["run.gputop"]  # no -wal/-shm left
    finally:
        w.finish()


def test_a_killed_recording_is_folded_listed_and_accepted_by_append_and_force(tmp_path, capsys):
    w = open_writer(tmp_path / "run.gputop")
    killed = as_killed(tmp_path / "run.gputop", tmp_path / "k")
    again = as_killed(tmp_path / "run.gputop", tmp_path / "f")
    with Reader(tmp_path / "run.gputop") as r:  # the writer still has it open: left alone
        assert r.state == "recording"
    w.finish()

    assert main(["record", "--list", str(killed.parent)]) == 0
    out = capsys.readouterr().out
    assert "run.gputop" in out and "not closed cleanly" in out
    # Reading it folded the WAL back: one self-contained file, with everything committed.
    assert sorted(p.name for p in killed.parent.iterdir()) == ["run.gputop"]
    with Reader(killed) as r:
        assert len(r.gpu_samples(0, 2e10)) == 20 and r.damage is None
    assert main(["info", str(killed)]) == 0
    assert "not closed cleanly" in capsys.readouterr().out

    w2 = RecordWriter.create(killed, append=True)
    w2.start_session(SessionMeta(mode="fake"))
    w2.flush([GpuSample(ts=T0 + 100, index=0, util_gpu=50.0)])
    w2.finish()
    with Reader(killed) as r:
        assert len(r.sessions) == 2 and len(r.gpu_samples(0, 2e10)) == 21
        assert r.unclosed_sessions == [1]  # the killed session stays marked; the new one closed

    w3 = RecordWriter.create(again, force=True)  # WAL and all replaced, not refused
    w3.start_session(SessionMeta(mode="fake"))
    w3.finish()
    assert not Path(f"{again}-wal").exists()
    with Reader(again) as r:
        assert r.state == "closed" and r.gpu_samples(0, 2e10) == []


def test_a_file_killed_by_an_older_recorder_is_recognised_from_its_wal(tmp_path, capsys):
    # Older versions switched to WAL before writing the marks: the main file's header is blank
    # and everything, page 1 included, is in the WAL until the first checkpoint.
    src = tmp_path / "old.gputop"
    c = sqlite3.connect(src, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute(f"PRAGMA application_id={schema.APPLICATION_ID}")
    c.execute(f"PRAGMA user_version={schema.SCHEMA_VERSION}")
    c.execute("BEGIN")
    for stmt in schema.DDL.split(";"):
        if stmt.strip():
            c.execute(stmt)
    c.execute("INSERT INTO meta VALUES ('format', 'gputop-recording')")
    c.execute("INSERT INTO sessions(started, host) VALUES (?, 'old-host')", (T0,))
    c.execute("COMMIT")
    killed = as_killed(src, tmp_path / "k")
    c.close()
    with open(killed, "rb") as f:
        assert f.read(100)[68:72] == b"\0\0\0\0"  # the state the issue describes
    assert looks_like_recording(killed) is True
    assert main(["record", "--list", str(killed.parent)]) == 0
    out = capsys.readouterr().out
    assert "old.gputop" in out and "not closed cleanly" in out
    w = RecordWriter.create(killed, append=True)
    w.start_session(SessionMeta(mode="fake"))
    w.finish()
    with Reader(killed) as r:
        assert [s["host"] for s in r.sessions][0] == "old-host"


@pytest.mark.parametrize("max_bytes, want, unwanted", [
    (None, "disk full", "--max-size"),
    (256 * 1024, "--max-size limit of 256 KB", None),
])
def test_a_full_disk_blames_max_size_only_when_there_is_one(max_bytes, want, unwanted):
    exc = sqlite3.OperationalError("database or disk is full")
    exc.sqlite_errorcode = 13  # type: ignore[attr-defined]
    text = describe_sqlite_error(exc, max_bytes)
    assert want in text and "disk full" in text
    assert unwanted is None or unwanted not in text


def test_a_wal_that_cannot_be_folded_for_want_of_space_is_not_called_live(tmp_path, monkeypatch):
    # A recorder stopped by a full disk leaves its -wal; folding it needs space too. That file is
    # not "being recorded now".
    import sqlite3

    from gputop.record import reader as reader_mod

    p = tmp_path / "full.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta(mode="fake"))
    w.flush(SyntheticSession(t0=1_767_225_600.0).seconds(3).__next__())
    real_connect = sqlite3.connect

    class FullDisk:
        def __init__(self, conn):
            self.conn = conn

        def execute(self, sql, *a):
            if "journal_mode" in sql:
                raise sqlite3.OperationalError("database or disk is full")
            return self.conn.execute(sql, *a)

        def close(self):
            self.conn.close()

    monkeypatch.setattr(reader_mod.sqlite3, "connect", lambda *a, **k: FullDisk(real_connect(*a, **k)))
    assert reader_mod.fold_wal(p) == "read-only"
    w.finish()


def _fill(w) -> sqlite3.Error:
    """Flush synthetic seconds into writer ``w`` until SQLite refuses for want of space."""
    from synth_recording import SyntheticSession

    for batch in SyntheticSession(t0=1_767_225_600.0).seconds(100_000):
        try:
            w.flush(batch)
        except sqlite3.Error as exc:
            return exc
    raise AssertionError("never full")


def test_a_full_recording_says_whether_the_max_size_or_the_disk_stopped_it(tmp_path):
    """'disk full (or the --max-size limit …)': the writer knows whether the file reached its cap."""
    w = RecordWriter.create(tmp_path / "cap.gputop", max_bytes=320 * 1024)  # an empty file takes ~150 KB
    w.start_session(SessionMeta(mode="fake"))
    exc = _fill(w)
    assert w.cap_reached() is True
    assert describe_sqlite_error(exc, w.max_bytes, w.cap_reached()) == "the --max-size limit of 320 KB reached"
    w.abort()
    # A disk that fills far below the cap: SQLite's page cap stands in for the disk here.
    w = RecordWriter.create(tmp_path / "disk.gputop", max_bytes=512 * 1024 * 1024)
    w.start_session(SessionMeta(mode="fake"))
    pages = w.conn.execute("PRAGMA page_count").fetchone()[0]
    w.conn.execute(f"PRAGMA max_page_count={pages + 40}")
    w.max_bytes = 512 * 1024 * 1024  # the user's cap, far away
    exc = _fill(w)
    w.conn.execute(f"PRAGMA max_page_count={512 * 1024 * 1024 // 4096}")  # what --max-size 512M set
    assert w.cap_reached() is False
    assert describe_sqlite_error(exc, w.max_bytes, w.cap_reached()) == "disk full"
    w.abort()
