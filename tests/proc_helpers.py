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
