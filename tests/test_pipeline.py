import threading
import time

from gputop.model import Event, HostSample
from gputop.pipeline import Pipeline
from gputop.store import Store


class ListSource:
    name = "list"

    def __init__(self, interval=0.01):
        self.interval = interval
        self.n = 0
        self.closed = False

    def poll(self):
        self.n += 1
        return [HostSample(ts=float(self.n), cpu_percent=1.0)]

    def close(self):
        self.closed = True


class BrokenSource(ListSource):
    name = "broken"

    def poll(self):
        raise RuntimeError("device fell over")


def test_poll_once_stores_and_notifies():
    store = Store()
    seen = []
    p = Pipeline(store, [ListSource()], clock=lambda: 5.0)
    unsub = p.subscribe(seen.append)
    p.poll_once()
    assert store.latest_host().ts == 1.0 and len(seen) == 1
    unsub()
    p.poll_once()
    assert len(seen) == 1


def test_a_failing_source_becomes_an_event_and_others_continue():
    store = Store()
    good = ListSource()
    p = Pipeline(store, [BrokenSource(), good], clock=lambda: 5.0)
    p.poll_once()
    ev = store.events()
    assert ev and ev[-1].source == "broken" and "device fell over" in ev[-1].message and ev[-1].level == "error"
    assert good.n == 1


def test_a_failing_subscriber_does_not_stop_collection():
    store = Store()
    p = Pipeline(store, [ListSource()], clock=lambda: 5.0)

    def bad(batch):
        raise ValueError("disk full")

    p.subscribe(bad)
    p.poll_once()
    assert store.latest_host() is not None
    assert any("disk full" in e.message for e in store.events())


def test_threads_run_and_stop_and_close_sources():
    store = Store()
    src = ListSource(interval=0.01)
    p = Pipeline(store, [src])
    got = threading.Event()
    p.subscribe(lambda b: got.set() if src.n >= 3 else None)
    p.start()
    assert got.wait(5)
    p.stop()
    assert src.closed and not p.running
    n = src.n
    time.sleep(0.05)
    assert src.n == n


def test_sources_added_while_running_start_polling():
    store = Store()
    p = Pipeline(store, [])
    p.start()
    try:
        src = ListSource()
        p.add_source(src)
        deadline = time.time() + 5
        while src.n == 0 and time.time() < deadline:
            time.sleep(0.01)
        assert src.n > 0
        p.remove_source(src)
        assert src.closed
    finally:
        p.stop()


def test_event_dataclass_is_immutable():
    e = Event(ts=1, source="s", message="m")
    try:
        e.message = "x"  # type: ignore[misc]
    except Exception:
        return
    raise AssertionError("Event must be frozen")
