"""`gputop record -o run.gputop [--pid PID] [--duration 8h]`: record headless.

For tmux, nohup or a job script: the same sources, store and advisor as the live UI, every
sample written to one file, one status line (rewritten in place on a terminal; a start and an
end line otherwise). Stops cleanly on SIGINT, SIGTERM, SIGHUP (unless ignored, as under nohup),
at the end of ``--duration``, or within a poll of the ``--pid`` target's exit; the file is
complete and closed on each of them, also for a signal that came while gputop was still
starting (see ``startup_signals``).
``gputop record --list [DIR]`` lists the recordings in a directory.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

from ..errors import UserError, os_reason, say, warn
from ..units import fmt_elapsed, fmt_length, fmt_size, fmt_time, truncate
from .options import add_live_options, add_stuck_after, parse_duration, parse_size

# How often the status line is rewritten on a terminal.
STATUS_EVERY_S = 1.0
# How often the loop looks for its end (the --duration, the --pid target's exit): the recording
# then stops at the sources' next poll, so it ends within a poll of either. Judgement: a look at
# /proc/PID/stat costs ~50 µs, five a second are nothing beside the sources.
CHECK_EVERY_S = 0.2


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "record",
        help="record a session to a file, headless (for tmux, nohup or a job script)",
        description="Sample the GPUs, the host and (with --pid) the training process's stacks, and write "
        "everything to one file that `gputop replay` and `gputop report` read. Stops on Ctrl-C, SIGTERM, "
        "SIGHUP (the terminal gone; not under nohup), at the end of --duration, or when the --pid process exits.",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="the recording to write (e.g. run.gputop)")
    add_live_options(p)
    p.add_argument("-d", "--duration", type=parse_duration, metavar="TIME",
                   help="stop after this long: 90s, 30m, 8h, 1h30m (default: until stopped)")
    add_stuck_after(p, "report the job as stuck after this long without progress")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("-f", "--force", action="store_true", help="overwrite FILE if it is an old recording")
    mode.add_argument("-a", "--append", action="store_true", help="add to FILE if it is a recording")
    p.add_argument("--max-size", type=parse_size, metavar="SIZE",
                   help="stop recording when the file reaches this size (e.g. 2G); monitoring stops too")
    p.add_argument("--no-advisor", action="store_true", help="do not run the advisor (no findings in the file)")
    p.add_argument("-l", "--list", nargs="?", const=".", metavar="DIR",
                   help="list the recordings in DIR (default: the current directory) and exit")
    # A Ctrl-C while gputop starts is this command's to take: the recording is still written.
    p.set_defaults(func=run, takes_interrupt=True)


def run(args: argparse.Namespace) -> int:
    if args.list is not None:
        from . import startup_signals

        if args.output:
            # Listing records nothing: an -o beside it was ignored without a word (a new user's report).
            raise UserError(f"--list records nothing: drop -o {args.output}, or drop --list to record to it")

        if startup_signals.release_interrupt():
            raise KeyboardInterrupt  # Ctrl-C while gputop started: nothing to list (as any command)
        return list_recordings(Path(args.list))
    if not args.output:
        raise UserError("record needs an output file: gputop record -o run.gputop")
    # First: a SIGTERM or SIGHUP from here on (or held since gputop started loading) stops the
    # recording cleanly, however early it comes: the file is still written, with what there is.
    stop = threading.Event()
    why: list[str] = []
    restore = _install_signals(stop, why)
    try:
        session, recorder, path = _open(args)
    except BaseException:
        restore()
        raise
    status = _Status(path, recorder, args.duration, target=args.pid)
    started = time.monotonic()
    # The same instant on the session's clock: the duration's end is this plus --duration, not the
    # clock read again later less the time elapsed (a thread preempted between the two reads on a
    # loaded host stretched the file by the delay: 2.0033 s for -d 2s).
    started_clock = session.clock()
    # The recording covers up to this instant (session clock): the end of --duration, or the last
    # moment the target was seen alive; None: up to the stop.
    until: float | None = None
    seen_alive = session.clock()
    next_status = 0.0
    session.start()
    status.start_line()
    try:
        while True:
            elapsed = time.monotonic() - started
            left = None if args.duration is None else args.duration - elapsed
            if stop.wait(CHECK_EVERY_S if left is None else max(0.0, min(CHECK_EVERY_S, left))):
                break
            elapsed = time.monotonic() - started
            if recorder.error:
                break
            if recorder.capped:
                why.append("--max-size reached")
                break
            if args.duration is not None and elapsed >= args.duration:
                why.append("duration reached")
                until = started_clock + args.duration
                # The file lasts what was asked: the last poll's utilisation points up to the
                # end are kept, its samples taken after it are not.
                recorder.end_at(until)
                break
            if args.pid is not None:
                if not _alive(args.pid):
                    why.append(f"process {args.pid} exited")
                    # Through the next poll, which says it exited (the host source's event): a
                    # file cut at the last time it was seen alive lost the exit, and with it the
                    # report's only word of how the job ended (a worker killed, then the job).
                    until = session.clock()
                    break
                seen_alive = session.clock()
            if elapsed >= next_status:
                status.update(elapsed, session.store)
                next_status = elapsed + STATUS_EVERY_S
    finally:
        # Closes the recording, one complete file, once the sources' next poll taken at or after
        # ``until`` (what happened up to the end) is in it.
        session.stop(until=until)
        restore()
    status.end_line(time.monotonic() - started, why)
    if recorder.error:
        raise UserError(recorder.error, exit_code=1)
    # As `advise`: stopped by SIGTERM or SIGHUP (a scheduler's limit, `timeout`, a closed SSH
    # session) is 128 + the signal's number, which a 0 would hide; Ctrl-C is the way to end it.
    sig = next((sig for sig, name in _stop_names().items() if name in why and sig != signal.SIGINT), None)
    return 128 + int(sig) if sig is not None else 0


def _open(args: argparse.Namespace):
    """The live session and its recorder, the file created (mode 0600, never over an existing
    file without --force or --append)."""
    from ..session import Config, open_live

    path = Path(args.output)
    _check_output(path, args.force, args.append)
    session = open_live(Config(interval=args.interval, fake=args.fake, pid=args.pid, stuck_after=args.stuck_after,
                               advisor=not args.no_advisor, sample_rate=args.sample_rate))
    if session.attach_error is not None:
        # A process whose stacks cannot be read (not Python, ptrace refused) still has a GPU and a
        # host to record: said once, then recorded without stacks (the UI does the same).
        warn("record", f"{session.attach_error}; recording its GPUs and the host without stacks")
    try:
        recorder = session.start_recording(path, force=args.force, append=args.append, max_bytes=args.max_size)
    except UserError:
        session.stop()
        raise
    change = recorder.writer.target_change()
    if change is not None:
        # Accepted (a restarted job is appended so), but never silently: the file then holds two runs.
        warn("record", change)
    return session, recorder, path


def _check_output(path: Path, force: bool, append: bool) -> None:
    """Refuse a bad path before any source starts (the writer checks again when it creates)."""
    if path.is_dir():
        raise UserError(f"{path} is a directory: give a file name, e.g. {path / 'run.gputop'}")
    if not path.parent.exists() and str(path.parent) not in ("", "."):
        raise UserError(f"cannot create {path}: directory {path.parent} does not exist")
    from ..record import looks_like_recording

    if path.is_file() and looks_like_recording(path) is False:
        # --force and --append are for recordings: neither would write over a report or a script.
        raise UserError(f"{path} exists and is not a gputop recording: record will not write over it; "
                        "choose another file name")
    if (path.exists() or path.is_symlink()) and not (force or append):
        raise UserError(f"{path} already exists: use --force to overwrite it or --append to add to it")


def _alive(pid: int) -> bool:
    try:
        import psutil

        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE
    except Exception:
        return False


def _stop_names() -> dict[int, str]:
    """The signals that stop a recording, each with the word the closing line says it with."""
    names = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}
    if hasattr(signal, "SIGHUP"):
        names[signal.SIGHUP] = "hung up"
    return names


def _install_signals(stop: threading.Event, why: list[str]):
    """SIGINT, SIGTERM and SIGHUP set ``stop`` (with why); the ones that came while gputop was
    starting are acted on now. SIGHUP stays ignored where it was (nohup: recording goes on when
    the SSH session drops). Returns what puts the old handlers back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    from . import startup_signals

    names = _stop_names()
    old = {}

    def handler(signum, _frame):
        why.append(names.get(signum, f"signal {signum}"))
        stop.set()

    for sig in names:
        try:
            prev = signal.getsignal(sig)
            if prev is signal.SIG_IGN and sig != signal.SIGINT:
                continue
            # Held since start-up: once recording ends, the signal does what it does by default.
            old[sig] = startup_signals.unheld(sig, prev)
            if sig not in startup_signals.HELD:
                signal.signal(sig, handler)
        except (ValueError, OSError):
            pass
    # A Ctrl-C while gputop started stops it too, the file still written (as SIGTERM then).
    startup_signals.take(handler, interrupt=True)

    def restore() -> None:
        for sig, h in old.items():
            try:
                signal.signal(sig, h)
            except (ValueError, OSError):
                pass

    return restore


