"""The busiest processes the host source follows leave out Linux kernel threads: they have no
memory or command line to show, and on an idle host they crowded the process table with rows of
'n/a' and 0 B (a new user's report)."""

from types import SimpleNamespace

from gputop.sources import host


def test_kernel_threads_are_not_among_the_busiest(monkeypatch):
    procs = [SimpleNamespace(pid=2, info={"cpu_percent": 3.0, "ppid": 0}),  # kthreadd
             SimpleNamespace(pid=15, info={"cpu_percent": 9.0, "ppid": 2}),  # rcu_preempt
             SimpleNamespace(pid=4000, info={"cpu_percent": 5.0, "ppid": 1}),
             SimpleNamespace(pid=4001, info={"cpu_percent": 1.0, "ppid": 4000}),
             SimpleNamespace(pid=4002, info={"cpu_percent": 0.0, "ppid": 4000})]
    monkeypatch.setattr(host.psutil, "process_iter", lambda attrs=None: iter(procs))
    src = host.HostSource.__new__(host.HostSource)
    assert src._busiest(10) == {4000, 4001}
    assert src._busiest(1) == {4000}
