"""The scenarios: what each workload reproduces and what gputop is expected to say about it.

Pure data, no torch import, so ``gputop demo --list``, the tests and the benchmark harness can
read it cheaply. ``expected_finding`` and ``expected_category`` are the contract the advisor and
the stack classifier are tested against: attached to this workload, the advisor's top finding
should carry ``expected_finding`` (``None``: no warning-level finding at all), and the dominant
category of the main thread's stacks should be ``expected_category`` (``None``: the stacks are not
the evidence; the GPU counters are).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model import Category


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str  # one line, for --list
    bottleneck: str  # what limits the job, in the words of the advice
    entry: str  # "module:function" inside gputop.workloads
    cpu: bool  # a CPU variant exists (CI smoke tests, demo without a GPU)
    cpu_exhibits: bool  # ...and it shows the bottleneck on a CPU-only machine too
    expected_finding: str | None
    expected_category: Category | None
    signature: str  # what the raw numbers show on a GPU (the harness checks these)
    stalls: bool = False  # stops making progress on purpose


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        name="healthy",
        description="bf16 autocast MLP, batches already on the GPU, a batch that fills the GPU",
        bottleneck="none: the GPU is busy with tensor-core work",
        entry="compute:healthy",
        cpu=True,
        cpu_exhibits=True,
        expected_finding=None,
        expected_category=None,
        signature="GPU util near 100 %, tensor activity high, no idle 200 ms samples",
    ),
    Scenario(
        name="dataloader-starved",
        description="DataLoader(num_workers=0) whose __getitem__ does real CPU work per sample",
        bottleneck="data loading runs on the training thread; the GPU waits for every batch",
        entry="loading:dataloader_starved",
        cpu=True,
        cpu_exhibits=True,
        expected_finding="data-starved",
        # num_workers=0: the main thread runs __getitem__ itself (fetch), it does not wait on a queue
        expected_category=Category.DATA_FETCH,
        signature="GPU util far below healthy, most 200 ms samples idle, main process ~1 core busy",
    ),
    Scenario(
        name="workers-saturated",
        description="2 DataLoader workers for CPU-heavy transforms on a many-core host",
        bottleneck="too few loader workers: each is 100 % busy while other cores idle",
        entry="loading:workers_saturated",
        cpu=True,
        cpu_exhibits=True,
        expected_finding="workers-saturated",
        expected_category=Category.DATA_WAIT,
        signature="GPU util far below healthy, each worker ~100 % of a core, host CPU mostly idle",
    ),
    Scenario(
        name="io-bound",
        description="samples read from files on disk, page cache bypassed (O_DIRECT or fadvise)",
        bottleneck="storage reads: loader workers block on disk, not on CPU",
        entry="loading:io_bound",
        cpu=True,
        cpu_exhibits=True,
        expected_finding="io-bound",
        expected_category=Category.DATA_WAIT,
        signature="GPU util far below healthy, high disk read rate, workers mostly waiting on IO",
    ),
    Scenario(
        name="host-sync",
        description="loss.item(), .cpu() of per-sample losses and torch.cuda.synchronize() every step",
        bottleneck="host syncs stop the CPU from queuing work ahead; the GPU idles between steps",
        entry="compute:host_sync",
        cpu=True,
        cpu_exhibits=False,  # without a GPU there is nothing to wait for
        expected_finding="host-sync",
        expected_category=Category.HOST_SYNC,
        signature="GPU util clearly below healthy, main thread stacks in item/cpu/synchronize",
    ),
    Scenario(
        name="pageable-h2d",
        description="a 256 MiB batch copied to the GPU from unpinned host memory every step",
        bottleneck="host-to-device copies from pageable memory, serialised with compute",
        entry="compute:pageable_h2d",
        cpu=False,
        cpu_exhibits=False,
        expected_finding="pageable-h2d",
        expected_category=Category.H2D_COPY,
        signature="GPU util well below healthy, high PCIe RX, main thread in .to(device)",
    ),
    Scenario(
        name="fp32-no-tensor-cores",
        description="large fp32 matmuls with TF32 disabled",
        bottleneck="tensor cores unused: the GPU is busy but runs on the fp32 pipes",
        entry="compute:fp32_no_tensor_cores",
        cpu=False,
        cpu_exhibits=False,
        expected_finding="no-tensor-cores",
        expected_category=None,
        signature="GPU util near 100 % but GPM tensor activity near 0 %",
    ),
    Scenario(
        name="launch-bound",
        description="a tiny model at batch size 4: thousands of microsecond kernels per second",
        bottleneck="kernel launch overhead: the CPU cannot launch kernels as fast as the GPU runs them",
        entry="compute:launch_bound",
        cpu=True,
        cpu_exhibits=False,
        expected_finding="launch-bound",
        expected_category=None,
        signature="main thread ~100 % of a core, GPM SM activity low, GPU memory tiny",
    ),
    Scenario(
        name="checkpoint-stall",
        description="a synchronous torch.save of model + optimizer (~2 GB) every few seconds",
        bottleneck="checkpoint writes stall training: the GPU idles while the state is saved",
        entry="compute:checkpoint_stall",
        cpu=True,
        cpu_exhibits=True,
        expected_finding="checkpoint-stall",
        expected_category=Category.CHECKPOINT_IO,
        signature="periodic runs of idle 200 ms samples, disk write bursts",
    ),
    Scenario(
        name="oversubscribed",
        description="one loader worker per core, each running torch ops on all cores",
        bottleneck="CPU oversubscription: workers x threads far above the core count",
        entry="loading:oversubscribed",
        cpu=True,
        cpu_exhibits=True,
        expected_finding="cpu-oversubscribed",
        expected_category=Category.DATA_WAIT,
        signature="host CPU near 100 %, load far above the core count, GPU util low",
    ),
    Scenario(
        name="stuck",
        description="trains a few seconds, then every DataLoader worker blocks forever",
        bottleneck="a deadlock: no progress, the main thread waits on the loader queue forever",
        entry="loading:stuck",
        cpu=True,
        cpu_exhibits=True,
        expected_finding="stuck",
        expected_category=Category.DATA_WAIT,
        signature="steps stop, GPU util drops to 0 %, main thread blocked in the loader queue",
        stalls=True,
    ),
)

_BY_NAME = {s.name: s for s in SCENARIOS}


def names() -> list[str]:
    return [s.name for s in SCENARIOS]


def get(name: str) -> Scenario:
    """The scenario called ``name``; KeyError with the known names if there is none."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(names())}") from None


def table() -> str:
    """The scenarios as text: name, where they run, description and bottleneck."""
    width = max(len(n) for n in names())
    lines = []
    for s in SCENARIOS:
        where = "cpu+cuda" if s.cpu else "cuda only"
        lines.append(f"{s.name:<{width}}  {where:<9}  {s.description}")
        lines.append(f"{'':<{width}}  {'':<9}  bottleneck: {s.bottleneck}")
    return "\n".join(lines)
