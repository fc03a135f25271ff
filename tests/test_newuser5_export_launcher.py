"""`gputop export --pid <torchrun launcher>` published only rank 0's gputop_job_info and no rank
series: the rank series were registered for --attach all only. Now a --pid session's ranks (the
launcher's every local rank, sampled) are published as --attach all publishes them. A real 2-rank
gloo job (tests/rank_job.py) under torch.distributed.run, kept short."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from proc_helpers import kill_tree, stop  # noqa: E402
from two_hosts import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
JOB = Path(__file__).with_name("rank_job.py")
DEADLINE_S = 90  # a loaded 2-core machine


def scrape(url: str) -> dict[str, list]:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def test_pid_of_the_launcher_publishes_every_local_rank(tmp_path):
    log = tmp_path / "job.log"
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                            "--master-port", str(free_port()), str(JOB), "straggler"],
                           stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
    exporter = None
    try:
        t0 = time.monotonic()
        while log.read_text().count("ready") < 2:
            assert job.poll() is None and time.monotonic() - t0 < DEADLINE_S, log.read_text()[-2000:]
            time.sleep(0.3)
        port = free_port()
        exporter = subprocess.Popen([sys.executable, "-m", "gputop", "export", "--pid", str(job.pid),
                                     "--listen", f"127.0.0.1:{port}", "--interval", "0.5"],
                                    cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                    env=dict(os.environ, PYTHONPATH=str(ROOT)))
        ranks: set[str] = set()
        m: dict[str, list] = {}
        while ranks != {"0", "1"} or "gputop_rank_hot_line" not in m:
            assert exporter.poll() is None, exporter.stderr.read()[-2000:]
            assert time.monotonic() - t0 < DEADLINE_S, (ranks, sorted(m))
            time.sleep(1.0)
            try:
                m = scrape(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                continue
            ranks = {s.labels["rank"] for s in m.get("gputop_rank_info", ())}
        pids = {s.labels["pid"] for s in m["gputop_job_info"]}
        assert {s.labels["pid"] for s in m["gputop_rank_info"]} <= pids and len(pids) >= 2
        assert {s.labels["rank"] for s in m["gputop_rank_hot_line"]} == {"0", "1"}
    finally:
        if exporter is not None:
            stop(exporter)
        kill_tree(job)
