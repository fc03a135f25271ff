"""Stop signals that arrive while gputop is still starting.

Loading gputop's modules (the analysis layer comes with the commands' defaults) takes about half a
second on a loaded machine, and until a command installs its handlers SIGTERM and SIGHUP kill the
process where it stands: `record` killed 0.4 s after it was started exited 143 with no file and no
word. So from the moment the commands are imported, in gputop's own process, these signals are
held: a command that ends cleanly on them (`record`) takes them with ``take`` and acts on them as
soon as it can; any other command gets the signal again once it is started (``HOLD_S``), by then
to its own handler or the default one, so nothing is ever swallowed. A signal the process
ignores (SIGHUP under nohup) stays ignored. Importing gputop as a library changes no handler.

SIGINT (Ctrl-C) is held too: left to Python it raised KeyboardInterrupt wherever the imports had got
to, a 30-line traceback, and `record` left no file. It is not delivered again later: the command
line settles it as soon as it knows the command (``release_interrupt``): `record` takes it (a
recording with what there is, as for SIGTERM), any other command ends there in one line with the
status a Ctrl-C gives (130). One that comes before gputop's first module runs (Python's own
start-up, up to ~0.1 s) is still Python's.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

HELD = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None)
# How long a held signal waits for a command to take it before it is delivered again (to the
# command's own handler if it has one by then, else with its default action). Judgement: gputop
# reaches its command in ~0.5 s on a loaded 2-core machine; six times that leaves room.
HOLD_S = 3.0

_pending: list[int] = []
_since: float | None = None  # when holding began (monotonic); None: not holding
_timer: threading.Timer | None = None
_lock = threading.Lock()
_interrupted = False  # a SIGINT came while held, not yet taken


def is_gputop_process(argv0: str | None = None) -> bool:
    """Whether this process is gputop's command line (its console script or ``python -m gputop``),
    not a program that imports gputop."""
    p = Path(sys.argv[0] if argv0 is None else argv0)
    return p.name == "gputop" or (p.name == "__main__.py" and p.parent.name == "gputop")


def hold() -> None:
    """Hold SIGINT, SIGTERM and SIGHUP until a command takes them (see the module's docstring)."""
    global _since
    if threading.current_thread() is not threading.main_thread() or _since is not None:
        return
    _since = time.monotonic()
    try:
        # First, so that by the time SIGTERM is seen held (a test reads /proc) SIGINT is too.
        # Python's own handler is replaced, which raises KeyboardInterrupt; one the process ignores
        # (a job started in the background by a script) stays ignored.
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _held_interrupt)
    except (ValueError, OSError):
        pass
    for sig in HELD:
        try:
            if signal.getsignal(sig) is signal.SIG_DFL:  # ignored (nohup) or handled: not ours
                signal.signal(sig, _held)
        except (ValueError, OSError):
            pass


def take(handler: Callable[[int, object], None], interrupt: bool = False) -> None:
    """For a command that ends cleanly on SIGTERM and SIGHUP: ``handler`` handles them from now on
    (not one the process ignores), and is called at once for each that came while it started.
    With ``interrupt`` it is called too for a SIGINT that came while gputop started (the command
    installs its own SIGINT handler)."""
    global _timer, _interrupted
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
        if interrupt and _interrupted:
            came.append(signal.SIGINT)
            _interrupted = False
    for sig in came:
        handler(sig, None)


def release_interrupt() -> bool:
    """SIGINT is Python's again (KeyboardInterrupt) unless a command installed its own; returns
    whether one came while gputop started (the caller ends as on Ctrl-C)."""
    global _interrupted
    try:
        if signal.getsignal(signal.SIGINT) is _held_interrupt:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    except (ValueError, OSError):
        pass
    with _lock:
        came, _interrupted = _interrupted, False
    return came


def unheld(signum: int, handler: object) -> object:
    """What ``signum`` should do once a command that took it is done: ``handler`` (from
    ``signal.getsignal``), or where that is this module's, what it does by default (Python's
    KeyboardInterrupt for SIGINT)."""
    if handler is None or handler is _held or handler is _held_interrupt:
        return signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
    return handler


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


def _held_interrupt(_signum: int, _frame: object) -> None:
    global _interrupted
    # Only noted: the command line acts on it once it knows the command (``release_interrupt``).
    _interrupted = True


def _again() -> None:
    """Deliver the held signals again: to the handler the command installed meanwhile, or (still
    ours, now past HOLD_S) with their default action."""
    global _timer
    with _lock:
        came, _pending[:] = list(_pending), []
        _timer = None
    for sig in came:
        os.kill(os.getpid(), sig)


__all__ = ["HELD", "HOLD_S", "hold", "is_gputop_process", "release_interrupt", "take", "unheld"]
