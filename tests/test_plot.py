"""The charts' drawing math: max/min bucketing, eighth blocks, stacked layers, the idle causes."""

from gputop.analysis import Bucket
from gputop.model import Category, Frame, GpuSample, StackSample, UtilPoint
from gputop.present.gpu_charts import chart_lines, split_width, window_label
from gputop.present.idle_causes import CAUSE_STYLE, column_causes
from gputop.present.panels import History
from gputop.present.plot import CAUSE_SHADE, area_rows, column_cells, eighths, minmax


def test_minmax_keeps_a_short_idle_gap_a_mean_would_hide():
    # Four busy 200 ms samples and one idle one in a column: the mean (80 %) looks busy.
    pts = [(0.1, 100.0), (0.3, 100.0), (0.5, 0.0), (0.7, 100.0), (0.9, 100.0)]
    assert minmax(pts, 0.0, 1.0, 1) == [(100.0, 0.0)]
    assert minmax(pts, 0.0, 2.0, 2) == [(100.0, 0.0), (None, None)]  # no data is not zero
    assert minmax(pts, 1.0, 1.0, 3) == [] and minmax(pts, 0.0, 1.0, 0) == []


def test_eighths_round_and_clamp():
    assert eighths(0.5, 2) == 8 and eighths(1.5, 2) == 16 and eighths(-1, 2) == 0
    assert eighths(1 / 16, 1) == 0 and eighths(0.07, 1) == 1


def test_a_column_fills_bottom_up_in_eighths():
    cells = column_cells(((0.75, "g"),), 2)  # 12 of 16 eighths
    assert cells == [("█", "g"), ("▄", "g")]
    assert column_cells(((0.0, "r"),), 2, floor=1) == [("▁", "r"), (" ", None)]  # idle stays in sight
    assert column_cells((), 2) == [(" ", None), (" ", None)]


def test_inner_layers_colour_the_cells_they_cover():
    # tensor 25 %, SM 50 %, utilisation 100 % over four rows: one row each, utilisation above.
    cells = column_cells(((0.25, "t"), (0.5, "s"), (1.0, "u")), 4)
    assert [s for _, s in cells] == ["t", "s", "u", "u"]


def test_an_idle_columns_cause_shades_the_empty_cells():
    cells = column_cells(((0.0, "y"),), 3, floor=1, shade="y")
    assert cells == [("▁", "y"), (CAUSE_SHADE, "y"), (CAUSE_SHADE, "y")]


def test_area_rows_are_top_first_with_one_span_per_run():
    cols = [column_cells(((v, "g"),), 2) for v in (1.0, 1.0, 0.5)]
    top, bottom = area_rows(cols, 2)
    assert top.plain == "██ " and bottom.plain == "███"
    assert len(bottom.spans) == 1


def test_split_and_window_label():
    assert sum(split_width(78)) == 76 and split_width(78)[0] == 38
    assert window_label(30) == "30s" and window_label(120) == "2m" and window_label(900) == "15m"


def _stack(ts: float, category: Category) -> StackSample:
    frames = (Frame("__next__", "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py", 1),
              Frame("train", "/home/u/train.py", 57))
    return StackSample(ts=ts, pid=7, thread_id=7, thread_name="MainThread", frames=frames, category=category,
                       active=False, is_main=True)


def _util(pattern: str, t0: float = 0.0) -> list[UtilPoint]:
    """One 200 ms point a character: '#' busy, '.' idle."""
    return [UtilPoint(t0 + 0.2 * (k + 1), 0, 100.0 if c == "#" else 0.0) for k, c in enumerate(pattern)]


def test_idle_columns_take_the_cause_of_the_stacks_in_them():
    util = _util("#####" "....." "#####" ".....")  # 4 s: busy, idle, busy, idle
    stacks = [_stack(1.5, Category.DATA_WAIT), _stack(3.5, Category.HOST_SYNC)]
    causes = column_causes(0, util, (), stacks, (), 0.0, 4.0, 4)
    assert causes == [None, Bucket.DATA, None, Bucket.SYNC]


def test_idle_without_a_stack_near_it_has_no_cause():
    util = _util("....." "....." "....." ".....")
    causes = column_causes(0, util, (), [_stack(0.5, Category.DATA_WAIT)], (), 0.0, 4.0, 4)
    assert causes[0] is Bucket.DATA and causes[2:] == [None, None]
    assert column_causes(0, util, (), (), (), 0.0, 4.0, 4) == [None] * 4  # not attached


def test_attached_chart_colours_idle_by_cause_and_names_it():
    util = _util("#####" "....." * 3)
    s = GpuSample(ts=4.0, index=0, util_gpu=0, power_w=90, power_limit_w=700, mem_used=1, mem_total=2)
    stacks = [_stack(t, Category.DATA_WAIT) for t in (1.5, 2.5, 3.5)]
    causes = column_causes(0, util, (), stacks, (), 0.0, 4.0, split_width(80)[0])
    h = History(0.0, 4.0, util=util, samples=[s], causes=causes, attached=True)
    lines = chart_lines(h, s, 80, 3, attached=True)
    assert len(lines) == 5 and lines[-1].plain.startswith("idle by cause:") and "data" in lines[-1].plain
    styles = {str(sp.style) for line in lines[:3] for sp in line.spans}
    assert CAUSE_STYLE[Bucket.DATA] in styles
    # Not attached: idle is red, no cause line.
    plain = chart_lines(History(0.0, 4.0, util=util, samples=[s]), s, 80, 3, attached=False)
    assert len(plain) == 4 and "idle" in plain[-1].plain
    assert CAUSE_STYLE[Bucket.DATA] not in {str(sp.style) for line in plain[:3] for sp in line.spans}
