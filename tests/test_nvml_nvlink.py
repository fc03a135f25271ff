"""NVLink data rates in the GPU samples, against the scripted fake of pynvml (no GPU needed):
GPM's NVLink rates where GPM gives them, else the link counters (KiB, summed over all links);
a counter that goes back gives no rate; what cannot be read is None with one note."""

from __future__ import annotations

from gputop.model import Event, GpuSample
from gputop.sources.nvml import NvmlSource

from fake_pynvml import (
    NVML_ALL_LINKS,
    NVML_ERROR_UNKNOWN,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC,
    NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
    NVML_GPM_METRIC_SM_UTIL,
    FakeClock,
    FakeGpu,
    FakeNvml,
)

MIB = 1024 * 1024
GPM_UNIT = 1000 * 1024  # GPM's NVLink 'MiB' is 1000 KiB: measured, bench/results/probe_nvlink.json
TX_KIB, RX_KIB = 48_000_000, 47_000_000  # ~46 GiB/s each way: a busy NVLink all-reduce


def make(gpus):
    clock = FakeClock()
    nv = FakeNvml(gpus=gpus, clock=clock)
    return NvmlSource.open(interval=1.0, clock=clock, nvml=nv), nv, clock


def polls(src, clock, n, dt=1.0):
    out = []
    for _ in range(n):
        out.append(src.poll())
        clock.advance(dt)
    return out


def rates(batch, index=0):
    (s,) = [x for x in batch if isinstance(x, GpuSample) and x.index == index]
    return s.nvlink_tx_bps, s.nvlink_rx_bps


def near(rate, kib_per_s):
    """Within a millionth: the fake's counters are floats of the clock, not exact integers."""
    return rate is not None and abs(rate - kib_per_s * 1024) <= kib_per_s * 1024 * 1e-6


def notes(batches, word="NVLink"):
    return [e for b in batches for e in b if isinstance(e, Event) and e.source == "nvml" and word in e.message]


def test_gpm_nvlink_rates_are_used_where_gpm_gives_them():
    gpm = {NVML_GPM_METRIC_SM_UTIL: 68.0, NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: 45_000.0,
           NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: 44_000.5}
    src, nv, clock = make([FakeGpu(nvlinks=18, gpm=gpm, nvlink_kib_per_s=(1, 1))])
    b = polls(src, clock, 3)
    assert rates(b[0]) == (None, None)  # GPM needs two samples for a window
    assert rates(b[1]) == (45_000.0 * GPM_UNIT, 44_000.5 * GPM_UNIT)  # GPM's unit -> bytes/s
    assert rates(b[2]) == (45_000.0 * GPM_UNIT, 44_000.5 * GPM_UNIT)
    assert nv.calls["nvmlDeviceGetFieldValues"] == 0  # GPM answers: the counters are not read
    assert not notes(b)


def test_link_counters_give_the_rate_summed_over_all_links_in_kib():
    src, nv, clock = make([FakeGpu(nvlinks=18, gpm=None, nvlink_kib_per_s=(TX_KIB, RX_KIB))])
    b = polls(src, clock, 3, dt=2.0)
    assert rates(b[0]) == (None, None)  # the first read is the baseline
    for batch in b[1:]:
        tx, rx = rates(batch)
        assert near(tx, TX_KIB) and near(rx, RX_KIB)
    # All links at once (scope UINT_MAX): the bare id would be link 0 alone.
    (_, ids) = nv.field_args[-1]
    assert ids == [(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_ALL_LINKS),
                   (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, NVML_ALL_LINKS)]
    assert nv.calls["nvmlDeviceGetFieldValues"] == 3  # one call a poll
    assert not notes(b)


def test_a_driver_without_the_all_links_scope_is_asked_link_by_link():
    src, nv, clock = make([FakeGpu(nvlinks=4, gpm=None, nvlink_kib_per_s=(4_000, 8_000), nvlink_scopes="links")])
    b = polls(src, clock, 3)
    tx, rx = rates(b[2])
    assert near(tx, 4_000) and near(rx, 8_000)
    (_, ids) = nv.field_args[-1]
    assert sorted({scope for _, scope in ids}) == [0, 1, 2, 3]  # the links up, not UINT_MAX again
    assert nv.calls["nvmlDeviceGetFieldValues"] == 2 + 1 + 1  # the refusal is asked once
    assert not notes(b)


