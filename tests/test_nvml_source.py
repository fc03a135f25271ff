"""The NVML source against a scripted fake of pynvml (no GPU needed)."""

from __future__ import annotations

import sys

import pytest

from gputop.model import Event, GpuInfo, GpuProcess, GpuSample, SystemInfo, UtilPoint
from gputop.pipeline import Pipeline
from gputop.sources import nvml as nvml_mod
from gputop.sources.nvml import NvmlSource, NvmlUnavailable, describe_environment
from gputop.store import Store

from fake_pynvml import (
    FAKE_FUNCTIONS,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_TIMEOUT,
    NVML_ERROR_UNKNOWN,
    NVML_FEATURE_DISABLED,
    NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    NVML_GPM_METRIC_DRAM_BW_UTIL,
    NVML_GPM_METRIC_FP16_UTIL,
    NVML_GPM_METRIC_DFMA_TENSOR_UTIL,
    NVML_GPM_METRIC_FP64_UTIL,
    NVML_GPM_METRIC_FP32_UTIL,
    NVML_GPM_METRIC_SM_OCCUPANCY,
    NVML_GPM_METRIC_SM_UTIL,
    FakeClock,
    FakeGpu,
    FakeNvml,
    FakeProcess,
    NVMLError,
)

MIB = 1024 * 1024


def make(gpus=None, **kw):
    clock = FakeClock()
    fake = FakeNvml(gpus if gpus is not None else [FakeGpu()], clock=clock, **kw)
    src = NvmlSource.open(interval=1.0, clock=clock, nvml=fake)
    return src, fake, clock


def of(batch, cls, index=None):
    items = [x for x in batch if isinstance(x, cls)]
    if index is not None:
        items = [x for x in items if getattr(x, "index", getattr(x, "gpu_index", None)) == index]
    return items


def sample(batch, index=0) -> GpuSample:
    (s,) = of(batch, GpuSample, index)
    return s


def run_polls(src, clock, n, dt=1.0):
    batches = []
    for _ in range(n):
        batches.append(src.poll())
        clock.advance(dt)
    return batches


# ----------------------------------------------------------------------------- open()


def test_open_without_pynvml_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    with pytest.raises(NvmlUnavailable) as ei:
        NvmlSource.open()
    assert "nvidia-ml-py" in str(ei.value)
    assert "\n" not in str(ei.value)


@pytest.mark.parametrize(
    "code, words",
    [
        (NVML_ERROR_LIBRARY_NOT_FOUND, "NVIDIA driver not loaded (libnvidia-ml.so.1 not found)"),
        (NVML_ERROR_DRIVER_NOT_LOADED, "NVIDIA driver not loaded"),
        (NVML_ERROR_NO_PERMISSION, "no permission"),
        (NVML_ERROR_UNKNOWN, "NVML init failed: Unknown Error"),
    ],
)
def test_open_init_failure_is_one_line(code, words):
    fake = FakeNvml(init_error=code)
    with pytest.raises(NvmlUnavailable) as ei:
        NvmlSource.open(nvml=fake)
    msg = str(ei.value)
    assert words in msg
    assert "\n" not in msg
    assert "Traceback" not in msg


def test_open_with_no_devices_shuts_nvml_down():
    fake = FakeNvml(gpus=[])
    with pytest.raises(NvmlUnavailable, match="^no NVIDIA GPU found$"):
        NvmlSource.open(nvml=fake)
    assert fake.shutdowns == 1


def test_open_with_every_handle_refused():
    fake = FakeNvml(gpus=[FakeGpu(), FakeGpu()], refuse_handles={0: NVML_ERROR_NO_PERMISSION, 1: NVML_ERROR_NO_PERMISSION})
    with pytest.raises(NvmlUnavailable, match="no accessible NVIDIA GPU"):
        NvmlSource.open(nvml=fake)
    assert fake.shutdowns == 1


