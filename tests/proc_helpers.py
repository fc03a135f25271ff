"""Helpers for tests that start real processes."""

from __future__ import annotations

import subprocess

import psutil


def kill_tree(proc: subprocess.Popen) -> None:
    """Kill ``proc`` and every process under it (DataLoader workers, spawned ranks), then reap it."""
    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        kids = []
    for k in kids:
        try:
            k.kill()
        except psutil.Error:
            pass
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


def stop(p: subprocess.Popen) -> None:
    """SIGTERM ``p`` (a server that closes cleanly on it), SIGKILL after 10 s, then reap it."""
    import signal

    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def as_from_a_terminal() -> None:
    """``preexec_fn`` for a child that a test stops as Ctrl-C or kill from a shell would: SIGINT,
    SIGTERM and SIGHUP at their defaults and unblocked, whatever the test runner's own process (a
    pytest-xdist worker) left them at. A child inherits a signal ignored or blocked; a command
    started from an interactive shell has them as here."""
    import signal

    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    for sig in sigs:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, sigs)


def signal_state(pid: int) -> str:
    """The kernel's view of a process's signals (SigBlk, SigIgn, SigCgt), for a failure's message."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return " ".join(ln.strip() for ln in f if ln.startswith(("SigBlk", "SigIgn", "SigCgt")))
    except OSError:
        return "(gone)"
