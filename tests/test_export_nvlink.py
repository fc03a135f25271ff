"""The exporter's NVLink series: one gauge per GPU and direction, in bytes/s, from the GPU
samples' NVLink rates; absent (not 0) on a GPU without them."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from gputop.model import GpuSample  # noqa: E402
from test_export import collector_for, fake_session, scrape, value  # noqa: E402

TX, RX = 46.5e9, 45.25e9


def _with_nvlink_on_gpu0(clock):
    start = clock()
    store, _ = fake_session(clock, seconds=5)
    clock.advance(1.0)
    store.add([GpuSample(clock(), 0, util_gpu=70.0, nvlink_tx_bps=TX, nvlink_rx_bps=RX),
               GpuSample(clock(), 1, util_gpu=70.0)])
    return collector_for(store, clock, start)


def test_nvlink_gauges_per_gpu_and_direction(clock):
    m = scrape(_with_nvlink_on_gpu0(clock))
    assert value(m["gputop_gpu_nvlink_transmit_bytes_per_second"], gpu="0") == TX
    assert value(m["gputop_gpu_nvlink_receive_bytes_per_second"], gpu="0") == RX
    # GPU 1 has no rates: no series for it rather than a false 0
    assert {s.labels["gpu"] for s in m["gputop_gpu_nvlink_transmit_bytes_per_second"]} == {"0"}
    assert {s.labels["gpu"] for s in m["gputop_gpu_nvlink_receive_bytes_per_second"]} == {"0"}


def test_nvlink_exposition_lines(clock):
    reg = CollectorRegistry()
    reg.register(_with_nvlink_on_gpu0(clock))
    text = generate_latest(reg).decode()
    assert "# HELP gputop_gpu_nvlink_transmit_bytes_per_second NVLink data out of the GPU" in text
    assert "# TYPE gputop_gpu_nvlink_receive_bytes_per_second gauge" in text
    line = next(x for x in text.splitlines() if x.startswith("gputop_gpu_nvlink_transmit_bytes_per_second{"))
    assert 'gpu="0"' in line and float(line.rsplit(" ", 1)[1]) == TX
