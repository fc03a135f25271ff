"""The exporter says which ranks are still starting (importing, joining the process group, their
first samples) and reads a started rank's shares from after its start-up, so the job view judges
no rank from its imports."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")

from gputop.export.rank_start import (  # noqa: E402
    FEW_SAMPLES, FIRST_STEPS, IMPORTING, JOINING, NO_SAMPLES, starting, startup_of, steady_since,
)
from gputop.model import Category, Frame, GpuProcess, GpuSample, ProcSample  # noqa: E402
from gputop.store import Store  # noqa: E402

from synth import LIB, T0, stack  # noqa: E402
from test_export_job import DECODE, PIDS, identify_on, scrape  # noqa: E402

IMPORT = (Frame("_find_and_load", "<frozen importlib._bootstrap>", 1176),
          Frame("<module>", f"{LIB}/nn/modules/linear.py", 3), Frame("<module>", "/home/u/train.py", 3))
JOIN = (Frame("_store_based_barrier", f"{LIB}/distributed/distributed_c10d.py", 400),
        Frame("init_process_group", f"{LIB}/distributed/distributed_c10d.py", 1500),
        Frame("main", "/home/u/train.py", 20))


def samples(spec: list[tuple[float, str]], pid: int = 7, rate: float = 5.0):
    """``spec``: (seconds, 'import' | 'join' | 'step') runs one after the other from T0."""
    out, t = [], T0
    for secs, what in spec:
        for _ in range(int(secs * rate)):
            frames = {"import": IMPORT, "join": JOIN}.get(what)
            cat = Category.OTHER if what == "import" else Category.COLLECTIVE if what == "join" else Category.FORWARD
            out.append(stack(t, cat, pid=pid, frames=frames))
            t += 1 / rate
    return out


def test_what_start_up_looks_like():
    assert startup_of(samples([(1, "import")])[0]) == IMPORTING
    assert startup_of(samples([(1, "join")])[0]) == JOINING
    assert startup_of(samples([(1, "step")])[0]) is None


def test_a_rank_is_starting_until_it_has_run_past_its_start_up():
    imp = samples([(10, "import")])
    assert starting(imp, imp[-1].ts) == IMPORTING
    joined = samples([(8, "import"), (6, "join")])
    assert starting(joined, joined[-1].ts) == JOINING
    busy = samples([(10, "import"), (1.2, "step")])  # the last 5 s still mostly imports
    assert starting(busy, busy[-1].ts) == IMPORTING
    # sampled at 2 Hz (a loaded machine's budget): past the imports, but by 6 samples only
    just = samples([(10, "import"), (3, "step")], rate=2)
    assert starting(just, just[-1].ts) == FIRST_STEPS
    ran = samples([(10, "import"), (4, "step")])
    assert starting(ran, ran[-1].ts) == ""
    assert steady_since(ran) == pytest.approx(T0 + 10 - 0.2)
    # attached to a rank that was running: no start-up in sight, but too little seen to judge
    few = samples([(1, "step")])
    assert starting(few, few[-1].ts) == FEW_SAMPLES and steady_since(few) is None
    assert starting([], T0) == NO_SAMPLES


def test_a_lone_import_mid_run_is_no_start_up():
    run = samples([(10, "step")])
    lazy = samples([(0.2, "import")])[0]
    mid = sorted([*run, type(lazy)(**{**{f: getattr(lazy, f) for f in lazy.__slots__}, "ts": T0 + 5.01})],
                 key=lambda s: s.ts)
    assert steady_since(mid) is None and starting(mid, mid[-1].ts) == ""


def _job(import_s: float, run_s: float) -> Store:
    """Four ranks that import for ``import_s`` then run ``run_s`` as in test_export_job: rank 1
    decodes, the others wait for it in all_reduce."""
    store = Store()
    store.add([*(GpuSample(T0, r, util_gpu=50.0) for r in range(4)),
               *(GpuProcess(T0, r, PIDS[r], used_memory=1 << 30) for r in range(4))])
    out: list[object] = []
    n_imp = int(import_s * 5)
    for k in range(int((import_s + run_s) * 5)):
        t = T0 + k * 0.2
        for r, pid in PIDS.items():
            if k < n_imp:
                out.append(stack(t, Category.OTHER, pid=pid, frames=IMPORT))
            elif r == 1:
                cat = Category.DATA_FETCH if k % 5 else Category.FORWARD
                out.append(stack(t, cat, pid=pid, frames=DECODE if cat is Category.DATA_FETCH else None))
            else:
                out.append(stack(t, Category.COLLECTIVE if k % 5 < 3 else Category.BACKWARD, pid=pid))
            out.append(ProcSample(t, pid, ppid=5000, name="python", cmdline="python train.py"))
    store.add(out)
    return store


HOSTS = {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}


def test_the_exporter_says_starting_then_reads_the_steps_alone():
    _, m = scrape(_job(import_s=12, run_s=0), identify_on(HOSTS))
    start = {s.labels["rank"]: (s.value, s.labels["what"]) for s in m["gputop_rank_starting"]}
    assert start == {r: (1.0, IMPORTING) for r in "0123"}
    # Past the imports (12 s of them in the 20 s window): the shares are the steps' own. Read
    # over the whole window, the imports would put the waiters' wait near 0.24 and call 60 % of
    # everything "other".
    _, m = scrape(_job(import_s=12, run_s=8), identify_on(HOSTS))
    start = {s.labels["rank"]: (s.value, s.labels["what"]) for s in m["gputop_rank_starting"]}
    assert start == {r: (0.0, "") for r in "0123"}
    wait = {s.labels["rank"]: s.value for s in m["gputop_rank_wait_ratio"]}
    assert min(wait["0"], wait["2"], wait["3"]) > 0.5 and wait["1"] < 0.1
    other = {s.labels["rank"]: s.value for s in m["gputop_rank_phase_ratio"] if s.labels["phase"] == "other"}
    assert max(other.values()) < 0.1
    samples_ = {s.labels["rank"]: s.value for s in m["gputop_rank_stack_samples"]}
    assert all(n <= 8 * 5 for n in samples_.values())  # the steps' samples only
