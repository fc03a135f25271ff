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


def test_nvml_per_call_costs_are_summed_per_metric_and_reported(bench, tmp_path):
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from fake_pynvml import FakeGpu, FakeNvml, FakeProcess
    finally:
        sys.path.pop(0)
    from gputop.sources.nvml import NvmlSource

    src = NvmlSource.open(interval=1.0, nvml=FakeNvml([FakeGpu(processes=[FakeProcess(5, sm_util=50)])]))
    calls: dict = {}
    src._get = bench._per_call_costs(src._get, calls)
    for _ in range(3):
        src.poll()
    assert calls["utilization"]["n"] == 3 and calls["memory"]["n"] == 3
    assert calls["process utilization"]["n"] == 1  # paced: one read within a few seconds
    assert all(c["cpu_s"] >= 0 and c["wall_s"] >= 0 for c in calls.values())
    # The report turns sums into per-poll costs, heaviest first.
    for c in calls.values():
        c["cpu_ms_per_poll"], c["wall_ms_per_poll"] = c.pop("cpu_s") * 1000 / 3, c.pop("wall_s") * 1000 / 3
    calls["utilization samples"]["cpu_ms_per_poll"] = 99.0
    result = bench.Result(tool="headless nvml", interval="1 s", cpu_pct=0.1, polls={"nvml": {"n": 3}}, calls=calls)
    data = {
        "machine": {"gpu": "none", "cores": 2, "cpu": "x", "python": "3"},
        "load": "none",
        "params": {"duration": 20.0, "warmup": 3.0},
        "results": [bench.asdict(result)],
    }
    bench.write_report(tmp_path, data)
    md = (tmp_path / "monitor_cpu.md").read_text()
    table = md[md.index("| metric | calls per poll"):].splitlines()
    assert table[2].startswith("| utilization samples | 1.0 | 99.000 |")
