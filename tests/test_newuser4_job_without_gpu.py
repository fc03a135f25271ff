"""`record --fake 2 --pid <a real CPU job>`: the report gave fake GPU 0's idle time to the job's CPU
work while saying the job held no GPU. In the live app's (and a replay's) idle colouring a GPU's
columns take their causes from the job's stacks only on a GPU NVML lists the job on; this pins it,
with the job on no GPU and on one of two. (The report's and the advisor's own attribution are in
report/ and analysis/, outside these files: see the CHANGELOG's note.)"""

from __future__ import annotations

import os

import pytest

from gputop.model import Frame, GpuProcess, StackSample
from gputop.pipeline import Pipeline
from gputop.session import Session
from gputop.sources.fake import FakeGpuSource
from gputop.store import Store
from gputop.ui import gpu_panels
from gputop.ui.app import GputopApp

ME = os.getpid()


class Gpus(FakeGpuSource):
    """Two scripted GPUs; NVML lists the job on ``on_gpu`` (None: on neither)."""

    def __init__(self, clock, on_gpu: int | None) -> None:
        super().__init__(gpus=2, clock=clock)
        self.on_gpu = on_gpu

    def poll(self) -> list[object]:
        out = super().poll()
        if self.on_gpu is not None:
            out.append(GpuProcess(ts=self._clock(), gpu_index=self.on_gpu, pid=ME, used_memory=1 << 30))
        return out


def _session(clock, on_gpu: int | None) -> Session:
    store = Store()
    src = Gpus(clock, on_gpu)
    s = Session(store=store, pipeline=Pipeline(store, [src], clock=clock), gpu=src, mode="live", target_pid=ME)
    frames = (Frame("work", "cpujob.py", 5, "__main__"), Frame("main", "cpujob.py", 9, "__main__"))
    for _ in range(3):
        clock.advance(1.0)
        s.pipeline.poll_once()
        store.add([StackSample(clock(), ME, 1, "MainThread", frames, True, True, True)])
    return s


@pytest.mark.parametrize("on_gpu", [None, 1])
async def test_only_a_gpu_the_job_holds_is_coloured_from_its_stacks(clock, monkeypatch, on_gpu):
    seen: dict[int, int] = {}
    real = gpu_panels.column_causes

    def spy(gpu, util, samples, stacks, *rest):
        seen[gpu] = len(stacks)
        return real(gpu, util, samples, stacks, *rest)

    monkeypatch.setattr(gpu_panels, "column_causes", spy)
    app = GputopApp(_session(clock, on_gpu), refresh=60)
    async with app.run_test(size=(140, 45)) as pilot:
        app.tick(force=True)
        await pilot.pause()
    assert set(seen) == {0, 1}  # both GPUs' charts were drawn, attached
    assert seen == {0: 0, 1: 0} if on_gpu is None else (seen[1] > 0 and seen[0] == 0)