class _Status:
    """The one status line: rewritten in place on a terminal, start and end lines otherwise."""

    def __init__(self, path: Path, recorder, duration: float | None, target: int | None = None) -> None:
        self.path = path
        self.recorder = recorder
        self.duration = duration
        self.target = target
        self.tty = sys.stderr.isatty()

    def start_line(self) -> None:
        until = f" for {fmt_elapsed(self.duration)}" if self.duration else ""
        target = f", attached to PID {self.target}" if self.target else ""
        if not self.tty:
            # The recorder's own PID is said as such: it is the one to signal, the target is not.
            say("record", f"recording to {self.path}{until}{target}; stop with SIGINT or SIGTERM to the "
                f"recorder (PID {os.getpid()})")

    def line(self, elapsed: float, store=None) -> str:
        gpus = len(store.gpu_indices()) if store is not None else len(self.recorder.writer.gpus)
        size = fmt_size(self.recorder.bytes_on_disk())
        left = f" of {fmt_elapsed(self.duration)}" if self.duration else ""
        dropped = f", {self.recorder.dropped:,} dropped" if self.recorder.dropped else ""
        target = f"  target PID {self.target}" if self.target else ""
        return (f"● recording {self.path}{target}  {fmt_elapsed(elapsed)}{left}  {gpus} GPU{'s' if gpus != 1 else ''}  "
                f"{self.recorder.samples:,} samples  {size}{dropped}")

    def update(self, elapsed: float, store) -> None:
        if self.tty:
            sys.stderr.write("\r\033[K" + self.line(elapsed, store) + "  (Ctrl-C stops)")
            sys.stderr.flush()

    def end_line(self, elapsed: float, why: list[str]) -> None:
        if self.tty:
            sys.stderr.write("\r\033[K")
        reason = f" ({why[0]})" if why else ""
        if self.recorder.error:
            return
        from ..record import backfill_note

        # This session's span, counted as `info` counts it: from its first sample recorded as it
        # happened, not from the GPU utilisation history NVML's buffer gave with the first poll
        # (said apart, as `info` does).
        span = self.recorder.writer.span()
        note = backfill_note(span.backfill_s)
        say("record", f"recorded {fmt_length(span.duration)} to {self.path}{reason}: "
            f"{self.recorder.samples:,} samples, {fmt_size(self.recorder.bytes_on_disk())}"
            + (f" ({note})" if note else ""))


