"""The exporter's collector on the fake source, read back with prometheus_client's own parser,
and the command's bad inputs."""

from __future__ import annotations

import os
import http.client
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from gputop.analysis.breakdown import Bucket  # noqa: E402
from gputop.export.attach import Attacher  # noqa: E402
from gputop.export.collector import THROTTLE_REASONS, GputopCollector  # noqa: E402
from gputop.export.jobs import Placement, parse_cgroup, script_of  # noqa: E402
from gputop.export.server import bind, parse_listen  # noqa: E402
from gputop.errors import UserError  # noqa: E402
from gputop.model import Category, Finding, GpuSample, Severity, StackSample, SystemInfo, Verdict  # noqa: E402
from gputop.sources.fake import FAKE_PID_BASE, FakeGpuSource  # noqa: E402
from gputop.store import Store  # noqa: E402
from attach_fakes import FakeSampler, attach_session  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKETS = {b.value for b in Bucket}


def scrape(collector) -> dict[str, list]:
    """name -> samples, through the exposition text and back."""
    reg = CollectorRegistry()
    reg.register(collector)
    text = generate_latest(reg).decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def value(samples, **labels) -> float:
    hits = [s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (labels, samples)
    return hits[0]


def fake_session(clock, gpus=2, seconds=30.0, step=1.0, store=None, extra=None):
    store = store or Store()
    src = FakeGpuSource(gpus=gpus, interval=step, clock=clock)
    t_end = clock() + seconds
    while True:
        store.add(src.poll())
        if extra is not None:
            extra(store, clock())
        if clock() >= t_end:
            break
        clock.advance(step)
    return store, src


def collector_for(store, clock, start, **kw):
    from gputop.export.account import TimeAccount

    return GputopCollector(store, interval=1.0, clock=clock, account=TimeAccount(start), placement=lambda pid: Placement(),
                           mode="fake", **kw)


def test_series_for_both_gpus_in_base_units(clock):
    start = clock()
    store, _ = fake_session(clock)
    m = scrape(collector_for(store, clock, start))
    for gpu in ("0", "1"):
        lab = {"gpu": gpu, "uuid": f"GPU-fake-000{gpu}", "model": "Fake H100 80GB HBM3 (scripted)"}
        assert value(m["gputop_gpu_up"], **lab) == 1
        assert 0 <= value(m["gputop_gpu_utilization_ratio"], **lab) <= 1
        assert value(m["gputop_gpu_memory_total_bytes"], **lab) == 80 * 1024**3
        assert value(m["gputop_gpu_sm_clock_hertz"], **lab) > 1e8  # MHz turned into Hz
        assert value(m["gputop_gpu_power_limit_watts"], **lab) == 700
        assert 0 <= value(m["gputop_gpu_tensor_active_ratio"], **lab) <= 1
        reasons = {s.labels["reason"]: s.value for s in m["gputop_gpu_throttle_reason"] if s.labels["gpu"] == gpu}
        assert set(reasons) == {name for _, name in THROTTLE_REASONS} and set(reasons.values()) <= {0.0, 1.0}
        assert {s.labels["bucket"] for s in m["gputop_gpu_time_seconds_total"] if s.labels["gpu"] == gpu} == BUCKETS
    # GPU 1 of the script is power capped, GPU 0 is not
    assert value(m["gputop_gpu_throttle_reason"], gpu="1", reason="power_cap") == 1
    assert value(m["gputop_gpu_throttle_reason"], gpu="0", reason="power_cap") == 0
    # SXM boards have no fan: the series is absent, not 0
    assert "gputop_gpu_fan_ratio" not in m
    assert value(m["gputop_nvml_up"]) == 1 and "gputop_nvml_error_info" not in m  # no series while up
    assert value(m["gputop_exporter_info"], source="fake") == 1
    mem = value(m["gputop_process_gpu_memory_used_bytes"], gpu="0", pid=str(FAKE_PID_BASE))
    assert mem == 60 * 1024**3
    job = [s for s in m["gputop_job_info"] if s.labels["pid"] == str(FAKE_PID_BASE)][0]
    assert job.labels["script"] == "train.py" and job.labels["user"] == "fake" and job.labels["attached"] == "0"


def test_gpu_time_counts_each_second_once_whoever_scrapes(clock):
    start = clock()
    store = Store()
    src = FakeGpuSource(gpus=2, interval=1.0, clock=clock)
    col = collector_for(store, clock, start)
    last: dict[tuple, float] = {}
    for k in range(90):
        store.add(src.poll())
        if k % 5 == 4:
            m = scrape(col)
            again = scrape(col)  # a second server scraping at once reads the same counter
            for s in m["gputop_gpu_time_seconds_total"]:
                key = (s.labels["gpu"], s.labels["bucket"])
                assert s.value >= last.get(key, 0.0) - 1e-9, key  # only grows
                last[key] = s.value
                assert value(again["gputop_gpu_time_seconds_total"], **s.labels) == s.value
        clock.advance(1.0)
    covered = clock() - 1.0 - 2.5 - start  # the newest SETTLE_S are left for the next scrape
    for gpu in ("0", "1"):
        total = sum(v for (g, _), v in last.items() if g == gpu)
        assert total == pytest.approx(covered, abs=1.0)
    busy0 = last[("0", "busy")] / sum(v for (g, _), v in last.items() if g == "0")
    assert busy0 == pytest.approx(0.8 * 0.97, abs=0.03)  # the script: busy 1.6 s of 2 at 97 %
    assert last[("0", "unknown")] > 0 and last[("0", "data")] == 0  # nothing attached: no causes


def test_idle_time_gets_its_cause_from_the_attached_jobs_stacks(clock):
    start = clock()
    pid = FAKE_PID_BASE  # the fake job on GPU 0

    def stacks(store, now):
        store.add([StackSample(now - 0.2 * k, pid, 1, is_main=True, active=False, category=Category.DATA_WAIT)
                   for k in range(4, -1, -1)])

    store, _ = fake_session(clock, seconds=40, extra=stacks)
    m = scrape(collector_for(store, clock, start, attached=lambda: {pid}))
    data = value(m["gputop_gpu_time_seconds_total"], gpu="0", bucket="data")
    idle = sum(s.value for s in m["gputop_gpu_time_seconds_total"] if s.labels["gpu"] == "0" and s.labels["bucket"] != "busy")
    assert data > 0 and data == pytest.approx(idle, rel=0.05)
    job = {s.labels["bucket"]: s.value for s in m["gputop_job_gpu_time_seconds_total"] if s.labels["pid"] == str(pid)}
    assert job["data"] == data
    assert value(m["gputop_job_info"], pid=str(pid)) == 1
    assert [s.labels["attached"] for s in m["gputop_job_info"] if s.labels["pid"] == str(pid)] == ["1"]


def test_lost_gpu_goes_stale_and_says_why(clock):
    start = clock()
    store, _ = fake_session(clock, seconds=10)
    store.add([GpuSample(clock(), 0, error="GPU is lost")])
    m = scrape(collector_for(store, clock, start))
    assert value(m["gputop_gpu_up"], gpu="0") == 0 and value(m["gputop_gpu_up"], gpu="1") == 1
    assert all(s.labels["gpu"] == "1" for s in m["gputop_gpu_utilization_ratio"])  # GPU 0's gauges left out
    assert value(m["gputop_nvml_up"]) == 1  # one GPU still answers
    assert [s.labels["reason"] for s in m["gputop_nvml_error_info"]] == ["GPU 0: GPU is lost"]
    # the whole source stops: every GPU series goes, NVML is down, the reason names the silence
    clock.advance(120)
    m = scrape(collector_for(store, clock, start))
    assert "gputop_gpu_utilization_ratio" not in m and value(m["gputop_nvml_up"]) == 0
    assert any("no sample for 1" in s.labels["reason"] for s in m["gputop_nvml_error_info"])


def test_nvml_unavailable_at_start(clock):
    store = Store()
    store.add([SystemInfo(clock(), nvml_error="NVML Shared Library Not Found")])
    m = scrape(collector_for(store, clock, clock()))
    assert value(m["gputop_nvml_up"]) == 0
    assert value(m["gputop_nvml_error_info"], reason="NVML unavailable: NVML Shared Library Not Found") == 1


def test_findings_with_cost_and_severity(clock):
    start = clock()
    store, _ = fake_session(clock, seconds=5)
    f = Finding("data-starved", "GPU waits for data", Severity.CRITICAL, 0.9, ("e",), "num_workers=8",
                cost_s=12.5, gpu_index=0)
    store.add([Verdict(store.now, (f, f))])
    m = scrape(collector_for(store, clock, start))
    assert value(m["gputop_finding"], id="data-starved", severity="critical", gpu="0") == 12.5
    assert value(m["gputop_finding_confidence"], id="data-starved") == 0.9
    assert value(m["gputop_advisor_window_seconds"]) == 60


@pytest.mark.parametrize(
    "text, want",
    [
        ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1f0b2c3d_4e5f_6789_abcd_ef0123456789.slice/"
         "cri-containerd-" + "a" * 64 + ".scope\n",
         Placement("a" * 64, "1f0b2c3d-4e5f-6789-abcd-ef0123456789")),
        ("12:memory:/kubepods/burstable/pod1f0b2c3d-4e5f-6789-abcd-ef0123456789/" + "b" * 64 + "\n"
         "11:cpu:/kubepods/burstable/pod1f0b2c3d-4e5f-6789-abcd-ef0123456789/" + "b" * 64 + "\n",
         Placement("b" * 64, "1f0b2c3d-4e5f-6789-abcd-ef0123456789")),
        ("0::/system.slice/docker-" + "c" * 64 + ".scope\n", Placement("c" * 64, "")),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", Placement("", "")),
        ("", Placement("", "")),
    ],
)
def test_container_and_pod_from_cgroup(text, want):
    assert parse_cgroup(text) == want


