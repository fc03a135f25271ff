"""`gputop export --max-attach 99999999999 --attach all` served, promising a per-host bound on
attached processes and series that was none; `--max-attach 3` without `--attach all` was taken
and did nothing, where `--attach-under` and `--host-label` alone are refused."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _export(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gputop", "export", "--listen", "127.0.0.1:0", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)  # one that serves runs until killed


@pytest.mark.parametrize("args, words", [
    (["--attach", "all", "--max-attach", "99999999999"], "--max-attach: must be 1 to 256: '99999999999'"),
    (["--attach", "all", "--max-attach", "0"], "--max-attach: must be 1 to 256: '0'"),
    # argparse's own "invalid int value: '1e308'" before: said as every other option says it
    (["--attach", "all", "--max-attach", "1e308"], "--max-attach: not a whole number: '1e308' (1 to 256)"),
    (["--max-attach", "3"], "go with --attach all"),
    # a new user's: a tree that is not there served, attaching to nothing, with no word of it
    (["--attach", "all", "--attach-under", "999999999"], "--attach-under: no such process: '999999999'"),
])
def test_an_absurd_or_lone_max_attach_is_one_line_and_status_2(args, words):
    p = _export(*args)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.startswith("gputop export: error: ") and words in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_help_gives_the_range():
    p = subprocess.run([sys.executable, "-m", "gputop", "export", "--help"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert "1 to 256" in " ".join(p.stdout.split())
