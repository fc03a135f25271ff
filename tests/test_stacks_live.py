"""Real py-spy against real PyTorch CPU training loops (tests/stack_targets.py).

The targets start once per module, in parallel (importing torch is most of their cost), and
are killed at the end whatever happens. Needs py-spy and ptrace rights (root in CI).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import redirect_stderr, redirect_stdout

import pytest

psutil = pytest.importorskip("psutil")

from gputop.ui.pane import PaneContext
from gputop.analysis.stacks_summary import category_shares  # noqa: E402

from gputop.analysis.window import stacks_view  # noqa: E402
from gputop.analysis.watch import StuckWatch  # noqa: E402
from gputop.analysis.window import stuck_verdict  # noqa: E402
from gputop.cli import main as cli_main  # noqa: E402
from gputop.model import Category, Event, GpuProcess, GpuSample, ProcSample, StackSample  # noqa: E402
from gputop.pipeline import Pipeline  # noqa: E402
from gputop.session import stack_sampler  # noqa: E402
from gputop.sources.stacks import (  # noqa: E402
    PYSPY_ENV,
    AttachError,
    PySpySource,
    PtraceFacts,
    permission_advice,
    ptrace_facts,
    check_attachable,
    find_pyspy,
    native_dump,
)
from gputop.sources.pyspy_binary import _classify_failure  # noqa: E402
from gputop.present.stacks import plain  # noqa: E402
from gputop.store import Store  # noqa: E402
from proc_helpers import kill_tree  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(180),
    # Looked up, not imported: torch in this process would make every later test's garbage
    # collections walk its objects (the targets import it, in their own processes).
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the targets need torch"),
    pytest.mark.skipif(find_pyspy() is None, reason="py-spy not installed"),
]

TARGETS = os.path.join(os.path.dirname(__file__), "stack_targets.py")


@pytest.fixture(scope="module", autouse=True)
def spare_cpus():
    """These check what the stacks say, not how the sampler yields to a saturated host (that is
    tests/test_newuser4_sampler_load.py): the machine running them may be busy, the targets are
    told apart from it."""
    from gputop.sources import stacks as stacks_mod
    from gputop.sources.host_cpu import HostCpu

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stacks_mod, "read_host_cpu", lambda: HostCpu(cpus=16, load1=0.5))
        yield
STUCK_AFTER = 3.0  # short threshold for the test; the default is 30 s


def marker_line(marker: str) -> int:
    with open(TARGETS) as f:
        for n, text in enumerate(f, 1):
            if marker in text:
                return n
    raise AssertionError(marker)


class Target:
    def __init__(self, *argv: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self.pid = self.proc.pid

    def wait_ready(self, timeout: float = 90.0) -> None:
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), True)
        end = time.time() + timeout
        while time.time() < end:
            line = self.proc.stdout.readline()
            if line.strip() == "ready":
                return
            if not line and self.proc.poll() is not None:
                raise RuntimeError(f"target {self.proc.args} exited with {self.proc.returncode}")
        raise RuntimeError("target never got ready")

    def kill(self) -> None:
        kill_tree(self.proc)


@pytest.fixture(scope="module")
def targets():
    started: dict[str, Target] = {}
    try:
        for mode in ("loader", "item", "deadlock", "exit"):
            started[mode] = Target(TARGETS, mode)
        started["plain"] = Target("-c", "import time; print('ready', flush=True); time.sleep(600)")
        for t in started.values():
            t.wait_ready()
        try:
            check_attachable(started["plain"].pid)
        except AttachError as exc:
            pytest.skip(f"py-spy cannot attach here: {exc}")
        yield started
    finally:
        for t in started.values():
            t.kill()


def poll_for(src: PySpySource, seconds: float) -> list[object]:
    out: list[object] = []
    end = time.time() + seconds
    while time.time() < end:
        out.extend(src.poll())
        time.sleep(src.interval)
    return out


class IdleGpu:
    """A GPU source saying ``pid`` holds an idle GPU: the job's GPU work has stopped."""

    name = "idle-gpu"
    interval = 0.5

    def __init__(self, pid):
        self.pid = pid

    def poll(self):
        now = time.time()
        return [GpuSample(ts=now, index=0, util_gpu=0.0), GpuProcess(ts=now, gpu_index=0, pid=self.pid)]

    def close(self):
        pass