@pytest.mark.parametrize(
    "cmd, want",
    [
        ("python train.py --token=[REDACTED]", "train.py"),
        ("/usr/bin/python3 -m torch.distributed.run --nproc 8 x.py", "-m torch.distributed.run"),
        ("python /data/run/finetune.py", "finetune.py"),
        ("pt_main_thread", "pt_main_thread"),
        ("", ""),
    ],
)
def test_script_label_is_only_the_program(cmd, want):
    assert script_of(cmd) == want


def test_listen_addresses():
    assert parse_listen("127.0.0.1:10405") == ("127.0.0.1", 10405)
    assert parse_listen("[::1]:9") == ("::1", 9)
    assert parse_listen(":10405") == ("0.0.0.0", 10405)
    for bad in ("10405", "host:", "host:port", "1.2.3.4:70000", "[::1:5"):
        with pytest.raises(UserError):
            parse_listen(bad)


def _request(port: int, method: str, path: str, headers=None) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


@pytest.fixture
def served(clock):
    """The exporter's HTTP server on a free port, over two fake GPUs."""
    store, _ = fake_session(clock, gpus=2, seconds=5)
    reg = CollectorRegistry()
    reg.register(collector_for(store, clock, clock()))
    httpd = bind("127.0.0.1", 0, reg)
    try:
        yield httpd.server_port
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_metrics_only_at_metrics_and_a_one_line_404_elsewhere(served):
    status, headers, body = _request(served, "GET", "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain; version=")
    assert int(headers["content-length"]) == len(body)
    names = {f.name for f in text_string_to_metric_families(body.decode())}
    assert "gputop_gpu_utilization_ratio" in names and "gputop_exporter_info" in names
    # prometheus-client's exposition is kept (content negotiation), and a query string is no new path.
    status, headers, body = _request(served, "GET", "/metrics", {"Accept": "application/openmetrics-text"})
    assert status == 200 and headers["content-type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")
    status, _, body = _request(served, "GET", "/metrics?x=1")
    assert status == 200 and b"gputop_gpu_utilization_ratio{" in body

    status, headers, body = _request(served, "GET", "/")
    assert status == 200 and b"/metrics" in body and body.count(b"\n") == 1
    for path in ("/nope", "/metrics/", "/metricsx", "/favicon.ico", "/healthz", "/%0Aevil"):
        status, headers, body = _request(served, "GET", path)
        assert status == 404, path
        assert headers["content-type"].startswith("text/plain")
        assert body.count(b"\n") == 1 and body.startswith(b"404") and b"evil" not in body, (path, body)
        assert b"gputop_" not in body


