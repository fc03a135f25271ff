"""Mechanics of bench/monitor_cpu.py that can be checked without a GPU."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("monitor_cpu", ROOT / "bench" / "monitor_cpu.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["monitor_cpu"] = mod  # dataclasses look their module up by name
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop("monitor_cpu", None)


def test_pty_reader_drains_so_a_chatty_app_finishes(bench):
    # 2 MB is far more than a pty buffer holds: without a reader the child would block forever.
    code = "import sys, os; print(os.get_terminal_size()); sys.stdout.write('x' * 2_000_000); sys.stdout.flush()"
    run = bench.PtyRun([sys.executable, "-c", code], bench._env())
    try:
        run.proc.wait(30)
    finally:
        rc = run.stop()
    assert rc == 0
    assert run.bytes >= 2_000_000
    assert "columns=120" not in run.tail_text()  # the size line came first, long gone from the tail


def test_pty_has_the_requested_size_and_term(bench):
    code = "import os, shutil; print('SIZE', os.get_terminal_size(0).columns, os.get_terminal_size(0).lines, os.environ['TERM'])"
    run = bench.PtyRun([sys.executable, "-c", code], bench._env())
    try:
        run.proc.wait(30)
    finally:
        run.stop()
    assert "SIZE 120 40 xterm-256color" in run.tail_text()


def test_stop_ends_the_whole_tool_tree(bench):
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    run = bench.PtyRun([sys.executable, "-c", code], bench._env())
    root = psutil.Process(run.proc.pid)
    for _ in range(200):
        kids = root.children(recursive=True)
        if kids:
            break
        time.sleep(0.05)
    assert kids, "the tool's child did not start"
    run.stop()
    assert not run.alive()
    gone, alive = psutil.wait_procs(kids, timeout=5)
    assert alive == []


def test_missing_tool_is_recorded_and_report_written(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(bench.shutil, "which", lambda name: None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    rc = bench.main(["--out", str(tmp_path), "--tools", "dmon,nvitop", "--duration", "2.5", "--warmup", "1", "--no-load"])
    assert rc == 0
    data = json.loads((tmp_path / "monitor_cpu.json").read_text())
    status = {r["tool"]: r["status"] for r in data["results"]}
    assert status == {"dmon": "not installed", "nvitop": "not installed"}
    md = (tmp_path / "monitor_cpu.md").read_text()
    assert "| dmon | 1 s | not installed |" in md
    assert "cores" in md


def test_a_tool_that_dies_is_a_failure_with_its_message(bench, tmp_path):
    args = bench.parse_args(["--tools", "gputop", "--duration", "3", "--warmup", "1", "--gputop-args=--no-such-option"])
    res = bench.run_tool("gputop", args, gpu_util=None)
    assert res.status == "failed"
    assert "exited early" in res.notes and "no-such-option" in res.notes


def test_bad_arguments(bench):
    with pytest.raises(SystemExit):
        bench.parse_args(["--tools", "htop"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--duration", "2", "--warmup", "3"])
