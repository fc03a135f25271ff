"""Attach to jobs that hung before gputop came: `gputop advise --pid P --duration 8 --json` with
every other option at its default (no --stuck-after) must say stuck, the kind of hang and where
every party waits; jobs that are slow or busy saving, attached the same way, must not be called
stuck. Real processes (tests/stack_targets.py), started and hung (or working) before the attach.

All targets start together and all `advise` runs go at once, so the module costs one torch
start-up and one 8 s watch (about 20 s on two cores).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

psutil = pytest.importorskip("psutil")

from gputop.sources.stacks import AttachError, check_attachable, find_pyspy  # noqa: E402
from proc_helpers import kill_tree  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(180),
    # Looked up, not imported: torch in this process would make every later test's garbage
    # collections walk its objects (the targets import it, in their own processes).
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the targets need torch"),
    pytest.mark.skipif(find_pyspy() is None, reason="py-spy not installed"),
    pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc"),
]

TARGETS = os.path.join(os.path.dirname(__file__), "stack_targets.py")
DURATION_S = 8
# The verdict must come within this long of the attach: the issue asks for 5 s; five watches
# and five targets on two cores at once stretch an 8 s watch to ~12 s, hence the margin.
VERDICT_WITHIN_S = 8.0
# The targets hang (or start working) this long before gputop attaches.
HUNG_BEFORE_S = 1.0


def marker_line(marker: str) -> int:
    with open(TARGETS) as f:
        for n, text in enumerate(f, 1):
            if marker in text:
                return n
    raise AssertionError(marker)


def _wait_ready(proc: subprocess.Popen, timeout: float = 90.0) -> int:
    """The PID to attach to: the target's, or the one it names on a ``rank0 PID`` line."""
    assert proc.stdout is not None
    end = time.time() + timeout
    pid = proc.pid
    while time.time() < end:
        line = proc.stdout.readline()
        if line.startswith("rank0 "):
            pid = int(line.split()[1])
        if line.strip() == "ready":
            return pid
        if not line and proc.poll() is not None:
            raise RuntimeError(f"target {proc.args} exited with {proc.returncode}")
    raise RuntimeError(f"target {proc.args} never got ready")


