"""The app's terminal going away, and an exit that cannot hang.

When a terminal hangs up (tmux kill-session, a dropped SSH connection) the kernel sends SIGHUP and
then SIGCONT. Textual answers SIGCONT by drawing its screen again, onto the terminal that is gone:
the writes fail, its writer thread dies, and its shutdown then waits on that thread for ever. A
replay left that way stayed alive, deaf to SIGTERM (its event loop was the one waiting), until
kill -9. So: after a hang-up the screen is not resumed (``forget_terminal``); a terminal that
stops being one without a SIGHUP (EIO on stdin or stdout) is noticed (``terminal_gone``); and an
exit asked for by a signal or a lost terminal is finished by ``ExitWatchdog`` if the UI's own
shutdown has not finished it in time.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Callable, Iterable

# How long the UI's own shutdown may take once an exit is asked for by a signal or a lost
# terminal, before the process is ended anyway (the session stopped first, so a recording is
# closed). Judgement: a normal shutdown, recording included, takes well under a second; stopping a
# recording waits for one more poll, at most RECORD_SETTLE_MAX_S (5 s) plus half a second.
EXIT_GRACE_S = 8.0


def terminal_fds() -> list[int]:
    """The standard streams that are terminals now: the ones whose loss ends the app."""
    out = []
    for fd in (0, 1):
        try:
            if os.isatty(fd):
                out.append(fd)
        except OSError:
            pass
    return out


def terminal_gone(fds: Iterable[int]) -> bool:
    """Whether any of ``fds`` (terminals when the app started) is no longer one: a hung-up
    terminal fails every ioctl with EIO, so it no longer reads as a terminal."""
    for fd in fds:
        try:
            if not os.isatty(fd):
                return True
        except OSError:
            return True
    return False


def forget_terminal() -> None:
    """The terminal is gone: a SIGCONT (sent with the hang-up) must not make Textual redraw onto
    it. Called in the SIGHUP handler, which Python runs before SIGCONT's (lower numbers first)."""
    cont = getattr(signal, "SIGCONT", None)
    if cont is not None:
        try:
            signal.signal(cont, signal.SIG_DFL)
        except (ValueError, OSError):
            pass


class ExitWatchdog:
    """Ends the process if an exit that was asked for has not happened ``grace_s`` later.

    ``arm(code)`` when the exit is asked for; ``done()`` once the app has returned and the session
    is stopped. If ``done`` does not come in time, ``cleanup`` runs (stop the session: a recording
    is closed) and the process exits with ``code``.
    """

    def __init__(self, cleanup: Callable[[], None], grace_s: float | None = None,
                 exit: Callable[[int], None] = os._exit) -> None:
        self.cleanup = cleanup
        self.grace_s = EXIT_GRACE_S if grace_s is None else grace_s  # read now: a test shortens it
        self._exit = exit
        self._done = threading.Event()
        self._armed = False
        self.code: int | None = None  # the exit status asked for, once armed
        self._lock = threading.Lock()

    def arm(self, code: int) -> None:
        with self._lock:
            if self._armed:
                return
            self._armed = True
            self.code = code
        threading.Thread(target=self._watch, args=(code,), name="gputop-exit-watchdog", daemon=True).start()

    def done(self) -> None:
        self._done.set()

    def _watch(self, code: int) -> None:
        if self._done.wait(self.grace_s):
            return
        try:
            self.cleanup()
        except Exception:
            pass
        self._exit(code)


__all__ = ["EXIT_GRACE_S", "ExitWatchdog", "forget_terminal", "terminal_fds", "terminal_gone"]
