"""`gputop attach PID`: the live monitor, attached to a running training process.

The same as ``gputop --pid PID``: the target is neither restarted nor changed; its stacks are
read from outside with py-spy.
"""

from __future__ import annotations

import argparse

from .options import add_live_options, add_stuck_after, pid_arg, require_terminal


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "attach",
        help="monitor GPUs and attach to a running training process by PID (stacks, stuck detection)",
        description="Live monitor attached to a running Python training process (py-spy, no restart).",
    )
    p.add_argument("pid", type=pid_arg, help="process id of the training process")
    add_live_options(p, with_pid=False)
    # The top-level parser has these too; SUPPRESS keeps a value given there when not given here.
    p.add_argument("--record", metavar="FILE", default=argparse.SUPPRESS, help="also record the session to FILE")
    add_stuck_after(p, "report the job as stuck after this long without progress", default=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    require_terminal()  # before attaching: nothing is started for a UI that cannot be shown
    from .live import run_live

    return run_live(args)
