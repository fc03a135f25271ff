"""Mechanics of bench/probe_nvlink.py on CPU: its readers against the scripted fake of pynvml,
and the windows that set each candidate's reads against the bytes the all_reduces moved."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fake_pynvml import (
    NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC,
    NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
    FakeClock,
    FakeGpu,
    FakeNvml,
)

ROOT = Path(__file__).resolve().parent.parent
RATE_KIB = 50_000  # the fake's counters grow by this each second, both ways


def load():
    spec = importlib.util.spec_from_file_location("probe_nvlink", ROOT / "bench" / "probe_nvlink.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_each_candidate_against_the_expected_bytes():
    probe = load()
    clock = FakeClock()
    gpm = {NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: RATE_KIB / 1024, NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: RATE_KIB / 1024}
    nv = FakeNvml([FakeGpu(nvlinks=4, gpm=gpm, nvlink_kib_per_s=(RATE_KIB, RATE_KIB)) for _ in range(2)], clock=clock)
    readers = {g: probe.Reader(nv, g) for g in (0, 1)}
    assert readers[0].links == [0, 1, 2, 3]
    t0 = clock()
    reads = []
    for _ in range(6):
        reads.append((clock(), {g: rd.read() for g, rd in readers.items()}))
        clock.advance(1.0)
    # One all_reduce a second, half a second long, of a buffer that moves RATE_KIB KiB a rank:
    # (n = 2: the buffer's size once each way).
    size = int(RATE_KIB * 1024 / probe.RING_FACTOR)
    ops = [(t0 + k + 0.25, t0 + k + 0.75) for k in range(6)]
    phases = [{"name": "slow", "rate": 1, "t0": t0, "t1": t0 + 6, "ops": 6}]
    logs = [{"rank": r, "size_bytes": size, "phases": phases, "ops": ops} for r in range(2)]
    wins = probe.windows(reads, logs, (0, 1))
    assert len(wins) == 5 and all(abs(w["gpus"]["0"]["expected_bps"] - RATE_KIB * 1024) < 1 for w in wins)
    s = probe.summarize(wins, (0, 1))["0"]
    for name in ("fv_data_all", "fv_data_links", "gpm_total"):
        assert abs(s[name]["tx_ratio_median"] - 1.0) < 1e-3 and abs(s[name]["rx_ratio_median"] - 1.0) < 1e-3, name
        assert s[name]["reads_zero_under_load"] is False
    assert abs(s["fv_data_scope0"]["tx_ratio_median"] - 0.25) < 1e-3  # link 0 of 4: a quarter
    assert s["fv_count_bytes_all"]["errors"] and s["util_counter0"]["errors"]  # what the fake lacks
    for rd in readers.values():
        rd.close()


def test_expected_bytes_apportion_an_operation_over_the_windows():
    probe = load()
    ops = [(10.0, 12.0)]
    assert probe.expected_bytes(ops, 1000, 9.0, 11.0) == probe.RING_FACTOR * 1000 / 2
    assert probe.expected_bytes(ops, 1000, 12.0, 13.0) == 0.0