def test_head_is_get_without_the_body_and_other_methods_are_refused(served):
    _, get_headers, get_body = _request(served, "GET", "/metrics")
    status, headers, body = _request(served, "HEAD", "/metrics")
    assert status == 200 and body == b""
    assert headers["content-type"] == get_headers["content-type"]
    assert int(headers["content-length"]) > 0  # the length a GET has (the gauges move, so not byte-equal)
    status, headers, body = _request(served, "HEAD", "/")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0
    status, headers, body = _request(served, "HEAD", "/nope")
    assert status == 404 and body == b""
    status, headers, body = _request(served, "OPTIONS", "/metrics")
    assert status == 200 and "HEAD" in headers["allow"]
    status, headers, body = _request(served, "POST", "/metrics")
    assert status == 405 and "GET" in headers["allow"] and body.count(b"\n") == 1


def test_attach_all_respects_the_cap_and_frees_slots(clock):
    store, _ = fake_session(clock, gpus=4, seconds=2)  # fake jobs on GPUs 0, 1 and 3
    session = attach_session(store)
    att = Attacher(session, FakeSampler, max_attach=2, python=lambda pid: True, check=lambda pid: None)
    events = att.poll()
    assert att.pids() == [FAKE_PID_BASE, FAKE_PID_BASE + 1]
    assert any("--max-attach" in e.message for e in events)
    session.pipeline.sources[0].exited = clock()
    att.poll()
    assert att.pids() == [FAKE_PID_BASE + 1] and len(session.pipeline.sources) == 1