def stacks(samples, pid=None, main=None):
    return [
        s for s in samples
        if isinstance(s, StackSample) and (pid is None or s.pid == pid) and (main is None or s.is_main == main)
    ]


# --------------------------------------------------------------------------- categories


@pytest.fixture(scope="module")
def sampled(targets):
    """3 s of samples of the DataLoader job and of the host-sync job, taken side by side (each
    sampler watches its own process). The host-sync job is stopped then: no other test watches it,
    and it keeps a core busy."""
    sources = {
        "loader": stack_sampler(targets["loader"].pid, worker_interval=0.2, target_details=True),
        "item": stack_sampler(targets["item"].pid),
    }
    try:
        with ThreadPoolExecutor(max_workers=len(sources)) as pool:
            futures = {name: pool.submit(poll_for, src, 3.0) for name, src in sources.items()}
            return {name: f.result() for name, f in futures.items()}
    finally:
        targets["item"].kill()


def test_dataloader_job_waits_on_data_and_workers_fetch(targets, sampled):
    t = targets["loader"]
    out = sampled["loader"]
    main = stacks(out, t.pid, main=True)
    assert len(main) >= 8
    shares = dict(category_shares(main))
    # Workers sleep in __getitem__: the main process spends its time waiting on their queue.
    assert shares.get(Category.DATA_WAIT, 0) >= 0.6, shares
    # py-spy calls a thread blocked on the queue idle: those samples are kept and classified.
    assert any(not s.active for s in main if s.category is Category.DATA_WAIT)
    workers = {p.pid: p for p in out if isinstance(p, ProcSample) and p.role == "worker"}
    assert len(workers) == 2
    assert all(p.ppid == t.pid and p.status for p in workers.values())
    assert any(p.cpu_percent is not None for p in workers.values())
    wstacks = [s for s in stacks(out, main=True) if s.pid in workers]
    assert {s.pid for s in wstacks} == set(workers)
    assert Category.DATA_FETCH in {s.category for s in wstacks}
    target = [p for p in out if isinstance(p, ProcSample) and p.role == "target"]
    assert target and "stack_targets.py loader" in target[-1].cmdline
    # Samples are on the time.time() clock.
    assert abs(main[-1].ts - time.time()) < 5


def test_item_every_step_is_host_sync(targets, sampled):
    t = targets["item"]
    out = sampled["item"]
    main = stacks(out, t.pid, main=True)
    # In a live session the host source reports the target's process details, not this one.
    assert not [p for p in out if isinstance(p, ProcSample)]
    shares = category_shares(main)
    assert shares[0][0] is Category.HOST_SYNC, shares
    line = marker_line("# HOT host-sync")
    # (a dump caught between frames can come back empty on a loaded machine: it is skipped)
    assert any(s.frames and s.frames[0].line == line and ".item()" in (s.frames[0].code or "") for s in main)


# --------------------------------------------------------------------------- stuck


