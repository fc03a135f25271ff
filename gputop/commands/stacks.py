"""`gputop stacks --pid PID`: one dump of every thread and DataLoader worker, with categories.

For scripts and bug reports: plain text (or ``--json``) on stdout, nothing interactive.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import UserError
from .options import pid_arg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "stacks",
        help="print the Python stacks of a process and its workers, classified (one shot)",
        description="Dump all threads of a Python process and of its child processes (DataLoader "
        "workers), each with what it is doing (data-wait, forward, host-sync, ...).",
    )
    # Not required by the parser: `gputop --pid PID stacks` gives it before the command. The usage
    # line is written out so that it says it is needed, as the help does (argparse's own showed
    # "[-p PID]", read as optional).
    p.usage = "%(prog)s [-h] -p PID [--json] [--native]"
    p.add_argument("-p", "--pid", type=pid_arg, default=argparse.SUPPRESS,
                   help="process id (required; also taken before the command: gputop --pid PID stacks)")
    p.add_argument("--json", action="store_true", help="JSON instead of text")
    p.add_argument(
        "--native",
        action="store_true",
        help="also dump native (C/C++/CUDA) frames of the main process (slower: ~0.6 s, pauses it)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..analysis import as_ranks, stacks_view
    from ..model import Event, StackSample
    from ..session import gpu_processes_now, stack_sampler
    from ..sources import check_attachable, native_dump
    from ..present import dump_dict, dump_text
    from ..store import Store

    pid = getattr(args, "pid", None)
    if pid is None:
        raise UserError("which process? gputop stacks --pid PID")
    pyspy = check_attachable(pid)
    samples = stack_sampler(pid, pyspy=pyspy).snapshot()
    faults = [s for s in samples if isinstance(s, Event) and s.level in ("warning", "error")]
    if faults and not any(isinstance(s, StackSample) for s in samples):
        raise UserError(faults[-1].message)
    native = native_dump(pid, pyspy) if args.native else None
    ranks = _ranks_of(pid)
    if ranks:
        # Judged as advise judges a multi-rank job's stacks: a CPU rank off the CPU in backward
        # waits in DDP's all-reduce (it read "backward off-CPU" beside advise's collective wait).
        stacks = [s for s in samples if isinstance(s, StackSample)]
        gpus, procs = gpu_processes_now()
        samples = [s for s in samples if not isinstance(s, StackSample)] + as_ranks(stacks, ranks, procs, gpus)
    store = Store()
    store.add(samples)
    view = stacks_view(store, pid, stuck_after=float("inf"))
    if args.json:
        out = dump_dict(view, ranks)
        if native is not None:
            out["native"] = native
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(dump_text(view, ranks))
        if native is not None:
            sys.stdout.write("\nNative stacks (py-spy dump --native):\n" + native)
    return 0


def _ranks_of(pid: int) -> dict[int, int]:
    """A multi-rank job's pid -> rank, from the ranks' environments; {} for one process."""
    from ..sources import find_ranks

    job = find_ranks(pid)
    return {r.pid: r.rank for r in job.ranks} if job is not None and len(job.ranks) > 1 else {}
