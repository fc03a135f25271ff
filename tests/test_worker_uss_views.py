"""The DataLoader workers' private memory where a person sees it, live and in a replay: each
worker's USS and, while the memory view judges it growing, its rate in the process table; the
workers' total on the host's memory line. Synthetic samples; the analysis is the memory view's."""

from __future__ import annotations

import pytest

from gputop.analysis import COPY_ON_READ, MAIN_LEAK, memory_view
from gputop.model import GpuProcess, HostSample, ProcSample
from gputop.present.panels import host_panel, host_panel_lines
from gputop.present.process_table import (
    COLUMNS, MIN_COMMAND, build_rows, command_room, row_cells, table_columns,
)
from gputop.units import fmt_growth

from synth import GiB, T0, TARGET

MiB = 2**20


def _worker(pid: int, uss_rate: float, seconds: int = 300, base: float = 300 * MiB) -> list[ProcSample]:
    """A worker read as the host source reads it: details each second, its USS every 12 s."""
    return [ProcSample(ts=T0 + k, pid=pid, ppid=TARGET, name="pt_data_worker", user="alice", role="worker",
                       cmdline="python train.py", cpu_percent=50.0, rss=int(1.9 * GiB), create_time=T0 - 60,
                       uss=int(base + uss_rate * k) if k % 12 == 0 else None)
            for k in range(seconds)]


def _procs(uss_rates, main_rate: float = 0.0, seconds: int = 300) -> dict[int, list[ProcSample]]:
    procs = {TARGET + 1 + i: _worker(TARGET + 1 + i, r, seconds) for i, r in enumerate(uss_rates)}
    procs[TARGET] = [ProcSample(ts=T0 + k, pid=TARGET, ppid=1, user="alice", cmdline="python train.py",
                                role="target", rss=int(2 * GiB + main_rate * k)) for k in range(seconds)]
    return procs


def _view(uss_rates, main_rate: float = 0.0, seconds: int = 300):
    procs = _procs(uss_rates, main_rate, seconds)
    workers = set(procs) - {TARGET}
    return memory_view((), {}, [], [], procs, {TARGET} | workers, workers)


def _rows(uss_rates, main_rate: float = 0.0, seconds: int = 300, with_view: bool = True):
    procs = _procs(uss_rates, main_rate, seconds)
    latest = {pid: ss[-1] for pid, ss in procs.items()}
    gp = [GpuProcess(ts=T0 + seconds - 1, gpu_index=0, pid=TARGET, used_memory=20 * GiB, sm_util=90.0)]
    view = _view(uss_rates, main_rate, seconds) if with_view else None
    return build_rows(gp, latest, T0 + seconds - 1, target=TARGET, memory=view)


# --------------------------------------------------------------------------- the figures


def test_growth_reads_per_minute_with_its_sign():
    assert fmt_growth(40 * MiB / 60) == "+40M/min"
    assert fmt_growth(4.5 * MiB / 60) == "+4.5M/min"
    assert fmt_growth(1.2 * GiB / 60) == "+1.2G/min"
    assert fmt_growth(-3 * MiB / 60) == "-3.0M/min"


def test_the_workers_together_are_the_memory_views_figures():
    v = _view([40 * MiB / 60] * 3 + [0.0])
    p = v.private
    assert p is not None and (p.read, p.judged, p.growing) == (4, 4, 3)
    assert p.total == pytest.approx(sum(w.uss.used for w in v.workers))
    assert p.median_rate == pytest.approx(40 * MiB / 60, rel=0.01)
    assert p.total_rate == pytest.approx(3 * 40 * MiB / 60, rel=0.01)
    assert p.grows and p.cause == COPY_ON_READ
    # one of four is that worker's affair, not the workers' memory growing
    one = _view([40 * MiB / 60, 0.0, 0.0, 0.0]).private
    assert one.growing == 1 and not one.grows and one.cause is None
    flat = _view([0.0] * 4, main_rate=3 * MiB).private
    assert flat.growing == 0 and flat.median_rate == 0.0 and flat.total_rate == 0.0 and flat.cause == MAIN_LEAK


def test_no_uss_read_or_too_little_history():
    procs = {TARGET + 1: [ProcSample(ts=T0 + k, pid=TARGET + 1, rss=400 * MiB) for k in range(300)]}
    assert memory_view((), {}, [], [], procs, {TARGET, TARGET + 1}, {TARGET + 1}).private is None
    young = _view([40 * MiB / 60] * 2, seconds=40).private  # read, but not yet judged
    assert young.read == 2 and young.judged == 0 and young.growing == 0 and not young.grows
    assert young.total == pytest.approx(2 * (300 * MiB + 40 * MiB / 60 * 36), rel=0.01)


# --------------------------------------------------------------------------- the process table


def test_each_worker_row_carries_its_uss_and_its_rate_while_growing():
    rows = _rows([40 * MiB / 60, 40 * MiB / 60, 0.0])
    assert [r.job for r in rows] == ["job", "worker", "worker", "worker"]
    job, *workers = rows
    assert job.uss is None and job.uss_rate is None  # the main process is never read
    assert all(w.uss is not None and w.uss > 300 * MiB - 1 for w in workers)
    assert [w.uss_rate is not None for w in workers] == [True, True, False]
    assert workers[0].uss_rate == pytest.approx(40 * MiB / 60, rel=0.01)
    # No memory view (not attached yet, a paused snapshot before the first): no figure, no column.
    assert all(r.uss is None for r in _rows([40 * MiB / 60], with_view=False))


