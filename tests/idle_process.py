"""An idle Python process with a command line of the test's choosing (secrets on it, say), ready
for py-spy: the tests that read what gputop makes of a process's command line share it."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from typing import Iterator, Mapping

import psutil

PY = sys.executable


@contextlib.contextmanager
def idle_python(args: list[str], env: Mapping[str, str]) -> Iterator[subprocess.Popen]:
    p = subprocess.Popen([PY, "-c", "import time; time.sleep(60)", *args], env=dict(env))
    try:
        # py-spy needs the interpreter initialised before it can find its state.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if psutil.Process(p.pid).cmdline()[:2] == [PY, "-c"]:
                    break
            except psutil.Error:
                pass
            time.sleep(0.05)
        time.sleep(0.3)
        yield p
    finally:
        p.kill()
        p.wait()
