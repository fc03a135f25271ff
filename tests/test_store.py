import tracemalloc

import pytest

from gputop.model import Event, GpuProcess, GpuSample, HostSample, ProcSample, Reset, StackSample, UtilPoint, Verdict
from gputop.sources.fake import FakeGpuSource
from gputop.store import Retention, Ring, Store


def test_ring_keeps_newest_and_stays_in_order():
    r = Ring(3)
    for t in range(5):
        r.append(UtilPoint(ts=float(t), index=0, util=t))
    assert len(r) == 3
    assert [p.ts for p in r] == [2.0, 3.0, 4.0]
    assert r[0].ts == 2.0 and r[-1].ts == 4.0
    with pytest.raises(IndexError):
        r[3]


def test_ring_drops_out_of_order_items():
    r = Ring(4)
    r.append(UtilPoint(ts=5.0, index=0, util=1))
    r.append(UtilPoint(ts=4.0, index=0, util=2))
    assert [p.ts for p in r] == [5.0]


def test_ring_window_uses_time_bounds_inclusively():
    r = Ring(100)
    for t in range(100):
        r.append(UtilPoint(ts=t * 0.5, index=0, util=0))
    w = r.window(10.0, 12.0)
    assert [p.ts for p in w] == [10.0, 10.5, 11.0, 11.5, 12.0]
    assert r.window(1000.0) == []


def test_ring_window_after_wraparound():
    r = Ring(10)
    for t in range(25):
        r.append(UtilPoint(ts=float(t), index=0, util=0))
    assert [p.ts for p in r.window(0, 100)] == [float(t) for t in range(15, 25)]
    assert [p.ts for p in r.window(17, 19)] == [17.0, 18.0, 19.0]


def test_store_process_snapshot_is_replaced_by_each_poll():
    s = Store()
    s.add([GpuSample(ts=1.0, index=0), GpuProcess(ts=1.0, gpu_index=0, pid=10), GpuProcess(ts=1.0, gpu_index=0, pid=11)])
    assert {p.pid for p in s.gpu_processes()} == {10, 11}
    s.add([GpuSample(ts=2.0, index=0), GpuProcess(ts=2.0, gpu_index=0, pid=11)])
    assert {p.pid for p in s.gpu_processes()} == {11}
    # A poll with no processes clears the table (the job exited).
    s.add([GpuSample(ts=3.0, index=0)])
    assert s.gpu_processes() == []
    # A batch without GPU samples (e.g. host source) leaves the snapshot alone.
    s.add([GpuSample(ts=4.0, index=0), GpuProcess(ts=4.0, gpu_index=0, pid=12)])
    s.add([HostSample(ts=4.5, cpu_percent=1.0)])
    assert [p.pid for p in s.gpu_processes()] == [12]


def test_store_replayed_multi_poll_batch_keeps_only_latest_processes():
    s = Store()
    s.add(
        [
            GpuSample(ts=1.0, index=0),
            GpuProcess(ts=1.0, gpu_index=0, pid=1),
            GpuSample(ts=2.0, index=0),
            GpuProcess(ts=2.0, gpu_index=0, pid=2),
        ]
    )
    assert [p.pid for p in s.gpu_processes()] == [2]


def test_store_clock_is_newest_sample():
    s = Store()
    s.add([HostSample(ts=5.0, cpu_percent=0), Event(ts=7.0, source="x", message="m")])
    assert s.now == 7.0
    v = s.version
    s.add([UtilPoint(ts=6.0, index=0, util=1)])
    assert s.now == 7.0 and s.version == v + 1


def test_a_mixed_batch_is_dispatched_by_type_and_only_what_is_kept_moves_the_clock():
    from types import SimpleNamespace

    from gputop.model import Finding, GpuInfo, PaneViews, SamplingCost, Severity, SystemInfo

    store = Store()
    stranger = SimpleNamespace(ts=9e9)  # has a timestamp, is none of the model's samples
    cost = SamplingCost(ts=8e9, pid=1, window_s=10.0, stacks_per_s=5.0, sampler_cpu_pct=1.0, pause_pct=0.0,
                        job_cost_pct=1.0)  # the model's, but not a stored sample
    store.add([GpuInfo(ts=5.0, index=0, name="g"), stranger, cost,
               SystemInfo(ts=6.0, hostname="h", cpu_count=2),
               Finding(id="x", title="t", severity=Severity.INFO, confidence=0.5, evidence=(), action="a", ts=7.0),
               PaneViews(ts=8.0)])
    assert store.now == 8.0 and store.gpu_info[0].name == "g" and store.system.hostname == "h"
    assert store.pane_views().ts == 8.0
    store.add([stranger])
    assert store.now == 8.0


