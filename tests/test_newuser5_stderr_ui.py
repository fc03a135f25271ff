"""`gputop --fake 4 2>err.txt` on a terminal refused with "standard error is not a terminal", which
read as a bug: only the errors were redirected. Textual's Linux driver draws the UI on standard
error, so the refusal stands, and now says why and what to do instead."""

from __future__ import annotations

import inspect
import os
import shlex
import sys
from pathlib import Path

import pytest

pytest.importorskip("textual")

from pty_helper import PtyProcess  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def test_textual_draws_on_standard_error():
    # What the message rests on: if Textual ever draws elsewhere, the refusal must be revisited.
    from textual.drivers.linux_driver import LinuxDriver

    assert "self._file = sys.__stderr__" in inspect.getsource(LinuxDriver.__init__)


def test_stderr_redirected_says_the_ui_draws_there(tmp_path):
    err = tmp_path / "err.txt"
    cmd = " ".join([shlex.quote(sys.executable), "-m", "gputop", "--fake", "4", "2>", shlex.quote(str(err))])
    with PtyProcess(["sh", "-c", cmd], cols=100, rows=30, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                    cwd=str(ROOT)) as p:
        code = p.wait(60)
    assert code == 2
    text = err.read_text()
    assert len(text.strip().splitlines()) == 1 and "Traceback" not in text
    assert "draws on standard error" in text and "leave standard error on the terminal" in text
    assert "gputop record -o FILE" in text
