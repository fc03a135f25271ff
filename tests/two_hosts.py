"""Two "hosts" on one machine for the across-hosts test and bench: 4-rank gloo jobs (tests/rank_job.py),
each launched as two torchrun nodes of 2 ranks; each host is one process tree (a shell that starts
its node of every job) with its own `gputop export --attach all --attach-under TREE --host-label`
on its own loopback address (127.0.0.2, 127.0.0.3); one real Prometheus scrapes both.

Every job is named by torchrun's ``--rdzv-id`` (``TORCHELASTIC_RUN_ID``), as a multi-node job
would be: a loopback rendezvous address alone is host-local by design (``job_identity``).
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from proc_helpers import kill_tree, stop

ROOT = Path(__file__).resolve().parents[1]
JOB = Path(__file__).with_name("rank_job.py")
PROMETHEUS = shutil.which("prometheus")
HOSTS = (("node-a", "127.0.0.2"), ("node-b", "127.0.0.3"))
NPROC = 2  # ranks per host: ranks 0-1 on node-a, 2-3 on node-b


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


class TwoHosts:
    """``jobs``: job id -> (mode, the odd rank). Start with ``start()``, stop with ``close()``."""

    def __init__(self, tmp: Path, jobs: dict[str, tuple[str, int]], stuck_after: float = 3.0,
                 interval: float = 0.5) -> None:
        self.tmp, self.jobs, self.stuck_after, self.interval = tmp, jobs, stuck_after, interval
        self.procs: list[subprocess.Popen] = []
        self.hosts: list[subprocess.Popen] = []
        self.exporters: list[subprocess.Popen] = []
        self.api = ""
        self.t0 = 0.0

    def _node_cmd(self, job: str, mode: str, odd: int, port: int, node: int) -> str:
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
                "--nproc-per-node", str(NPROC), "--master-addr", "127.0.0.1", "--master-port", str(port),
                "--rdzv-id", job, str(JOB), mode, str(odd)]
        return shlex.join(argv) + f" >{shlex.quote(str(self.tmp / f'{job}-{node}.log'))} 2>&1"

    def start(self) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        ports = {job: free_port() for job in self.jobs}
        self.t0 = time.monotonic()
        for node, _ in enumerate(HOSTS):
            # One shell per host: its process tree is what that host's exporter may attach to.
            script = " & ".join(self._node_cmd(j, m, odd, ports[j], node) for j, (m, odd) in self.jobs.items())
            self.hosts.append(subprocess.Popen(["/bin/sh", "-c", script + " & wait"], env=env,
                                               start_new_session=True))
        prom_port = free_port()
        targets = []
        for (label, addr), tree in zip(HOSTS, self.hosts):
            port = free_port(addr)
            targets.append(f"'{addr}:{port}'")
            self.exporters.append(subprocess.Popen(
                [sys.executable, "-m", "gputop", "export", "--attach", "all", "--attach-under", str(tree.pid),
                 "--host-label", label, "--listen", f"{addr}:{port}", "--interval", str(self.interval),
                 "--stuck-after", f"{self.stuck_after:g}"],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        (self.tmp / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: gputop\n"
            f"    static_configs:\n      - targets: [{', '.join(targets)}]\n")
        self.procs.append(subprocess.Popen(
            [PROMETHEUS, f"--config.file={self.tmp / 'prometheus.yml'}", f"--storage.tsdb.path={self.tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        self.api = f"http://127.0.0.1:{prom_port}"

    def ready(self, job: str) -> bool:
        """Every rank of ``job`` is past its first all_reduce."""
        n = 0
        for node, _ in enumerate(HOSTS):
            log = self.tmp / f"{job}-{node}.log"
            n += log.read_text().count("ready") if log.exists() else 0
        return n >= NPROC * len(HOSTS)

    def check_alive(self) -> None:
        for p in (*self.exporters, *self.procs):
            if p.poll() is not None:
                raise AssertionError(f"{p.args[:3]} exited {p.returncode}: {p.stderr.read()[-2000:]}")

    def close(self) -> None:
        for p in self.hosts:
            kill_tree(p)
        for p in (*self.exporters, *self.procs):
            stop(p)

    def __enter__(self) -> "TwoHosts":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def view(api: str, job: str) -> tuple[str, float]:
    """`gputop job --prometheus API JOB --once`: its text (stderr on failure) and how long it took."""
    t = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "gputop", "job", "--prometheus", api, job, "--once"],
                         cwd=ROOT, capture_output=True, text=True, timeout=30)
    return (res.stdout if res.returncode == 0 else res.stderr), time.monotonic() - t


def verdict(api: str, job: str):
    """The job and what `gputop job --once` shows of it (the last minute's evaluations through
    the hold rule, in-process, for polling), None before the job's series reach Prometheus."""
    from gputop.commands.job import fetch_job
    from gputop.errors import UserError

    try:
        return fetch_job(api, job)
    except UserError:
        return None
