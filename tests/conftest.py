import gc
import os
import sys

import pytest

# Tests import the package from the checkout, installed or not.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# The files whose tests run real multi-process jobs (2-rank gloo jobs, CPU training loops, attaches
# to a hung or busy process) and judge them by their timing: under the two pytest-xdist workers
# (pyproject's addopts) each of them running beside another one starved both on CI's 2 cores (a
# gloo straggler read "stuck" in one full run of three here). They run one after another on one
# worker, as one xdist group, while the other worker takes the in-process tests; every other file
# is a group of its own, so a module's shared fixtures still start once (--dist loadfile's way).
TIMING_SENSITIVE_FILES = frozenset({
    "test_ranks.py", "test_stuck_attach.py", "test_stuck_sparse_attach.py", "test_job_e2e.py",
    "test_advisor_e2e.py", "test_workloads.py", "test_stacks_live.py", "test_worker_uss_job.py",
})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # First: xdist's own hook reads the group marks to name each item's group; marks added after it
    # are not seen, and every file's tests were dealt out one by one (test_ranks.py's 2-rank jobs
    # started on both workers at once, each starving the other).
    for item in items:
        name = item.path.name
        item.add_marker(pytest.mark.xdist_group("timing-sensitive" if name in TIMING_SENSITIVE_FILES else name))


def pytest_collection_finish(session):
    """What is alive once the tests are collected (the modules and their imports: Textual, the
    package, the test modules) lives for the whole run: set it aside from the garbage collector,
    whose full collections would otherwise walk it again and again (about 5 % of the time of the
    in-process UI tests on 2 cores)."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """What is still alive once a test module is done and its fixtures are torn down (the caches
    and imports its tests left: the count of such objects grows from ~60k to ~200k over the run)
    is set aside the same way, so each later full collection walks only what came after it: the
    full collections took ~10 s of the in-process tests on 2 cores, ~4 s with this. The young
    generations are collected first, so that little garbage is set aside with it."""
    yield
    if nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None):
        gc.collect(1)
        gc.freeze()


class FakeClock:
    """A clock tests move by hand, so time-based logic is deterministic."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> float:
        self.t += dt
        return self.t


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def utc(monkeypatch):
    """Reports and screens write local times: make local UTC for the test."""
    import time

    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