def test_one_refused_handle_is_a_warning_and_the_rest_is_polled():
    clock = FakeClock()
    fake = FakeNvml(gpus=[FakeGpu(), FakeGpu()], clock=clock, refuse_handles={0: NVML_ERROR_NO_PERMISSION})
    src = NvmlSource.open(nvml=fake, clock=clock)
    batch = src.poll()
    assert [s.index for s in of(batch, GpuSample)] == [1]
    warnings = [e for e in of(batch, Event) if e.level == "warning"]
    assert len(warnings) == 1 and "GPU 0" in warnings[0].message
    assert of(batch, SystemInfo)[0].gpu_count == 1


# ----------------------------------------------------------------------------- first poll


def test_first_poll_describes_system_and_gpus():
    src, fake, clock = make([FakeGpu(), FakeGpu(name="NVIDIA A100-SXM4-40GB", compute_capability=(8, 0), cuda_cores=6912, gpm=None)])
    batch = src.poll()
    (system,) = of(batch, SystemInfo)
    assert system.driver_version == "580.159.04"
    assert system.cuda_driver_version == "13.0"
    assert system.nvml_version == "13.580.159.04"
    assert system.gpu_count == 2
    assert system.source == "live"
    assert system.hostname
    assert system.cpu_count and system.cpu_count >= 1
    info0, info1 = sorted(of(batch, GpuInfo), key=lambda i: i.index)
    assert info0.name == "NVIDIA H100 80GB HBM3"
    assert info0.uuid.startswith("GPU-")
    assert info0.memory_total == 80 * 2**30
    assert info0.power_limit_w == 700.0
    assert (info0.pcie_max_gen, info0.pcie_max_width) == (5, 16)
    assert info0.compute_capability == (9, 0)
    assert info0.sm_count == 132
    assert info0.gpm_supported is True
    assert info0.persistence_mode is True
    assert info0.numa_cpus == "0-15"
    assert info1.sm_count == 108  # A100: 64 FP32 lanes per SM
    assert info1.gpm_supported is False
    # later polls: no system/info again when nothing changed
    clock.advance(1)
    batch2 = src.poll()
    assert not of(batch2, SystemInfo) and not of(batch2, GpuInfo)


def test_cuda_version_and_cpu_ranges_helpers():
    assert nvml_mod._cuda_version(13000) == "13.0"
    assert nvml_mod._cuda_version(12040) == "12.4"
    assert nvml_mod._cuda_version(0) is None
    assert nvml_mod._cpu_ranges([0b1011]) == "0-1,3"
    assert nvml_mod._cpu_ranges([0xFFFF, 0xFFFF]) == "0-15,64-79"
    assert nvml_mod._cpu_ranges([0]) is None


def test_unknown_architecture_has_no_sm_count():
    src, _, _ = make([FakeGpu(compute_capability=(6, 1), cuda_cores=3584)])
    (info,) = of(src.poll(), GpuInfo)
    assert info.sm_count is None


# ----------------------------------------------------------------------------- the sample


def test_every_field_mapped_with_units():
    gpu = FakeGpu(
        util_gpu=88,
        util_mem=31,
        memory_used=12 * 2**30,
        memory_reserved=600 * 2**20,
        temperature=71,
        power_mw=612_345,
        power_limit_mw=650_000,
        fan=42,
        sm_clock=1755,
        mem_clock=2619,
        sm_clock_max=1980,
        clocks_reasons=0x24,
        pcie_gen=4,
        pcie_width=8,
        ecc_corrected=7,
        ecc_uncorrected=1,
    )
    src, _, clock = make([gpu])
    s = sample(src.poll())
    assert s.ts == clock()
    assert s.error is None
    assert (s.util_gpu, s.util_mem) == (88.0, 31.0)
    assert s.mem_used == 12 * 2**30  # v2: the driver's reserved memory is not "used"
    assert s.mem_total == 80 * 2**30
    assert s.temperature_c == 71.0
    assert s.power_w == pytest.approx(612.345)  # mW -> W
    assert s.power_limit_w == 650.0
    assert s.fan_pct == 42.0
    assert (s.sm_clock_mhz, s.mem_clock_mhz, s.sm_clock_max_mhz) == (1755, 2619, 1980)
    assert s.throttle_reasons == 0x24
    assert (s.pcie_gen, s.pcie_width, s.pcie_max_gen, s.pcie_max_width) == (4, 8, 5, 16)
    assert (s.ecc_corrected, s.ecc_uncorrected) == (7, 1)  # volatile, not aggregate