def test_the_uss_column_comes_with_a_reading_and_the_command_keeps_its_room():
    plain = _rows([0.0], with_view=False)
    assert table_columns(plain, 80) == COLUMNS  # as before: nothing added, nothing dropped
    assert command_room(COLUMNS, 80) == 17
    flat = _rows([0.0] * 3)
    cols = table_columns(flat, 80)
    keys = [k for k, _, _ in cols]
    assert keys == ["pid", "user", "gpu", "gpu_mem", "sm", "cpu", "rss", "uss", "command"]  # TIME gave way
    assert dict((k, w) for k, _, w in cols)["uss"] == 6 and command_room(cols, 80) >= MIN_COMMAND
    growing = _rows([40 * MiB / 60] * 3)
    cols = table_columns(growing, 80)
    assert [k for k, _, _ in cols] == ["pid", "gpu", "gpu_mem", "sm", "cpu", "rss", "uss", "command"]
    assert command_room(cols, 80) >= MIN_COMMAND
    wide = table_columns(growing, 120)
    assert [k for k, _, _ in wide] == ["pid", "user", "gpu", "gpu_mem", "sm", "cpu", "rss", "uss", "time", "command"]
    # a narrow terminal: the command keeps its room without any USS too
    assert [k for k, _, _ in table_columns(plain, 70)] == ["pid", "user", "gpu", "gpu_mem", "sm", "cpu", "rss", "command"]
    assert [k for k, _, _ in table_columns(plain, 60)] == ["pid", "gpu", "gpu_mem", "sm", "cpu", "rss", "command"]


def test_the_cells_line_the_figures_up_under_the_title():
    rows = _rows([40 * MiB / 60, 0.0])
    cols = table_columns(rows, 120)
    uss = [k for k, _, _ in cols].index("uss")
    title = cols[uss][1]
    cells = [row_cells(r, cols)[uss] for r in rows]
    assert title == "   USS"
    assert cells[0] == ""  # the job's main process: blank, not "n/a"
    grown, flat = cells[1], cells[2]
    assert grown.endswith("+40M/min") and len(grown) == len(flat) == cols[uss][2]
    assert grown[:6].strip() and grown[:6].endswith("M") and flat[:6].endswith("M")  # right-aligned as RSS
    assert row_cells(rows[1], cols)[-1].startswith("└ worker  ")
    assert row_cells(rows[0], cols)[-1].startswith("● ")


# --------------------------------------------------------------------------- the host's memory line


def _host() -> HostSample:
    return HostSample(ts=T0, cpu_percent=20.0, mem_total=64 * GiB, mem_used=16 * GiB, mem_available=48 * GiB,
                      swap_total=0, swap_used=0)


def test_the_host_memory_line_says_the_workers_total_and_its_growth():
    p = _view([40 * MiB / 60] * 4).private
    line = host_panel_lines(_host(), 160, 2, p)[1]
    assert "16.0G/64.0G  4 workers' USS " in line.plain and "+160M/min" in line.plain
    span = next(s for s in line.spans if line.plain[s.start:s.end] == " +160M/min")
    assert span.style == "yellow"  # the workers' memory grows: copy-on-read's look
    one = _view([40 * MiB / 60, 0.0, 0.0, 0.0]).private
    line = host_panel_lines(_host(), 160, 2, one)[1]
    assert "+40M/min" in line.plain
    assert next(s for s in line.spans if line.plain[s.start:s.end] == " +40M/min").style == "dim"
    flat = host_panel(_host(), 160, 2, _view([0.0]).private).plain
    assert "1 worker's USS 300.0M  SWP" in flat and "/min" not in flat
    assert "USS" not in host_panel(_host(), 160, 2).plain  # unattached: the line as before


# --------------------------------------------------------------------------- a replay


def test_a_replay_shows_the_recorded_uss_in_the_table(tmp_path):
    """The same pipeline from a recording: the workers' USS read back (schema version 2) reaches
    the memory view the replay's job stage publishes, and the table's worker rows."""
    from gputop.record.writer import RecordWriter, SessionMeta
    from gputop.session import open_replay
    from gputop.ui.gpu_panels import job_memory
    from synth_recording import TARGET_PID, SyntheticSession

    p = tmp_path / "cow.gputop"
    w = RecordWriter.create(p)
    w.start_session(SessionMeta(mode="fake", target_pid=TARGET_PID, target_cmdline="python train.py"))
    for b in SyntheticSession(worker_uss=lambda t, i: 200 * MiB + 40 * MiB / 60 * t).seconds(240):
        w.flush(b)
    w.finish()
    session = open_replay(p, start="90%", paused=True, views=True, advisor=False)
    try:
        for _ in range(2):  # the position's history, then the job stage's views of it
            session.pipeline.poll_once()
        memory = job_memory(session.store, TARGET_PID)
        assert memory is not None and memory.private is not None and memory.private.read == 3
        view = session.store
        rows = build_rows(view.gpu_processes(), view.procs_latest(), view.now, target=TARGET_PID, memory=memory)
        workers = [r for r in rows if r.job == "worker"]
        assert len(workers) == 3 and all(r.uss is not None and r.uss > 300 * MiB for r in workers)
        assert "uss" in [k for k, _, _ in table_columns(rows, 120)]
    finally:
        session.pipeline.stop()