def test_deadlocked_job_is_reported_stuck_at_the_lock_line(targets, busy_watch):
    # busy_watch: started here, so the busy job's watch runs during this test and the next ones.
    t = targets["deadlock"]
    store = Store()
    src = stack_sampler(t.pid)
    pipe = Pipeline(store, [src, StuckWatch(store, t.pid, STUCK_AFTER)])
    pipe.start()
    try:
        # Wait bound, not a speed claim: the verdict must come within threshold + a few seconds.
        deadline = time.time() + STUCK_AFTER + 10.0
        verdict = stuck_verdict(store, t.pid, STUCK_AFTER, now=time.time())

        def said_stuck() -> bool:
            return any(e.source == "stuck" for e in store.events())

        # The pane's verdict and the stuck watch's one-time event are decided on separate threads:
        # wait (within the same bound) for both.
        while not (verdict.stuck and said_stuck()) and time.time() < deadline:
            time.sleep(0.2)
            verdict = stuck_verdict(store, t.pid, STUCK_AFTER, now=time.time())
    finally:
        pipe.stop()
    assert verdict.stuck, verdict.reason
    assert verdict.held_s >= STUCK_AFTER
    assert verdict.where == f"tests/stack_targets.py:{marker_line('# DEADLOCK')} in mode_deadlock"
    assert verdict.category is Category.IDLE
    assert "metrics-writer" in [s.thread_name for s in verdict.others]
    events = [e for e in store.events() if e.source == "stuck"]
    assert events and "looks stuck" in events[0].message and "stack_targets.py" in events[0].message

    # The pane says it plainly.
    view = stacks_view(store, t.pid, STUCK_AFTER, now=time.time())
    from gputop.present.stacks import stacks_pane_lines

    text = plain(stacks_pane_lines(view))
    assert "STUCK: PID" in text and f"stack_targets.py:{marker_line('# DEADLOCK')}" in text
    assert "metrics-writer" in text and "press n for a native" in text


def test_the_stacks_tab_the_stuck_event_and_the_advisor_agree_on_a_hung_job(targets):
    """One window a tick (the session's job stage): on a real deadlocked CPU job the Stacks tab's
    verdict, the stuck watch's event and the advisor's stuck finding name the same place, from
    the same verdict."""
    from gputop.advisor.engine import AdvisorSource
    from gputop.advisor.stage import JobStage
    from gputop.analysis.views import ViewsStage

    t = targets["deadlock"]
    store = Store()
    stage = JobStage(store, t.pid, stuck_after_s=STUCK_AFTER,
                     advisor=AdvisorSource(store, target_pid=t.pid, stuck_after_s=STUCK_AFTER),
                     stuck_watch=StuckWatch(store, t.pid, STUCK_AFTER), views=ViewsStage(store, t.pid, STUCK_AFTER))
    pipe = Pipeline(store, [stack_sampler(t.pid), stage])
    pipe.start()
    try:
        deadline = time.time() + STUCK_AFTER + 15.0  # a bound, not a speed claim

        def all_three() -> bool:
            views = store.pane_views()
            return (any(e.source == "stuck" for e in store.events()) and any(f.id == "stuck" for f in store.findings())
                    and views is not None and views.stacks is not None and views.stacks.verdict.stuck)

        while not all_three() and time.time() < deadline:
            time.sleep(0.2)
    finally:
        pipe.stop()
    assert all_three(), [e.message for e in store.events()]
    place = f"tests/stack_targets.py:{marker_line('# DEADLOCK')} in mode_deadlock"
    tab = store.pane_views().stacks.verdict
    event = next(e for e in store.events() if e.source == "stuck")
    finding = next(f for f in store.findings() if f.id == "stuck")
    assert tab.where == place
    assert place in event.message
    assert any(place in line for line in finding.evidence), finding.evidence
    # The tab's verdict is the one the advisor's last evaluation judged, not a second judgement.
    assert stage.advisor.advisor.last_context.stuck.where == tab.where


