"""SIGTERM and SIGHUP for a headless command that watches for a while, then prints (`advise`).

A scheduler's time limit, `timeout`, a batch system's cancel or a closed SSH session send SIGTERM or
SIGHUP, and their default action kills the process before it prints a word: `timeout 8 gputop
advise --json > f` left an empty file. With ``StopSignals`` the command stops watching as it does on
Ctrl-C, prints what it judged, closes what it writes, and then exits with 128 + the signal's number
(143 for SIGTERM): the status a shell, `timeout` and a scheduler read as "ended by that signal",
which a clean 0 would hide. Ctrl-C stays Python's KeyboardInterrupt: the user asked for the
answer early, and gets it with the command's usual status.

A signal the process ignores (SIGHUP under nohup) stays ignored; one that came while gputop was
still starting (held by ``startup_signals``) is acted on at once.
"""

from __future__ import annotations

import signal
import threading

from . import startup_signals

_NAMES = {getattr(signal, "SIGTERM", None): "terminated", getattr(signal, "SIGHUP", None): "hung up"}


class StopSignals:
    """Install with ``install()``; ``signum`` is the first stop signal that came (None: none);
    ``restore()`` puts the old handlers back. The handler only notes the signal: the command's
    loop looks at ``stopped`` between waits, so nothing is cut half-way (a JSON half-printed)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, object] = {}

    def install(self) -> "StopSignals":
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in startup_signals.HELD:
            try:
                prev = signal.getsignal(sig)
            except (ValueError, OSError):
                continue
            if prev is signal.SIG_IGN:
                continue
            # Held since start-up: afterwards the signal does what it does by default.
            self._old[sig] = startup_signals.unheld(sig, prev)
        startup_signals.take(self._handler)
        return self

    def _handler(self, signum: int, _frame: object) -> None:
        if self.signum is None:
            self.signum = signum

    @property
    def stopped(self) -> bool:
        return self.signum is not None

    @property
    def why(self) -> str | None:
        """``terminated`` or ``hung up``; None when no stop signal came."""
        return None if self.signum is None else _NAMES.get(self.signum, f"signal {self.signum}")

    def status(self, rc: int) -> int:
        """The exit status: 128 + the signal's number when one stopped the command, else ``rc``."""
        return rc if self.signum is None else 128 + self.signum

    def restore(self) -> None:
        for sig, h in self._old.items():
            try:
                signal.signal(sig, h)
            except (ValueError, OSError):
                pass
        self._old.clear()


__all__ = ["StopSignals"]