@pytest.fixture(scope="module")
def verdicts():
    tmp = tempfile.mkdtemp(prefix="gputop-stuck-")
    modes = {
        "deadlock": ["callback_deadlock"],
        "socket": ["socket_workers"],
        "worker": ["hung_worker"],
        "slow": ["slow_getitem"],
        "save": ["long_save", os.path.join(tmp, "ckpt.pt")],
        "fifo": ["fifo_read", os.path.join(tmp, "batches.fifo")],
        "child": ["child_wait"],
        "collective": ["collective_pid"],
    }
    targets: dict[str, subprocess.Popen] = {}
    runs: dict[str, subprocess.Popen] = {}
    try:
        for name, argv in modes.items():
            targets[name] = subprocess.Popen([sys.executable, TARGETS, *argv], stdout=subprocess.PIPE,
                                             stderr=subprocess.DEVNULL, text=True)
        pids = {name: _wait_ready(t) for name, t in targets.items()}
        try:
            check_attachable(targets["deadlock"].pid)
        except AttachError as exc:
            pytest.skip(f"py-spy cannot attach here: {exc}")
        time.sleep(HUNG_BEFORE_S)
        for name, pid in pids.items():
            runs[name] = subprocess.Popen(
                [sys.executable, "-m", "gputop", "advise", "--pid", str(pid), "--duration", str(DURATION_S), "--json"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out = {}
        for name, r in runs.items():
            stdout, stderr = r.communicate(timeout=60)
            assert r.returncode == 0, stderr
            out[name] = json.loads(stdout)
        if os.environ.get("GPUTOP_STUCK_DUMP"):
            with open(os.environ["GPUTOP_STUCK_DUMP"], "w") as f:
                json.dump(out, f, indent=1)
        yield out
    finally:
        for r in runs.values():
            if r.poll() is None:
                r.kill()
        for t in targets.values():
            kill_tree(t)


def stuck_of(report: dict) -> dict:
    found = [f for f in report["findings"] if f["id"] == "stuck"]
    assert found, f"not called stuck: {[f['id'] for f in report['findings']]}"
    seen = next(s for s in report["seen"] if s["id"] == "stuck")
    assert seen["first_seen_s"] <= VERDICT_WITHIN_S, seen
    assert report["stuck_after_s"] == 30.0  # the default: nothing overridden
    return found[0]


def text_of(f: dict) -> str:
    return "\n".join([f["title"], *f["evidence"], f["action"]])


def test_lock_order_deadlock_in_a_callback_names_both_threads_and_lines(verdicts):
    f = stuck_of(verdicts["deadlock"])
    text = text_of(f)
    assert "deadlock" in f["title"]
    assert f"stack_targets.py:{marker_line('# DEADLOCK callback main')} in Callbacks.on_step_end" in text
    assert f"stack_targets.py:{marker_line('# DEADLOCK callback helper')} in Callbacks.flush_metrics" in text
    assert "metrics-flusher" in text and "futex" in text
    assert "≥" in f["title"]  # how long at least, from the evidence's reach
    assert "--native" in f["action"] and "faulthandler" in f["action"]


def test_workers_hung_on_a_socket_are_a_hung_worker_not_slow_storage(verdicts):
    report = verdicts["socket"]
    f = stuck_of(report)
    text = text_of(f)
    assert "DataLoader worker" in f["title"] and "socket" in f["title"]
    hung = f"stack_targets.py:{marker_line('# HUNG socket recv')} in SocketDataset.__getitem__"
    assert text.count(hung) >= 2, text  # both workers, each at its __getitem__ line
    assert "recvfrom" in text or "socket:[" in text
    assert "DataLoader(..., timeout=" in f["action"] and "settimeout" in f["action"]
    assert all(s["id"] != "io-bound" for s in report["seen"]), report["seen"]


def test_worker_hung_inside_getitem_names_the_worker_and_line(verdicts):
    f = stuck_of(verdicts["worker"])
    text = text_of(f)
    assert "DataLoader worker" in f["title"]
    assert f"stack_targets.py:{marker_line('# HUNG getitem')} in HangingDataset.__getitem__" in f["title"]
    assert "main thread" in text and "data-wait" in text
    assert "DataLoader(..., timeout=" in f["action"]


def test_slow_getitem_at_full_cpu_is_not_stuck(verdicts):
    assert all(s["id"] != "stuck" for s in verdicts["slow"]["seen"]), verdicts["slow"]["seen"]


def test_long_checkpoint_save_is_not_stuck(verdicts):
    assert all(s["id"] != "stuck" for s in verdicts["save"]["seen"]), verdicts["save"]["seen"]


def test_a_read_from_a_fifo_that_never_comes_is_an_io_hang_at_the_read(verdicts):
    f = stuck_of(verdicts["fifo"])
    text = text_of(f)
    assert f"stack_targets.py:{marker_line('# HUNG fifo read')} in mode_fifo_read" in text
    assert "batches.fifo" in text or "pipe" in text.lower() or "FIFO" in text, text


def test_a_wait_for_a_child_process_names_the_wait(verdicts):
    f = stuck_of(verdicts["child"])
    text = text_of(f)
    assert f"stack_targets.py:{marker_line('# HUNG child wait')} in mode_child_wait" in text
    assert "child" in f["title"].lower(), f["title"]


def test_a_rank_waiting_in_a_barrier_for_a_rank_that_never_comes_is_a_collective_hang(verdicts):
    f = stuck_of(verdicts["collective"])
    text = text_of(f)
    assert "collective" in f["title"].lower(), f["title"]
    assert f"stack_targets.py:{marker_line('# HUNG barrier')} in _collective_rank_pid" in text
    assert "init_process_group(" in f["action"] and "TORCH_NCCL" in f["action"]
