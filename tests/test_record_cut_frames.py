"""A copy of a recording cut inside its frames table: the short read past the cut comes back
zero-filled, and such a row is damage, not a frame to show."""

from __future__ import annotations

from pathlib import Path

from gputop.record.reader import Reader


def test_a_frame_whose_text_the_cut_zero_filled_is_damage_not_a_path(tmp_path):
    # A copy cut inside the frames table: SQLite zero-fills the short read past the cut, and a
    # frame's path read "site-pack??????…:0" in the replay's Stacks tab as if it were real.
    src = Path(__file__).parent / "fixtures" / "recordings" / "h100-checkpoint-stall.gputop"
    seen_bad = 0
    for size in (92160, 96256):
        p = tmp_path / f"cut{size}.gputop"
        p.write_bytes(src.read_bytes()[:size])
        with Reader(p) as r:
            samples = r.stack_samples(r.start_ts - 1, r.end_ts + 1)
            assert samples
            assert not any("?" in f.filename or "\x00" in f.filename for s in samples for f in s.frames)
            seen_bad += r.bad_rows
    assert seen_bad >= 1  # counted as damage