async def test_pane_native_dump_runs_off_the_event_loop(targets):
    from textual.app import App
    from textual.containers import VerticalScroll

    from gputop.ui.stacks_pane import StacksPane

    from gputop.analysis.views import ViewsStage

    t = targets["deadlock"]
    store = Store()
    src = stack_sampler(t.pid)
    store.add(src.poll())
    store.add(ViewsStage(store, t.pid, STUCK_AFTER).poll())  # what the UI session's views stage publishes

    # The dump waits for the test's word: on a loaded host a real dump once ended before the first
    # look, so "running" was never seen. Held, it proves the loop stays free while a dump runs.
    release = threading.Event()

    def held_dump(pid: int) -> str:
        release.wait(60)
        return native_dump(pid)

    class Host(App):
        def compose(self):
            yield StacksPane(native_dump=held_dump, id="stacks-pane")

    app = Host()
    async with app.run_test(size=(120, 50)) as pilot:
        pane = app.query_one(StacksPane)
        pane.update_view(PaneContext(store, t.pid))
        assert "mode_deadlock" in plain(pane.last_lines)
        pane.query_one(VerticalScroll).focus()
        await pilot.press("n")
        # The key is handled on the event loop, which stays free while the dump runs: the pane says
        # so within a few frames (once in CI the first look came a frame early).
        for _ in range(40):
            if "running py-spy dump --native" in plain(pane.last_lines):
                break
            await pilot.pause(0.05)
        assert "running py-spy dump --native" in plain(pane.last_lines)
        await pilot.press("n")  # a second press while one runs starts nothing
        assert "running py-spy dump --native" in plain(pane.last_lines)
        release.set()
        for _ in range(300):
            await pilot.pause(0.05)
            if "Native dump of PID" in plain(pane.last_lines):
                break
        text = plain(pane.last_lines)
    assert f"Native dump of PID {t.pid}" in text
    assert "mode_deadlock" in text  # py-spy's native output still names the Python frame


# --------------------------------------------------------------------------- faults


def test_target_exit_is_reported_with_its_code_and_history_kept(targets):
    t = targets["exit"]
    store = Store()
    src = stack_sampler(t.pid)
    for _ in range(3):
        store.add(src.poll())
        time.sleep(0.1)
    before = len(store.stack_window(0))
    assert before > 0
    os.kill(t.pid, signal.SIGUSR1)
    for _ in range(100):
        store.add(src.poll())
        if src.exited is not None:
            break
        time.sleep(0.1)
    assert src.exited is not None
    exits = [e for e in store.events() if "exited" in e.message]
    assert len(exits) == 1 and "with code 3" in exits[0].message and str(t.pid) in exits[0].message
    assert store.latest_proc(t.pid).status == "exited"
    assert src.poll() == []  # sampling stopped ...
    assert len(store.stack_window(0)) == before or len(store.stack_window(0)) > before  # ... history kept
    view = stacks_view(store, t.pid, 30.0)
    assert view.exited and view.fault is not None and "code 3" in view.fault.message
    assert not view.verdict.stuck


class BusyWatch:
    """A job that computes for ever on one line (C code under one Python line): the stack never
    moves, as in a slow __getitem__ with num_workers=0, but the process burns a core. Watched with
    the stuck threshold from the moment the first test asks for it."""

    def __init__(self) -> None:
        self.spin = Target("-c", "print('ready', flush=True)\nwhile True: x = sum(range(100000))")
        self.pipe = None
        try:
            self.spin.wait_ready()
            self.store = Store()
            src = stack_sampler(self.spin.pid, target_details=True)
            self.pipe = Pipeline(self.store, [src, IdleGpu(self.spin.pid), StuckWatch(self.store, self.spin.pid, STUCK_AFTER)])
            self.pipe.start()
            self.started = time.monotonic()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.pipe is not None:
            self.pipe.stop()
        self.spin.kill()


@pytest.fixture(scope="module")
def busy_watch(targets):
    """Asked for by the deadlock test, which starts it, and read by the busy-job test at the end
    of this section: the watch runs during the tests between them."""
    watch = BusyWatch()
    try:
        yield watch
    finally:
        watch.close()


def test_busy_job_with_an_unchanged_stack_is_not_stuck(busy_watch):
    w = busy_watch
    try:
        time.sleep(max(0.0, w.started + STUCK_AFTER + 4.0 - time.monotonic()))
        w.pipe.stop()
        verdict = stuck_verdict(w.store, w.spin.pid, STUCK_AFTER, now=w.store.now)
    finally:
        w.close()
    assert verdict.held_s >= STUCK_AFTER, verdict.reason  # the stack did not move...
    assert not verdict.stuck and "% CPU" in verdict.reason, verdict.reason  # ...yet it works
    assert verdict.tree_cores is not None and verdict.tree_cores >= 0.2
    assert [e.message for e in w.store.events() if e.source == "stuck"] == []


