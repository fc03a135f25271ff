"""An event line at 80 columns is cut honestly: at a word with an ellipsis on the one-line status
line, wrapped whole in the report and the stacks pane; never cropped mid-word with no sign."""

from __future__ import annotations

import sys
from pathlib import Path

from gputop.model import Event, HostSample
from gputop.units import truncate_words, word_cut

MSG = ("cannot attach to PID 4242: ptrace is restricted (kernel.yama.ptrace_scope=1); run gputop as the "
       "job's user with CAP_SYS_PTRACE, or set ptrace_scope to 0")


def test_a_cut_ends_at_a_word_with_an_ellipsis():
    line = "12:00:00 stacks: " + MSG
    cut = truncate_words(line, 80)
    assert len(cut) <= 80 and cut.endswith("…")
    assert cut == "12:00:00 stacks: cannot attach to PID 4242: ptrace is restricted…"
    assert truncate_words("short line", 80) == "short line" and word_cut("short", 80) == 5
    # A single long word is cut inside rather than dropped whole: the line still says something.
    assert truncate_words("/a/very/long/path/" * 10, 20) == ("/a/very/long/path/" * 2)[:19] + "…"
    # No separator left dangling before the ellipsis.
    assert truncate_words("one, two, three, four", 12) == "one, two…"


async def test_the_status_line_at_80_columns_ends_at_a_word(clock):
    sys.path.insert(0, str(Path(__file__).parent))
    from test_ui import feed, make_session

    from gputop.ui.app import GputopApp
    from gputop.ui.lines_view import LinesView

    s = make_session(clock, gpus=1)
    feed(s, clock)
    s.store.add([Event(ts=clock(), source="stacks", message=MSG, level="error")])
    app = GputopApp(s, refresh=60)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        status = app.query_one("#status", LinesView)
        shown = "".join(seg.text for seg in status.render_line(0)).rstrip()
        assert shown.endswith("ptrace is restricted…"), shown
        assert "kernel.yama." not in shown
        assert MSG in status.plain  # the whole message is still what the line holds


def test_the_report_wraps_an_event_at_80_columns(tmp_path):
    from gputop.record import Reader
    from gputop.record.writer import RecordWriter, SessionMeta
    from gputop.report import collect, render_text

    t0 = 1_767_225_600.0
    p = tmp_path / "ev.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta())
    w.flush([HostSample(ts=t0 + k, cpu_percent=10.0) for k in range(5)])
    w.flush([Event(t0 + 2, "stacks", MSG, "error")])
    w.finish()
    with Reader(p) as r:
        text = render_text(collect(r), 80)
    lines = text.split("warnings and errors (1)\n", 1)[1].splitlines()
    assert all(len(ln) <= 80 for ln in lines)
    body = " ".join(ln.strip() for ln in lines)
    assert body.endswith("set ptrace_scope to 0"), body
    assert "stacks: cannot attach to PID 4242" in lines[0]


def test_the_stacks_pane_wraps_its_fault_at_80_columns():
    sys.path.insert(0, str(Path(__file__).parent))
    from test_stacks_format import T0, fixture_store

    from gputop.analysis.window import stacks_view
    from gputop.present.stacks import plain, stacks_pane_lines

    store, pid = fixture_store("data-wait", n=5)
    store.add([Event(T0 + 1, "stacks", MSG, "warning")])
    lines = plain(stacks_pane_lines(stacks_view(store, pid, 30.0), 80)).splitlines()
    fault = [ln for ln in lines[1:4] if ln.strip()]
    assert all(len(ln) <= 80 for ln in fault)
    assert " ".join(ln.strip() for ln in fault).endswith("set ptrace_scope to 0"), fault