def test_memory_falls_back_to_v1_on_old_drivers():
    class OldDriver(FakeNvml):
        def nvmlDeviceGetMemoryInfo(self, h, version=None):
            if version is not None:
                raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
            return super().nvmlDeviceGetMemoryInfo(h)

    clock = FakeClock()
    fake = OldDriver([FakeGpu(memory_used=10 * 2**30, memory_reserved=2**30)], clock=clock)
    src = NvmlSource.open(nvml=fake, clock=clock)
    for _ in range(2):
        s = sample(src.poll())
        clock.advance(1)
        assert s.mem_used == 11 * 2**30
    assert not [e for e in of(src.poll(), Event) if "memory" in e.message]


def test_clocks_reasons_fall_back_to_the_older_name():
    class OldDriver(FakeNvml):
        def nvmlDeviceGetCurrentClocksEventReasons(self, h):
            self.calls["nvmlDeviceGetCurrentClocksEventReasons"] += 1
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)

    clock = FakeClock()
    fake = OldDriver([FakeGpu(clocks_reasons=0x40)], clock=clock)
    src = NvmlSource.open(nvml=fake, clock=clock)
    for _ in range(3):
        assert sample(src.poll()).throttle_reasons == 0x40
        clock.advance(1)
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1  # remembered
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 3


def test_one_timestamp_for_the_whole_poll():
    src, _, clock = make([FakeGpu(processes=[FakeProcess(11), FakeProcess(12)]), FakeGpu(processes=[FakeProcess(13)])])
    clock.advance(0.25)
    batch = src.poll()
    stamps = {x.ts for x in batch if isinstance(x, (GpuSample, GpuProcess, GpuInfo, SystemInfo, Event))}
    assert stamps == {clock()}
    assert len(of(batch, GpuProcess)) == 3


# ----------------------------------------------------------------------------- optional metrics


def test_not_supported_is_none_with_one_event_and_not_asked_again():
    gpu = FakeGpu(unsupported={"nvmlDeviceGetFanSpeed", "nvmlDeviceGetTotalEccErrors"})
    src, fake, clock = make([gpu])
    batches = run_polls(src, clock, 4)
    for b in batches:
        s = sample(b)
        assert s.fan_pct is None and s.ecc_corrected is None and s.ecc_uncorrected is None
        assert s.temperature_c == 65.0  # the rest still read
    events = [e for b in batches for e in of(b, Event)]
    assert len(events) == 1
    ev = events[0]
    # a metric the model does not have is kept as data, not held in the status line
    assert ev.level == "debug" and ev.source == "nvml"
    assert "GPU 0" in ev.message and "fan" in ev.message and "ECC" in ev.message and "not supported" in ev.message
    assert fake.calls["nvmlDeviceGetFanSpeed"] == 1
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == 1


def test_other_errors_are_retried_but_reported_once():
    gpu = FakeGpu(errors={"nvmlDeviceGetPowerUsage": NVML_ERROR_NO_PERMISSION})
    src, fake, clock = make([gpu])
    batches = run_polls(src, clock, 3)
    assert all(sample(b).power_w is None for b in batches)
    events = [e for b in batches for e in of(b, Event)]
    assert len(events) == 1 and "power" in events[0].message and "Insufficient Permissions" in events[0].message
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 3
    del gpu.errors["nvmlDeviceGetPowerUsage"]
    assert sample(src.poll()).power_w == 650.0


def test_a_metric_failing_later_is_reported_then():
    gpu = FakeGpu()
    src, _, clock = make([gpu])
    run_polls(src, clock, 2)
    gpu.errors["nvmlDeviceGetTemperature"] = NVML_ERROR_NO_PERMISSION
    b = src.poll()
    assert sample(b).temperature_c is None
    assert len(of(b, Event)) == 1 and "temperature" in of(b, Event)[0].message


