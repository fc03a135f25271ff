"""Who a GPU process is, for labels a fleet can group by: command, user, container, pod.

The container and the Kubernetes pod come from ``/proc/PID/cgroup``: the runtimes name the
cgroup after the container id and the kubelet after the pod's UID, on cgroup v1 and v2 alike.
The pod's UID joins ``kube_pod_info{uid=...}`` of kube-state-metrics for its name and namespace;
reading the name here would need the API server, which a node agent should not talk to.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

# kubepods-burstable-pod1f0b..._slice (systemd driver, '_' for '-') or /kubepods/pod1f0b.../ (cgroupfs)
_POD_RE = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
# docker-<id>.scope, cri-containerd-<id>.scope, crio-<id>.scope, libpod-<id>.scope, or a bare <id>
_CONTAINER_RE = re.compile(r"(?:^|[/-])([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True, slots=True)
class Placement:
    container_id: str = ""
    pod_uid: str = ""


def parse_cgroup(text: str) -> Placement:
    """The container id and pod UID named by a ``/proc/PID/cgroup`` file, '' where none."""
    container = pod = ""
    for line in text.splitlines():
        path = line.split(":", 2)[-1].strip()
        if not path:
            continue
        if not pod:
            m = _POD_RE.search(path)
            if m:
                pod = m.group(1).replace("_", "-")
        if not container:
            m = _CONTAINER_RE.search(path.rstrip("/"))
            if m:
                container = m.group(1)
    return Placement(container_id=container, pod_uid=pod)


def read_placement(pid: int) -> Placement:
    """``parse_cgroup`` of a live process; an empty Placement when it cannot be read (gone, a
    fake PID, another PID namespace)."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            return parse_cgroup(f.read())
    except OSError:
        return Placement()


def script_of(cmdline: str) -> str:
    """The program a Python command line runs: ``train.py`` or ``-m torch.distributed.run``.

    Only this part of the (already redacted) command line becomes a label: arguments carry data
    paths, run names and sometimes secrets a redactor cannot know, and every distinct value is
    a new series in Prometheus.
    """
    try:
        argv = shlex.split(cmdline)
    except ValueError:
        argv = cmdline.split()
    for i, arg in enumerate(argv[1:], 1):
        if arg == "-m" and i + 1 < len(argv):
            return f"-m {argv[i + 1]}"
        if arg.startswith("-m") and len(arg) > 2:
            return f"-m {arg[2:]}"
        if arg.endswith(".py"):
            return arg.rsplit("/", 1)[-1]
    return argv[0].rsplit("/", 1)[-1] if argv else ""
