"""End to end: a real Prometheus server scrapes `gputop export --fake 2` and answers PromQL.

Needs the `prometheus` binary (Debian's package; `.ci/run` installs it). Skipped without it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
from proc_helpers import stop

pytest.importorskip("prometheus_client")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMETHEUS = shutil.which("prometheus")
BUCKETS = {"busy", "data", "cpu", "sync", "h2d", "io", "collective", "checkpoint", "unknown"}

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="no `prometheus` binary on PATH (apt-get install prometheus; CI installs it)"
)


def _free_ports(n: int) -> list[int]:
    """n distinct free ports (held open together, so the kernel cannot hand out one twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _query(api: str, promql: str) -> list[dict]:
    url = f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def _dashboard_queries() -> list[str]:
    with open(os.path.join(ROOT, "deploy", "grafana", "gputop.json")) as f:
        dash = json.load(f)
    subst = {"$__rate_interval": "5s", "$__range": "1m", "$job": ".*", "$instance": ".*"}
    out = []
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            expr = t["expr"]
            for k, v in subst.items():
                expr = expr.replace(k, v)
            out.append(expr)
    return out


def test_prometheus_scrapes_both_fake_gpus_with_their_buckets(tmp_path):
    exp_port, prom_port = _free_ports(2)
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: gputop\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{exp_port}']\n"
    )
    exporter = subprocess.Popen(
        [sys.executable, "-m", "gputop", "export", "--fake", "2", "--interval", "0.5", "--listen",
         f"127.0.0.1:{exp_port}"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    prom = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    api = f"http://127.0.0.1:{prom_port}"
    try:
        deadline = time.monotonic() + 20
        util = buckets = []
        while time.monotonic() < deadline:
            assert exporter.poll() is None, exporter.stderr.read()
            assert prom.poll() is None, prom.stderr.read()[-2000:]
            try:
                util = _query(api, 'gputop_gpu_utilization_ratio{job="gputop"}')
                buckets = _query(api, 'gputop_gpu_time_seconds_total{job="gputop"}')
            except OSError:  # not listening yet
                pass
            busy = [r for r in buckets if r["metric"]["bucket"] == "busy" and float(r["value"][1]) > 0]
            if len(util) == 2 and len(busy) == 2:
                break
            time.sleep(0.5)
        assert {r["metric"]["gpu"] for r in util} == {"0", "1"}, util
        by_gpu: dict[str, set[str]] = {}
        for r in buckets:
            by_gpu.setdefault(r["metric"]["gpu"], set()).add(r["metric"]["bucket"])
        assert by_gpu == {"0": BUCKETS, "1": BUCKETS}, by_gpu
        assert len(busy) == 2, buckets
        assert {r["metric"]["uuid"] for r in util} == {"GPU-fake-0000", "GPU-fake-0001"}
        up = _query(api, "gputop_nvml_up")
        assert [r["value"][1] for r in up] == ["1"]
        # Every query of the shipped dashboard parses and names only series the exporter has.
        # (names from the exporter's HELP lines: a family with no series yet, such as findings, counts)
        with urllib.request.urlopen(f"http://127.0.0.1:{exp_port}/metrics", timeout=5) as r:
            exported = set(re.findall(r"(?m)^# HELP (\S+)", r.read().decode()))
        exported |= {n + "_total" for n in exported}
        for expr in _dashboard_queries():
            _query(api, expr)  # a syntax error fails here
            names = set(re.findall(r"\b((?:gputop|process)_[a-z_]+)\b", expr))
            assert names <= exported, (expr, names - exported)
    finally:
        stop(prom)
        stop(exporter)
    assert exporter.returncode == 143  # stopped by SIGTERM, cleanly (proc_helpers.stop)
