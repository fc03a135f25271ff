import pytest

from gputop.model import GpuProcess, ProcSample
from gputop.present.process_table import build_rows, sort_rows


def data():
    gp = [
        GpuProcess(ts=100, gpu_index=0, pid=10, used_memory=5 * 2**30, sm_util=90),
        GpuProcess(ts=100, gpu_index=1, pid=20, used_memory=9 * 2**30, sm_util=None),
        GpuProcess(ts=100, gpu_index=1, pid=30, used_memory=None, sm_util=10),
    ]
    procs = {
        10: ProcSample(ts=100, pid=10, user="alice", cmdline="python train.py", cpu_percent=150, rss=2**30, create_time=40),
        20: ProcSample(ts=100, pid=20, user="bob", cmdline="python eval.py", cpu_percent=20, rss=2**31, create_time=90),
    }
    return gp, procs


def test_join_and_default_sort_by_gpu_memory():
    rows = build_rows(*data(), now=100)
    assert [r.pid for r in rows] == [20, 10, 30]  # missing memory sorts last
    r10 = next(r for r in rows if r.pid == 10)
    assert r10.user == "alice" and r10.cpu == 150 and r10.elapsed == 60
    r30 = next(r for r in rows if r.pid == 30)
    assert r30.user is None and "not visible" in r30.command


def test_sort_directions_and_missing_last():
    rows = build_rows(*data(), now=100)
    assert [r.pid for r in sort_rows(rows, "pid")] == [10, 20, 30]
    assert [r.pid for r in sort_rows(rows, "pid", reverse=True)] == [30, 20, 10]
    assert [r.pid for r in sort_rows(rows, "sm")] == [10, 30, 20]
    assert [r.pid for r in sort_rows(rows, "sm", reverse=True)] == [30, 10, 20]
    assert [r.pid for r in sort_rows(rows, "command")] == [30, 20, 10]  # "(not visible…" sorts before letters
    with pytest.raises(ValueError):
        sort_rows(rows, "nope")


def test_filter_matches_pid_user_gpu_and_command():
    gp, procs = data()
    assert [r.pid for r in build_rows(gp, procs, 100, query="TRAIN")] == [10]
    assert [r.pid for r in build_rows(gp, procs, 100, query="bob")] == [20]
    assert {r.pid for r in build_rows(gp, procs, 100, query="gpu1")} == {20, 30}
    assert build_rows(gp, procs, 100, query="zzz") == []


def test_target_and_busy_cpu_processes_get_rows_without_a_gpu():
    gp, procs = data()
    procs = dict(procs)
    procs[40] = ProcSample(ts=100, pid=40, cmdline="python prep.py", cpu_percent=99, role="target")
    procs[50] = ProcSample(ts=100, pid=50, cmdline="ffmpeg", cpu_percent=300, role="cpu")
    procs[60] = ProcSample(ts=10, pid=60, cmdline="gone", cpu_percent=300, role="cpu")  # stale
    procs[70] = ProcSample(ts=100, pid=70, cmdline="worker", cpu_percent=300, role="worker")
    rows = build_rows(gp, procs, now=100, sort="cpu")
    assert [r.pid for r in rows] == [50, 10, 40, 20, 30]
    assert next(r for r in rows if r.pid == 40).gpu is None
    assert [r.pid for r in build_rows(gp, procs, 100, query="gpu1")] == [20, 30]


def test_attachable_rows():
    from gputop.present.process_table import ProcRow, attachable

    row = lambda pid, user, cmd="python x.py": ProcRow(pid, None, user, None, None, 1.0, None, None, cmd)  # noqa: E731
    assert not attachable(row(1, "root", "/sbin/init"), "alice", False, 999)
    assert not attachable(row(1, "root", "/sbin/init"), "root", True, 999)  # init is never the job
    assert not attachable(row(999, "alice"), "alice", False, 999)  # gputop itself
    assert not attachable(row(20, "bob"), "alice", False, 999)  # another user's: ptrace refuses
    assert attachable(row(20, "bob"), "root", True, 999) and attachable(row(10, "alice"), "alice", False, 999)


async def test_without_a_gpu_the_selection_starts_on_an_attachable_row_and_stays_on_its_process():
    """No GPU: PID 1 was selected at start and kept as rows re-sorted, so Enter attached to init
    ('permission denied'). The cursor starts on the top row the user can attach to. Then it
    followed whatever attachable row came on top as the table re-sorted by CPU, and Enter attached
    to another process that had just jumped above the user's job: now it stays on its process."""
    from textual.app import App

    from gputop.store import Store
    from gputop.ui.process_table import ProcessTable

    selected: list[str] = []

    class TableApp(App):
        def compose(self):
            yield ProcessTable(id="procs")

        def on_proc_list_selected(self, message) -> None:  # what Enter asks the app to attach to
            selected.append(message.key)

    def poll(store, t, cpu):
        users = {1: "root", 300: "root", 400: "alice", 500: "alice"}
        store.add([ProcSample(ts=t, pid=pid, user=users[pid], cmdline=f"cmd{pid}", cpu_percent=c, role="cpu")
                   for pid, c in cpu.items()])

    store = Store()
    app = TableApp()
    async with app.run_test(size=(100, 12)) as pilot:
        table = app.query_one(ProcessTable)
        table._me = ("alice", False)
        table.sort_by("cpu")
        poll(store, 100.0, {1: 0.0, 300: 0.0, 400: 0.0, 500: 0.0})  # the first reading: all 0 %
        table.show(store, None)
        await pilot.pause()
        assert table.rows[0].pid == 1 and table.selected.pid == 400  # init first; not selected
        poll(store, 101.0, {1: 1.0, 300: 50.0, 400: 5.0, 500: 80.0})  # re-sorted by CPU
        table.show(store, None)
        assert [r.pid for r in table.rows] == [500, 300, 400, 1] and table.selected.pid == 400
        table.focus()
        await pilot.press("enter")  # Enter attaches to the process the cursor was on
        await pilot.pause()
        assert selected == [table.keys[table.cursor]] and table.selected.pid == 400
        poll(store, 103.0, {1: 2.0, 300: 90.0, 400: 1.0, 500: 99.0})  # re-sorted again: 400 last
        table.show(store, None)
        assert table.rows[-1].pid == 400 and table.selected.pid == 400


