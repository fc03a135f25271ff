"""`gputop export`: a Prometheus endpoint with the GPUs' numbers and gputop's diagnosis.

Long-running and headless: the same sources, store and advisor as the live UI, read by
Prometheus at each scrape. See gputop/export/, the README's "Export to Prometheus" and docs/export.md.
"""

from __future__ import annotations

import argparse

from ..errors import value_problem
from .options import DEFAULT_FAKE_GPUS, add_stuck_after, count_between, fake_gpus, interval_arg, parse_duration, pid_arg


def register(sub: argparse._SubParsersAction) -> None:
    from ..export.config import DEFAULT_INTERVAL, DEFAULT_LISTEN, DEFAULT_MAX_ATTACH, DEFAULT_WINDOW_S, MAX_MAX_ATTACH

    p = sub.add_parser(
        "export",
        help="serve GPU metrics and the time breakdown per cause to Prometheus (/metrics)",
        description="Serve a Prometheus endpoint: per-GPU numbers (utilisation, memory, power, clocks, "
        "throttling, PCIe, GPM activity), per-process GPU memory, GPU time per cause as counters, and "
        "the advisor's active findings. SIGTERM or Ctrl-C stops it.",
    )
    p.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                   help=f"address to serve /metrics on; :PORT for all interfaces (default {DEFAULT_LISTEN})")
    p.add_argument("-i", "--interval", type=interval_arg, default=DEFAULT_INTERVAL, metavar="SECONDS",
                   help=f"sampling interval (default {DEFAULT_INTERVAL:g} s: NVML's buffer keeps the detail)")
    p.add_argument("--fake", nargs="?", const=DEFAULT_FAKE_GPUS, type=fake_gpus, metavar="N",
                   help=f"a scripted fake GPU source with N GPUs (default {DEFAULT_FAKE_GPUS}), for tests and demos; "
                   "its series say source=\"fake\" in gputop_exporter_info")
    who = p.add_mutually_exclusive_group()
    who.add_argument("-p", "--pid", type=pid_arg,
                     help="attach to this training process (py-spy): its GPUs' idle time gets causes")
    who.add_argument("--attach", choices=["all"],
                     help="attach to every Python process using a GPU, or on a host without a GPU to every "
                     "Python process whose environment sets RANK and WORLD_SIZE (about 1.5 %% of a core each, "
                     "see --max-attach)")
    p.add_argument("--max-attach", type=count_between(1, MAX_MAX_ATTACH), default=None, metavar="N",
                   help=f"with --attach all: at most N processes sampled at once, 1 to {MAX_MAX_ATTACH} "
                   f"(default {DEFAULT_MAX_ATTACH})")
    p.add_argument("--attach-under", type=pid_arg, metavar="PID",
                   help="with --attach all: only processes under this one (a launcher, a Slurm step, a "
                   "container's init)")
    p.add_argument("--host-label", type=host_label, metavar="NAME",
                   help="the host label of the rank series (default: the short host name); for hosts whose "
                   "names are not unique, or several exporters on one machine")
    p.add_argument("-w", "--window", type=parse_duration, default=DEFAULT_WINDOW_S, metavar="TIME",
                   help=f"the window the advisor's findings speak of (default {DEFAULT_WINDOW_S:g} s)")
    add_stuck_after(p, "call an attached job stuck after this long without progress")
    p.set_defaults(func=run)


# A label value, not a free text: the characters host names and pod names use.
_HOST_LABEL = r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}"


def host_label(text: str) -> str:
    import re

    if not re.fullmatch(_HOST_LABEL, text):
        raise argparse.ArgumentTypeError(value_problem("not a host name", text, "letters, digits, '.', '_', '-'; at most 63"))
    return text


def run(args: argparse.Namespace) -> int:
    from ..errors import OptionError, UserError
    from ..export.server import serve

    from ..export.config import DEFAULT_MAX_ATTACH, MAX_MAX_ATTACH

    if args.attach is None and (args.attach_under is not None or args.host_label is not None
                                or args.max_attach is not None):
        raise UserError("--max-attach, --attach-under and --host-label go with --attach all")
    max_attach = DEFAULT_MAX_ATTACH if args.max_attach is None else args.max_attach
    if not 1 <= max_attach <= MAX_MAX_ATTACH:  # the parser checks it; a caller of run() may not have
        raise OptionError("--max-attach", f"must be 1 to {MAX_MAX_ATTACH}", max_attach)
    if args.attach_under is not None:
        import psutil

        # As for --pid: a tree that is not there is bad input, not an exporter that attaches to nothing.
        if not psutil.pid_exists(args.attach_under):
            raise OptionError("--attach-under", "no such process", args.attach_under)
    return serve(
        listen=args.listen,
        interval=args.interval,
        fake=args.fake,
        pid=args.pid,
        attach_all=args.attach == "all",
        max_attach=max_attach,
        stuck_after=args.stuck_after,
        window=args.window,
        host_label=args.host_label,
        attach_under=args.attach_under,
    )
