"""Runs sources on their own threads and fans their batches out: store first, then subscribers.

Each source gets a thread so a slow one (a 20 ms PCIe read, a py-spy call, a disk write in a
subscriber) delays only itself and never the UI's event loop. A source that raises is turned
into an ``Event``; collection goes on.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Protocol, Sequence

from .model import Event
from .store import Store

Batch = Sequence[object]
Subscriber = Callable[[Batch], None]


class Source(Protocol):
    """Anything that turns the world (or a file, or a script) into samples."""

    name: str
    interval: float  # seconds between polls

    def poll(self) -> list[object]:
        """Return the samples produced since the last call. Must not raise for routine faults."""

    def close(self) -> None: ...


class Pipeline:
    def __init__(self, store: Store, sources: Sequence[Source], clock: Callable[[], float] = time.time):
        self.store = store
        self.sources = list(sources)
        self.clock = clock
        self._subs: list[Subscriber] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._sub_lock = threading.Lock()
        self._started = False

    # ----------------------------------------------------------------- wiring

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback(batch)`` after each batch is stored. Returns an unsubscribe."""
        with self._sub_lock:
            self._subs.append(callback)

        def unsubscribe() -> None:
            with self._sub_lock:
                if callback in self._subs:
                    self._subs.remove(callback)

        return unsubscribe

    def add_source(self, source: Source) -> None:
        self.sources.append(source)
        if self._started:  # already running: start this one too
            self._start_thread(source)

    def remove_source(self, source: Source) -> None:
        if source in self.sources:
            self.sources.remove(source)
        _safe_close(source)

    def publish(self, batch: Batch) -> None:
        if not batch:
            return
        self.store.add(batch)
        with self._sub_lock:
            subs = list(self._subs)
        for cb in subs:
            try:
                cb(batch)
            except Exception as exc:  # a broken subscriber must not stop collection
                self.store.add([Event(self.clock(), "pipeline", f"subscriber failed: {exc}", "error")])

    # ----------------------------------------------------------------- running

    def poll_once(self) -> None:
        """Poll every source once, synchronously (tests, headless one-shots)."""
        for src in list(self.sources):
            self._poll(src)

    def start(self) -> None:
        self._stop.clear()
        self._started = True
        for src in list(self.sources):
            self._start_thread(src)

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._started = False
        for t in self._threads:
            t.join(timeout)
        self._threads.clear()
        for src in list(self.sources):
            _safe_close(src)

    @property
    def running(self) -> bool:
        return self._started

    def _start_thread(self, src: Source) -> None:
        t = threading.Thread(target=self._run, args=(src,), name=f"gputop-{src.name}", daemon=True)
        self._threads.append(t)
        t.start()

    def _run(self, src: Source) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set() and src in self.sources:
            self._poll(src)
            # Fixed-rate schedule; after a stall, skip missed ticks instead of bursting.
            next_at += max(0.01, src.interval)
            now = time.monotonic()
            if next_at < now:
                next_at = now
            self._stop.wait(next_at - now)

    def _poll(self, src: Source) -> None:
        try:
            batch = src.poll()
        except Exception as exc:
            batch = [Event(self.clock(), src.name, f"{type(exc).__name__}: {exc}", "error")]
        self.publish(batch)


def _safe_close(src: Source) -> None:
    try:
        src.close()
    except Exception:
        pass
