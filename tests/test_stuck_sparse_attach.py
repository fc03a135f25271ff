"""Real CPU jobs watched at one stack a second (what a loaded host leaves py-spy): a training loop
that sleeps 50 ms a step in its logging is not stuck, however many samples in a row find it
asleep; a job blocked forever on a lock inside save_checkpoint() is stuck within seconds, and
stays stuck, while another process writes to the disk; no checkpoint saves are invented for it.
A dataset read that sleeps 2 ms an item in the main process is starved, not stuck; the same read
polling in a loop of its own for a file nobody writes is stuck.

All jobs and their `advise` runs go at once: one torch start-up and one 14 s watch.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

pytest.importorskip("psutil")

from gputop.sources.stacks import AttachError, check_attachable, find_pyspy  # noqa: E402
from proc_helpers import kill_tree  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(180),
    # Looked up, not imported: torch in this process would slow every later test's collections.
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the jobs need torch"),
    pytest.mark.skipif(find_pyspy() is None, reason="py-spy not installed"),
    pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc"),
]

DURATION_S = 14
# Short enough that the sleeper's unchanged runs reach it within the watch: the old verdict's path.
STUCK_AFTER_S = 6
SAMPLE_RATE = 1  # stacks/s, as a saturated host held sampling back to

PRELUDE = """
import threading, time, torch
torch.set_num_threads(1)
m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
def step():
    loss = torch.nn.functional.cross_entropy(m(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
"""
JOBS = {
    # ~19 steps/s, asleep at one line ~97 % of the time
    "sleeper": PRELUDE + textwrap.dedent("""
        def log_metrics():
            time.sleep(0.05)
        print("ready", flush=True)
        while True:
            step(); log_metrics()
    """),
    # trains, then waits forever on a lock another thread holds, inside a function named like a save
    "save_hang": PRELUDE + textwrap.dedent("""
        lock = threading.Lock()
        def holder():
            lock.acquire()
            while True: time.sleep(1000)
        threading.Thread(target=holder, daemon=True).start(); time.sleep(0.2)
        for _ in range(5): step()
        def save_checkpoint():
            with lock:
                pass
        print("ready", flush=True)
        save_checkpoint()
    """),
    # A DataLoader with no workers whose dataset sleeps 2 ms an item (a remote read): asleep at one
    # line in every sample, each wake a few microseconds of work, like a poll; but the read
    # returns every time (no loop of its own) and the fetcher moves on to the next item.
    "item_reads": PRELUDE + textwrap.dedent("""
        from torch.utils.data import Dataset, DataLoader
        class Remote(Dataset):
            def __len__(self): return 10**9
            def __getitem__(self, i):
                time.sleep(0.002)
                return torch.randn(256), i % 10
        print("ready", flush=True)
        for xb, yb in DataLoader(Remote(), batch_size=32):
            loss = torch.nn.functional.cross_entropy(m(xb), yb)
            opt.zero_grad(); loss.backward(); opt.step()
    """),
    # The same read, polling for a file nobody writes: the same line, the same wakes, in a loop.
    "item_poll": PRELUDE + textwrap.dedent("""
        import os
        from torch.utils.data import Dataset, DataLoader
        class Remote(Dataset):
            def __len__(self): return 10**9
            def __getitem__(self, i):
                while not os.path.exists("/nonexistent/ready.flag"):
                    time.sleep(0.002)
                return torch.randn(256), i % 10
        print("ready", flush=True)
        for xb, yb in DataLoader(Remote(), batch_size=32):
            loss = torch.nn.functional.cross_entropy(m(xb), yb)
    """),
}
# Someone else's disk writes on the host (another job, a recording): no evidence about this job.
WRITER = textwrap.dedent("""
    import os, sys, time
    with open(sys.argv[1], "wb") as f:
        while True:
            f.write(os.urandom(1 << 20)); f.flush(); os.fsync(f.fileno()); f.seek(0); time.sleep(0.2)
""")


def _wait_ready(proc: subprocess.Popen, timeout: float = 90.0) -> None:
    assert proc.stdout is not None
    end = time.time() + timeout
    while time.time() < end:
        line = proc.stdout.readline()
        if line.strip() == "ready":
            return
        if not line and proc.poll() is not None:
            raise RuntimeError(f"job exited with {proc.returncode}")
    raise RuntimeError("job never got ready")


@pytest.fixture(scope="module")
def reports():
    tmp = tempfile.mkdtemp(prefix="gputop-sparse-")
    procs: list[subprocess.Popen] = []
    try:
        jobs = {}
        for name, code in JOBS.items():
            path = os.path.join(tmp, f"{name}.py")
            with open(path, "w") as f:
                f.write(code)
            jobs[name] = subprocess.Popen([sys.executable, path], stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, text=True)
            procs.append(jobs[name])
        for p in jobs.values():
            _wait_ready(p)
        try:
            check_attachable(jobs["sleeper"].pid)
        except AttachError as exc:
            pytest.skip(f"py-spy cannot attach here: {exc}")
        writer = os.path.join(tmp, "writer.py")
        with open(writer, "w") as f:
            f.write(WRITER)
        procs.append(subprocess.Popen([sys.executable, writer, os.path.join(tmp, "other.bin")]))
        time.sleep(1.0)
        runs = {name: subprocess.Popen(
            [sys.executable, "-m", "gputop", "advise", "--pid", str(p.pid), "--duration", str(DURATION_S),
             "--sample-rate", str(SAMPLE_RATE), "--stuck-after", str(STUCK_AFTER_S), "--json",
             # Kept beside the jobs: a verdict that fails can be replayed (bench/replay_advise.py).
             "--record", os.path.join(tmp, f"{name}.gputop")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name, p in jobs.items()}
        procs += runs.values()
        out = {}
        for name, r in runs.items():
            stdout, stderr = r.communicate(timeout=90)
            assert r.returncode == 0, stderr
            out[name] = json.loads(stdout)
            out[name]["recorded_to"] = os.path.join(tmp, f"{name}.gputop")
        yield out
    finally:
        for p in procs:
            if p.poll() is None:
                kill_tree(p)


def ids(report: dict) -> set[str]:
    return {f["id"] for f in report["findings"]} | {s["id"] for s in report["seen"]}


def test_a_loop_asleep_at_one_line_most_of_each_step_is_never_called_stuck(reports):
    r = reports["sleeper"]
    # Never shown, not only absent at the end: a wrong warning shown for a few seconds is wrong.
    assert "stuck" not in ids(r), ([f["title"] for f in r["findings"]], r["recorded_to"])


def test_a_lock_hang_inside_a_save_is_stuck_at_once_and_no_saves_are_invented(reports):
    r = reports["save_hang"]
    found = {f["id"]: f for f in r["findings"]}
    assert "stuck" in found, [f["title"] for f in r["findings"]]
    seen = next(s for s in r["seen"] if s["id"] == "stuck")
    assert seen["first_seen_s"] <= 8.0 and seen["last_seen_s"] >= DURATION_S - 3, seen
    assert "checkpoint-stall" not in ids(r)
    assert "save_checkpoint" in "\n".join([found["stuck"]["title"], *found["stuck"]["evidence"]])


def test_a_dataset_read_that_returns_every_item_is_starved_not_stuck(reports):
    r = reports["item_reads"]
    assert not ids(r) & {"stuck", "weighing-hang"}, ([f["title"] for f in r["findings"]], r["recorded_to"])
    assert "data-starved" in {f["id"] for f in r["findings"]}, [f["title"] for f in r["findings"]]


def test_the_same_read_polling_in_a_loop_of_its_own_is_stuck(reports):
    r = reports["item_poll"]
    found = {f["id"]: f for f in r["findings"]}
    assert "stuck" in found, [f["title"] for f in r["findings"]]
    assert "__getitem__" in found["stuck"]["title"], found["stuck"]["title"]