# --------------------------------------------------------------------------- --list

# The name a recording is given in the documentation and examples (run.gputop): a file so named
# that cannot be read is listed with why rather than left out.
RECORDING_SUFFIX = ".gputop"


def _unreadable(p: Path) -> str | None:
    """Why ``p`` cannot be opened for reading, None when it can."""
    try:
        with p.open("rb"):
            return None
    except OSError as exc:
        return os_reason(exc)


def _size_of(p: Path) -> str:
    try:
        return fmt_size(p.stat().st_size)
    except OSError:
        return "?"


# The TARGET column's width: the command is cut at its end to fit.
TARGET_W = 40


def target_text(cmdline: str | None) -> str:
    """The recorded target as the list shows it: the interpreter by its name, then the script and
    its (already redacted) arguments, cut at the end. The first 40 characters of the command line
    were the interpreter's path, the same for every job of a virtualenv."""
    from ..present import shown_command

    return truncate(shown_command(cmdline or ""), TARGET_W)


def list_recordings(folder: Path) -> int:
    from ..record import Reader
    from ..record import looks_like_recording

    try:
        if not folder.is_dir():
            raise UserError(f"{folder}: not a directory")
        entries = sorted(folder.iterdir())
    except OSError as exc:
        raise UserError(f"cannot list {folder}: {os_reason(exc)}", exit_code=1) from None
    rows = []
    for p in entries:
        try:
            # An entry that cannot even be looked at (/proc/1/cwd) is not one of ours to list.
            if not p.is_file() or p.name.endswith(("-wal", "-shm")):
                continue
        except OSError:
            continue
        why = _unreadable(p)
        if why is not None:
            # A file that cannot be read (another user's, a failing disk) is listed with why when
            # it is named as a recording is; other files are not ours to guess about.
            if p.name.endswith(RECORDING_SUFFIX):
                rows.append((p.name, "?", "?", "?", "?", _size_of(p), f"cannot be read: {why}"[:60]))
            continue
        kind = looks_like_recording(p)
        if kind is not True:
            if p.name.endswith(RECORDING_SUFFIX):
                what = "empty: nothing written yet" if kind is None else "not a gputop recording"
                rows.append((p.name, "?", "?", "?", "?", _size_of(p), what))
            continue
        try:
            with Reader(p) as r:
                d = r.describe(counts=False)
            gpus = ", ".join(sorted({g["name"] for g in d["gpus"]}))
            state = "" if d["state"] == "closed" else f" [{d['state']}]"
            rows.append((p.name, d["host"] or "?", f"{len(d['gpus'])}× {gpus}" if gpus else "CPU only", fmt_time(d["start"]),
                         fmt_length(d["duration_s"]), fmt_size(d["size_bytes"]),
                         target_text(d["target_cmdline"]) + (" [damaged]" if d["damage"] else "") + state))
        except (UserError, OSError) as exc:
            # The row names the file already: the reason without it, whole up to a long line.
            why = str(exc)
            for name in (str(p), p.name):
                if why.startswith(name):
                    why = why[len(name):].lstrip(" :")
                    break
            rows.append((p.name, "?", "?", "?", "?", _size_of(p), truncate(f"unreadable: {why}", 100)))
    if not rows:
        print(f"no gputop recordings in {folder}")
        return 0
    head = ("FILE", "HOST", "GPUS", "START", "LENGTH", "SIZE", "TARGET")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip())
    return 0