def test_unexpected_exception_in_one_call_leaves_the_rest(monkeypatch):
    src, fake, clock = make()

    def broken(h, sensor):
        raise ValueError("odd binding")

    monkeypatch.setattr(fake, "nvmlDeviceGetTemperature", broken, raising=False)
    batch = src.poll()
    s = sample(batch)
    assert s.temperature_c is None
    assert s.power_w == 650.0 and s.error is None
    assert any("temperature" in e.message and "ValueError" in e.message for e in of(batch, Event))


def test_poll_never_raises_even_if_the_module_is_broken(monkeypatch):
    src, fake, clock = make()
    monkeypatch.setattr(fake, "nvmlDeviceGetSamples", None, raising=False)  # not callable: TypeError inside
    monkeypatch.setattr(fake, "nvmlDeviceGetComputeRunningProcesses", lambda h: [object()], raising=False)
    batch = src.poll()  # must not raise
    s = sample(batch)
    assert s.error is None and s.util_gpu == 97.0 and s.power_w == 650.0
    assert not of(batch, UtilPoint) and not of(batch, GpuProcess)
    text = " ".join(e.message for e in of(batch, Event))
    assert "utilization samples" in text and "processes" in text


# ----------------------------------------------------------------------------- lost GPU


def test_lost_gpu_error_sample_one_warning_others_continue():
    lost = FakeGpu(lost_after_polls=2)
    other = FakeGpu(util_gpu=10)
    src, fake, clock = make([lost, other])
    b1, b2 = run_polls(src, clock, 2)
    assert sample(b1, 0).error is None and sample(b2, 0).error is None

    other.util_gpu = 55
    b3 = src.poll()
    s0 = sample(b3, 0)
    assert s0.error and s0.error.startswith("GPU lost:") and "GPU is lost" in s0.error
    assert s0.util_gpu is None
    assert sample(b3, 1).util_gpu == 55.0  # the other GPU keeps updating
    warnings = [e for e in of(b3, Event) if e.level == "warning"]
    assert len(warnings) == 1 and "GPU 0" in warnings[0].message
    assert not of(b3, UtilPoint, 0) and not of(b3, GpuProcess, 0)

    calls_when_lost = fake.calls["nvmlDeviceGetUtilizationRates"]
    clock.advance(0.5)
    other.util_gpu = 66
    b4 = src.poll()  # within the retry delay: no NVML call for GPU 0
    assert sample(b4, 0).error == s0.error
    assert sample(b4, 1).util_gpu == 66.0
    assert not [e for e in of(b4, Event) if e.level == "warning"]
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == calls_when_lost + 1  # GPU 1 only


def test_lost_gpu_is_retried_with_backoff_and_comes_back():
    gpu = FakeGpu(lost_after_polls=0)
    src, fake, clock = make([gpu])
    t0 = clock()
    assert sample(src.poll()).error  # lost at once; next try after 2 s
    handle_calls = fake.calls["nvmlDeviceGetHandleByIndex"]
    clock.t = t0 + 1.9
    src.poll()
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == handle_calls
    clock.t = t0 + 2.0
    assert sample(src.poll()).error  # tried: still lost; next try 4 s later
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == handle_calls + 1
    clock.t = t0 + 5.9
    src.poll()
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == handle_calls + 1
    gpu.lost, gpu.lost_after_polls = False, None
    clock.t = t0 + 6.0
    batch = src.poll()
    s = sample(batch)
    assert s.error is None and s.util_gpu == 97.0
    assert any("answers again" in e.message for e in of(batch, Event))


def test_unknown_error_on_the_first_call_means_lost_but_not_on_a_metric():
    src, _, _ = make([FakeGpu(errors={"nvmlDeviceGetUtilizationRates": NVML_ERROR_UNKNOWN})])
    assert sample(src.poll()).error.startswith("GPU lost")
    src, _, _ = make([FakeGpu(errors={"nvmlDeviceGetUtilizationRates": NVML_ERROR_TIMEOUT})])
    assert sample(src.poll()).error.startswith("GPU lost")
    src, _, _ = make([FakeGpu(errors={"nvmlDeviceGetTemperature": NVML_ERROR_UNKNOWN})])
    s = sample(src.poll())
    assert s.error is None and s.temperature_c is None and s.power_w == 650.0