def test_process_table_is_bounded_and_evicts_the_stalest():
    s = Store(Retention(max_processes=3, proc_samples=5))
    for pid in range(1, 6):
        s.add([ProcSample(ts=float(pid), pid=pid)])
    assert set(s.procs_latest()) == {3, 4, 5}
    for t in range(20):
        s.add([ProcSample(ts=100.0 + t, pid=5)])
    assert len(s.proc_window(5, 0)) == 5


def test_long_session_memory_is_flat():
    """Hours of 1 s polls through the store: item counts and traced memory stop growing."""
    ret = Retention(gpu_samples=300, util_points=750, host_samples=300, proc_samples=120, stack_samples=1000, events=100)
    store = Store(ret)
    clock_t = [1_700_000_000.0]
    src = FakeGpuSource(gpus=2, clock=lambda: clock_t[0])

    def feed(seconds: int) -> None:
        for _ in range(seconds):
            clock_t[0] += 1.0
            batch = src.poll()
            batch.append(HostSample(ts=clock_t[0], cpu_percent=10.0))
            batch.append(StackSample(ts=clock_t[0], pid=1, thread_id=1))
            batch.append(Event(ts=clock_t[0], source="t", message="tick"))
            store.add(batch)

    tracemalloc.start()
    feed(1500)  # every ring is full after 300 s
    sizes_full = store.sizes()
    mem_full, _ = tracemalloc.get_traced_memory()
    feed(6000)  # five times as long again
    mem_later, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert store.sizes() == sizes_full
    assert sizes_full["gpu0"] == 300 and sizes_full["util1"] == 750
    assert sizes_full["stacks"] == 1000 and sizes_full["events"] == 100
    # Five times the samples, yet memory within 15 % (allocator noise), not five times more.
    assert mem_later < mem_full * 1.15, (mem_full, mem_later)


def test_reset_forgets_samples_but_versions_keep_counting():
    store = Store()
    store.add([GpuSample(ts=10.0, index=0, util_gpu=50.0)])
    store.add([Verdict(10.0, breakdowns=("x",))])
    v, av = store.version, store.analysis_version
    store.add([Reset(3.0)])  # a replay's jump back: the marker comes first in its batch
    assert store.gpu_indices() == [] and store.now == 0.0 and store.breakdowns() == ()
    assert store.version > v and store.analysis_version > av
    store.add([GpuSample(ts=5.0, index=0, util_gpu=1.0)])
    assert store.latest_gpu(0).ts == 5.0  # an earlier time is fine after a reset
    # New samples alone leave the analysis version where it is.
    av = store.analysis_version
    store.add([GpuSample(ts=6.0, index=0, util_gpu=1.0)])
    assert store.analysis_version == av
    store.add([Verdict(7.0)])
    assert store.analysis_version == av + 1


def test_a_late_event_is_kept_in_time_order():
    # Events come from every source's thread: one stamped a few ms before the newest (an attach
    # failure noted while NVML was being opened) must not be dropped.
    store = Store()
    store.add([Event(10.0, "nvml", "NVML unavailable", "warning")])
    store.add([Event(9.99, "stacks", "cannot sample stacks of 42: not Python", "error")])
    store.add([Event(11.0, "host", "later", "info")])
    assert [e.source for e in store.events()] == ["stacks", "nvml", "host"]


def test_ring_insert_keeps_order_and_capacity():
    from gputop.store import Ring

    r = Ring(3)
    for ts in (1.0, 3.0, 5.0):
        r.insert(Event(ts, "s", str(ts)))
    r.insert(Event(4.0, "s", "late"))  # full: the oldest goes
    assert [e.ts for e in r] == [3.0, 4.0, 5.0]
    r.insert(Event(0.5, "s", "too old"))  # older than all a full ring keeps
    assert [e.ts for e in r] == [3.0, 4.0, 5.0]
    r.append(Event(6.0, "s", "in order"))
    assert [e.ts for e in r] == [4.0, 5.0, 6.0] and r.latest().ts == 6.0