def _gputop(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "gputop", "export", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def test_port_in_use_is_one_line_and_nonzero():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = _gputop("--fake", "1", "--listen", f"127.0.0.1:{port}")
        out, err = p.communicate(timeout=30)
    assert p.returncode == 1  # the machine's state (another process holds it), not a bad argument
    assert err.strip().splitlines() == [f"gputop export: error: cannot listen on 127.0.0.1:{port}: address already in use"]


@pytest.mark.parametrize("listen, words", [("192.0.2.1:10405", "cannot listen on 192.0.2.1:10405"),
                                           ("nonsense", "--listen: not HOST:PORT: 'nonsense'")])
def test_bad_address_is_one_line_and_nonzero(listen, words):
    p = _gputop("--fake", "1", "--listen", listen)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 2  # bad input
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gputop export: error: ") and words in lines[0], lines


def test_serves_and_stops_cleanly_on_sigterm():
    p = _gputop("--fake", "2", "--listen", "127.0.0.1:0", "--interval", "0.5")
    try:
        line = p.stderr.readline()
        assert "serving http://127.0.0.1:" in line, line
        url = line.split()[3]
        deadline = time.monotonic() + 15
        while True:
            text = urllib.request.urlopen(url, timeout=5).read().decode()
            if "gputop_gpu_utilization_ratio{" in text or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        gpus = {s.labels["gpu"] for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "gputop_gpu_utilization_ratio"}
        assert gpus == {"0", "1"}
        with pytest.raises(urllib.error.HTTPError) as err:  # only /metrics (and /) are served
            urllib.request.urlopen(url.replace("/metrics", "/metric"), timeout=5)
        assert err.value.code == 404
        t = time.monotonic()
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10) == 128 + signal.SIGTERM  # as record and advise: it says it was terminated
        assert time.monotonic() - t < 5
        assert "stopped" in p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_memory_growth_and_time_to_limit(clock):
    """A GPU whose memory grows 50 MiB/s gets its rate and the time to the card's limit; a flat
    one gets rate 0 and no time; only the GPU's labels (no PID)."""
    from gputop.export.account import TimeAccount
    from gputop.model import GpuProcess, HostSample

    store = Store()
    t0 = clock()
    for k in range(181):
        ts = t0 + k
        store.add([GpuSample(ts=ts, index=0, mem_used=4 * 2**30 + 50 * 2**20 * k, mem_total=80 * 2**30),
                   GpuSample(ts=ts, index=1, mem_used=10 * 2**30, mem_total=80 * 2**30),
                   GpuProcess(ts=ts, gpu_index=0, pid=77, used_memory=4 * 2**30 + 50 * 2**20 * k),
                   HostSample(ts=ts, cpu_percent=1.0, mem_total=64 * 2**30, mem_available=32 * 2**30)])
    now = t0 + 180
    c = GputopCollector(store, interval=1.0, clock=lambda: now, account=TimeAccount(t0), placement=lambda pid: Placement(),
                        attached=lambda: [77])
    got = scrape(c)
    rate = got["gputop_gpu_memory_growth_bytes_per_second"]
    assert value(rate, gpu="0") == pytest.approx(50 * 2**20)
    assert value(rate, gpu="1") == 0.0
    eta = got["gputop_gpu_memory_time_to_limit_seconds"]
    assert value(eta, gpu="0") == pytest.approx((80 * 2**30 - (4 * 2**30 + 50 * 2**20 * 180)) / (50 * 2**20), rel=0.01)
    assert [s.labels["gpu"] for s in eta] == ["0"]
    assert set(eta[0].labels) == {"gpu", "uuid", "model"}
    assert value(got["gputop_host_memory_growth_bytes_per_second"]) == 0.0
    assert "gputop_host_memory_time_to_limit_seconds" not in got


def test_a_job_whose_process_is_gone_keeps_its_labels():
    # A new user's exporter: once the --pid target exited, its per-job series came back with
    # `user=""` (no process sample to read it from): a new series for the same job.
    from gputop.export.account import TimeAccount
    from gputop.model import ProcSample

    c = GputopCollector(None, interval=1.0, clock=lambda: 0.0, account=TimeAccount(0.0),
                        placement=lambda pid: Placement())
    ps = ProcSample(ts=0.0, pid=4242, name="python", cmdline="python train.py", user="root", role="target")
    seen = c._job_labels(4242, ps)
    assert seen[3] == "root" and c._job_labels(4242, None) == seen
    assert c._job_labels(4343, None)[3] == ""  # never seen: nothing to keep
