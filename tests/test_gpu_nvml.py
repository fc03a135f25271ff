"""The NVML source against a real GPU and driver (run on a GPU machine: ``pytest -m gpu``)."""

from __future__ import annotations

import statistics
import time

import pytest

from gputop.model import Event, GpuInfo, GpuProcess, GpuSample, SystemInfo, UtilPoint
from gputop.sources.nvml import NvmlSource, NvmlUnavailable, describe_environment

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(60)]

POLLS = 3
POLL_GAP_S = 1.25  # 3 polls over ~2.5 s


@pytest.fixture(scope="module")
def polled():
    try:
        src = NvmlSource.open(interval=1.0)
    except NvmlUnavailable as exc:
        pytest.skip(f"no usable NVIDIA GPU: {exc}")
    batches = []
    try:
        for i in range(POLLS):
            if i:
                time.sleep(POLL_GAP_S)
            batches.append(src.poll())
    finally:
        src.close()
    return batches


def _all(batches, cls):
    return [x for b in batches for x in b if isinstance(x, cls)]


def test_system_and_gpu_description(polled):
    (system,) = _all(polled, SystemInfo)
    assert system.gpu_count >= 1
    assert system.driver_version
    assert system.cuda_driver_version and "." in system.cuda_driver_version
    infos = _all(polled[:1], GpuInfo)
    assert len(infos) == system.gpu_count
    for info in infos:
        assert info.name.strip()
        assert info.memory_total and info.memory_total > 0
        assert info.compute_capability and info.compute_capability[0] >= 3
        if info.sm_count is not None:
            assert 1 <= info.sm_count <= 1000
        if info.power_limit_w is not None:
            assert 10 < info.power_limit_w < 5000


def test_samples_are_plausible(polled):
    for batch in polled:
        samples = [x for x in batch if isinstance(x, GpuSample)]
        assert samples, "one GpuSample per GPU per poll"
        stamps = {x.ts for x in batch if isinstance(x, (GpuSample, GpuProcess))}
        assert len(stamps) == 1, "one timestamp per poll"
        for s in samples:
            assert s.error is None, s.error
            assert s.util_gpu is not None and 0 <= s.util_gpu <= 100
            assert s.util_mem is None or 0 <= s.util_mem <= 100
            assert s.mem_used is not None and s.mem_total and 0 <= s.mem_used <= s.mem_total
            assert s.power_w is not None and s.power_w > 0
            assert s.temperature_c is not None and 5 <= s.temperature_c <= 110
            assert s.sm_clock_mhz is None or 0 <= s.sm_clock_mhz <= 5000
            assert s.throttle_reasons is None or s.throttle_reasons >= 0


def test_util_points_every_200ms(polled):
    points = _all(polled, UtilPoint)
    by_gpu: dict[int, list[UtilPoint]] = {}
    for p in points:
        by_gpu.setdefault(p.index, []).append(p)
    if not by_gpu and all(s.util_gpu == 0 for s in _all(polled, GpuSample)):
        pytest.skip("idle GPU and NVML kept no utilisation samples")
    assert by_gpu, "the 200 ms buffer gave nothing"
    now = time.time()
    for idx, pts in by_gpu.items():
        ts = [p.ts for p in pts]
        assert len(ts) == len(set(ts)), "a point was emitted twice"
        assert ts == sorted(ts)
        assert all(0 <= p.util <= 100 for p in pts), "buffer values are not percentages"
        assert all(now - 120 < t <= now + 1 for t in ts), "buffer timestamps are not on time.time()'s clock"
        gaps = [b - a for a, b in zip(ts, ts[1:])]
        assert len(gaps) >= 5
        assert 0.1 <= statistics.median(gaps) <= 0.4, f"GPU {idx}: median spacing {statistics.median(gaps):.3f} s"


def test_gpm_where_supported(polled):
    infos = {i.index: i for i in _all(polled[:1], GpuInfo)}
    supported = [i for i, info in infos.items() if info.gpm_supported]
    if not supported:
        pytest.skip("no GPU here reports GPM support")
    last = {s.index: s for s in polled[-1] if isinstance(s, GpuSample)}
    for i in supported:
        s = last[i]
        assert s.sm_active is not None and 0 <= s.sm_active <= 100
        assert s.tensor_active is not None and 0 <= s.tensor_active <= 100
        assert s.dram_active is None or 0 <= s.dram_active <= 100


def test_h100_supports_gpm(polled):
    infos = _all(polled[:1], GpuInfo)
    hopper = [i for i in infos if i.compute_capability and i.compute_capability[0] >= 9]
    if not hopper:
        pytest.skip("no Hopper-or-newer GPU here")
    assert all(i.gpm_supported for i in hopper)


def test_no_error_events(polled):
    bad = [e for e in _all(polled, Event) if e.level in ("warning", "error")]
    assert bad == []


def test_describe_environment_on_real_driver():
    try:
        NvmlSource.open().close()
    except NvmlUnavailable as exc:
        pytest.skip(str(exc))
    checks = describe_environment()
    by = {name: ok for name, ok, _ in checks}
    assert by.get("NVIDIA driver") is True, checks
    assert by.get("GPUs") is True, checks
    assert any(name == "GPU 0" for name, _, _ in checks)


def test_close_twice_and_poll_after_close():
    try:
        src = NvmlSource.open()
    except NvmlUnavailable as exc:
        pytest.skip(str(exc))
    assert src.poll()
    src.close()
    src.close()
    assert src.poll() == []
