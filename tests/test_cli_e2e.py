"""The real command line, run as a user runs it: a fresh interpreter, a pseudo-terminal of a
given size, keys typed, exit codes and every byte of output checked.

Covers the live UI (fake GPUs and the no-GPU machine), argument errors, attach errors, the
headless subcommands that exist in this build, NO_COLOR and secrets on command lines.
Subcommands that are not built yet are skipped by name, so the tests start running when they
land.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from idle_process import idle_python  # noqa: E402
from pty_helper import SGR, PtyProcess  # noqa: E402

from gputop.cli import build_parser  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable  # the real interpreter: a shell shim would put a non-Python process between
GPUTOP = [PY, "-m", "gputop"]
# Generous: a cold start on a loaded 2-core CI box imports Textual and Rich in a few seconds.
START_TIMEOUT = 30.0
EXIT_TIMEOUT = 15.0
# Terminal codes a full-screen app writes to take over the terminal; none may appear when a
# command fails before its UI starts.
ALT_SCREEN = "\x1b[?1049h"


def env(**extra: str) -> dict[str, str]:
    e = dict(os.environ)
    e.pop("NO_COLOR", None)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.update(extra)
    return e


def run_cli(*args: str, timeout: float = 60.0, cwd: Path | str = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*GPUTOP, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env(),
        cwd=str(cwd),
        stdin=subprocess.DEVNULL,
    )


def run_cli_tty(*args: str, timeout: float = START_TIMEOUT) -> subprocess.CompletedProcess:
    """``run_cli`` on a terminal, for the commands that draw the full-screen UI (without one they
    refuse before anything else). ``stdout`` holds every byte written, escape codes included;
    ``stderr`` the same text without them: a pty has one stream."""
    with PtyProcess([*GPUTOP, *args], cols=100, rows=30, env=env(), cwd=str(ROOT)) as p:
        try:
            code = p.wait(timeout)
        except TimeoutError:
            raise AssertionError(f"still running after {timeout} s: {p.text[-2000:]}") from None
        return subprocess.CompletedProcess([*GPUTOP, *args], code, p.raw, p.text)


def assert_one_line_error(proc: subprocess.CompletedProcess, *must_contain: str) -> str:
    """Non-zero exit, no traceback, exactly one ``gputop [COMMAND]: error:`` line naming the problem."""
    assert proc.returncode != 0, f"exit 0 for bad input; stdout={proc.stdout!r} stderr={proc.stderr!r}"
    both = proc.stdout + proc.stderr
    assert "Traceback" not in both, both
    errors = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1, proc.stderr
    line = errors[0]
    assert line.startswith("gputop"), line
    for text in must_contain:
        assert text in line, f"{text!r} not in {line!r}"
    return line


def gone_pid() -> int:
    """A PID that is certainly not running: a child that has exited and been reaped."""
    child = subprocess.Popen([PY, "-c", "pass"])
    child.wait()
    if psutil.pid_exists(child.pid):  # reused in between: vanishingly rare, fall back past pid_max
        return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    return child.pid


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


SUBCOMMANDS = subcommands()


def need(name: str) -> argparse.ArgumentParser:
    if name not in SUBCOMMANDS:
        pytest.skip(f"gputop {name} is not in this build")
    return SUBCOMMANDS[name]


def pid_argv(name: str, pid: int) -> list[str]:
    """How the command takes a process id: ``--pid N`` or a positional ``PID``."""
    p = need(name)
    for a in p._actions:
        if a.dest == "pid":
            return [name, a.option_strings[-1], str(pid)] if a.option_strings else [name, str(pid)]
    pytest.skip(f"gputop {name} takes no process id")


def file_argv(name: str, path: Path) -> list[str]:
    """How the command takes a recording: the first positional, or an input-file option."""
    p = need(name)
    for a in p._actions:
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction) and a.dest != "pid":
            return [name, str(path)]
    for a in p._actions:
        if a.dest in ("file", "path", "recording", "input", "from_file") and a.option_strings:
            return [name, a.option_strings[-1], str(path)]
    pytest.skip(f"gputop {name} takes no recording file")


@functools.lru_cache(maxsize=1)
def no_nvml() -> bool:
    """No NVIDIA driver here. Loads the library by hand: importing pynvml into the test
    process could disturb the tests that put a fake pynvml in its place."""
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return True
    return False


@pytest.fixture
def sleeper():
    """A non-Python process the test owns."""
    p = subprocess.Popen(["sleep", "60"])
    yield p
    p.kill()
    p.wait()


@pytest.fixture(scope="module")
def secret_child():
    """A Python process with secrets on its command line (idle; one for the module: the tests
    only read it)."""
    with idle_python(["--api-key", "SEKRIT123", "--token=SEKRIT456"],
                     {"PATH": os.environ.get("PATH", ""), "API_TOKEN": "SEKRIT789"}) as p:
        yield p


@pytest.fixture(scope="module", autouse=True)
def recordings(tmp_path_factory):
    """The two recordings some tests below read, made in the background from the start of the
    module: each is seconds of waiting on fake GPUs (the headless recorder's --duration, the live
    UI's refreshes), spent while the tests before them run. Name -> a future of what the fixture
    of that name returns."""
    pool = ThreadPoolExecutor(max_workers=2)
    try:
        yield {
            "recorded": pool.submit(_make_recorded, tmp_path_factory.mktemp("recorded")),
            "live": pool.submit(_make_live_recording, tmp_path_factory.mktemp("rec")),
        }
    finally:
        pool.shutdown(wait=True)


class CliRuns:
    """Command lines run ahead of the tests that read them, two at a time: each still a fresh
    interpreter with the same arguments and environment as ``run_cli``, its exit code and output
    read by its own test. ``in_empty_dir``: run in a fresh empty directory (the test checks that
    nothing was written there; it is the result's ``cwd``)."""

    def __init__(self, tmp_path_factory) -> None:
        self._tmp = tmp_path_factory
        self._pool = ThreadPoolExecutor(max_workers=2)
        self._runs: dict[tuple[tuple[str, ...], bool], Future] = {}

    def start(self, *args: str, in_empty_dir: bool = False) -> None:
        key = (args, in_empty_dir)
        if key not in self._runs:
            cwd = self._tmp.mktemp("cwd") if in_empty_dir else ROOT
            self._runs[key] = self._pool.submit(self._run, args, cwd)

    @staticmethod
    def _run(args: tuple[str, ...], cwd: Path) -> subprocess.CompletedProcess:
        proc = run_cli(*args, cwd=cwd)
        proc.cwd = cwd
        return proc

    def get(self, *args: str, in_empty_dir: bool = False) -> subprocess.CompletedProcess:
        self.start(*args, in_empty_dir=in_empty_dir)
        return self._runs[(args, in_empty_dir)].result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


@pytest.fixture(scope="module", autouse=True)
def cli_runs(tmp_path_factory):
    """The argument tests' command lines (each a fresh interpreter, a fraction of a second of
    start-up), started together when the module starts."""
    runs = CliRuns(tmp_path_factory)
    try:
        for flag in ("--version", "-V", "--help"):
            runs.start(flag)
        for name in sorted(SUBCOMMANDS):
            runs.start(name, "--help")
        for args, _ in BAD_ARGUMENTS:
            runs.start(*args)
        for name, args, _ in SUBCOMMAND_BAD_ARGUMENTS:
            runs.start(name, *args, in_empty_dir=True)
        runs.start("demo", "--list")
        runs.start("stacks")
        yield runs
    finally:
        runs.close()


# --------------------------------------------------------------------------- 1. arguments


@pytest.mark.parametrize("flag", ["--version", "-V", "--help"])
def test_version_and_help_exit_zero(flag, cli_runs):
    proc = cli_runs.get(flag)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    if flag == "--help":
        assert "usage: gputop" in proc.stdout and "--fake" in proc.stdout
    else:
        assert re.fullmatch(r"gputop \d+\.\d+\.\d+\S*\n", proc.stdout), proc.stdout


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_help_exits_zero(name, cli_runs):
    proc = cli_runs.get(name, "--help")
    assert proc.returncode == 0, proc.stderr
    assert f"usage: gputop {name}" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


BAD_ARGUMENTS = [
    (["--interval", "0"], ["--interval", "'0'"]),
    (["--interval", "abc"], ["--interval", "'abc'"]),
    (["--interval", "-1"], ["--interval", "'-1'"]),
    (["--pid", "-3"], ["--pid", "'-3'"]),
    (["--pid", "abc"], ["--pid", "'abc'"]),
    (["--pid", "0"], ["--pid", "'0'"]),
    (["--no-such-option"], ["--no-such-option"]),
    # Numbers Python parses but nothing downstream can use: rejected as arguments, not
    # met later as an OverflowError or a blank UI.
    (["--pid", "99999999999999999999"], ["--pid", "'99999999999999999999'"]),
    (["--pid", str(2**31)], ["--pid", f"'{2**31}'"]),
    (["--interval", "inf"], ["--interval", "'inf'"]),
    (["--interval", "nan"], ["--interval", "'nan'"]),
    (["--interval", "1e999"], ["--interval", "'1e999'"]),
    (["--interval", "2h"], ["--interval", "'2h'"]),
    (["--stuck-after", "nan"], ["--stuck-after", "'nan'"]),
    (["--fake", "-3"], ["--fake", "'-3'"]),
    (["--fake", "0"], ["--fake", "'0'"]),
    (["--fake", "1000"], ["--fake", "'1000'"]),
]


@pytest.mark.parametrize("args, names", BAD_ARGUMENTS)
def test_bad_arguments_exit_2_with_one_error_line(args, names, cli_runs):
    proc = cli_runs.get(*args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert_one_line_error(proc, *names)


# --------------------------------------------------------------------------- 2. no GPU


@pytest.mark.skipif(not no_nvml(), reason="this machine has a working NVIDIA driver")
def test_live_without_gpu_explains_and_quits():
    with PtyProcess(GPUTOP, cols=100, rows=30, env=env(), cwd=str(ROOT)) as p:
        screen = p.wait_for("NVML unavailable", timeout=START_TIMEOUT)
        # The host panel and the process table still work.
        screen = p.wait_for(re.compile(r"CPU\s+\S.*%"), timeout=START_TIMEOUT)
        assert "No GPU data" in screen
        # The reason follows the headline, not just "unavailable".
        reason = re.search(r"NVML unavailable: (\S[^\n▌]{5,})", screen)
        assert reason, screen[-2000:]
        p.send("q")
        assert p.wait(EXIT_TIMEOUT) == 0
        assert "Traceback" not in p.text
        # The terminal is handed back: alternate screen left.
        assert "\x1b[?1049l" in p.raw


# --------------------------------------------------------------------------- 3. resize


def test_fake_eight_gpus_survive_resizes():
    with PtyProcess([*GPUTOP, "--fake", "8"], cols=80, rows=24, env=env(), cwd=str(ROOT)) as p:
        for i in range(8):
            p.wait_for(f"[{i}]", timeout=START_TIMEOUT)
        for cols, rows in ((200, 60), (40, 10), (80, 24)):
            mark = p.mark()
            p.resize(cols, rows)
            # Something is drawn again for the new size, and the app is still alive.
            p.wait_for("gputop", timeout=EXIT_TIMEOUT, since=mark)
            assert p.poll() is None, p.text[-2000:]
        # Still takes keys: the help opens, closes, and opens again (so it really closed).
        mark = p.mark()
        p.send("?")
        p.wait_for("gputop keys", timeout=EXIT_TIMEOUT, since=mark)
        time.sleep(0.3)
        p.send("escape")
        time.sleep(0.5)  # Textual waits a moment to tell a lone Esc from an escape sequence
        mark = p.mark()
        p.send("?")
        p.wait_for("gputop keys", timeout=EXIT_TIMEOUT, since=mark)
        p.send("escape")
        time.sleep(0.5)
        p.send("q")
        assert p.wait(EXIT_TIMEOUT) == 0
        assert "Traceback" not in p.text


# --------------------------------------------------------------------------- 4. attach errors


def test_pid_that_does_not_exist_fails_before_the_ui():
    pid = gone_pid()
    with PtyProcess([*GPUTOP, "--pid", str(pid)], cols=80, rows=24, env=env(), cwd=str(ROOT)) as p:
        code = p.wait(START_TIMEOUT)
        out = p.text
        raw = p.raw
    assert code != 0
    assert "Traceback" not in out
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1, out
    assert lines[0].startswith("gputop: error:") and str(pid) in lines[0]
    # No escape codes at all: the terminal was never taken over.
    assert ALT_SCREEN not in raw and "\x1b[" not in raw, repr(raw[:300])


def error_or_ui_saying_not_python(argv: list[str], pid: int) -> str:
    """Run a live command on a non-Python PID. Either it fails before the UI with one line,
    or the UI starts, says the target is not Python, and quits cleanly. Returns which."""
    with PtyProcess(argv, cols=120, rows=40, env=env(), cwd=str(ROOT)) as p:
        deadline = time.monotonic() + START_TIMEOUT
        while p.poll() is None and time.monotonic() < deadline:
            if "not a Python" in p.text and ALT_SCREEN in p.raw:
                break  # said inside the UI
            time.sleep(0.1)
        if p.poll() is None:
            p.wait_for(f"PID {pid} is not a Python process", timeout=1)
            # Monitoring goes on: the host panel is drawn.
            p.wait_for(re.compile(r"CPU\s+\S.*%"), timeout=START_TIMEOUT)
            p.send("q")
            assert p.wait(EXIT_TIMEOUT) == 0
            assert "Traceback" not in p.text
            return "ui"
        code = p.wait(EXIT_TIMEOUT)
        out, raw = p.text, p.raw
    assert code != 0
    assert "Traceback" not in out
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1, out
    assert str(pid) in lines[0] and "not a Python process" in lines[0]
    assert ALT_SCREEN not in raw
    return "error"


def test_pid_of_non_python_process(sleeper):
    """`gputop --pid` of a `sleep`: an error before the UI, or a UI that says so (now: the UI)."""
    error_or_ui_saying_not_python([*GPUTOP, "--fake", "1", "--pid", str(sleeper.pid)], sleeper.pid)


def test_attach_non_python_process(sleeper):
    argv = pid_argv("attach", sleeper.pid)
    error_or_ui_saying_not_python([*GPUTOP, *argv, "--fake", "1"], sleeper.pid)


@pytest.mark.parametrize("name", ["attach", "stacks", "advise", "record"])
def test_subcommand_pid_that_does_not_exist(name, tmp_path):
    pid = gone_pid()
    argv = pid_argv(name, pid)
    out = tmp_path / "run.gputop"
    if name == "record":
        argv += ["-o", str(out), "--fake", "1", "--duration", "5s"]
    # attach draws the UI: on a terminal, or it refuses for want of one before looking at the PID.
    proc = run_cli_tty(*argv) if name == "attach" else run_cli(*argv, timeout=60)
    assert_one_line_error(proc, str(pid))
    assert ALT_SCREEN not in proc.stdout
    assert not out.exists(), "a recording was started for a process that does not exist"


def test_stacks_of_non_python_process(sleeper):
    """One-shot stacks have nothing to show for a non-Python process: an error."""
    proc = run_cli(*pid_argv("stacks", sleeper.pid))
    assert_one_line_error(proc, str(sleeper.pid), "not a Python process")


def test_advise_on_non_python_process(sleeper):
    """Either a one-line error, or the report goes on without stacks and says why."""
    proc = run_cli(*pid_argv("advise", sleeper.pid), "--fake", "1", "--duration", "3")
    assert "Traceback" not in proc.stdout + proc.stderr
    if proc.returncode != 0:
        assert_one_line_error(proc, str(sleeper.pid), "not a Python process")
    else:
        assert f"PID {sleeper.pid} is not a Python process" in " ".join(proc.stdout.split())


def test_advise_on_non_python_process_says_what_still_watches_it(sleeper):
    """The refusal says what advise needs and which commands still watch the process (it said
    "GPU and CPU monitoring still work" and stopped, which read as a contradiction)."""
    proc = run_cli(*pid_argv("advise", sleeper.pid), "--fake", "1", "--duration", "3")
    assert proc.returncode != 0
    line = assert_one_line_error(proc, str(sleeper.pid), "not a Python process")
    assert "advise needs the job's stacks" in line and f"gputop record --pid {sleeper.pid}" in line


def test_record_of_a_non_python_process_records_its_gpus_and_host(sleeper, tmp_path):
    """A process whose stacks cannot be read (a C++ trainer, say) still has GPUs and a host to
    record: said once on stderr, recorded without stacks, exit 0."""
    out = tmp_path / "native.gputop"
    proc = run_cli("record", "--pid", str(sleeper.pid), "--fake", "1", "--duration", "2", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "not a Python process" in proc.stderr and "without stacks" in proc.stderr
    # Said as the command's other warnings are (export's, record -a's), not as a bare line.
    assert proc.stderr.startswith(f"gputop record: warning: cannot sample stacks of PID {sleeper.pid}"), proc.stderr
    info = run_cli("info", str(out))
    assert info.returncode == 0 and "GPU" in info.stdout, info.stdout + info.stderr


SUBCOMMAND_BAD_ARGUMENTS = [
    ("advise", ["--duration", "0"], ["--duration", "'0'"]),
    ("advise", ["--duration", "abc"], ["--duration", "'abc'"]),
    ("advise", ["--window", "-1"], ["--window", "'-1'"]),
    ("advise", ["--pid", "abc"], ["--pid", "'abc'"]),
    ("advise", ["--pid", "99999999999999999999"], ["--pid", "'99999999999999999999'"]),
    ("advise", ["--fake", "-3"], ["--fake", "'-3'"]),
    ("advise", ["--fake", "0"], ["--fake", "'0'"]),
    ("advise", ["--duration", "inf"], ["--duration", "'inf'"]),
    ("advise", ["--window", "nan"], ["--window", "'nan'"]),
    ("advise", ["--interval", "inf"], ["--interval", "'inf'"]),
    ("attach", ["99999999999999999999"], ["'99999999999999999999'"]),
    ("stacks", ["--pid", "99999999999999999999"], ["--pid", "'99999999999999999999'"]),
    ("record", ["-o", "x.gputop", "--interval", "nan"], ["--interval", "'nan'"]),
    ("record", ["-o", "x.gputop", "--duration", "1e999"], ["--duration", "'1e999'"]),
    ("record", ["-o", "x.gputop", "--pid", "99999999999999999999"], ["--pid", "'99999999999999999999'"]),
    ("demo", ["--interval", "inf"], ["--interval", "'inf'"]),
    ("attach", [], ["pid"]),
    ("attach", ["abc"], ["'abc'"]),
    ("attach", ["1234", "--interval", "0"], ["--interval"]),
    ("stacks", ["--pid", "-1"], ["--pid", "'-1'"]),
    ("demo", ["no-such-scenario"], ["'no-such-scenario'"]),
    ("demo", ["--device", "tpu"], ["--device", "'tpu'"]),
    ("record", ["--interval", "0"], ["--interval"]),
    ("record", [], ["-o"]),
    ("record", ["-o", "x.gputop", "--duration", "abc"], ["--duration", "'abc'"]),
    ("record", ["-o", "x.gputop", "--duration", "0"], ["--duration"]),
    ("record", ["-o", "x.gputop", "--max-size", "lots"], ["--max-size", "'lots'"]),
    ("record", ["-o", "x.gputop", "--force", "--append"], ["--append"]),
    ("replay", [], []),
    ("report", [], []),
    ("info", ["x.gputop", "--no-such-option"], ["--no-such-option"]),
    ("info", [], ["FILE"]),
    ("doctor", ["--bogus"], ["--bogus"]),
    ("report", ["x.gputop", "-o"], ["-o"]),
]


@pytest.mark.parametrize("name, args, names", SUBCOMMAND_BAD_ARGUMENTS)
def test_subcommand_bad_arguments(name, args, names, cli_runs):
    need(name)
    proc = cli_runs.get(name, *args, in_empty_dir=True)
    assert proc.returncode == 2
    assert_one_line_error(proc, *names)
    assert os.listdir(proc.cwd) == [], "bad arguments, yet a file was written"


def test_demo_list_names_the_scenarios(cli_runs):
    need("demo")
    proc = cli_runs.get("demo", "--list")
    assert proc.returncode == 0, proc.stderr
    assert "dataloader-starved" in proc.stdout and "Traceback" not in proc.stderr


def test_stacks_without_pid_says_how(cli_runs):
    need("stacks")
    proc = cli_runs.get("stacks")
    assert_one_line_error(proc, "--pid")


def _option(parser: argparse.ArgumentParser, dest: str) -> argparse.Action:
    (action,) = [a for a in parser._actions if a.dest == dest]
    return action


def test_one_duration_syntax_for_every_command():
    """`advise --duration 30s` means what `record --duration 30s` means: one parser for every
    time-like option, and the defaults written once."""
    from gputop.commands import options

    parser = build_parser()
    args = parser.parse_args(["advise", "--duration", "30s", "--window", "2m", "--stuck-after", "1m30s", "-i", "5s"])
    assert (args.duration, args.window, args.stuck_after, args.interval) == (30.0, 120.0, 90.0, 5.0)
    assert parser.parse_args(["record", "-o", "x", "--duration", "30s"]).duration == 30.0
    subs = SUBCOMMANDS
    durations = [_option(subs["advise"], "duration"), _option(subs["advise"], "window"),
                 _option(subs["record"], "duration")]
    durations += [_option(p, "stuck_after") for p in (parser, subs["advise"], subs["record"], subs["attach"])]
    assert {a.type for a in durations} == {options.parse_duration}
    intervals = [_option(p, "interval") for p in (parser, *(subs[n] for n in ("advise", "record", "attach", "demo")))]
    assert {a.type for a in intervals} == {options.interval_arg}
    assert {a.default for a in intervals} == {options.DEFAULT_INTERVAL} == {2.0}
    assert parser.parse_args([]).stuck_after == options.DEFAULT_STUCK_AFTER == 30.0
    assert parser.parse_args(["advise"]).stuck_after == parser.parse_args(["record", "-o", "x"]).stuck_after == 30.0


def test_commands_do_not_import_the_cli():
    """cli.py imports the commands, never the reverse: no import loop between them."""
    code = (
        "import importlib, sys\n"
        "from gputop.cli import COMMANDS\n"
        "sys.modules.pop('gputop.cli')\n"
        "for name in COMMANDS:\n"
        "    importlib.import_module('gputop.commands.' + name)\n"
        "print('gputop.cli' in sys.modules)\n"
    )
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=env(), cwd=str(ROOT), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False", "a command imports gputop.cli"


def test_doctor_names_a_cpu_only_torch_build(monkeypatch):
    """A CPU wheel of torch has torch.version.cuda = None: say "CPU-only", not "CUDA None"."""
    import types

    from gputop.commands.doctor import torch_checks

    fake = types.ModuleType("torch")
    fake.__version__ = "2.13.0+cpu"
    fake.version = types.SimpleNamespace(cuda=None, hip=None)
    fake.cuda = types.SimpleNamespace(is_available=lambda: False)
    monkeypatch.setitem(sys.modules, "torch", fake)
    checks = torch_checks()
    text = " ".join(detail for _, _, detail in checks)
    assert "None" not in text, checks
    assert checks[0] == ("torch", True, "2.13.0+cpu, CPU-only build: no CUDA support compiled in")
    assert checks[1][0] == "torch.cuda" and not checks[1][1] and "CPU-only build" in checks[1][2]
    fake.version = types.SimpleNamespace(cuda="12.6", hip=None)
    assert torch_checks()[0] == ("torch", True, "2.13.0+cpu, built for CUDA 12.6")


# The commands that draw the full-screen UI, and what each needs to get that far.
UI_COMMANDS = {
    "live": ["--fake", "1"],
    "live-record": ["--fake", "1", "--record", "{tmp}/run.gputop"],
    "attach": ["attach", "{pid}", "--fake", "1"],
    "replay": ["replay", "{recording}"],
    "demo": ["demo", "healthy", "--device", "cpu"],
}


def _ui_argv(which: str, tmp_path: Path, recording: Path) -> list[str]:
    if which == "demo" and __import__("importlib").util.find_spec("torch") is None:
        pytest.skip("gputop demo needs torch before it looks for a terminal")
    if which != "live" and which != "live-record":
        need(which)
    fill = {"tmp": str(tmp_path), "pid": str(os.getpid()), "recording": str(recording)}
    return [a.format(**fill) for a in UI_COMMANDS[which]]


def _assert_refused_for_want_of_a_terminal(proc: subprocess.CompletedProcess, raw: str, which: str = "live") -> None:
    # It points to the headless commands that do the same job: for a replay, the report.
    pointers = ("gputop report", "gputop info") if which == "replay" else ("gputop record -o FILE", "gputop advise")
    assert_one_line_error(proc, "terminal", *pointers)
    assert "\x1b" not in raw, repr(raw[:300])  # not one escape code, anywhere


@pytest.mark.parametrize("which", sorted(UI_COMMANDS))
def test_ui_without_a_terminal_refuses_with_one_line(which, tmp_path, recorded):
    """Run from a script or nohup (no terminal at all), the UI would write escape codes into a
    log for as long as it ran. It says so at once and points to the headless commands."""
    path, _ = recorded
    argv = _ui_argv(which, tmp_path, path)
    before = sorted(os.listdir(tmp_path))
    try:
        proc = run_cli(*argv, timeout=EXIT_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the UI ran without a terminal: {(exc.stdout or '')[:300]!r}") from None
    _assert_refused_for_want_of_a_terminal(proc, proc.stdout + proc.stderr, which)
    assert proc.stdout == ""
    assert sorted(os.listdir(tmp_path)) == before, "nothing is started or written for a UI that cannot run"


def test_ui_with_stdout_redirected_refuses_with_one_line(tmp_path):
    """`gputop > log` on a terminal: the UI would draw on the terminal and leave the log empty."""
    log = tmp_path / "log"
    cmd = " ".join([*(shlex.quote(a) for a in GPUTOP), "--fake", "1", ">", shlex.quote(str(log))])
    with PtyProcess(["sh", "-c", cmd], cols=100, rows=30, env=env(), cwd=str(ROOT)) as p:
        try:
            code = p.wait(EXIT_TIMEOUT)
        except TimeoutError:
            raise AssertionError(f"the UI started with stdout in a file: {p.text[-300:]!r}") from None
        proc = subprocess.CompletedProcess(cmd, code, "", p.text)
        _assert_refused_for_want_of_a_terminal(proc, p.raw + log.read_text())
    assert "standard output is not a terminal" in p.text
    assert log.read_text() == ""


# --------------------------------------------------------------------------- 5. bad files

BAD_FILES = {
    "missing": None,
    "text": b"step 1 loss 2.3\nstep 2 loss 2.1\n",
    "random": bytes(range(256)) * 16,
    "empty": b"",
    "directory": "dir",
    "sqlite-not-ours": "sqlite",
}


def make_bad_file(kind: str, tmp_path: Path) -> Path:
    path = tmp_path / f"{kind}.gputop"
    content = BAD_FILES[kind]
    if content is None:
        return path
    if content == "dir":
        path.mkdir()
    elif content == "sqlite":
        import sqlite3

        with sqlite3.connect(path) as db:
            db.execute("create table t(x)")
            db.execute("insert into t values (1)")
        db.close()
    else:
        path.write_bytes(content)
    return path


FILE_COMMANDS = ["replay", "report", "info"]


def _read_bad_file(name: str, kind: str, folder: Path) -> tuple[subprocess.CompletedProcess, Path, list[str]]:
    """``name`` run on a bad recording of ``kind``: (the run, the file, the folder's listing before)."""
    argv = file_argv(name, folder / "x")
    path = make_bad_file(kind, folder)
    argv[-1] = str(path)
    before = sorted(os.listdir(folder))
    return run_cli(*argv, timeout=60), path, before


@pytest.fixture(scope="module")
def bad_file_reads(tmp_path_factory):
    """Every file command on every bad recording, two at a time, when the first test asks: (name,
    kind) -> a future of ``_read_bad_file`` (each a fresh interpreter in a folder of its own)."""
    pool = ThreadPoolExecutor(max_workers=2)
    try:
        yield {
            (name, kind): pool.submit(_read_bad_file, name, kind, tmp_path_factory.mktemp("bad"))
            for name in FILE_COMMANDS if name in SUBCOMMANDS for kind in sorted(BAD_FILES)
        }
    finally:
        pool.shutdown(wait=True)


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
@pytest.mark.parametrize("name", FILE_COMMANDS)
def test_file_commands_reject_bad_recordings(name, kind, bad_file_reads):
    need(name)
    proc, path, before = bad_file_reads[(name, kind)].result()
    line = assert_one_line_error(proc, path.name)
    assert ALT_SCREEN not in proc.stdout
    # Reading a bad file must not create or change files beside it (no stray -wal/-journal).
    assert sorted(os.listdir(path.parent)) == before, line
    if kind == "missing":
        assert not path.exists()


def test_record_to_unwritable_place(tmp_path):
    p = need("record")
    target = tmp_path / "no" / "such" / "dir" / "run.gputop"
    out_opt = next(
        (a for a in p._actions if a.dest in ("out", "output", "file", "path") and a.option_strings), None
    )
    argv = ["record", *( [out_opt.option_strings[-1], str(target)] if out_opt else [str(target)] )]
    proc = run_cli(*argv, "--fake", "1", timeout=60)
    assert_one_line_error(proc)
    assert not target.exists()


@pytest.mark.parametrize(
    "kind, mode",
    [
        ("text", []),
        ("text", ["--force"]),
        ("sqlite-not-ours", ["--force"]),
        ("random", ["--append"]),
        ("directory", ["--force"]),
    ],
)
def test_record_never_overwrites_what_is_not_a_recording(kind, mode, tmp_path):
    need("record")
    path = make_bad_file(kind, tmp_path)
    before = path.read_bytes() if path.is_file() else None
    proc = run_cli("record", "-o", str(path), "--fake", "1", "--duration", "3s", *mode, timeout=60)
    assert_one_line_error(proc, path.name)
    if before is not None:
        assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == [path.name]


def _make_recorded(folder: Path) -> tuple[Path, subprocess.CompletedProcess]:
    """A 2-second headless recording of two fake GPUs."""
    need("record")
    path = folder / "run.gputop"
    proc = run_cli("record", "-o", str(path), "--fake", "2", "--duration", "2s", timeout=60)
    return path, proc


@pytest.fixture(scope="module")
def recorded(recordings):
    """A 2-second headless recording of two fake GPUs, made once for the tests that read one."""
    return recordings["recorded"].result()


def test_record_then_info(recorded):
    """The happy path of the headless recorder, as a job script would use it."""
    path, proc = recorded
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    # A finished recording is one file: what a user copies off the machine is all there is.
    assert sorted(os.listdir(path.parent)) == [path.name]
    need("info")
    info = run_cli("info", str(path))
    assert info.returncode == 0, info.stderr
    assert "gpu 1" in info.stdout and "Traceback" not in info.stderr
    check = run_cli("info", "--check", "--json", str(path))
    assert check.returncode == 0, check.stderr
    import json

    assert isinstance(json.loads(check.stdout), dict)
    # Recording again to the same name needs --force; nothing changes without it.
    size = path.stat().st_size
    again = run_cli("record", "-o", str(path), "--fake", "1", "--duration", "1s", timeout=60)
    assert_one_line_error(again, path.name, "--force")
    assert path.stat().st_size == size


def test_replay_opens_the_recording_and_quits(recorded):
    need("replay")
    path, proc = recorded
    assert proc.returncode == 0, proc.stderr
    with PtyProcess([*GPUTOP, "replay", str(path)], cols=120, rows=40, env=env(), cwd=str(ROOT)) as p:
        p.wait_for("REPLAY", timeout=START_TIMEOUT)
        p.wait_for("[1]", timeout=START_TIMEOUT)
        p.send("q")
        assert p.wait(EXIT_TIMEOUT) == 0
        assert "Traceback" not in p.text


def test_reading_a_recording_leaves_nothing_beside_it(recorded, tmp_path):
    need("info")
    path, proc = recorded
    assert proc.returncode == 0, proc.stderr
    copy = tmp_path / "copy.gputop"
    shutil.copyfile(path, copy)
    info = run_cli("info", str(copy))
    assert info.returncode == 0, info.stderr
    assert sorted(os.listdir(tmp_path)) == [copy.name]


def test_replay_start_before_the_end_as_documented(recorded):
    need("replay")
    path, _ = recorded
    with PtyProcess([*GPUTOP, "replay", str(path), "--start", "-1s"], cols=120, rows=40, env=env()) as p:
        p.wait_for("REPLAY", timeout=START_TIMEOUT)
        p.send("q")
        assert p.wait(EXIT_TIMEOUT) == 0


@pytest.mark.parametrize(
    "args, names",
    [
        (["--speed", "0"], ["--speed"]),
        (["--speed", "fast"], ["--speed", "'fast'"]),
        (["--start", "yesterday-ish"], ["yesterday-ish"]),
        (["--start", "25:99"], ["'25:99'"]),
        (["--start", "150%"], ["'150%'"]),
        (["--start", "+abc"], ["'+abc'"]),
    ],
)
def test_replay_bad_options(recorded, args, names):
    need("replay")
    path, _ = recorded
    proc = run_cli("replay", str(path), *args)
    assert_one_line_error(proc, *names)
    assert ALT_SCREEN not in proc.stdout


def test_live_record_to_unwritable_place_fails_before_ui(tmp_path):
    target = tmp_path / "no" / "such" / "dir" / "run.gputop"
    with PtyProcess([*GPUTOP, "--fake", "1", "--record", str(target)], cols=80, rows=24, env=env()) as p:
        deadline = time.monotonic() + START_TIMEOUT
        while p.poll() is None and time.monotonic() < deadline:
            if "gputop keys" in p.text or "[0]" in p.text:
                break
            time.sleep(0.1)
        started_ui = p.poll() is None
        if started_ui:
            p.send("q")
            p.wait(EXIT_TIMEOUT)
        out = p.text
    assert not started_ui, "the UI started although the recording cannot be written"
    assert p.returncode != 0
    assert "Traceback" not in out, out
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("gputop: error:"), out


# --------------------------------------------------------------------------- 6. NO_COLOR


def colours(raw: str) -> set[tuple[int, int, int] | int]:
    """Every foreground/background colour set by SGR codes: 256-colour indexes and RGB triples."""
    found: set = set()
    for params in SGR.findall(raw):
        codes = [int(c) if c.isdigit() else 0 for c in re.split(r"[;:]", params)]
        i = 0
        while i < len(codes):
            c = codes[i]
            if c in (38, 48) and i + 1 < len(codes):
                if codes[i + 1] == 5 and i + 2 < len(codes):
                    found.add(codes[i + 2])
                    i += 3
                    continue
                if codes[i + 1] == 2 and i + 4 < len(codes):
                    found.add(tuple(codes[i + 2 : i + 5]))
                    i += 5
                    continue
            if 30 <= c <= 37 or 40 <= c <= 47 or 90 <= c <= 97 or 100 <= c <= 107:
                found.add(("basic", c))
            i += 1
    return found


def is_grey(colour) -> bool:
    if isinstance(colour, tuple) and len(colour) == 3 and all(isinstance(v, int) for v in colour):
        return max(colour) - min(colour) <= 8
    if isinstance(colour, int):
        if colour in (0, 7, 8, 15) or 232 <= colour <= 255:
            return True
        if 16 <= colour <= 231:
            n = colour - 16
            r, g, b = n // 36, (n // 6) % 6, n % 6
            return r == g == b
        return False
    return colour in (("basic", 30), ("basic", 37), ("basic", 40), ("basic", 47), ("basic", 90), ("basic", 97))


def capture_fake_screen(extra_env: dict[str, str]) -> str:
    with PtyProcess([*GPUTOP, "--fake", "1"], cols=100, rows=30, env=env(**extra_env), cwd=str(ROOT)) as p:
        p.wait_for("[0]", timeout=START_TIMEOUT)
        p.wait_for("Processes", timeout=START_TIMEOUT)
        time.sleep(1.0)  # another refresh or two, so panels draw their bars and warnings
        p.send("q")
        assert p.wait(EXIT_TIMEOUT) == 0
        return p.raw


def test_no_color_draws_in_greys_only():
    """Textual's NO_COLOR support renders in monochrome: it still writes 256-colour codes,
    but every one is a grey. Without NO_COLOR the same screen uses hues (so this can fail)."""
    with ThreadPoolExecutor(max_workers=2) as pool:  # the two screens side by side
        normal, mono = pool.submit(capture_fake_screen, {}), pool.submit(capture_fake_screen, {"NO_COLOR": "1"})
        coloured, plain = colours(normal.result()), colours(mono.result())
    hues = {c for c in coloured if not is_grey(c)}
    assert hues, "the normal screen had no colour at all: the check below proves nothing"
    assert plain, "no SGR colours at all under NO_COLOR (fine, but then update this test)"
    assert {c for c in plain if not is_grey(c)} == set()


# --------------------------------------------------------------------------- 7. secrets


def test_secrets_never_shown_in_live_ui(secret_child):
    pid = secret_child.pid
    with PtyProcess([*GPUTOP, "--fake", "1", "--pid", str(pid)], cols=220, rows=50, env=env(), cwd=str(ROOT)) as p:
        p.wait_for(str(pid), timeout=START_TIMEOUT)
        # The process table shows the target's command line ...
        p.wait_for("--api-key", timeout=START_TIMEOUT)
        # ... and the stacks tab its stack and command line.
        mark = p.mark()
        p.send("3")
        p.wait_for("<module>", timeout=START_TIMEOUT, since=mark)
        # The filter searches the redacted command line: the row is found by its flag.
        p.send("1")
        time.sleep(0.3)
        p.send("/")
        time.sleep(0.3)
        mark = p.mark()
        p.send("token=***")
        p.wait_for(re.compile(rf"\n\s*{pid}\s"), timeout=START_TIMEOUT, since=mark)
        p.send("escape")
        time.sleep(0.5)
        p.send("q")
        code = p.wait(EXIT_TIMEOUT)
        out = p.text
    assert code == 0
    assert "***" in out
    assert "SEKRIT" not in out
    assert "Traceback" not in out


def test_secrets_never_shown_by_stacks_command(secret_child):
    pid = secret_child.pid
    for extra in ([], ["--json"]):
        proc = run_cli(*pid_argv("stacks", pid), *extra)
        assert proc.returncode == 0, proc.stderr
        assert str(pid) in proc.stdout and "<module>" in proc.stdout
        if extra:  # the text form cuts the command line short; the JSON one has all of it
            assert "--api-key ***" in proc.stdout and "--token=***" in proc.stdout, proc.stdout[:500]
        assert "SEKRIT" not in proc.stdout + proc.stderr


# --------------------------------------------------------------------------- attach from the table

BUSY_CHILD = """
import sys, time
def e2e_busy_marker_fn():
    t = time.time()
    while time.time() - t < 0.05:
        pass
while True:
    e2e_busy_marker_fn()
    time.sleep(0.05)
"""


@pytest.fixture
def busy_child():
    """A Python process using about half a core, so the no-GPU table (busiest processes) lists it."""
    marker = f"e2e-marker-{os.getpid()}"
    p = subprocess.Popen([PY, "-c", BUSY_CHILD, marker])
    time.sleep(0.5)
    yield p, marker
    p.kill()
    p.wait()


def _filter_and_select(p: PtyProcess, pid: int, marker: str) -> None:
    p.wait_for(re.compile(r"CPU\s+\S.*%"), timeout=START_TIMEOUT)
    p.send("/")
    time.sleep(0.3)
    p.send(marker)
    p.wait_for(re.compile(rf"\n\s*{pid}\s"), timeout=START_TIMEOUT)
    p.send("enter")  # submit the filter: focus goes to the table
    time.sleep(0.5)
    p.send("enter")  # select the row: attach


@pytest.mark.skipif(not no_nvml(), reason="the no-GPU table lists host processes; with GPUs only GPU users")
def test_attach_from_filtered_table_then_stacks_tab(busy_child):
    child, marker = busy_child
    with PtyProcess(GPUTOP, cols=140, rows=40, env=env(), cwd=str(ROOT)) as p:
        _filter_and_select(p, child.pid, marker)
        p.wait_for(f"attached to process {child.pid}", timeout=START_TIMEOUT)
        p.send("escape")  # clears the filter: the tab keys reach the app again
        time.sleep(0.6)
        mark = p.mark()
        p.send("3")
        p.wait_for("e2e_busy_marker_fn", timeout=START_TIMEOUT, since=mark)
        p.send("q")
        assert p.wait(EXIT_TIMEOUT) == 0
        assert "Traceback" not in p.text


@pytest.mark.skipif(not no_nvml(), reason="the no-GPU table lists host processes; with GPUs only GPU users")
def test_attach_from_filtered_table_shows_stacks_by_itself(busy_child):
    child, marker = busy_child
    with PtyProcess(GPUTOP, cols=140, rows=40, env=env(), cwd=str(ROOT)) as p:
        _filter_and_select(p, child.pid, marker)
        p.wait_for(f"attached to process {child.pid}", timeout=START_TIMEOUT)
        # The app switches to the stacks tab itself after attaching.
        p.wait_for("e2e_busy_marker_fn", timeout=START_TIMEOUT)  # hottest frames fill in as samples come


def test_secrets_never_shown_by_native_dump(secret_child):
    pid = secret_child.pid
    for extra in (["--native"], ["--native", "--json"]):
        proc = run_cli(*pid_argv("stacks", pid), *extra)
        assert proc.returncode == 0, proc.stderr
        assert "SEKRIT" not in proc.stdout + proc.stderr


# --------------------------------------------------------------------------- live --record


@pytest.fixture(scope="module")
def live_recording(recordings):
    """One live session with --fake 2 --record, quit with q after a few refreshes."""
    return recordings["live"].result()


def _make_live_recording(folder: Path) -> tuple[Path, int, str, str]:
    path = folder / "session.gputop"
    with PtyProcess([*GPUTOP, "--fake", "2", "--record", str(path)], cols=120, rows=40, env=env(), cwd=str(ROOT)) as p:
        p.wait_for("[1]", timeout=START_TIMEOUT)
        screen = p.wait_for("RECORDING", timeout=START_TIMEOUT)
        time.sleep(2.5)
        p.send("q")
        code = p.wait(EXIT_TIMEOUT)
        out = p.text
    return path, code, out, screen


def test_live_record_writes_a_readable_recording(live_recording):
    from gputop.record.reader import Reader

    path, code, out, _ = live_recording
    assert code == 0 and "Traceback" not in out
    with Reader(path) as r:
        assert r.gpu_indices() == [0, 1]
        counts = r.counts()
        assert counts["gpu_samples"] >= 2 and counts["host_samples"] >= 1, counts


def test_live_record_is_one_self_contained_file(live_recording):
    import sqlite3

    path, code, _, _ = live_recording
    leftovers = sorted(p.name for p in path.parent.iterdir() if p != path)
    assert leftovers == []
    db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        assert db.execute("select count(*) from sqlite_master").fetchone()[0] > 0
    finally:
        db.close()


def test_record_over_existing_file_suggests_options_that_exist(tmp_path):
    path = tmp_path / "old.gputop"
    path.write_bytes(b"")
    proc = run_cli_tty("--fake", "1", "--record", str(path))
    line = assert_one_line_error(proc, path.name)
    suggested = re.findall(r"(--[a-z][a-z-]+)", line)
    known = {s for a in build_parser()._actions for s in a.option_strings}
    assert suggested and set(suggested) <= known, (suggested, line)


# --------------------------------------------------------------------------- report


def test_report_text_json_and_html(recorded, tmp_path):
    need("report")
    path, proc = recorded
    assert proc.returncode == 0, proc.stderr
    text = run_cli("report", str(path))
    assert text.returncode == 0, text.stderr
    assert "Traceback" not in text.stdout + text.stderr and "GPU" in text.stdout
    js = run_cli("report", "--json", str(path))
    assert js.returncode == 0, js.stderr
    import json

    assert isinstance(json.loads(js.stdout), dict)
    html = tmp_path / "r.html"
    out = run_cli("report", "-o", str(html), str(path))
    assert out.returncode == 0, out.stderr
    assert html.read_text(encoding="utf-8").lstrip().lower().startswith(("<!doctype html", "<html"))
    # An existing output is not overwritten without -f.
    before = html.read_bytes()
    again = run_cli("report", "-o", str(html), str(path))
    assert_one_line_error(again, html.name)
    assert html.read_bytes() == before
    missing_dir = run_cli("report", "-o", str(tmp_path / "no" / "dir" / "r.html"), str(path))
    assert_one_line_error(missing_dir)


def test_secrets_never_written_to_a_recording(secret_child, tmp_path):
    """Record a job with secrets on its command line; nothing written or printed holds them."""
    need("record")
    path = tmp_path / "secret.gputop"
    proc = run_cli("record", "-o", str(path), "--fake", "1", "--pid", str(secret_child.pid), "--duration", "2s")
    assert proc.returncode == 0, proc.stderr
    outputs = [proc.stdout, proc.stderr]
    for cmd in (["info", "--json"], ["report"], ["report", "--json"]):
        if cmd[0] in SUBCOMMANDS:
            r = run_cli(*cmd, str(path))
            assert r.returncode == 0, (cmd, r.stderr)
            outputs += [r.stdout, r.stderr]
    assert not any("SEKRIT" in o for o in outputs)
    # The recording itself, every byte (compressed blocks are decoded by the reader above; the
    # command line is stored as text, so a leak would show here or in the outputs).
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert b"SEKRIT" not in raw
    from gputop.record.reader import Reader

    with Reader(path) as r:
        procs = r.proc_samples(float("-inf"), float("inf"))
    cmdlines = " ".join(str(getattr(p, "cmdline", "")) for p in procs)
    assert "--api-key" in cmdlines and "SEKRIT" not in cmdlines, cmdlines[:300]
