"""`gputop advise --pid PID --duration 30`: watch a job headless, then print what to change.

The same sources, store and advisor as the live UI; findings ranked by the GPU time they cost,
each with its evidence, the exact change and the expected gain, plus the time breakdown per GPU.
``--json`` gives the same for scripts, with the time each finding first appeared.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from ..advisor import DEFAULT_WINDOW_S, STATE_IDS, WARMUP_ID
from ..units import fmt_seconds
from .options import add_live_options, add_stuck_after, parse_duration

DEFAULT_DURATION_S = 30.0
# A line of progress on a non-terminal stderr this often (a terminal gets one updating line).
PROGRESS_EVERY_S = 5.0
# The JSON logs this many evaluations from the start (the seconds a verdict takes), no more.
EVALUATION_LOG_MAX = 60


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "advise",
        help="watch a training job for a while, then print what to change (text or JSON)",
        description="Sample the GPUs, the host and (with --pid) the training process's stacks for "
        "--duration seconds, then print the advisor's findings ranked by the GPU time they cost, "
        "with evidence and the exact change, and where each GPU's time went. Ctrl-C, SIGTERM and "
        "SIGHUP print what it has so far (after SIGTERM or SIGHUP the exit status is 128 + the signal's "
        "number, e.g. 143).",
    )
    add_live_options(p, pid_help="the training process to attach to (py-spy)")
    p.add_argument("-d", "--duration", type=parse_duration, default=DEFAULT_DURATION_S, metavar="TIME",
                   help=f"how long to watch: 30, 30s, 5m (default {DEFAULT_DURATION_S:g} s)")
    p.add_argument("-w", "--window", type=parse_duration, default=DEFAULT_WINDOW_S, metavar="TIME",
                   help=f"the window the findings speak of: the last 60s, 5m, ... (default {DEFAULT_WINDOW_S:g} s)")
    add_stuck_after(p, "call the job stuck after this long without progress")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--record", metavar="FILE",
                   help="also record the session to FILE (a new file), to replay or report the evidence later")
    p.add_argument("-f", "--force", action="store_true", help="with --record: overwrite FILE if it is an old recording")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .stop_signals import StopSignals

    # First, before the slow start: SIGTERM or SIGHUP (a time limit, `timeout`, a closed SSH
    # session) ends the watch as Ctrl-C does, and what was judged is still printed.
    signals = StopSignals().install()
    try:
        return signals.status(_run(args, signals))
    finally:
        signals.restore()


def _run(args: argparse.Namespace, signals) -> int:
    from ..analysis import step_dict, step_line
    from ..present import breakdown_table, findings_text, report_dict, session_start_in
    from ..session import Config, open_live

    session = open_live(Config(interval=args.interval, fake=args.fake, pid=args.pid, stuck_after=args.stuck_after,
                               window=args.window, sample_rate=args.sample_rate))
    session.require_stacks()
    if args.record:
        # Checked before anything runs: a name that exists is refused, never written over.
        try:
            session.start_recording(Path(args.record), force=args.force)
        except BaseException:  # a name refused, or Ctrl-C while the file is made: closed all the same
            session.stop()
            raise
    stage, advisor = session.stage, session.advisor
    assert stage is not None and advisor is not None  # open_live puts the advisor on (Config.advisor)
    start = time.time()
    interrupted = False
    ended = None
    progress = _Progress(session, args.duration, start)
    until = None  # the --record file ends here (session clock): the end of --duration
    watched = None
    try:
        session.start()  # in the try: a Ctrl-C while the sources start is one in the watch
        ended = session.run_for(args.duration, tick=progress,
                                should_stop=lambda: signals.why or _target_exited(session, start))
        watched = time.time() - start
        if ended is None and not signals.stopped and session.recorder is not None:
            # As `record --duration`: the file lasts what was asked, not a poll more (-d 10
            # --record watched, and recorded, 12 s at 2 s polls).
            until = session.clock()
            session.recorder.end_at(until)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        # Closes the --record file too: complete, whatever ended the watch.
        session.stop(until=until)
    if signals.stopped:
        ended = None  # the signal's name, not a reason the target gave
        interrupted = True
    # One last evaluation on everything collected.
    session.pipeline.publish(stage.poll())
    progress.note_top()
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")  # the progress line
    store = session.store
    findings = store.findings()
    breakdowns = store.breakdowns()
    elapsed = time.time() - start if watched is None else watched
    nvml_error = store.system.nvml_error if store.system is not None else None
    # Why stacks could not be read (not Python, permission, py-spy failing) changes what the
    # findings can say: the reader must see it.
    attach_errors = [e.message for e in store.events() if e.source == "stacks" and e.level == "error"]
    state = session.target_state
    cost = state.cost if state is not None else None  # what sampling the job cost it, as measured
    # The training step as the last evaluation saw it (the main thread's phases, its loop, the
    # user's code outside the model), from the same context the findings came from.
    last = advisor.advisor.last_context
    step = last.step if last is not None and last.step.samples else None
    # How the target ended, where its memory readings tell (likely CUDA OOM, likely the OOM killer).
    cause = last.memory.exit_cause if ended and last is not None and last.memory is not None else None
    if cause:
        ended = f"{ended}: {cause}"
    if args.json:
        extra = {
            "pid": args.pid,
            "mode": session.mode,
            "started_at": round(start, 3),
            "duration_s": round(elapsed, 2),
            "window_s": args.window,
            "stuck_after_s": args.stuck_after,
            "evaluations": advisor.evaluations,
            # When the top finding changed (seconds from the start): how long the verdict took
            # and whether it wavered on the way.
            "top_timeline": progress.timeline,
            # When each finding's rule first fired (before it had held long enough to show):
            # how much of a verdict's delay is evidence accruing and how much is the hold.
            "first_fired_s": progress.first_fired,
            # What each of the first evaluations saw: why a verdict is not there yet (too few
            # stacks, the job warming up, a rule firing but not yet held).
            "evaluation_log": progress.evaluations,
            # The log keeps the first EVALUATION_LOG_MAX: said, so a short log is not read as the
            # whole run (first_fired_s and top_timeline cover every evaluation).
            "evaluation_log_max": EVALUATION_LOG_MAX,
            "evaluation_log_left_out": max(0, advisor.evaluations - len(progress.evaluations)),
            # Set when the run ended before the advisor had enough evidence for a verdict (an
            # empty "findings" then means "not yet", not "nothing found").
            "collecting": None if store.collecting() is None else dataclasses.asdict(store.collecting()),
            "interrupted": interrupted,
            # SIGTERM or SIGHUP ended the watch ("terminated", "hung up"); the exit status is
            # then 128 + the signal's number.
            "terminated_by": signals.why,
            "target_exited": ended,
            # "code N" / "signal NAME" where it could be read (None: unknown, or still running).
            "target_exit_status": state.exit_status if ended and state is not None else None,
            "nvml_error": nvml_error,
            "attach_errors": attach_errors,
            "step": None if step is None else step_dict(step),
            "sampling_cost": None if cost is None else {
                "job_cost_pct": round(cost.job_cost_pct, 3),
                "sampler_cpu_pct": round(cost.sampler_cpu_pct, 2),
                "target_paused_pct": round(cost.pause_pct, 3),
                "stacks_per_s": round(cost.stacks_per_s, 2),
                "asked_per_s": cost.asked_per_s,
                "held_back": cost.held_back,
                "load1": cost.load1,
                "cpus": cost.cpus,
                "cpu_pressure_pct": cost.cpu_pressure_pct,
                "job_cpu_pct": None if cost.job_cpu_pct is None else round(cost.job_cpu_pct, 2),
                "window_s": cost.window_s,
            },
        }
        json.dump(report_dict(findings, breakdowns, start, advisor.history, extra), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    what = f"PID {args.pid}" if args.pid else "this machine (no --pid: idle time is not attributed)"
    mode = " [fake GPU source]" if session.mode == "fake" else ""
    how = f" ({signals.why})" if signals.stopped else " (interrupted)" if interrupted else ""
    print(f"gputop advise: {what}, watched {fmt_seconds(elapsed)}{mode}{how}")
    if ended:
        print(f"note: {ended}")
    if nvml_error:
        print(f"note: no GPU data (NVML unavailable: {nvml_error})")
    for msg in attach_errors:
        print(f"note: {msg}")
    if cost is not None:
        print(f"note: {sampling_cost_text(cost)}")
    table = breakdown_table(breakdowns, session_start_in(store, breakdowns))
    if table:
        print()
        print(table)
    if step is not None:
        print()
        print(step_line(step))
    print()
    print(findings_text(findings, since=start, collecting=store.collecting(), breakdowns=breakdowns,
                        pid=args.pid, attached=args.pid is not None))
    return 0


def sampling_cost_text(cost) -> str:
    """One line on a gputop.model.SamplingCost: what it costs the job, and that it is held back
    and why, when far fewer stacks came than asked for."""
    from ..present import held_back_text

    # Beside the job's own CPU: on a saturated host the job gets a fraction of a core, and the
    # sampler's share of what it gets is what the user weighs.
    versus = (f" ({cost.sampler_cpu_pct / cost.job_cpu_pct * 100:.0f} % of the CPU the job itself used)"
              if cost.job_cpu_pct and cost.job_cpu_pct >= 1.0 else "")
    text = (f"sampling costs the job about {cost.job_cost_pct:.2g} % ({cost.stacks_per_s:.1f} stacks/s; "
            f"gputop's sampler {cost.sampler_cpu_pct:.1f} % of a core{versus}, the job stopped "
            f"{cost.pause_pct:.2f} % of the time)")
    why = held_back_text(cost)
    if why is not None:
        text += f"; held back to {cost.stacks_per_s:.1f} of {cost.asked_per_s:g} stacks/s asked: {why}"
    return text


def _target_exited(session, start: float) -> str | None:
    state = session.target_state
    exited = state.exited_at if state is not None else None
    if exited is None:
        return None
    # How it ended, from the sampler's reading of its wait status (the one the recording's
    # "exited ... with code 1" comes from): a job that crashed must not read like one that finished.
    after = fmt_seconds(max(0.0, exited - start))
    if state.exit_status is None:
        return f"the target exited after {after} (exit status unknown: its parent reaped it before gputop read it)"
    return f"the target {exit_words(state.exit_status)} after {after}"


def exit_words(status: str) -> str:
    """'exited with status 1 (an error)' from the sampler's "code 1" / "signal SIGKILL"."""
    kind, _, value = status.partition(" ")
    if kind == "signal":
        return f"was killed by {value}" if value.startswith("SIG") else f"was killed by signal {value}"
    if kind == "code" and value.lstrip("-").isdigit():
        return f"exited with status {value} ({'success' if int(value) == 0 else 'an error'})"
    return f"exited with {status}"


