"""A report of a job that held none of the GPUs: their idle time is someone else's, never put down
to the job's CPU work (the report once did, while its own CPU section said the job held no GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUSY = "import time\nt = time.time()\nwhile time.time() - t < 30:\n    sum(i * i for i in range(20000))\n"


def _gputop(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "gputop", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env=env)


@pytest.mark.timeout(120)
def test_fake_gpus_idle_time_is_not_the_cpu_jobs(tmp_path):
    job = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        time.sleep(0.5)
        rec = tmp_path / "cpu-job.gputop"
        out = _gputop("record", "--fake", "2", "--pid", str(job.pid), "--duration", "4s", "-o", str(rec))
        assert out.returncode == 0, out.stderr
    finally:
        job.kill()
        job.wait()
    rep = _gputop("report", "--json", str(rec))
    assert rep.returncode == 0, rep.stderr
    doc = json.loads(rep.stdout)
    assert doc["cpu_device"] and doc["cpu_device"]["why"] == "the job held none of the GPUs"
    for g in doc["gpus"]:
        # Busy, and idle left unexplained: no bucket of the job's own (its CPU work, syncs, data).
        assert set(g["seconds"]) <= {"busy", "other/unknown"}, g["seconds"]
    text = _gputop("report", str(rec)).stdout
    gpus = text.split("CPU (no GPU)")[0]
    # Each GPU is said to be none of the job's, in place of an idle breakdown.
    assert gpus.count("not used by the attached job") == 2 and "CPU work in main process" not in gpus
    assert all(g["used_by_job"] is False for g in doc["gpus"])
