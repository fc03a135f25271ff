"""A copy of a long recording cut short: `info`, the span and the replay agree on what survived.

A new user's `head -c 50000 run.gputop > cut.gputop` read 2,360 polls in `info` while the replay's
panels said "waiting for first sample": each reader stopped at a different missing page (a sum
over the blocks, the newest block for the span, a time range for the replay)."""

from __future__ import annotations

from collections import Counter
from unittest import mock

import pytest

from gputop.record.reader import Reader
from gputop.record.replay import ReplaySource
from gputop.record.writer import RecordWriter, SessionMeta
from synth_recording import SyntheticSession

T0 = 1_767_225_600.0
SECONDS = 1200  # 20 minutes: enough blocks that a cut leaves some tables' pages out of order


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    p = tmp_path_factory.mktemp("cut") / "whole.gputop"
    w = RecordWriter.create(p)
    with mock.patch("gputop.record.writer.time.time", return_value=T0):  # started as the samples
        w.start_session(SessionMeta(mode="fake", target_pid=4_194_300, interval=1.0))
    for batch in SyntheticSession(t0=T0).seconds(SECONDS):
        w.flush(batch)
    w.finish()
    return p


def cut(whole, tmp_path, kb: int):
    p = tmp_path / f"cut{kb}.gputop"
    p.write_bytes(whole.read_bytes()[: kb * 1024])
    return p


# Cuts that keep GPU polls but lose pages of their table in the middle (the old reader counted 0
# polls there and gave the recording a span of 0 s, so the replay had nothing to play).
@pytest.mark.parametrize("kb", [130, 170, 210, 250, 310])
def test_info_the_span_and_the_replay_read_the_same_polls(whole, tmp_path, kb):
    with Reader(cut(whole, tmp_path, kb)) as r:
        assert r.damage
        counted = r.counts()["gpu_samples"]
        read = r.gpu_samples(float("-inf"), float("inf"))
        assert counted == len(read) > 0  # info's count is what a read returns
        # The span covers every poll that survived, and a replay starts at the first of them.
        assert r.start_ts <= read[0].ts and read[-1].ts <= r.end_ts
        assert r.duration >= read[-1].ts - read[0].ts > 0
        source = ReplaySource(r)
        first = Counter(type(x).__name__ for x in source.poll())
        assert first["GpuSample"] >= 1 and first["GpuInfo"] >= 1
        source.seek(r.end_ts)
        assert r.gpu_samples(r.end_ts - 10, r.end_ts)  # the end is where polls still are


def test_a_cut_replay_says_what_was_lost_from_its_first_frame(whole, tmp_path):
    with Reader(cut(whole, tmp_path, 130)) as r:
        batch = ReplaySource(r).poll()
    warnings = [x for x in batch if type(x).__name__ == "Event" and x.level == "warning"]
    assert warnings and "truncated" in warnings[0].message
