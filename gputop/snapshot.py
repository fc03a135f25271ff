"""A store frozen at one moment: what the display shows while the user has paused it.

Collection goes on into the store; the snapshot keeps the latest values as they were at the
pause and cuts every window at that moment, so zooming, resizing or re-sorting a paused view
redraws the same moment instead of jumping to live data.
"""

from __future__ import annotations

from .model import GpuInfo, GpuProcess, GpuSample, HostSample, ProcSample, SystemInfo, UtilPoint
from .store import Store


class StoreSnapshot:
    """The read side of `Store` the panels use, as it was when the snapshot was taken."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.now = store.now
        self.version = store.version
        self.system: SystemInfo | None = store.system
        self.gpu_info: dict[int, GpuInfo] = dict(store.gpu_info)
        self._indices = store.gpu_indices()
        self._latest_gpu = {i: store.latest_gpu(i) for i in self._indices}
        self._latest_host = store.latest_host()
        self._gpu_processes = store.gpu_processes()
        self._procs_latest = store.procs_latest()

    def gpu_indices(self) -> list[int]:
        return list(self._indices)

    def latest_gpu(self, index: int) -> GpuSample | None:
        return self._latest_gpu.get(index)

    def latest_host(self) -> HostSample | None:
        return self._latest_host

    def gpu_processes(self) -> list[GpuProcess]:
        return list(self._gpu_processes)

    def procs_latest(self) -> dict[int, ProcSample]:
        return dict(self._procs_latest)

    def util_window(self, index: int, t0: float, t1: float = float("inf")) -> list[UtilPoint]:
        return self._store.util_window(index, t0, min(t1, self._end))

    def gpu_window(self, index: int, t0: float, t1: float = float("inf")) -> list[GpuSample]:
        return self._store.gpu_window(index, t0, min(t1, self._end))

    @property
    def _end(self) -> float:
        # Windows are half-open [t0, t1): the sample taken at the pause itself belongs in.
        return self.now + 1e-6
