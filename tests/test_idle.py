"""GPU busy/idle time from NVML's 200 ms utilisation samples."""

import pytest

from gputop.analysis.idle import (
    MAX_SLICE_S,
    idle_fraction,
    idle_intervals,
    periodicity,
    poll_slices,
    totals,
    util_slices,
)
from gputop.model import GpuSample, UtilPoint

T = 1000.0


def points(utils, period=0.2, start=T, index=0):
    return [UtilPoint(start + (k + 1) * period, index, u) for k, u in enumerate(utils)]


def test_each_point_covers_the_time_since_the_previous_one():
    sl = util_slices(points([100, 0, 50]))
    assert [(round(s.start - T, 3), round(s.end - T, 3)) for s in sl] == [(0.0, 0.2), (0.2, 0.4), (0.4, 0.6)]
    # the first point's period is the median spacing of the rest
    assert sl[0].duration == pytest.approx(0.2)


def test_busy_and_idle_seconds_add_up_and_partial_utilisation_counts():
    sl = util_slices(points([100, 0, 60, 25]))
    busy, idle = totals(sl)
    assert busy + idle == pytest.approx(0.8)
    assert busy == pytest.approx(0.2 * (1.0 + 0.0 + 0.6 + 0.25))
    assert idle_fraction(sl) == pytest.approx(idle / 0.8)


def test_a_gap_in_the_buffer_is_missing_data_not_a_long_sample():
    pts = points([100, 100]) + [UtilPoint(T + 0.4 + MAX_SLICE_S + 1.0, 0, 0.0)]
    sl = util_slices(pts)
    assert len(sl) == 2  # the late point's "period" would span the gap: left out
    assert totals(sl)[1] == 0.0


def test_slices_are_clipped_to_the_window():
    sl = util_slices(points([0] * 10), t0=T + 0.3, t1=T + 1.1)
    assert sl[0].start == pytest.approx(T + 0.3)
    assert sl[-1].end == pytest.approx(T + 1.1)
    assert sum(s.duration for s in sl) == pytest.approx(0.8)


def test_out_of_order_points_are_sorted_first():
    pts = points([10, 20, 30])
    assert [s.util for s in util_slices(list(reversed(pts)))] == [10, 20, 30]


def test_poll_slices_stand_in_when_there_is_no_sample_buffer():
    samples = [GpuSample(ts=T + k, index=0, util_gpu=u) for k, u in enumerate([50, 50, None, 100], start=1)]
    sl = poll_slices(samples)
    # None is skipped: the 100 % poll covers the two seconds since the last reading
    assert [s.util for s in sl] == [50, 50, 100]
    assert sl[-1].duration == pytest.approx(2.0)


def test_idle_intervals_merge_runs_and_split_on_busy_or_gaps():
    utils = [100, 0, 0, 0, 100, 5, 100]
    ivs = idle_intervals(util_slices(points(utils)))
    assert [(round(i.start - T, 2), round(i.end - T, 2)) for i in ivs] == [(0.2, 0.8), (1.0, 1.2)]
    assert ivs[0].duration == pytest.approx(0.6)
    assert idle_intervals(util_slices(points(utils)), min_duration=0.5) == ivs[:1]


def test_periodicity_is_the_median_spacing_of_idle_starts():
    # idle 0.4 s every 2 s
    utils = ([100] * 8 + [0, 0]) * 4
    ivs = idle_intervals(util_slices(points(utils)))
    assert len(ivs) == 4
    assert periodicity(ivs) == pytest.approx(2.0)
    assert periodicity(ivs[:2]) is None


def test_empty_inputs():
    assert util_slices([]) == []
    assert idle_fraction([]) is None
    assert idle_intervals([]) == []
