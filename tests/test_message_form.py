"""Every line gputop writes on standard error has one form, whichever command runs and whichever
part of gputop found the problem (a new user's audit):

    gputop COMMAND: error: OPTION: WHAT IS WRONG: 'VALUE' (WHAT IS ACCEPTED)
    gputop COMMAND: warning: ...
    gputop COMMAND: ...            (a status line)

``gputop: ...`` only with no command. The exit statuses stay the README's (2 bad input, 1 the
machine's state)."""

from __future__ import annotations

import errno
import os

import pytest

from gputop.cli import COMMANDS, main
from gputop.errors import OptionError, line, os_reason


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's errors
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def _one_error_line(err: str, command: str | None) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    prefix = f"gputop {command}: error: " if command else "gputop: error: "
    assert lines[0].startswith(prefix), err
    return lines[0][len(prefix):]


# A problem each command itself finds (not argparse), without a GPU, a process or a terminal.
_COMMAND_FINDS = {
    "attach": ["attach", "1"],  # no terminal under pytest: said before attaching
    "stacks": ["stacks"],
    "advise": ["advise", "--pid", "2147483646", "--duration", "1"],
    "record": ["record"],
    "replay": ["replay", "/nonexistent/r.gputop"],
    "report": ["report", "/nonexistent/r.gputop"],
    "info": ["info", "/nonexistent/r.gputop"],
    "demo": ["demo", "no-such-scenario"],
    "export": ["export", "--listen", "abc"],
    "job": ["job", "--prometheus", "ftp://x"],
    "autopsy": ["autopsy", "/nonexistent/dumps_"],
    "rules": ["rules", "no-such-rule"],
}


@pytest.mark.parametrize("name", COMMANDS)
def test_a_commands_own_error_names_the_command(capsys, name):
    if name not in _COMMAND_FINDS:
        pytest.skip(f"{name} has no bad input of its own beyond argparse's")
    rc, _, err = _run(capsys, _COMMAND_FINDS[name])
    assert rc == 2, err  # bad input, as before
    _one_error_line(err, name)


@pytest.mark.parametrize("name", COMMANDS)
def test_argparse_errors_name_the_command_too(capsys, name):
    needs = {"attach": ["1"], "replay": ["x"], "report": ["x"], "info": ["x"],
             "job": ["--prometheus", "http://h:9090"]}
    rc, _, err = _run(capsys, [name, *needs.get(name, []), "--no-such-option"])
    assert rc == 2
    assert _one_error_line(err, name).startswith("unrecognized arguments: --no-such-option")


@pytest.mark.parametrize("argv, command, message", [
    # argparse's type checks: the option, what is wrong, the value quoted, what is accepted
    (["advise", "-p", "0"], "advise", "-p/--pid: not a process id: '0' (1 to 2147483647)"),
    (["advise", "--sample-rate", "0"], "advise", "--sample-rate: must be 0.1 to 20 stacks/s: '0'"),
    (["advise", "--sample-rate", "nan"], "advise", "--sample-rate: must be 0.1 to 20 stacks/s: 'nan'"),
    (["advise", "--sample-rate", "x"], "advise", "--sample-rate: not a number: 'x' (0.1 to 20 stacks/s)"),
    (["record", "-o", "r.gputop", "--max-size", "1e308"], "record", "--max-size: must be at most 16T: '1e308'"),
    (["record", "-o", "r.gputop", "-d", "1e308"], "record", "-d/--duration: must be at most 366d (31,622,400 s): '1e308'"),
    (["record", "-o", "r.gputop", "--max-size", "10K"], "record",
     "--max-size: must be at least 1M: '10K' (a smaller cap stops at once)"),
    (["replay", "x", "-s", "0"], "replay",
     "-s/--speed: must be greater than 0 and at most 1000000: '0' (60 plays a minute a second)"),
    (["export", "--attach", "all", "--max-attach", "0"], "export", "--max-attach: must be 1 to 256: '0'"),
    (["export", "--attach", "all", "--max-attach", "1e308"], "export",
     "--max-attach: not a whole number: '1e308' (1 to 256)"),
    (["export", "--attach", "foo"], "export", "--attach: invalid choice: 'foo' (choose from 'all')"),
    (["--fake", "x"], None, "--fake: not a number of GPUs: 'x' (1 to 64)"),
    # the same form where the command finds it
    (["export", "--listen", "abc"], "export",
     "--listen: not HOST:PORT: 'abc' (e.g. 127.0.0.1:10405, [::1]:10405 or :10405)"),
    (["export", "--listen", ":99999"], "export", "--listen: port out of range: ':99999' (0 to 65535)"),
    (["export", "--attach", "all", "--attach-under", "2147483646"], "export",
     "--attach-under: no such process: '2147483646'"),
    (["job", "--prometheus", "ftp://x"], "job", "--prometheus: not an http(s) URL: 'ftp://x' (e.g. http://prometheus:9090)"),
])
def test_an_options_value_reads_the_same_whoever_refuses_it(capsys, tmp_path, monkeypatch, argv, command, message):
    monkeypatch.chdir(tmp_path)
    rc, _, err = _run(capsys, argv)
    assert rc == 2
    assert _one_error_line(err, command) == message  # no "argument ", no options hint: the message says it all