def test_not_python_process(targets):
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        with pytest.raises(AttachError) as exc:
            check_attachable(sleeper.pid)
        assert exc.value.kind == "not-python" and "not a Python process" in str(exc.value)
        src = stack_sampler(sleeper.pid, target_details=True)
        first = src.poll()
        # CPU monitoring still works; stacks do not, said once.
        assert any(isinstance(s, ProcSample) and s.role == "target" for s in first)
        errs = [e for e in first if isinstance(e, Event)]
        assert len(errs) == 1 and "not a Python process" in errs[0].message
        assert not [e for e in src.poll() if isinstance(e, Event)]
    finally:
        sleeper.kill()
        sleeper.wait()


def test_no_such_process():
    pid = 4_000_000  # above Linux's pid_max limit
    with pytest.raises(AttachError) as exc:
        check_attachable(pid)
    assert exc.value.kind == "gone" and str(exc.value) == f"no process with PID {pid}"
    src = stack_sampler(pid)
    out = src.poll()
    assert [e.message for e in out if isinstance(e, Event)] == [f"no process with PID {pid}"]
    assert src.poll() == []


def test_pyspy_missing_or_unrunnable(targets, monkeypatch):
    pid = targets["plain"].pid
    with pytest.raises(AttachError) as exc:
        check_attachable(pid, pyspy="/nonexistent/py-spy")
    assert exc.value.kind == "pyspy-missing"
    monkeypatch.setenv(PYSPY_ENV, "/nonexistent/py-spy")
    assert find_pyspy() is None
    with pytest.raises(AttachError) as exc:
        check_attachable(pid)
    assert "pip install py-spy" in str(exc.value)
    src = stack_sampler(pid, target_details=True)
    out = src.poll()
    assert any(isinstance(e, Event) and "py-spy not found" in e.message for e in out)
    assert any(isinstance(s, ProcSample) for s in out)


