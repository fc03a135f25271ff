import time

from gputop.units import (
    bar,
    bucket,
    fmt_bytes,
    fmt_clock,
    fmt_duration,
    fmt_elapsed,
    fmt_pct,
    fmt_rate,
    fmt_share,
    fmt_si,
    fmt_size,
    fmt_size_limit,
    fmt_time,
    short_gpu_name,
    sparkline,
    truncate,
)


def test_fmt_bytes_uses_binary_units():
    assert fmt_bytes(None) == "n/a"
    assert fmt_bytes(512) == "512B"
    assert fmt_bytes(1536) == "1.5K"
    assert fmt_bytes(80 * 1024**3) == "80.0G"
    assert fmt_rate(2.5 * 1024**2) == "2.5M/s"
    assert fmt_rate(None) == "n/a"


def test_fmt_duration_like_ps():
    assert fmt_duration(5) == "5s"
    assert fmt_duration(65) == "1:05"
    assert fmt_duration(3 * 3600 + 4 * 60 + 5) == "3:04:05"
    assert fmt_duration(2 * 86400 + 3 * 3600) == "2d03h"
    assert fmt_duration(None) == "n/a" and fmt_duration(-1) == "n/a"


def test_fmt_pct():
    assert fmt_pct(97.4) == "97%"
    assert fmt_pct(None, 4) == " n/a"
    assert fmt_pct(3.14159, digits=1) == "3.1%" and fmt_pct(None, digits=1) == "n/a"
    assert fmt_share(0.423) == "42%"


def test_sizes_in_sentences_and_limits():
    assert fmt_size(512) == "512 B" and fmt_size(1536) == "1.5 KB" and fmt_size(2 * 1024**3) == "2.0 GB"
    assert fmt_size(None) == "?"
    assert fmt_size_limit(320 * 1024) == "320 KB" and fmt_size_limit(1.5 * 1024**2) == "1.5 MB"
    assert fmt_si(9500) == "9500" and fmt_si(15_000) == "15k" and fmt_si(3e6) == "3M" and fmt_si(2e9) == "2G"


def test_running_times_and_moments():
    assert fmt_elapsed(65) == "1:05" and fmt_elapsed(3723.9) == "1:02:03" and fmt_elapsed(None) == "?"
    ts = time.mktime((2026, 11, 22, 14, 3, 12, 0, 0, -1))
    assert fmt_clock(ts) == "14:03:12" and fmt_time(ts) == "2026-11-22 14:03:12" and fmt_time(None) == "?"


def test_bar_has_exact_width_and_eighths():
    assert bar(0.0, 8) == "░" * 8
    assert bar(1.0, 8) == "█" * 8
    assert bar(2.0, 8) == "█" * 8  # clamped
    half = bar(0.5, 8)
    assert half.startswith("████") and len(half) == 8
    assert bar(0.5, 1) == "▌"
    assert bar(None, 5) == "░" * 5
    assert bar(0.5, 0) == ""


def test_bucket_means_and_mins_with_gaps():
    pts = [(0.0, 100.0), (0.2, 0.0), (0.4, 100.0), (2.5, 50.0)]
    cells = bucket(pts, 0.0, 3.0, 3)
    assert cells[0] == (200 / 3, 0.0)  # a sub-second idle dip survives as the bucket's min
    assert cells[1] == (None, None)  # no data is not zero
    assert cells[2] == (50.0, 50.0)
    assert bucket(pts, 0.0, 0.0, 3) == []


def test_sparkline_levels_and_gaps():
    assert sparkline([0, 100]) == "▁█"
    assert sparkline([None, 50]) == " ▅"
    assert sparkline([150, -5]) == "█▁"


def test_truncate_and_names():
    assert truncate("abcdef", 4) == "abc…"
    assert truncate("abc", 4) == "abc"
    assert short_gpu_name("NVIDIA H100 80GB HBM3") == "H100 80GB HBM3"


def test_bridge_gaps_joins_a_2s_series_in_1s_buckets_but_keeps_real_gaps():
    from gputop.units import bridge_gaps

    t0 = 1000.0
    # a sample every 2 s for 20 s, then nothing for 20 s (the GPU was lost), then again
    pts = [(t0 + t, 50.0) for t in range(0, 20, 2)] + [(t0 + t, 70.0) for t in range(40, 60, 2)]
    cells = bucket(pts, t0, t0 + 60, 60)  # 1 s buckets: every other one empty
    assert sum(m is None for m, _ in cells[:19]) == 9
    joined = bridge_gaps(cells, pts, t0, t0 + 60)
    assert all(m == 50.0 for m, _ in joined[:19])  # no dots between polls
    assert all(m is None for m, _ in joined[20:40])  # a 20 s silence stays a gap
    assert all(m == 70.0 for m, _ in joined[40:59])
    assert bridge_gaps(cells[:1], pts[:1], t0, t0 + 1) == cells[:1]
