"""The exporter does not call a rank stuck when its stack samples are sparse (py-spy starved on a
saturated host) while the OS shows it working: it reads the stuck detector with the same OS
evidence the advisor gives it."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")

from synth import T0, stack  # noqa: E402

from gputop.analysis import judge  # noqa: E402
from gputop.export.job_rows import rank_rows  # noqa: E402
from gputop.model import Category, Frame, ProcSample  # noqa: E402
from gputop.sources.job_identity import identity_of  # noqa: E402
from gputop.store import Store  # noqa: E402

RANK = 5100
WAIT = (Frame("wait", "/usr/lib/python3.11/threading.py", 331),
        Frame("_BaseDataLoaderIter.__next__", "/usr/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 630),
        Frame("train", "/home/u/train.py", 40))


def _identity():
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}
    return {RANK: identity_of(env, "node-a", launcher_pid=5000)}


def starved_rank(workers_cpu: float | None, main_cpu: float = 3.0) -> Store:
    """A rank waiting on its DataLoader, sampled every 4 s (a starved py-spy): each sample lands
    on the same wait for 40 s, the rank at ``main_cpu`` % of a core. Its two workers at ``workers_cpu`` % each
    (None: not read)."""
    store = Store()
    out: list[object] = []
    for k in range(11):
        t = T0 + 4.0 * k
        out.append(stack(t, Category.DATA_WAIT, pid=RANK, active=False, frames=WAIT))
    for k in range(41):
        t = T0 + k
        out.append(ProcSample(t, RANK, ppid=5000, name="python", cpu_percent=main_cpu, role="target"))
        for w in (1, 2):
            out.append(ProcSample(t, RANK + w, ppid=RANK, name="pt_data_worker", cpu_percent=workers_cpu,
                                  role="worker", status="running"))
    store.add(sorted(out, key=lambda s: s.ts))
    return store


def test_a_starved_rank_whose_workers_run_is_not_stuck():
    store = starved_rank(workers_cpu=100.0)
    (row,) = rank_rows(store, _identity(), store.now, 60.0, 30.0)
    assert not row.stuck and row.stuck_s == 0.0


def test_the_same_stacks_with_nothing_running_are_stuck():
    # A hung wait burns next to nothing: a rank at 3 % of a core between samples that all sit in
    # one wait is working where the samples cannot see (the stuck detector's sparse-sampling rule).
    store = starved_rank(workers_cpu=0.0, main_cpu=0.2)
    (row,) = rank_rows(store, _identity(), store.now, 60.0, 30.0)
    assert row.stuck and row.stuck_s >= 30.0 and "train.py:40" in row.stuck_where


def test_sparse_but_changing_stacks_are_not_stuck():
    """The detector itself: a running job sampled every 4 s whose stack differs sample to sample."""
    lines = (40, 41, 43)
    main = [stack(T0 + 4.0 * k, Category.FORWARD, pid=RANK, active=False,
                  frames=(Frame("train", "/home/u/train.py", lines[k % 3]),)) for k in range(11)]
    v = judge(main, T0 + 40.5, 30.0)
    assert not v.stuck and v.held_s < 5.0
