"""`report -o`: where the report may go. Never over a recording (the one it reads, by any name or
link, or any other one), whatever --force says."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gputop.cli import main
from gputop.model import GpuSample
from gputop.record.writer import RecordWriter, SessionMeta

T0 = 1_767_225_600.0


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("out") / "made.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta(mode="fake"))
    w.flush([GpuSample(ts=T0 + k, index=0, util_gpu=50.0 * (k % 2)) for k in range(1, 11)])
    w.finish()
    return p


@pytest.fixture
def rec(made, tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    shutil.copy(made, tmp_path / "run.gputop")
    os.chmod(tmp_path / "run.gputop", 0o600)
    return tmp_path / "run.gputop"


def _one_line_error(capsys) -> str:
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert err.startswith("gputop report: error:") and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert cap.out == ""
    return err


@pytest.mark.parametrize("force", [[], ["--force"]])
@pytest.mark.parametrize("how", ["same", "relative", "symlink", "hardlink", "other", "other-no-extension",
                                 "wal-name", "journal-name"])
def test_report_never_writes_over_a_recording(rec, capsys, how, force):
    other = rec.parent / "other.gputop"
    out = {
        "same": "run.gputop",
        "relative": "sub/../run.gputop",
        "symlink": "link.html",
        "hardlink": "hard.html",
        "other": "other.gputop",
        "other-no-extension": "report.html",  # a recording by its content, whatever it is called
        "wal-name": "run.gputop-wal",
        "journal-name": "run.gputop-journal",
    }[how]
    if how == "symlink":
        os.symlink("run.gputop", out)
    elif how == "hardlink":
        os.link("run.gputop", out)
    elif how == "other":
        shutil.copy(rec, other)
    elif how == "other-no-extension":
        shutil.copy(rec, out)
    before = {p.name: p.read_bytes() for p in rec.parent.iterdir() if p.is_file()}
    assert main(["report", "run.gputop", "-o", out, *force]) != 0
    err = _one_line_error(capsys)
    assert "recording" in err and "not" in err
    after = {p.name: p.read_bytes() for p in rec.parent.iterdir() if p.is_file()}
    assert after == before  # nothing written, nothing created
    assert (rec.stat().st_mode & 0o777) == 0o600
    if how == "symlink":
        assert os.path.islink(out)


def test_report_over_an_ordinary_file_still_needs_force(rec, capsys):
    Path("old.html").write_text("an old report")
    assert main(["report", "run.gputop", "-o", "old.html"]) == 2
    assert "already exists" in _one_line_error(capsys)
    assert main(["report", "run.gputop", "-o", "old.html", "--force"]) == 0
    assert Path("old.html").read_text().startswith("<!DOCTYPE html>")


# --------------------------------------------------------------------------- -o FILE: the file, not the terminal


@pytest.mark.parametrize("name, flags, starts", [
    ("r.html", [], "<!DOCTYPE html>"),
    ("r.html", ["--html"], "<!DOCTYPE html>"),
    ("r.txt", [], "gputop report:"),
    ("r.txt", ["--text"], "gputop report:"),
    ("r.json", [], "{"),
    ("r.json", ["--json"], "{"),
    ("report", [], "<!DOCTYPE html>"),  # a name that says nothing: HTML...
    ("report.out", ["--json"], "{"),  # ...or what the flag asks for
    ("report.out", ["--text"], "gputop report:"),
])
def test_report_to_a_file_writes_the_format_asked_and_prints_only_where(rec, capsys, name, flags, starts):
    assert main(["report", "run.gputop", "-o", name, *flags]) == 0
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err == f"gputop report: wrote {name}\n"
    assert Path(name).read_text().startswith(starts)


@pytest.mark.parametrize("name, flag", [("x.html", "--json"), ("x.html", "--text"), ("x.json", "--html"),
                                        ("x.json", "--text"), ("x.txt", "--json"), ("X.HTM", "--json")])
def test_report_refuses_a_flag_that_contradicts_the_file_name(rec, capsys, name, flag):
    assert main(["report", "run.gputop", flag, "-o", name]) == 2
    err = _one_line_error(capsys)
    assert flag in err and name in err
    assert not Path(name).exists()


@pytest.mark.parametrize("name", ["r.pdf", "r.png", "notes.md"])
def test_report_refuses_a_name_that_says_a_format_it_does_not_write(rec, capsys, name):
    # HTML written into r.pdf is a file nothing opens as what its name says.
    assert main(["report", "run.gputop", "-o", name]) == 2
    err = _one_line_error(capsys)
    assert name in err and ".html" in err
    assert not Path(name).exists()
    # With a flag the user says what they want, whatever the name.
    assert main(["report", "run.gputop", "-o", name, "--html"]) == 0


# --------------------------------------------------------------------------- -o a device or a pipe, a full disk


def test_report_force_into_a_pipe_leaves_its_mode_alone(rec, capsys):
    # As root, `-o /dev/null --force` made /dev/null 0600: every other user's writes to it failed.
    # A FIFO stands for the device here (any user can make one).
    import threading

    # It also hung: looking whether the pipe was a recording read from it (`-o /dev/stdout | less`).
    os.mkfifo("pipe", 0o644)
    got: list[bytes] = []
    status: list[int] = []
    reader = threading.Thread(target=lambda: got.append(Path("pipe").read_bytes()), daemon=True)
    reader.start()
    writer = threading.Thread(target=lambda: status.append(main(["report", "run.gputop", "-o", "pipe", "--text",
                                                                 "--force"])), daemon=True)
    writer.start()
    writer.join(20)
    reader.join(5)
    if writer.is_alive() or reader.is_alive():
        os.close(os.open("pipe", os.O_RDWR))  # let the stuck thread go
    assert status == [0]
    assert got and got[0].startswith(b"gputop report:")
    assert (os.stat("pipe").st_mode & 0o777) == 0o644


def test_report_force_through_a_link_to_a_pipe_keeps_the_link(rec, capsys):
    # `-o /dev/stdout --force` (a link to /proc/self/fd/1) replaced the link with a regular file:
    # as root, /dev/stdout itself.
    import threading

    os.mkfifo("pipe", 0o644)
    os.symlink("pipe", "stdout")
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(Path("pipe").read_bytes()), daemon=True)
    reader.start()
    assert main(["report", "run.gputop", "-o", "stdout", "--text", "--force"]) == 0
    reader.join(10)
    assert os.path.islink("stdout") and os.readlink("stdout") == "pipe"
    assert got and got[0].startswith(b"gputop report:")


def test_report_to_a_link_to_standard_output_writes_there_and_keeps_the_link(rec, capsys):
    # `-o /dev/stdout --force` (a link to /proc/self/fd/1) replaced the link with a regular file: as
    # root, /dev/stdout itself. A link of the test's own stands for it.
    os.symlink("/proc/self/fd/1", "so")
    assert main(["report", "run.gputop", "-o", "so", "--force"]) == 0
    assert os.path.islink("so") and os.readlink("so") == "/proc/self/fd/1"
    assert capsys.readouterr().out.startswith("gputop report:")  # as `-o -`: text, to standard output


def test_report_that_cannot_be_written_is_status_1_and_leaves_no_half_file(rec, capsys, monkeypatch):
    import errno

    import gputop.commands.report as report_cmd

    real_fdopen = os.fdopen

    def full_disk(fd, *a, **k):
        f = real_fdopen(fd, *a, **k)

        def write(_body):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        f.write = write
        return f
    monkeypatch.setattr(report_cmd.os, "fdopen", full_disk)
    assert main(["report", "run.gputop", "-o", "r.html"]) == 1  # the README: a full disk is status 1
    assert _one_line_error(capsys).endswith(": disk full")  # as record says it, not the C library's "No space left on device"
    assert not Path("r.html").exists()  # the next try needs no --force
