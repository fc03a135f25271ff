"""A paused display's view of the store."""

from gputop.model import GpuProcess, GpuSample, HostSample, UtilPoint
from gputop.store import StoreSnapshot
from gputop.store import Store


def batch(t, util):
    return [
        GpuSample(ts=t, index=0, util_gpu=util),
        UtilPoint(ts=t, index=0, util=util),
        HostSample(ts=t, cpu_percent=util / 2),
        GpuProcess(ts=t, gpu_index=0, pid=int(t), used_memory=1),
    ]


def test_snapshot_keeps_the_moment_while_the_store_moves_on():
    store = Store()
    for t in (100.0, 101.0, 102.0):
        store.add(batch(t, t - 50))
    snap = StoreSnapshot(store)
    for t in (103.0, 104.0):
        store.add(batch(t, 0.0))
    assert snap.now == 102.0 and store.now == 104.0
    assert snap.latest_gpu(0).util_gpu == 52.0 and store.latest_gpu(0).util_gpu == 0.0
    assert snap.latest_host().cpu_percent == 26.0
    assert [p.pid for p in snap.gpu_processes()] == [102]
    assert [p.ts for p in snap.util_window(0, 0.0)] == [100.0, 101.0, 102.0]
    assert [s.ts for s in snap.gpu_window(0, 101.0)] == [101.0, 102.0]
    assert [s.ts for s in snap.gpu_window(0, 0.0, 101.5)] == [100.0, 101.0]  # a tighter end still applies
    assert snap.gpu_indices() == [0] and snap.version < store.version
