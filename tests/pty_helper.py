"""Run a command in a pseudo-terminal, the way a user's terminal would.

Tests use it to drive the real ``gputop`` command line: start it at a given size, read the
screen output (ANSI codes stripped for matching), send keys, resize, and always clean up.
The child gets its own session (and so its own process group), which is killed on close.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Sequence

# CSI (incl. private modes like ?1049h), OSC (terminated by BEL or ST), and other 2-char escapes.
_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"
    r"|\x1bP[^\x1b]*\x1b\\"
    r"|\x1b[@-Z\\-_]"
)
# SGR (colour / attribute) sequences: ESC [ params m
SGR = re.compile(r"\x1b\[([0-9;:]*)m")

KEYS = {
    "escape": "\x1b",
    "enter": "\r",
    "tab": "\t",
    "backspace": "\x7f",
    "up": "\x1b[A",
    "down": "\x1b[B",
    "right": "\x1b[C",
    "left": "\x1b[D",
    "ctrl+c": "\x03",
}


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def _take_controlling_tty() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class PtyProcess:
    """A command running on the slave side of a pty; we hold the master.

    Output is drained continuously on a thread so the child never blocks on a full pty buffer.
    """

    def __init__(
        self,
        argv: Sequence[str],
        cols: int = 80,
        rows: int = 24,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> None:
        self.argv = list(argv)
        full_env = dict(os.environ if env is None else env)
        full_env["TERM"] = "xterm-256color"
        # A terminal emulator does not set these; the size comes from the pty (TIOCGWINSZ).
        full_env.pop("COLUMNS", None)
        full_env.pop("LINES", None)
        master, slave = os.openpty()
        _set_size(slave, cols, rows)
        self._master = master
        self._buf = bytearray()
        self._lock = threading.Lock()
        self._closed = False
        # The child leads a new session with the pty as its controlling terminal, as in a
        # real terminal emulator, so SIGWINCH and job control reach it.
        self._proc = subprocess.Popen(
            self.argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_take_controlling_tty,
            close_fds=True,
        )
        os.close(slave)
        self.pid = self._proc.pid
        self.returncode: int | None = None
        self._reader = threading.Thread(target=self._drain, name="pty-drain", daemon=True)
        self._reader.start()

    # ---------------------------------------------------------------- output

    def _drain(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self._master], [], [], 0.1)
            except (OSError, ValueError):
                return
            if not ready:
                if self._closed:
                    return
                continue
            try:
                data = os.read(self._master, 65536)
            except OSError as exc:  # EIO: the slave side closed (child gone)
                if exc.errno in (errno.EIO, errno.EBADF):
                    return
                raise
            if not data:
                return
            with self._lock:
                self._buf += data

    @property
    def raw(self) -> str:
        with self._lock:
            return self._buf.decode("utf-8", errors="replace")

    @property
    def text(self) -> str:
        """Everything written so far, escape sequences removed."""
        return strip_ansi(self.raw)

    def mark(self) -> int:
        """A position in the output; pass to ``wait_for(since=...)`` to match only newer text."""
        with self._lock:
            return len(self._buf)

    def wait_for(self, pattern: str | re.Pattern, timeout: float = 15.0, since: int = 0) -> str:
        """Wait until ``pattern`` (a substring or regex) is in the stripped output after ``since``."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                chunk = self._buf[since:].decode("utf-8", errors="replace")
            plain = strip_ansi(chunk)
            found = pattern.search(plain) if isinstance(pattern, re.Pattern) else pattern in plain
            if found:
                return plain
            if time.monotonic() > deadline:
                tail = plain[-2000:]
                raise TimeoutError(f"{pattern!r} not seen within {timeout} s; output tail:\n{tail}")
            if self.poll() is not None and not self._reader.is_alive():
                raise AssertionError(f"process exited ({self.returncode}) before {pattern!r}; tail:\n{plain[-2000:]}")
            time.sleep(0.05)

    # ---------------------------------------------------------------- input / control

    def send(self, keys: str) -> None:
        """Send raw text, or a named key from KEYS ('escape', 'enter', 'up', ...)."""
        data = KEYS.get(keys, keys)
        os.write(self._master, data.encode())

    def resize(self, cols: int, rows: int) -> None:
        _set_size(self._master, cols, rows)
        # The kernel signals the foreground group itself; signal explicitly too, in case the
        # child is not (yet) the foreground group of the terminal.
        try:
            os.killpg(self.pid, signal.SIGWINCH)
        except ProcessLookupError:
            pass

    def poll(self) -> int | None:
        self.returncode = self._proc.poll()
        return self.returncode

    def wait(self, timeout: float = 10.0) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.argv} still running after {timeout} s")
            time.sleep(0.05)
        self._reader.join(timeout=2.0)  # collect the last output
        assert self.returncode is not None
        return self.returncode

    def close(self) -> None:
        """Kill the whole process group (the command and anything it started), reap, close."""
        if self.poll() is None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.wait(timeout=3.0)
                    break
                except TimeoutError:
                    continue
        else:
            # The leader is gone; stragglers in its group still die.
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self._closed = True
        self._reader.join(timeout=2.0)
        try:
            os.close(self._master)
        except OSError:
            pass

    def __enter__(self) -> PtyProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
