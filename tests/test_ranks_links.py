"""GPU links from NVML (topology, P2P, NVLink state and throughput) against the scripted fake:
every call optional, NotSupported gives nothing rather than an error."""

from __future__ import annotations

from gputop.analysis.ranks import topology
from gputop.model import Event, GpuSample
from gputop.sources.nvml import NvmlSource

from fake_pynvml import (
    NVML_P2P_STATUS_NOT_SUPPORTED,
    NVML_P2P_STATUS_OK,
    NVML_TOPOLOGY_HOSTBRIDGE,
    NVML_TOPOLOGY_SINGLE,
    FakeClock,
    FakeGpu,
    FakeNvml,
)


def source(links, gpus):
    clock = FakeClock()
    nv = FakeNvml(gpus=gpus, clock=clock, links=links)
    return NvmlSource.open(interval=1.0, clock=clock, nvml=nv), clock, nv


def topo_events(batch):
    return [e for e in batch if isinstance(e, Event) and e.source == "topology"]


def test_topology_p2p_and_nvlink_are_one_event_read_back():
    links = {(0, 1): (NVML_TOPOLOGY_SINGLE, NVML_P2P_STATUS_OK, NVML_P2P_STATUS_OK),
             (0, 2): (NVML_TOPOLOGY_HOSTBRIDGE, NVML_P2P_STATUS_NOT_SUPPORTED, NVML_P2P_STATUS_NOT_SUPPORTED),
             (1, 2): (NVML_TOPOLOGY_HOSTBRIDGE, NVML_P2P_STATUS_OK, NVML_P2P_STATUS_NOT_SUPPORTED)}
    gpus = [FakeGpu(nvlinks=18, nvlink_kib_per_s=(1000, 2000), gpm=None), FakeGpu(nvlinks=18), FakeGpu()]
    src, clock, nv = source(links, gpus)
    events = topo_events(src.poll())
    assert len(events) == 1, events
    t = topology(events)
    assert t.between(1, 0) == ("NVLink", "ok")
    assert t.between(0, 2) == ("PCIe host bridge", "not supported")
    assert t.between(1, 2) == ("PCIe host bridge", "ok")
    assert t.nvlinks == {0: 18, 1: 18}
    clock.advance(2.0)
    batch = src.poll()
    assert topo_events(batch) == []  # once per source
    s = {x.index: x for x in batch if isinstance(x, GpuSample)}
    assert round(s[0].nvlink_tx_bps) == 1000 * 1024 and round(s[0].nvlink_rx_bps) == 2000 * 1024
    assert s[2].nvlink_tx_bps is None  # no NVLink: no rate, and no call for it after the first poll
    assert nv.calls["nvmlDeviceGetNvLinkState"] == 18 + 18 + 1


def test_no_topology_support_is_no_event_and_no_error():
    src, clock, nv = source(None, [FakeGpu(), FakeGpu()])
    batch = src.poll()
    assert topo_events(batch) == []
    assert not [e for e in batch if isinstance(e, Event) and e.level in ("warning", "error")]
    assert all(x.nvlink_tx_bps is None for x in batch if isinstance(x, GpuSample)) and topology([]) is None


def test_the_links_lines_give_the_nvlink_rates_in_units_that_fit():
    from types import SimpleNamespace

    from gputop.present.ranks import _link_lines

    t = topology([Event(0.0, "topology", "GPU pairs: 0-1 NVLink, P2P ok | NVLinks up: GPU 0 18, GPU 1 18")])
    job = SimpleNamespace(topology=t, ranks=[SimpleNamespace(gpu=0), SimpleNamespace(gpu=1)])
    lines = _link_lines(job, {0: (46.5 * 2**30, 45 * 2**30), 1: (48 * 2**20, 0.0)}, 100)
    text = ["".join(part for part, _ in line) for line in lines]
    assert "GPU 0: 18 NVLinks up, 46.5G/s out, 45.0G/s in" in text
    assert "GPU 1: 18 NVLinks up, 48.0M/s out, 0B/s in" in text  # a modest rate is not "0.0 GB/s"
