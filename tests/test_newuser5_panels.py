"""Three things a new user saw in the GPU panels: `UTIL 58%` beside the Advisor's `busy 78 %` read
as a contradiction (one is the latest poll, the other the window); the fake GPU's name cut to
`Fake H100 80G…` at 200 columns; no history charts for 2 GPUs at 80x24 while the rows kept for a
two-process table stood empty."""

from __future__ import annotations

from gputop.model import GpuInfo
from gputop.present.panels import FULL, gpu_panel
from gputop.ui.gpu_panels import CHARTS, choose_layout

from test_panels import full_sample

FAKE = GpuInfo(ts=0, index=0, name="Fake H100 80GB HBM3 (scripted)", memory_total=80 * 2**30)
REAL = GpuInfo(ts=0, index=0, name="NVIDIA H100 80GB HBM3", memory_total=80 * 2**30)


def test_the_panels_utilisation_says_it_is_the_latest_poll():
    first = gpu_panel(REAL, full_sample(), None, 140, FULL).plain.split("\n")[0]
    assert "UTIL now " in first and "97%" in first
    narrow = gpu_panel(REAL, full_sample(), None, 80, FULL).plain.split("\n")[0]
    assert len(narrow) <= 80  # where there is no room the word is left out, not the figures
    assert "97%" in narrow and "61.0G/80.0G" in narrow


def test_a_long_name_is_whole_on_a_wide_terminal_and_panels_still_line_up():
    wide = gpu_panel(FAKE, full_sample(), None, 200, FULL).plain.split("\n")[0]
    assert "Fake H100 80GB HBM3 (scripted)" in wide and "…" not in wide and len(wide) <= 200
    # Names of 14 or fewer keep one label width, so panels of two usual models line up.
    a = gpu_panel(REAL, full_sample(), None, 200, FULL).plain.split("\n")[0]
    b = gpu_panel(GpuInfo(ts=0, index=0, name="NVIDIA A100-SXM4-80GB"), full_sample(), None, 200, FULL).plain
    assert a.index("UTIL") == b.split("\n")[0].index("UTIL")
    assert "Fake H100 80G…" in gpu_panel(FAKE, full_sample(), None, 120, FULL).plain


def test_two_gpus_at_80x24_get_charts_when_the_table_has_few_rows():
    mode, rows = choose_layout(24, 2, procs=2)
    assert mode == CHARTS and rows >= 2
    # A table with many processes keeps its rows: no charts then.
    assert choose_layout(24, 2, procs=30)[0] != CHARTS or choose_layout(24, 2, procs=30)[1] < rows