# ----------------------------------------------------------------------------- 200 ms buffer


def test_util_points_history_on_first_poll_then_only_new_ones():
    values = {}

    def util_at(t):
        return values.setdefault(round(t * 5), int(t * 5) % 100)

    src, fake, clock = make([FakeGpu(util_at=util_at)])
    batches = run_polls(src, clock, 5)
    first = of(batches[0], UtilPoint)
    assert len(first) == 70  # ~14 s at 200 ms: a diagnosis need not wait
    assert first[-1].ts <= clock() - 4  # (clock moved on since)
    assert first[-1].ts - first[0].ts == pytest.approx(13.8)
    assert all(b.ts - a.ts == pytest.approx(0.2) for a, b in zip(first, first[1:]))
    seen = [p.ts for b in batches for p in of(b, UtilPoint)]
    assert len(seen) == len(set(seen))  # each point once
    assert seen == sorted(seen)
    for b in batches[1:]:
        assert len(of(b, UtilPoint)) == 5
    # the last-seen timestamp is passed back in µs
    args = [a for _, a in fake.samples_args]
    assert args[0] == 0
    assert args[1] == round(first[-1].ts * 1e6)
    # values from the buffer, in %
    p = first[3]
    assert p.util == float(int(p.ts * 5 + 1e-6) % 100)


def test_util_points_nothing_new_is_quiet():
    src, fake, clock = make()
    src.poll()
    batch = src.poll()  # same instant: NVML answers NotFound
    assert not of(batch, UtilPoint)
    assert not of(batch, Event)
    assert fake.calls["nvmlDeviceGetSamples"] == 2


def test_util_points_reach_the_store_in_order():
    src, _, clock = make()
    store = Store()
    for b in run_polls(src, clock, 3):
        store.add(b)
    pts = store.util_window(0, 0)
    assert len(pts) == 80
    assert [p.ts for p in pts] == sorted(p.ts for p in pts)


# ----------------------------------------------------------------------------- PCIe


def test_pcie_throughput_is_paced_without_gpm():
    gpu = FakeGpu(gpm=None, pcie_rx_kbs=3000, pcie_tx_kbs=1500)
    src, fake, clock = make([gpu])
    batches = run_polls(src, clock, 11)  # t = 0..10 s
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 6  # at 0, 5 and 10 s, rx + tx
    for b in batches:
        s = sample(b)
        assert s.pcie_rx_bps == 3000 * 1024  # KB/s -> bytes/s, reused between reads
        assert s.pcie_tx_bps == 1500 * 1024


def test_pcie_reads_are_staggered_across_gpus():
    gpus = [FakeGpu(gpm=None) for _ in range(4)]
    src, fake, clock = make(gpus)
    b = src.poll()
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 2  # GPU 0 only in the first poll
    assert sample(b, 0).pcie_rx_bps is not None and sample(b, 3).pcie_rx_bps is None
    run_polls(src, clock, 5)
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 8  # each GPU once within 5 s


def test_pcie_comes_from_gpm_when_supported():
    src, fake, clock = make()
    b1, b2 = run_polls(src, clock, 2)
    assert sample(b1).pcie_rx_bps is None  # GPM needs two samples
    s = sample(b2)
    assert s.pcie_rx_bps == pytest.approx(4.75 * MIB)
    assert s.pcie_tx_bps == pytest.approx(2.5 * MIB)
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 0  # the 20 ms call is avoided


def test_pcie_falls_back_when_gpm_lacks_pcie_metrics():
    gpu = FakeGpu(gpm={NVML_GPM_METRIC_SM_UTIL: 50.0}, pcie_rx_kbs=100)
    src, fake, clock = make([gpu])
    batches = run_polls(src, clock, 3)
    assert sample(batches[2]).pcie_rx_bps == 100 * 1024
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 2
    assert sample(batches[2]).sm_active == 50.0


# ----------------------------------------------------------------------------- processes