def test_pyspy_found_next_to_the_interpreter(monkeypatch):
    monkeypatch.delenv(PYSPY_ENV, raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    path = find_pyspy()
    assert path is not None and os.access(path, os.X_OK)


def test_permission_denied_message_says_how_to_fix():
    # py-spy's own words when ptrace is refused.
    err = _classify_failure(os.getpid(), "Permission Denied: Try running again with elevated permissions by going 'sudo env \"PATH=$PATH\" !!'", 1)
    assert err.kind == "permission"
    msg = str(err)
    assert "\n" not in msg and msg.startswith(f"permission denied reading PID {os.getpid()}'s stacks: ")
    assert msg.endswith(permission_advice(os.getpid()))


ROOT_UID, ME, OTHER = 0, 4_242_424, 4_242_425  # uids no box has a name for


def _facts(**kw):
    base = dict(euid=ME, target_uid=ME, ptrace_scope=None, cap_sys_ptrace=False, exe_readable=True)
    return PtraceFacts(**{**base, **kw})


@pytest.mark.parametrize("facts, says, never", [
    # The new user's case: root, with the capability, no Yama, /proc/1/exe unreadable.
    (_facts(euid=ROOT_UID, target_uid=ROOT_UID, cap_sys_ptrace=True, exe_readable=False),
     ["runs as root with CAP_SYS_PTRACE, no kernel.yama.ptrace_scope", "/proc/1/exe is unreadable",
      "another container or PID namespace"],
     ["same user", "sysctl", "--cap-add", "run gputop as root"]),
    # Another user's process: that is the cause, not Yama or a capability.
    (_facts(target_uid=OTHER, exe_readable=False, ptrace_scope=1),
     ["belongs to uid 4242425", "run gputop as uid 4242425 or as root"], ["ptrace_scope", "CAP_SYS_PTRACE", "exe"]),
    # Root without the capability (a container) reading another user's process.
    (_facts(target_uid=ROOT_UID, exe_readable=False),
     ["belongs to root and gputop runs as uid 4242424: run gputop as root"], ["or as root", "ptrace_scope"]),
    (_facts(euid=ROOT_UID, target_uid=OTHER, exe_readable=False),
     ["runs as root without CAP_SYS_PTRACE", "--cap-add SYS_PTRACE"], ["sysctl", "exe"]),
    # Same user, Yama 1: only its children.
    (_facts(ptrace_scope=1), ["kernel.yama.ptrace_scope=1", "run gputop as root", "ptrace_scope=0"],
     ["--cap-add", "same user"]),
    (_facts(ptrace_scope=2), ["kernel.yama.ptrace_scope=2", "only CAP_SYS_PTRACE"], ["ptrace_scope=0"]),
    (_facts(euid=ROOT_UID, target_uid=ROOT_UID, cap_sys_ptrace=True, ptrace_scope=3),
     ["kernel.yama.ptrace_scope=3", "reboot"], ["--cap-add", "run gputop as root"]),
    # Yama 1 does not stop a process holding CAP_SYS_PTRACE: not blamed.
    (_facts(euid=ROOT_UID, target_uid=ROOT_UID, ptrace_scope=1, cap_sys_ptrace=True),
     ["kernel.yama.ptrace_scope=1 and /proc/1/exe readable", "security module"], ["sysctl", "--cap-add"]),
    (_facts(euid=ROOT_UID, target_uid=ROOT_UID), ["without CAP_SYS_PTRACE", "--cap-add SYS_PTRACE"], ["sysctl"]),
])
def test_permission_advice_says_which_applies(facts, says, never):
    msg = permission_advice(1, facts)
    assert "\n" not in msg
    for s in says:
        assert s in msg, (s, msg)
    for s in never:
        assert s not in msg, (s, msg)


def test_ptrace_facts_read_this_process():
    f = ptrace_facts(os.getpid())
    assert f.euid == os.geteuid() and f.target_uid == os.geteuid() and f.exe_readable
    assert (f.ptrace_scope is None) == (not os.path.exists("/proc/sys/kernel/yama/ptrace_scope"))
    assert ptrace_facts(2**31 - 2).target_uid is None  # no such process
    assert not ptrace_facts(2**31 - 2).exe_readable


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None, reason="needs root and runuser")
def test_permission_denied_for_real(targets):
    # py-spy run as 'nobody' against a root-owned target: the kernel refuses.
    tmp = tempfile.mkdtemp(prefix="gputop-perm-")
    try:
        os.chmod(tmp, 0o755)
        spy = os.path.join(tmp, "py-spy")
        shutil.copy(find_pyspy(), spy)
        os.chmod(spy, 0o755)
        wrapper = os.path.join(tmp, "as-nobody")
        with open(wrapper, "w") as f:
            f.write(f'#!/bin/sh\nexec runuser -u nobody -- {spy} "$@"\n')
        os.chmod(wrapper, 0o755)
        with pytest.raises(AttachError) as exc:
            check_attachable(targets["plain"].pid, pyspy=wrapper)
        # py-spy ran as nobody, gputop as root: the message is gputop's view, on one line.
        assert exc.value.kind == "permission" and "\n" not in str(exc.value)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- gputop stacks


def run_cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = cli_main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def test_stacks_command_text_and_json(targets):
    pid = targets["loader"].pid
    rc, out, _ = run_cli("stacks", "--pid", str(pid))
    assert rc == 0
    assert f"PID {pid}" in out and "MainThread" in out and "data-wait" in out
    assert out.count("worker PID") == 2 and "data-fetch" in out
    assert "frames of the parent at fork time" in out
    rc, out, _ = run_cli("stacks", "--pid", str(pid), "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["pid"] == pid
    main = [t for t in doc["threads"] if t["main"]]
    assert main and main[0]["category"] in ("data-wait", "data-fetch")
    assert len(doc["workers"]) == 2
    assert all(w["threads"] and w["category"] for w in doc["workers"])


def test_stacks_command_bad_input():
    rc, out, err = run_cli("stacks", "--pid", "4000000")
    assert rc == 2 and out == "" and err.strip() == "gputop stacks: error: no process with PID 4000000"
    rc, _, err = run_cli("stacks")
    assert rc == 2 and "--pid" in err