class _Progress:
    """One updating line on a terminal, a line every PROGRESS_EVERY_S otherwise; and the
    timeline of the top finding."""

    def __init__(self, session, duration: float, start: float) -> None:
        self.session, self.duration, self.start = session, duration, start
        self.tty = sys.stderr.isatty()
        self.last_line = float("-inf")
        self.timeline: list[dict] = []
        self.first_fired: dict[str, float] = {}
        self.evaluations: list[dict] = []
        self._last_ctx = None

    def note_top(self) -> None:
        findings = self.session.store.findings()
        now = round(time.time() - self.start, 2)
        # From the store (the advisor's published verdict), not the advisor itself: it runs on
        # the pipeline's thread.
        pending = self.session.store.pending_findings()
        for f in [*findings, *pending]:
            self.first_fired.setdefault(f.id, now)
        run = self.session.advisor.advisor.last_run if self.session.advisor is not None else None
        ctx, withdrawn = run if run is not None else (None, {})
        if ctx is not None and ctx is not self._last_ctx and len(self.evaluations) < EVALUATION_LOG_MAX:
            self._last_ctx = ctx
            self.evaluations.append({
                "t_s": now, "main_stacks": len(ctx.main_stacks), "warmup": ctx.warmup,
                "fired": sorted(f.id for f in [*findings, *pending]),
                "shown": [f.id for f in findings],
                # What a rule took back, and why: the evidence fits another cause as well.
                "withdrawn": dict(withdrawn),
            })
        top = (findings[0].id, findings[0].severity.value) if findings else (None, None)
        last = self.timeline[-1] if self.timeline else None
        if last is None or (last["top"], last["severity"]) != top:
            self.timeline.append({"t_s": now, "top": top[0], "severity": top[1]})

    def __call__(self, elapsed: float) -> None:
        self.note_top()
        findings = self.session.store.findings()
        # Warming up is a state of the job, not a finding: said as such, not counted.
        warming = any(f.id == WARMUP_ID for f in findings)
        findings = [f for f in findings if f.id not in STATE_IDS]
        top = f", top: {findings[0].id}" if findings else ""
        n = len(findings)
        msg = (f"gputop advise: {elapsed:4.0f}/{fmt_seconds(self.duration)}, {n} finding{'' if n == 1 else 's'}{top}"
               + (" (the job is warming up)" if warming else ""))
        if self.tty:
            sys.stderr.write("\r\033[K" + msg)
            sys.stderr.flush()
        elif elapsed - self.last_line >= PROGRESS_EVERY_S:
            print(msg, file=sys.stderr, flush=True)
            self.last_line = elapsed