def test_gpm_without_nvlink_rates_falls_back_to_the_counters_and_says_so_once():
    gpm = {NVML_GPM_METRIC_SM_UTIL: 68.0}  # this GPU's GPM has no NVLink metrics
    src, nv, clock = make([FakeGpu(nvlinks=18, gpm=gpm, nvlink_kib_per_s=(TX_KIB, RX_KIB))])
    b = polls(src, clock, 5)
    got = [rates(x) for x in b]
    # No GPM window yet; then GPM refuses and the counters take their baseline in the same poll.
    assert got[0] == got[1] == (None, None)
    assert all(near(tx, TX_KIB) and near(rx, RX_KIB) for tx, rx in got[2:])
    (note,) = notes(b)
    assert "GPM NVLink rates" in note.message and "link counters" in note.message


def test_unsupported_counters_are_none_with_one_note_and_not_asked_again():
    src, nv, clock = make([FakeGpu(nvlinks=18, gpm=None, nvlink_scopes="none")])
    b = polls(src, clock, 4)
    assert all(rates(x) == (None, None) for x in b)
    (note,) = notes(b)
    assert "NVLink throughput (not supported)" in note.message
    calls = nv.calls["nvmlDeviceGetFieldValues"]
    polls(src, clock, 3)
    assert nv.calls["nvmlDeviceGetFieldValues"] == calls


def test_a_failing_read_is_none_and_noted_once_and_tried_again():
    gpu = FakeGpu(nvlinks=18, gpm=None, nvlink_kib_per_s=(TX_KIB, RX_KIB), errors={"nvmlDeviceGetFieldValues": NVML_ERROR_UNKNOWN})
    src, nv, clock = make([gpu])
    b = polls(src, clock, 3)
    assert all(rates(x) == (None, None) for x in b)
    assert len(notes(b)) == 1
    del gpu.errors["nvmlDeviceGetFieldValues"]  # it answers again: a baseline, then rates
    b = polls(src, clock, 2)
    assert rates(b[0]) == (None, None) and rates(b[1])[0] is not None


def test_a_counter_that_goes_back_gives_no_rate_never_a_negative_one():
    clock_start = FakeClock().t
    gpu = FakeGpu(nvlinks=18, gpm=None, nvlink_kib_per_s=(TX_KIB, RX_KIB), nvlink_reset_at=clock_start + 3.5)
    src, nv, clock = make([gpu])
    b = polls(src, clock, 7)
    got = [rates(x) for x in b]
    assert got[4] == (None, None)  # the counters restarted from 0 between polls 3 and 4
    for tx, rx in got[1:4] + got[5:]:
        assert near(tx, TX_KIB) and near(rx, RX_KIB)
    assert all(v is None or v >= 0 for pair in got for v in pair)


def test_a_gpu_without_nvlink_has_no_rate_and_no_call_for_it():
    src, nv, clock = make([FakeGpu(gpm=None), FakeGpu(gpm=None, nvlinks=2, nvlink_kib_per_s=(10, 10))])
    b = polls(src, clock, 3)
    assert all(rates(x, 0) == (None, None) for x in b)
    assert rates(b[2], 1)[0] is not None
    assert {i for i, _ in nv.field_args} == {1}
    assert not notes(b)


def test_a_gpm_request_refused_over_the_nvlink_ids_keeps_the_other_gpm_metrics():
    gpm = {NVML_GPM_METRIC_SM_UTIL: 68.0, NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: 1.0,
           NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: 1.0}
    gpu = FakeGpu(nvlinks=18, gpm=gpm, nvlink_kib_per_s=(TX_KIB, RX_KIB),
                  gpm_refuse_ids={NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC})
    src, nv, clock = make([gpu])
    b = polls(src, clock, 4)
    samples = [next(x for x in batch if isinstance(x, GpuSample)) for batch in b]
    assert all(s.sm_active == 68.0 for s in samples[1:])  # GPM's own metrics still read
    assert near(samples[3].nvlink_tx_bps, TX_KIB) and near(samples[3].nvlink_rx_bps, RX_KIB)
    (note,) = notes(b)
    assert "GPM NVLink rates" in note.message and "link counters" in note.message