def test_processes_merged_by_kind_with_utilisation():
    gpu = FakeGpu(
        processes=[
            FakeProcess(100, used_memory=3 * 2**30, sm_util=80, mem_util=20),
            FakeProcess(200, used_memory=None, kind="G", sm_util=None),
            FakeProcess(300, used_memory=2**30, kind="C+G", sm_util=5, mem_util=1),
        ]
    )
    src, fake, clock = make([gpu])
    clock.advance(1)
    procs = {p.pid: p for p in of(src.poll(), GpuProcess)}
    assert set(procs) == {100, 200, 300}
    assert procs[100].kind == "C" and procs[100].used_memory == 3 * 2**30
    assert (procs[100].sm_util, procs[100].mem_util) == (80.0, 20.0)
    assert procs[200].kind == "G" and procs[200].used_memory is None
    assert procs[200].sm_util is None and procs[200].mem_util is None
    assert procs[300].kind == "C+G" and procs[300].sm_util == 5.0
    assert all(p.gpu_index == 0 and p.ts == clock() for p in procs.values())


def test_process_utilisation_uses_last_seen_and_not_found_means_no_util(monkeypatch):
    monkeypatch.setattr(nvml_mod, "PROC_UTIL_EVERY_S", 0.0)  # a read on every poll
    gpu = FakeGpu(processes=[FakeProcess(100, sm_util=70)])
    src, fake, clock = make([gpu])
    b1 = src.poll()
    assert of(b1, GpuProcess)[0].sm_util == 70.0
    first_since = fake.proc_util_args[0][1]
    assert first_since == round((clock() - nvml_mod.PROC_UTIL_LOOKBACK_S) * 1e6)
    b2 = src.poll()  # same instant: no new samples -> NotFound
    assert of(b2, GpuProcess)[0].sm_util is None
    assert not of(b2, Event)
    last_sample_us = (round(clock() * 1e6) // gpu.proc_sample_period_us) * gpu.proc_sample_period_us
    assert fake.proc_util_args[1][1] == last_sample_us
    clock.advance(1)
    gpu.processes[0].sm_util = 33
    assert of(src.poll(), GpuProcess)[0].sm_util == 33.0


def test_process_utilisation_is_read_every_few_seconds_and_at_once_for_a_new_process():
    gpu = FakeGpu(processes=[FakeProcess(100, sm_util=70)])
    src, fake, clock = make([gpu])  # interval 1 s
    assert of(src.poll(), GpuProcess)[0].sm_util == 70.0
    gpu.processes[0].sm_util = 20
    for _ in range(3):
        clock.advance(1)
        assert of(src.poll(), GpuProcess)[0].sm_util == 70.0  # the last reading, not a new call
    assert fake.calls["nvmlDeviceGetProcessUtilization"] == 1
    clock.advance(1)
    assert of(src.poll(), GpuProcess)[0].sm_util == 20.0  # PROC_UTIL_EVERY_S later
    assert fake.calls["nvmlDeviceGetProcessUtilization"] == 2
    gpu.processes.append(FakeProcess(200, sm_util=55))
    clock.advance(1)
    procs = {p.pid: p for p in of(src.poll(), GpuProcess)}
    assert procs[200].sm_util == 55.0 and fake.calls["nvmlDeviceGetProcessUtilization"] == 3


def test_process_utilisation_not_asked_when_no_process():
    src, fake, clock = make([FakeGpu(processes=[])])
    run_polls(src, clock, 3)
    assert fake.calls["nvmlDeviceGetProcessUtilization"] == 0


def test_process_snapshot_replaced_in_the_store():
    gpu = FakeGpu(processes=[FakeProcess(1), FakeProcess(2)])
    src, _, clock = make([gpu])
    store = Store()
    pipe = Pipeline(store, [src], clock=clock)
    pipe.poll_once()
    assert {p.pid for p in store.gpu_processes()} == {1, 2}
    gpu.processes = [FakeProcess(3)]
    clock.advance(1)
    pipe.poll_once()
    assert {p.pid for p in store.gpu_processes()} == {3}
    gpu.processes = []
    clock.advance(1)
    pipe.poll_once()
    assert store.gpu_processes() == []


# ----------------------------------------------------------------------------- GPM


def test_gpm_metrics_mapped_between_consecutive_polls():
    gpm = {
        NVML_GPM_METRIC_SM_UTIL: 96.9,
        NVML_GPM_METRIC_SM_OCCUPANCY: 12.1,
        NVML_GPM_METRIC_ANY_TENSOR_UTIL: 0.0,
        NVML_GPM_METRIC_DRAM_BW_UTIL: 6.5,
        NVML_GPM_METRIC_FP32_UTIL: 77.4,
        NVML_GPM_METRIC_FP16_UTIL: 1.5,
        NVML_GPM_METRIC_DFMA_TENSOR_UTIL: 54.0,
        NVML_GPM_METRIC_FP64_UTIL: 9.5,
    }
    src, fake, clock = make([FakeGpu(gpm=gpm)])
    t0 = clock()
    batches = run_polls(src, clock, 3)
    s0, s1, s2 = (sample(b) for b in batches)
    assert s0.sm_active is None and s0.tensor_active is None  # one sample is not a rate
    assert (s1.sm_active, s1.sm_occupancy, s1.tensor_active) == (96.9, 12.1, 0.0)
    assert (s1.dram_active, s1.fp32_active, s1.fp16_active) == (6.5, 77.4, 1.5)
    assert (s1.dfma_active, s1.fp64_active) == (54.0, 9.5)  # the FP64 tensor cores and pipes
    assert s2.sm_active == 96.9
    assert fake.gpm_pairs == [(t0, t0 + 1), (t0 + 1, t0 + 2)]  # previous -> current
    assert fake.calls["nvmlGpmSampleAlloc"] == 2  # two per GPU, reused
    # the first-poll None is not reported as "not available"
    assert not any("GPM" in e.message for b in batches for e in of(b, Event))


def test_gpm_polls_closer_than_the_minimum_window_reuse_the_last_values():
    src, fake, clock = make()
    run_polls(src, clock, 2)
    pairs = list(fake.gpm_pairs)
    clock.advance(-0.95)  # 50 ms after the previous poll
    b = src.poll()
    assert sample(b).sm_active == 96.9
    assert fake.gpm_pairs == pairs
    assert not of(b, Event)


def test_gpm_unsupported_gpu():
    src, fake, clock = make([FakeGpu(gpm=None)])
    batches = run_polls(src, clock, 3)
    assert of(batches[0], GpuInfo)[0].gpm_supported is False
    assert all(sample(b).sm_active is None for b in batches)
    assert fake.calls["nvmlGpmSampleGet"] == 0 and fake.calls["nvmlGpmSampleAlloc"] == 0
    events = [e for b in batches for e in of(b, Event)]
    assert len(events) == 1 and "GPM" in events[0].message


def test_gpm_one_metric_missing():
    gpm = {NVML_GPM_METRIC_SM_UTIL: 40.0, NVML_GPM_METRIC_ANY_TENSOR_UTIL: 30.0}
    src, fake, clock = make([FakeGpu(gpm=gpm)])
    batches = run_polls(src, clock, 3)
    s = sample(batches[2])
    assert (s.sm_active, s.tensor_active, s.dram_active) == (40.0, 30.0, None)
    events = [e for b in batches for e in of(b, Event)]
    assert len(events) == 1 and "dram_active" in events[0].message


# ----------------------------------------------------------------------------- info changes, close


def test_gpu_info_re_emitted_when_it_changes():
    gpu = FakeGpu()
    src, _, clock = make([gpu])
    assert of(src.poll(), GpuInfo)[0].power_limit_w == 700.0
    clock.advance(1)
    assert not of(src.poll(), GpuInfo)
    gpu.power_limit_mw = 500_000
    clock.advance(1)
    b = src.poll()
    assert of(b, GpuInfo)[0].power_limit_w == 500.0 and sample(b).power_limit_w == 500.0
    gpu.persistence = NVML_FEATURE_DISABLED
    clock.advance(nvml_mod.INFO_REFRESH_S)
    (info,) = of(src.poll(), GpuInfo)
    assert info.persistence_mode is False
    clock.advance(nvml_mod.INFO_REFRESH_S)
    assert not of(src.poll(), GpuInfo)


def test_close_frees_gpm_samples_and_shuts_down_once():
    src, fake, clock = make([FakeGpu(), FakeGpu()])
    run_polls(src, clock, 2)
    src.close()
    src.close()
    assert fake.shutdowns == 1
    assert len(fake.gpm_samples) == 4 and all(s.freed for s in fake.gpm_samples)
    assert src.poll() == []


def test_source_protocol_attributes():
    src, _, _ = make()
    assert src.name == "nvml"
    # the first polls come every 0.5 s (GPM readings exist per poll), then the interval asked for
    seen = []
    for _ in range(6):
        seen.append(src.interval)
        src.poll()
    assert seen == [0.5] * src.START_POLLS + [1.0] * (6 - src.START_POLLS)


# ----------------------------------------------------------------------------- doctor


def test_describe_environment_healthy():
    checks = describe_environment(FakeNvml())
    by = {name: (ok, detail) for name, ok, detail in checks}
    assert by["NVIDIA driver"] == (True, "580.159.04 (CUDA 13.0)")
    assert by["NVML"][0] and "13.580.159.04" in by["NVML"][1]
    assert by["GPUs"][0]
    assert by["GPU 0"][0] and "H100" in by["GPU 0"][1] and "80 GiB" in by["GPU 0"][1] and "compute 9.0" in by["GPU 0"][1]
    assert by["GPU 0 persistence mode"] == (True, "on")
    assert by["GPU 0 GPM"][0]
    assert by["GPU 0 PCIe link"] == (True, "gen 5 x16 (max gen 5 x16)")


def test_describe_environment_problems():
    fake = FakeNvml([FakeGpu(persistence=NVML_FEATURE_DISABLED, gpm=None, pcie_gen=3, pcie_width=8)])
    by = {name: (ok, detail) for name, ok, detail in describe_environment(fake)}
    assert by["GPU 0 persistence mode"][0] is False and "nvidia-smi -pm 1" in by["GPU 0 persistence mode"][1]
    assert by["GPU 0 GPM"][0] is False
    ok, detail = by["GPU 0 PCIe link"]
    assert ok is False and detail.startswith("gen 3 x8 (max gen 5 x16)")
    assert fake.shutdowns == 1


def test_describe_environment_without_driver_or_gpu(monkeypatch):
    assert describe_environment(FakeNvml(init_error=NVML_ERROR_LIBRARY_NOT_FOUND)) == [
        ("NVIDIA driver", False, "NVIDIA driver not loaded (libnvidia-ml.so.1 not found)")
    ]
    assert describe_environment(FakeNvml(gpus=[])) == [("GPUs", False, "no NVIDIA GPU found")]
    monkeypatch.setitem(sys.modules, "pynvml", None)
    ((name, ok, detail),) = describe_environment()
    assert name == "nvidia-ml-py" and not ok


# ----------------------------------------------------------------------------- the fake itself


def test_fake_only_uses_names_real_pynvml_has():
    pynvml = pytest.importorskip("pynvml")
    missing = [n for n in FAKE_FUNCTIONS if not hasattr(pynvml, n)]
    assert missing == []
    for const in ("NVML_GPM_METRIC_SM_UTIL", "NVML_GPM_METRIC_PCIE_RX_PER_SEC", "nvmlMemory_v2", "NVML_ERROR_GPU_IS_LOST"):
        assert getattr(pynvml, const) == getattr(FakeNvml(), const), const
    assert pynvml.NVMLError(3).__class__.__name__ == NVMLError(3).__class__.__name__ == "NVMLError_NotSupported"


def test_doctor_notes_a_metric_the_model_does_not_have_once_as_no_problem():
    # A datacenter GPU has no fan: doctor says so once, as a fact of the model, not a failure.
    fake = FakeNvml([FakeGpu(unsupported={"nvmlDeviceGetFanSpeed"})])
    checks = describe_environment(fake)
    notes = [(ok, detail) for name, ok, detail in checks if name == "metrics"]
    assert notes == [(True, "GPU 0: not available: fan (not supported)")]
    assert all(ok for name, ok, _ in checks if name == "NVML")
