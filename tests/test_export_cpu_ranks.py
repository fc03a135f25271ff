"""`--attach all` on a host without a GPU: CPU ranks (gloo) found by their launcher's environment,
within the same budget; `--attach-under` narrows to one process tree; `--host-label`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("prometheus_client")

from gputop.export.attach import Attacher  # noqa: E402
from gputop.export.cpu_ranks import RankScanner, is_under, names_a_rank, parent_of  # noqa: E402
from gputop.model import GpuProcess, GpuSample  # noqa: E402
from gputop.store import Store  # noqa: E402
from attach_fakes import FakeSampler, attach_session  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANK_ENV = b"PATH=/bin\0RANK=1\0WORLD_SIZE=4\0MASTER_PORT=29500\0"


def _attacher(store, ranks, **kw):
    session = attach_session(store)
    return Attacher(session, FakeSampler, python=lambda pid: True, check=lambda pid: None, ranks=ranks, **kw)


def test_a_rank_is_named_by_rank_and_world_size_and_the_launcher_is_not():
    assert names_a_rank(RANK_ENV)
    assert not names_a_rank(b"PATH=/bin\0RANK=1\0")  # a RANK alone is too common a name
    assert not names_a_rank(b"PATH=/bin\0TORCHELASTIC_RUN_ID=x\0MASTER_PORT=29500\0")  # torchrun itself
    assert not names_a_rank(b"")


def test_the_scanner_reads_each_process_once_and_forgets_the_gone():
    live = {10, 11, 12}
    reads: list[int] = []

    def environ(pid):
        reads.append(pid)
        return RANK_ENV if pid in (11, 13) else b"A=1\0"

    scan = RankScanner(python=lambda pid: pid != 12, pids=lambda: live, environ=environ)
    assert scan() == [11]
    assert scan() == [11] and sorted(reads) == [10, 11]  # not read again; 12 is no Python
    live.discard(11)
    live.add(13)
    assert scan() == [13]


def test_cpu_ranks_are_attached_only_where_there_is_no_gpu_within_the_budget():
    store = Store()
    att = _attacher(store, ranks=lambda: [301, 302, 303], max_attach=2)
    events = att.poll()
    assert att.pids() == [301, 302]
    assert any("--max-attach" in e.message for e in events)
    gpu_host = Store()
    gpu_host.add([GpuSample(1.0, 0, util_gpu=10.0), GpuProcess(1.0, 0, 900, used_memory=1 << 30)])
    att = _attacher(gpu_host, ranks=lambda: [301])
    att.poll()
    assert att.pids() == [900]  # on a GPU host the budget goes to the GPUs' processes


def test_attach_under_keeps_to_one_process_tree():
    parents = {301: 300, 300: 200, 302: 250, 250: 1}
    att = _attacher(Store(), ranks=lambda: [301, 302], under=lambda p: is_under(p, 200, parents.get))
    att.poll()
    assert att.pids() == [301]
    assert is_under(200, 200, parents.get) and not is_under(302, 200, parents.get)
    assert not is_under(999, 200, parents.get)  # its parent unknown: gone


def test_parent_of_reads_this_process():
    assert parent_of(os.getpid()) == os.getppid()
    assert is_under(os.getpid(), os.getppid())


def test_a_real_rank_process_is_found_by_the_scanner():
    from gputop.export.attach import is_python

    env = dict(os.environ, RANK="0", WORLD_SIZE="1")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        assert child.pid in RankScanner(is_python)()
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("args, words", [
    (["--host-label", "node a"], "--host-label: not a host name: 'node a'"),
    (["--attach-under", "1"], "go with --attach all"),
])
def test_bad_host_label_or_a_lone_option_is_one_line(args, words):
    p = subprocess.run([sys.executable, "-m", "gputop", "export", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0 and words in p.stderr, p.stderr
    assert sum("error" in line for line in p.stderr.splitlines()) == 1  # one error line (after argparse's usage)