def test_an_unknown_command_names_the_commands(capsys):
    rc, _, err = _run(capsys, ["nosuch"])
    assert rc == 2
    assert _one_error_line(err, None) == f"not a command: 'nosuch' ({', '.join(COMMANDS)})"


def test_what_was_not_understood_still_says_where_the_options_are(capsys):
    rc, _, err = _run(capsys, ["export", "-p", "1", "--attach", "all"])
    assert rc == 2
    assert _one_error_line(err, "export") == "--attach: not allowed with -p/--pid; options: gputop export --help"
    rc, _, err = _run(capsys, ["advise", "-p"])
    assert _one_error_line(err, "advise") == "-p/--pid: expected one argument; options: gputop advise --help"


def test_the_same_failure_gets_the_same_prefix(capsys):
    # argparse's refusal and the command's own, of one option, start alike.
    _, _, by_argparse = _run(capsys, ["advise", "-p", "0"])
    _, _, by_command = _run(capsys, ["advise", "-p", "2147483646", "-d", "1"])
    assert by_argparse.split(": error: ")[0] == by_command.split(": error: ")[0] == "gputop advise"


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    path = tmp_path_factory.mktemp("rec") / "r.gputop"
    assert main(["record", "-o", str(path), "--fake", "1", "-i", "0.2", "-d", "0.5"]) == 0
    return path


def test_replay_start_is_said_as_speed_is(capsys, recording):
    path = recording
    capsys.readouterr()
    rc, _, err = _run(capsys, ["replay", str(path), "--start", "abc"])
    assert rc == 2
    assert _one_error_line(err, "replay") == "--start: not a time: 'abc' (try +90s, 14:03, 2026-11-22 14:03 or 50%)"
    rc, _, err = _run(capsys, ["replay", str(path), "--start", "+99h"])
    assert rc == 2
    assert _one_error_line(err, "replay").startswith("--start: after the end of the recording: '+99h' (it is ")


def test_fake_before_a_command_is_the_commands_fake(capsys):
    # `gputop --fake advise` gave "--fake: not a number of GPUs: 'advise'": the command is the command.
    rc, out, err = _run(capsys, ["--fake", "advise", "-d", "0.3", "-i", "0.1"])
    assert rc == 0, err
    assert "[fake GPU source]" in out
    assert all(ln.startswith("gputop advise: ") for ln in err.splitlines()), err


def test_record_and_report_status_lines_name_their_command(capsys, tmp_path):
    out = tmp_path / "r.gputop"
    assert main(["record", "-o", str(out), "--fake", "1", "-i", "0.2", "-d", "0.5"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err and all(ln.startswith("gputop record: ") for ln in err), err
    assert main(["report", str(out), "-o", str(tmp_path / "r.txt")]) == 0
    assert capsys.readouterr().err == f"gputop report: wrote {tmp_path / 'r.txt'}\n"


def test_os_errors_are_said_in_gputops_words(tmp_path, capsys, monkeypatch, recording):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.txt").write_text("")
    rc, _, err = _run(capsys, ["record", "--fake", "1", "-d", "1", "-o", "t.txt/r.gputop"])
    assert rc == 2
    assert _one_error_line(err, "record") == "cannot create t.txt/r.gputop: t.txt is not a directory"
    # report says what record says of the same place
    rc, _, err = _run(capsys, ["report", str(recording), "-o", "/proc/r.html"])
    assert rc == 2
    assert _one_error_line(err, "report") == "cannot write /proc/r.html: /proc does not take new files"
    rc, _, err = _run(capsys, ["report", str(recording), "-o", "t.txt/r.html"])
    assert _one_error_line(err, "report") == "cannot write t.txt/r.html: t.txt is not a directory"


@pytest.mark.parametrize("code, path, says", [
    (errno.EACCES, None, "permission denied"),
    (errno.ENOSPC, None, "disk full"),
    (errno.EROFS, None, "read-only file system"),
    (errno.EADDRINUSE, None, "address already in use"),  # no word of gputop's: the C library's, lower case
    (errno.ENOENT, "/nonexistent/dir/f", "directory /nonexistent/dir does not exist"),
    (errno.ENOENT, "/proc/f", "/proc does not take new files"),
])
def test_os_reason(code, path, says):
    assert os_reason(OSError(code, os.strerror(code)), path) == says


def test_report_suggests_names_that_say_a_format(capsys, tmp_path, monkeypatch, recording):
    monkeypatch.chdir(tmp_path)
    rc, _, err = _run(capsys, ["report", str(recording), "-o", "x.json.gz"])
    assert rc == 2
    assert _one_error_line(err, "report") == ("-o/--output: a format gputop does not write (.gz): 'x.json.gz' "
                                              "(name it x.html, x.txt or x.json, or pass --html, --text or --json)")


def test_option_error_and_line():
    assert str(OptionError("--listen", "not HOST:PORT", "abc", "e.g. :10405")) == "--listen: not HOST:PORT: 'abc' (e.g. :10405)"
    assert line(None, "interrupted") == "gputop: interrupted"
    assert line("record", "disk full", "error") == "gputop record: error: disk full"