def test_the_attached_job_comes_first_with_its_workers_under_it():
    from gputop.model import GpuProcess, ProcSample
    from gputop.present.process_table import build_rows

    now = 100.0
    gpu = [GpuProcess(ts=now, gpu_index=0, pid=50, used_memory=9 * 2**30),
           GpuProcess(ts=now, gpu_index=1, pid=10, used_memory=2 * 2**30),
           GpuProcess(ts=now, gpu_index=1, pid=11, used_memory=2 * 2**30)]
    procs = {
        50: ProcSample(ts=now, pid=50, ppid=1, name="other", cmdline="other job"),
        10: ProcSample(ts=now, pid=10, ppid=1, name="python", cmdline="python train.py", role="target"),
        11: ProcSample(ts=now, pid=11, ppid=10, name="python", cmdline="python rank1", role="worker"),
        12: ProcSample(ts=now, pid=12, ppid=11, name="pt_data_worker", cmdline="pt_data_worker", role="worker"),
        13: ProcSample(ts=now - 60, pid=13, ppid=10, name="gone", role="worker"),  # stale: no row
    }
    rows = build_rows(gpu, procs, now, target=10, ranks={10: 0, 11: 1})
    assert [(r.pid, r.job) for r in rows] == [(10, "rank 0"), (11, "rank 1"), (12, "worker"), (50, "")]
    # Not attached: as sorted (GPU memory), nobody grouped, no workers listed.
    assert [r.pid for r in build_rows(gpu, procs, now)] == [50, 10, 11]


def test_attached_to_a_launcher_the_job_leads_launcher_first_each_rank_with_its_workers():
    """torchrun on a host without GPUs: rank 0 led ("● rank 0"), unrelated busy processes came
    next, then rank 1 unnamed and the launcher 11th. The job leads: the launcher, each rank named
    under it in rank order, each rank's DataLoader workers under that rank."""
    from gputop.present.process_table import COLUMNS, row_cells

    now = 100.0
    procs = {
        # the ranks' parent; on a GPU host it is read for the table alone (role "gpu", no GPU)
        900: ProcSample(ts=now, pid=900, ppid=1, cmdline="python -m torch.distributed.run ddp.py", cpu_percent=1,
                        role="gpu"),
        901: ProcSample(ts=now, pid=901, ppid=900, cmdline="python ddp.py", cpu_percent=60, role="target"),
        902: ProcSample(ts=now, pid=902, ppid=900, cmdline="python ddp.py", cpu_percent=90, role="cpu"),
        911: ProcSample(ts=now, pid=911, ppid=901, cmdline="python ddp.py", cpu_percent=5, role="worker"),
        912: ProcSample(ts=now, pid=912, ppid=902, cmdline="python ddp.py", cpu_percent=5, role="worker"),
        **{p: ProcSample(ts=now, pid=p, ppid=1, cmdline=f"busy{p}", cpu_percent=70 + p % 10, role="cpu")
           for p in range(200, 209)},
    }
    # the session follows rank 0 for a launcher's PID
    rows = build_rows([], procs, now, sort="cpu", target=901, ranks={901: 0, 902: 1})
    assert [(r.pid, r.job, r.depth) for r in rows[:5]] == [
        (900, "launcher", 0), (901, "rank 0", 1), (911, "worker", 2), (902, "rank 1", 1), (912, "worker", 2)]
    assert all(not r.job for r in rows[5:]) and len(rows) == 14
    commands = [row_cells(r, COLUMNS)[-1] for r in rows[:4]]
    assert commands == ["● launcher  python -m torch.distributed.run ddp.py", "└ rank 0  python ddp.py",
                        "  └ worker  python ddp.py", "└ rank 1  python ddp.py"]
    # the launcher not read (a recording from before): the ranks lead, each a head of its own
    del procs[900]
    rows = build_rows([], procs, now, sort="cpu", target=902, ranks={901: 0, 902: 1})
    assert [(r.pid, r.job, r.depth) for r in rows[:4]] == [
        (901, "rank 0", 0), (911, "worker", 1), (902, "rank 1", 0), (912, "worker", 1)]
