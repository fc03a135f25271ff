"""A session's ranks found again: on a later attach to a launcher's or a rank's PID, and while
attached, when a rank exits or restarts. The process lookups and the samplers are replaced by
fakes: no process is started."""

from __future__ import annotations

import pytest

import gputop.session as session_mod
import gputop.sources as sources
from gputop.analysis.ranks import rank_map
from gputop.pipeline import Pipeline
from gputop.session import RankWatch, Session
from gputop.sources.ranks import Job, Rank, find_ranks
from gputop.store import Store

LAUNCHER = 100


class FakeSampler:
    def __init__(self, pid: int, **options) -> None:
        self.pid, self.options, self.closed = pid, options, False
        self.name, self.interval = "stacks", 1.0

    def poll(self) -> list[object]:
        return []

    def close(self) -> None:
        self.closed = True


class World:
    """What find_ranks would see: the launcher's children by rank (None: all gone)."""

    def __init__(self, pids: dict[int, int] | None) -> None:
        self.pids = pids  # rank -> pid

    def find(self, pid: int) -> Job | None:
        if self.pids is None or (pid != LAUNCHER and pid not in self.pids.values()):
            return None
        ranks = tuple(Rank(r, p, r) for r, p in sorted(self.pids.items()))
        return Job(LAUNCHER, ranks, given_is_rank=pid != LAUNCHER)


@pytest.fixture
def world(monkeypatch):
    w = World({0: 101, 1: 102})
    monkeypatch.setattr(session_mod, "_find_job", w.find)
    monkeypatch.setattr(session_mod, "stack_sampler", FakeSampler)
    monkeypatch.setattr(session_mod, "procfs_reader", FakeSampler)
    monkeypatch.setattr(sources, "check_attachable", lambda pid: "py-spy")  # the face session imports it from
    return w


def new_session(clock) -> Session:
    store = Store()
    return Session(store=store, pipeline=Pipeline(store, [], clock=clock), clock=clock)


def sampled(s: Session) -> list[int]:
    return sorted(src.pid for src in s.pipeline.sources if isinstance(src, FakeSampler) and src.name == "stacks"
                  and src is not s.procfs)


def test_a_later_attach_to_the_launcher_finds_every_rank(world, clock):
    s = new_session(clock)
    s.attach(LAUNCHER)
    assert s.target_pid == 101 and s.stacks.pid == 101 and [x.pid for x in s.rank_stacks] == [102]
    assert s.stacks.options["rate"] == pytest.approx(s.sample_rate / 2)  # the budget shared
    assert rank_map(s.store.events()) == {101: 0, 102: 1}
    assert isinstance(s.rank_watch, RankWatch) and s.rank_watch in s.pipeline.sources
    assert "the job of process 100 (2 ranks, rank 0 as target)" in s.store.events()[-2].message
    # Attaching to rank 1 itself keeps rank 1 as the target, rank 0 sampled beside it.
    s.attach(102)
    assert s.target_pid == 102 and [x.pid for x in s.rank_stacks] == [101]


def test_a_rank_that_restarts_is_followed_and_said(world, clock):
    s = new_session(clock)
    s.attach(LAUNCHER)
    old = s.rank_stacks[0]
    world.pids = {0: 101, 1: 202}  # the launcher restarted rank 1
    events = s.refresh_ranks()
    assert [e.message for e in events if e.source == "job"] == ["rank 1 (pid 102) exited; restarted as pid 202"]
    s.pipeline.publish(events)
    assert rank_map(s.store.events()) == {101: 0, 202: 1}
    assert old.closed and [x.pid for x in s.rank_stacks] == [202]
    assert s.refresh_ranks() == []  # nothing changed since


def test_the_target_follows_its_rank_and_a_job_that_ends_is_said_once(world, clock):
    s = new_session(clock)
    s.attach(LAUNCHER)
    world.pids = {0: 301, 1: 102}  # rank 0, the target, restarted
    s.pipeline.publish(s.refresh_ranks())
    assert s.target_pid == 301 and s.stacks.pid == 301 and s.procfs.pid == 301
    assert [x.pid for x in s.rank_stacks] == [102]
    world.pids = {1: 102}  # rank 0 gone for good: the lowest rank left is the target
    s.pipeline.publish(s.refresh_ranks())
    assert s.target_pid == 102 and s.rank_stacks == () and sampled(s) == [102]
    world.pids = None
    events = s.refresh_ranks()
    assert [e.message for e in events] == ["the multi-rank job's ranks have all exited"]
    assert s.refresh_ranks() == []


def test_the_store_losing_the_ranks_event_gets_it_again(world, clock):
    s = new_session(clock)
    s.attach(LAUNCHER)
    s.store.add([s.store.events()[-1].__class__(clock(), "ranks", "multi-rank job: ")])  # the map evicted
    again = s.refresh_ranks()
    assert [e.source for e in again] == ["ranks"] and rank_map(again) == {101: 0, 102: 1}


def test_attaching_to_one_process_drops_the_job(world, clock, monkeypatch):
    s = new_session(clock)
    s.attach(LAUNCHER)
    monkeypatch.setattr(session_mod, "_find_job", lambda pid: None)  # 555 is a lone process
    s.attach(555)
    assert s.target_pid == 555 and s.rank_stacks == () and s.job is None and s.rank_watch is None
    assert sampled(s) == [555]


def test_find_ranks_of_a_process_that_is_gone_is_none():
    assert find_ranks(2**22 + 12345) is None
