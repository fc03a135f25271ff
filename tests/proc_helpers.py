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
