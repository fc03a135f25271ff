from gputop.model import CoreTimes, GpuInfo, GpuSample, HostSample, SystemInfo, UtilPoint
from gputop.present.panels import COMPACT, FULL, MEDIUM, History, gpu_panel, header_text, host_panel

INFO = GpuInfo(ts=0, index=0, name="NVIDIA H100 80GB HBM3", memory_total=80 * 2**30)


def full_sample(**kw):
    base = dict(
        ts=10.0, index=0, util_gpu=97, mem_used=61 * 2**30, mem_total=80 * 2**30, temperature_c=84,
        power_w=698, power_limit_w=700, sm_clock_mhz=1980, mem_clock_mhz=2619, throttle_reasons=0x4,
        pcie_gen=5, pcie_width=16, pcie_max_gen=5, pcie_max_width=16, pcie_rx_bps=2e9, pcie_tx_bps=1e7,
        ecc_corrected=0, ecc_uncorrected=0, sm_active=96.9, sm_occupancy=12.1, tensor_active=0.0,
        dram_active=6.5, fp32_active=77.4, fp16_active=0.0,
    )
    base.update(kw)
    return GpuSample(**base)


def test_full_panel_shows_every_metric():
    hist = History(t0=0, t1=10.0, util=[UtilPoint(ts=t / 5, index=0, util=100 if t % 5 else 0) for t in range(50)])
    text = gpu_panel(INFO, full_sample(), hist, 140, FULL).plain
    lines = text.split("\n")
    assert len(lines) == 7  # three lines of numbers, three chart rows, the legend
    assert "H100 80GB HBM3" in lines[0] and "97%" in lines[0] and "61.0G/80.0G" in lines[0]
    assert "84°C" in lines[0] and "698W/700W" in lines[0]
    assert "1980MHz" in lines[1] and "power cap" in lines[1] and "5x16/5x16" in lines[1]
    assert "rx 1.9G/s" in lines[1] and "ECC 0/0" in lines[1]
    assert "SM act 97%" in lines[2] and "tensor 0%" in lines[2] and "dram 6%" in lines[2]
    assert lines[6].startswith("util 10s") and "power to 700W" in lines[6] and "mem to 80.0G" in lines[6]
    assert all(len(line) <= 140 for line in lines)


def test_idle_buckets_are_marked_red_in_the_util_chart():
    hist = History(t0=0, t1=10.0, util=[UtilPoint(ts=t / 5, index=0, util=100 if t % 5 else 0) for t in range(50)])
    text = gpu_panel(INFO, full_sample(), hist, 140, FULL)
    charts_start = text.plain.index("\n", text.plain.index("fp16"))
    styles = {str(span.style) for span in text.spans if span.start > charts_start and span.style}
    assert "red" in styles  # columns holding a sub-second idle sample


def test_missing_metrics_say_na_not_zero():
    s = GpuSample(ts=1, index=0, util_gpu=50)
    text = gpu_panel(INFO, s, None, 120, MEDIUM).plain
    assert "n/a°C" in text and "THROTTLE n/a" in text
    assert "GPM n/a on this GPU" in text
    assert len(text.split("\n")) == 3


def test_compact_is_one_line_within_width():
    for width in (78, 100, 160):
        text = gpu_panel(INFO, full_sample(), History(0, 10), width, COMPACT).plain
        assert "\n" not in text and len(text) <= width
        assert text.startswith("[0]")


def test_lost_gpu_panel_says_so():
    text = gpu_panel(INFO, GpuSample(ts=1, index=0, error="GPU lost: fell off the bus"), None, 100).plain
    assert "GPU lost: fell off the bus" in text


def test_degraded_pcie_width_is_highlighted():
    text = gpu_panel(INFO, full_sample(pcie_width=8), None, 140, MEDIUM)
    start = text.plain.index("5x8/5x16")
    assert any("yellow" in str(s.style) for s in text.spans if s.start <= start < s.end)


def test_header_states_and_nvml_error():
    sysinfo = SystemInfo(ts=0, hostname="node7", driver_version="580.159.04", cuda_driver_version="13.0", nvml_version="13.580")
    h = header_text(sysinfo, "0.1.0", 1.0, "live", 200).plain
    assert "LIVE" in h and "node7" in h and "driver 580.159.04" in h and "CUDA 13.0" in h and "every 1s" in h
    bad = SystemInfo(ts=0, hostname="laptop", nvml_error="NVIDIA driver not loaded")
    assert "NVML unavailable: NVIDIA driver not loaded" in header_text(bad, "0.1.0", 1.0, "live", 200).plain
    narrow = header_text(sysinfo, "0.1.0", 1.0, "paused", 40).plain
    assert "PAUSED" in narrow and len(narrow) <= 40


def test_host_panel_lines():
    h = HostSample(
        ts=1, cpu_percent=42.0, cores=(CoreTimes(80, 5, 0), CoreTimes(4, 1, 60)), iowait_percent=30.0,
        load1=1.0, load5=0.5, load15=0.2, mem_total=64 * 2**30, mem_used=16 * 2**30, mem_available=48 * 2**30,
        swap_total=0, swap_used=0, disk_read_bps=1e8, disk_write_bps=0.0, net_rx_bps=None, net_tx_bps=None,
        shm_total=2**30, shm_used=0,
    )
    text = host_panel(h, 160, 3).plain
    lines = text.split("\n")
    assert len(lines) == 3
    assert "42.0%" in lines[0] and "iowait 30.0%" in lines[0] and "2 cores" in lines[0]
    assert "16.0G/64.0G" in lines[1] and "r 95.4M/s" in lines[1] and "rx n/a" in lines[1]
    assert lines[2].startswith("cores ") and len(lines[2]) == len("cores ") + 2
    assert host_panel(None, 80).plain.startswith("host: waiting")


def test_the_process_table_shows_the_program_by_name_so_the_script_fits():
    from gputop.present.process_table import shown_command

    assert shown_command("/tmp/nu/venv/bin/python3 train.py --bs 8") == "python3 train.py --bs 8"
    assert shown_command("/root/.pyenv/versions/3.11.7/bin/python -m torch.distributed.run x.py") == \
        "python -m torch.distributed.run x.py"
    assert shown_command("python train.py") == "python train.py" and shown_command("sleep") == "sleep"
