"""Stop signals that arrive while gputop is still starting.

Loading gputop's modules (the analysis layer comes with the commands' defaults) takes about half a
second on a loaded machine, and until a command installs its handlers SIGTERM and SIGHUP kill the
process where it stands: `record` killed 0.4 s after it was started exited 143 with no file and no
word. So from the moment the commands are imported, in gputop's own process, these signals are
held: a command that ends cleanly on them (`record`) takes them with ``take`` and acts on them as
soon as it can; any other command gets the signal again once it is started (``HOLD_S``), by then
to its own handler or the default one, so nothing is ever swallowed. A signal the process
ignores (SIGHUP under nohup) stays ignored. Importing gputop as a library changes no handler.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

# SIGINT is left to Python: during start-up it raises KeyboardInterrupt, which the CLI turns into
# its exit status without a traceback.
HELD = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None)
# How long a held signal waits for a command to take it before it is delivered again (to the
# command's own handler if it has one by then, else with its default action). Judgement: gputop
# reaches its command in ~0.5 s on a loaded 2-core machine; six times that leaves room.
HOLD_S = 3.0

_pending: list[int] = []
_since: float | None = None  # when holding began (monotonic); None: not holding
_timer: threading.Timer | None = None
_lock = threading.Lock()


def is_gputop_process(argv0: str | None = None) -> bool:
    """Whether this process is gputop's command line (its console script or ``python -m gputop``),
    not a program that imports gputop."""
    p = Path(sys.argv[0] if argv0 is None else argv0)
    return p.name == "gputop" or (p.name == "__main__.py" and p.parent.name == "gputop")


def hold() -> None:
    """Hold SIGTERM and SIGHUP until a command takes them (see the module's docstring)."""
    global _since
    if threading.current_thread() is not threading.main_thread() or _since is not None:
        return
    _since = time.monotonic()
    for sig in HELD:
        try:
            if signal.getsignal(sig) is signal.SIG_DFL:  # ignored (nohup) or handled: not ours
                signal.signal(sig, _held)
        except (ValueError, OSError):
            pass


def take(handler: Callable[[int, object], None]) -> None:
    """For a command that ends cleanly on SIGTERM and SIGHUP: ``handler`` handles them from now on
    (not one the process ignores), and is called at once for each that came while it started."""
    global _timer
    for sig in HELD:
        try:
            if signal.getsignal(sig) is not signal.SIG_IGN:
                signal.signal(sig, handler)
        except (ValueError, OSError):
            pass
    with _lock:
        came, _pending[:] = list(_pending), []
        if _timer is not None:
            _timer.cancel()
            _timer = None
    for sig in came:
        handler(sig, None)


def holding(handler: object) -> bool:
    """Whether ``handler`` (from ``signal.getsignal``) is this module's: the signal is held."""
    return handler is _held


def _held(signum: int, _frame: object) -> None:
    global _timer
    waited = time.monotonic() - (_since or 0.0)
    if waited >= HOLD_S:
        # No command took it: what the signal would have done unheld.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    with _lock:
        if signum not in _pending:
            _pending.append(signum)
        if _timer is None:
            _timer = threading.Timer(HOLD_S - waited, _again)
            _timer.daemon = True
            _timer.start()


def _again() -> None:
    """Deliver the held signals again: to the handler the command installed meanwhile, or (still
    ours, now past HOLD_S) with their default action."""
    global _timer
    with _lock:
        came, _pending[:] = list(_pending), []
        _timer = None
    for sig in came:
        os.kill(os.getpid(), sig)


__all__ = ["HELD", "HOLD_S", "hold", "holding", "is_gputop_process", "take"]
