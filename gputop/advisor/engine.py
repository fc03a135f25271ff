"""Findings that hold still: hysteresis, supersession and a stable ranking over the rules.

A rule's raw answer can change every second (an idle share near its threshold, a save that just
ended). What the user sees changes only when the answer has held: a finding appears once its
rule has fired continuously for ``appear_after_s`` and leaves once it has been silent for
``clear_after_s`` (longer), showing its last evidence meanwhile. Ranking is by the GPU time a
cause cost (critical ones first); two findings swap places only when the one behind costs
clearly more.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Sequence

from ..model import Category, Event, Evidence, Finding, Severity, Verdict
from ..units import fmt_seconds
from ..analysis import DEFAULT_STUCK_AFTER_S, Forming, JobWindow, project_frame, read_window, short_path
from .context import DEFAULT_WINDOW_S, AnalysisContext, context_of
from .rules import RULES, THROUGHPUT_IDS, Rule
from .rules.base import Withdraw

# While the job warms up (imports, worker start-up, torch.compile, its first steps: see
# advisor.context.warming_up) its rates say nothing of its steady state: the throughput findings
# are held, and this note says why the list is quiet. Hangs and the system's faults (throttling,
# ECC, PCIe) are not held.
WARMUP_ID = "warming-up"
# Held while warming up: the findings read from rates. Oversubscription is read from the
# configuration (processes x threads against the cores), shows from the first second, and is
# itself what can make a start-up crawl: on the H100 the oversubscribed workload (16 workers x
# 16 threads on 16 cores) was still starting its workers 66 s in and got only "warming up".
HELD_WHILE_WARMING = tuple(i for i in THROUGHPUT_IDS if i != "cpu-oversubscribed")
# While a hang may be forming (analysis.hang_forming: the main thread still longer than its steps'
# waits, not yet stuck), the advisor says what it weighs under this id, and holds the findings
# read from the step's own samples, which a hang's single wait would feed (a GPU hang read as
# "host-device syncs every step" for 4 s). The ranks' findings stay: a rank waiting for a peer is
# what they read, and the straggler is one answer to what is weighed.
WEIGHING_ID = "weighing-hang"
_RANKS_IDS = ("collective-wait", "rank-straggler", "collective-bound", "manual-grad-sync", "accumulation-sync")
HELD_WHILE_FORMING = tuple(i for i in HELD_WHILE_WARMING if i not in _RANKS_IDS)
# States of the job, not findings: shown, recorded and replayed, never counted as a finding.
STATE_IDS = frozenset({WARMUP_ID, WEIGHING_ID})

# A finding must hold across two evaluations a second apart (the cadence of every mode): one
# outlier evaluation (a burst of loading at start, one long save) does not make a finding. It
# was 2 s (three evaluations), a second of latency on every verdict after attaching; the rules'
# own bars (the share and the seconds or recurrences a cause must reach, base.significant)
# already keep a young window's single stall out.
APPEAR_AFTER_S = 1.0
# The hold is measured in data time (the store's clock: the newest sample's timestamp), and two
# evaluations a second apart by the wall clock can be 0.9 s apart in data time when a poll lands
# just after one of them: the hold forgives this much, or a verdict waits a third evaluation.
# Measured on the H100 (bench/results/real_jobs.md): rules that fired at +2.0 s showed at +4.0 s.
HOLD_SLACK_S = 0.25
# Once shown, it stays until silent for this long: five times the appearance delay, so a cause
# that comes and goes (periodic stalls, a threshold crossed back and forth) does not blink.
CLEAR_AFTER_S = 10.0
# Before its first verdict ("no findings" included) an evaluation must have this much to go on:
# main-thread stacks of the attached job, and seconds of GPU samples. Judgement: twice the stacks
# a stack-based claim needs (rules.base.MIN_MAIN_SAMPLES), which the sampler's attach burst takes
# in its first 2 s (10 Hz), and 2 s of GPU samples (NVML's buffer gives more at once): over 2 s a
# cause taking half the time has cost the 1 s bar (rules.base.MIN_COST_S). Until then the
# Advisor tab says what it is collecting, not "no findings".
FIRST_VERDICT_STACKS = 20
FIRST_VERDICT_GPU_S = 2.0
# The finding behind overtakes the one ahead only when it costs this much more.
RANK_MARGIN = 1.2
SEVERITY_RANK = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}


@dataclass
class _Track:
    pending_since: float  # when the rule started firing without a break
    last_seen: float
    finding: Finding
    shown_since: float | None = None
    raw_severity: Severity | None = None  # the rule's severity at its last firing
    severity_since: float = 0.0  # since when it has fired at least that severe


@dataclass
class Advisor:
    """Stateful over time, pure over input: call ``update(candidates, now)`` with the rules'
    raw findings, or ``evaluate(store)`` to run the rules on the store first."""

    rules: Sequence[Rule] = RULES
    appear_after_s: float = APPEAR_AFTER_S
    clear_after_s: float = CLEAR_AFTER_S
    window_s: float = DEFAULT_WINDOW_S
    stuck_after_s: float = DEFAULT_STUCK_AFTER_S
    target_pid: int | None = None
    _tracks: dict[str, _Track] = field(default_factory=dict)
    _order: list[str] = field(default_factory=list)  # ids as last ranked
    errors: dict[str, str] = field(default_factory=dict)  # rule id -> last exception text
    last_context: AnalysisContext | None = None
    _last_update: float | None = None
    _held: tuple[str, ...] = ()  # the rules the last run held back (warming up, a hang forming)
    withdrawn: dict[str, str] = field(default_factory=dict)  # rule id -> why its check took it back, last run
    # The last evaluation's context with what its checks withdrew, set together once both are known:
    # another thread (advise's log) reads the pair as one.
    last_run: tuple[AnalysisContext, dict[str, str]] | None = None

    # ----------------------------------------------------------------- driving

    def evaluate(self, store, now: float | None = None) -> list[Finding]:
        """Run the rules on the store's window ending at ``now`` (a window of its own)."""
        return self.evaluate_window(read_window(store, self.target_pid, self.stuck_after_s, self.window_s, now))

    def evaluate_window(self, window: JobWindow) -> list[Finding]:
        """Run the rules on one evidence window, shared with the other readers of its tick."""
        ctx = context_of(window)
        self.last_context = ctx
        found = self.run_rules(ctx)
        self.last_run = (ctx, self.withdrawn)
        return self.update(found, ctx.now)

    def run_rules(self, ctx: AnalysisContext) -> list[Finding]:
        out: list[Finding] = []
        warmup = ctx.warmup
        forming = ctx.forming if not warmup else None
        # A hang forming while every other rank's GPU spins in a collective holds the ranks'
        # findings too: all of them wait, none is slow.
        held = (HELD_WHILE_WARMING if warmup or (forming and forming.peers_wait)
                else HELD_WHILE_FORMING if forming else ())
        self._held = held
        self.withdrawn = {}
        for r in self.rules:
            if r.id in held:
                continue
            try:
                f = r.run(ctx)
            except Exception as exc:  # one broken rule must not silence the others
                self.errors[r.id] = f"{type(exc).__name__}: {exc}"
                continue
            if isinstance(f, Withdraw):
                self.withdrawn[r.id] = f.why
            elif f is not None:
                out.append(f)
        if warmup and not any(f.id == "stuck" for f in out):
            out.append(warmup_finding(warmup, ctx.now))
        if forming and not any(f.id == "stuck" for f in out):
            out.append(weighing_finding(forming, ctx.now, ctx.target_pid, ctx.ranks))
        return out

    # ----------------------------------------------------------------- hysteresis

    def update(self, candidates: Iterable[Finding], now: float) -> list[Finding]:
        """Fold one evaluation's raw findings in; return the findings to show, ranked."""
        fresh = {f.id: f for f in candidates}
        if self._last_update is not None and now < self._last_update:
            self.reset()  # time went back (a replay seek): what was held no longer holds
        self._last_update = now
        for fid, f in fresh.items():
            # "Held" means fired at every evaluation since pending_since: a track that misses one
            # evaluation is dropped below before it is shown. Nothing here depends on how often
            # evaluations come (every 1 s in `advise`, every 2 s in the UI, every 60 s of data
            # in a 60x replay), so every mode reaches the same verdict on the same data.
            tr = self._tracks.get(fid)
            if tr is None:
                self._tracks[fid] = tr = _Track(pending_since=now, last_seen=now, finding=f)
            if tr.raw_severity is None or SEVERITY_RANK[f.severity] < SEVERITY_RANK[tr.raw_severity]:
                tr.severity_since = now
            tr.raw_severity = f.severity
            tr.last_seen = now
            hold = self._appear_after(fid) - HOLD_SLACK_S
            if tr.shown_since is None and now - tr.pending_since >= hold:
                tr.shown_since = now
            first = tr.shown_since if tr.shown_since is not None else 0.0
            # A rise in severity holds as an appearance does: the finding keeps the milder answer it
            # held until the graver one has held too (an information weighing launch overhead against
            # syncs became a warning for one evaluation and was shown as one: the track had held).
            rising = (SEVERITY_RANK[f.severity] < SEVERITY_RANK[tr.finding.severity]
                      and now - tr.severity_since < hold)
            tr.finding = replace(tr.finding if rising else f, first_seen=first, ts=now)
        for fid in list(self._tracks):
            tr = self._tracks[fid]
            if fid in fresh:
                continue
            # A finding whose rule was held back is withdrawn at once: the state shown says why
            # (a launch-bound warning lingered 5 s into a hang's weighing). So is one whose check
            # took it back (rules.base.Withdraw): its evidence now fits another cause as well.
            if (tr.shown_since is None or now - tr.last_seen >= self.clear_after_s or fid in STATE_IDS
                    or fid in self._held or fid in self.withdrawn):
                del self._tracks[fid]
        shown = [tr.finding for tr in self._tracks.values() if tr.shown_since is not None]
        shown = self._drop_superseded(shown)
        return self._rank(shown)

    @property
    def fresh(self) -> bool:
        """No evaluation since it was made or reset: the next one starts from nothing."""
        return self._last_update is None

    @property
    def pending(self) -> list[Finding]:
        """Findings that fired at the last evaluation but have not held long enough to show."""
        return [tr.finding for tr in self._tracks.values()
                if tr.shown_since is None and tr.last_seen == self._last_update]

    def _rule(self, fid: str) -> Rule | None:
        return next((r for r in self.rules if r.id == fid), None)

    def _appear_after(self, fid: str) -> float:
        if fid in STATE_IDS:
            return 0.0  # a state, not a rate: shown at once
        rule = self._rule(fid)
        if rule is not None and rule.appear_after_s is not None:
            return rule.appear_after_s
        return self.appear_after_s

    def _drop_superseded(self, shown: list[Finding]) -> list[Finding]:
        ids = {f.id for f in shown}
        gone: set[str] = set()
        for f in shown:
            rule = self._rule(f.id)
            if rule is not None:
                gone |= set(rule.supersedes) & ids
        for fid in gone:
            self._tracks.pop(fid, None)  # superseded: gone at once, no lingering
        return [f for f in shown if f.id not in gone]

    def _rank(self, shown: list[Finding]) -> list[Finding]:
        table_order = {r.id: i for i, r in enumerate(self.rules)}
        # Critical findings (a hang, memory errors: progress or results at stake) lead whatever
        # their cost; the rest by the GPU time they cost.
        ranked = sorted(
            shown,
            key=lambda f: (
                f.severity is not Severity.CRITICAL,
                -f.cost_s,
                SEVERITY_RANK.get(f.severity, 3),
                table_order.get(f.id, 99),
            ),
        )
        # Keep the previous order between neighbours whose costs are close.
        prev = {fid: i for i, fid in enumerate(self._order)}
        changed = True
        while changed:
            changed = False
            for i in range(len(ranked) - 1):
                a, b = ranked[i], ranked[i + 1]
                if a.id in prev and b.id in prev and prev[b.id] < prev[a.id] and _close(a, b):
                    ranked[i], ranked[i + 1] = b, a
                    changed = True
        self._order = [f.id for f in ranked]
        return ranked

    def reset(self) -> None:
        self._tracks.clear()
        self._order.clear()
        self._last_update = None


def evidence(ctx: AnalysisContext, window: JobWindow, attached: bool = True) -> Evidence:
    """What an evaluation had to go on: the attached job's main-thread stacks in its window (none
    are asked for when no job is attached), and the longest span of GPU samples (NVML's 200 ms
    points, else the polls) of any GPU in it."""
    gpu_s = None
    for i in window.gpu_indices:
        pts = ([p for p in window.util_points.get(i, ()) if ctx.t0 <= p.ts <= ctx.now]
               or [p for p in window.gpu_samples.get(i, ()) if ctx.t0 <= p.ts <= ctx.now])
        span = pts[-1].ts - pts[0].ts if len(pts) >= 2 else 0.0
        gpu_s = max(gpu_s or 0.0, span)
    return Evidence(stacks=len(ctx.main_stacks) if attached else None,
                    stacks_needed=FIRST_VERDICT_STACKS, gpu_s=gpu_s, gpu_needed_s=FIRST_VERDICT_GPU_S)


def nothing_yet(attached: bool, has_gpu: bool) -> Evidence:
    """What is collected before the advisor's first evaluation of a job: nothing of it yet."""
    return Evidence(stacks=0 if attached else None, stacks_needed=FIRST_VERDICT_STACKS,
                    gpu_s=0.0 if has_gpu else None, gpu_needed_s=FIRST_VERDICT_GPU_S)


def warmup_finding(what: str, now: float) -> Finding:
    return Finding(
        id=WARMUP_ID,
        title=f"Warming up: {what}",
        severity=Severity.INFO,
        confidence=1.0,
        evidence=(f"warming up: {what}",
                  "throughput findings (data, syncs, launches, IO, copies) wait until the job runs steadily"),
        action="nothing yet: the advice on the job's speed comes once its warm-up is over",
        ts=now,
    )


def weighing_finding(f: Forming, now: float, pid: int | None = None, ranks: Sequence = ()) -> Finding:
    """What the advisor weighs while the main thread stands still: a hang, or one long step."""
    before = (f"its longest earlier stretch in this window {fmt_seconds(f.longest_before_s)}"
              if f.longest_before_s > 0 else "no earlier stretch in this window to compare")
    return Finding(
        id=WEIGHING_ID,
        title=f"Weighing: no progress for {fmt_seconds(f.held_s)} at {f.where} (a hang forming, or one long step)",
        severity=Severity.INFO,
        confidence=1.0,
        evidence=(f"main thread unchanged for {fmt_seconds(f.held_s)} at {f.where}; {before}",
                  *_ranks_elsewhere(ranks, pid),
                  "the step's findings (data, syncs, launches, copies) wait until it moves: a hang's one wait "
                  "reads like a step's",
                  f"stuck is said at {fmt_seconds(f.stuck_at_s)} unchanged (--stuck-after)"),
        action="nothing yet: if it does not move, the stuck verdict names the hang and its line; every thread's "
               f"stack now: gputop stacks --pid {pid if pid is not None else 'PID'}",
        ts=now,
    )


# What a peer rank's newest sample shows it doing that is not the step's model or communication:
# its own code (a loop that never reaches the collective the target waits in looks like this).
_MODEL_OR_COMM = (Category.FORWARD, Category.BACKWARD, Category.OPTIMIZER, Category.COLLECTIVE)


def _ranks_elsewhere(ranks: Sequence, pid: int | None) -> list[str]:
    """Of a multi-rank job whose target stands still, the other ranks that still move in code of
    their own, outside the model and any collective: the one the others may be waiting for (a rank
    busy-looping in `except Exception: continue` never arrives while it works, so the never-arrives
    verdict, which wants it standing still, does not name it)."""
    out = []
    for v in ranks:
        s = v.latest
        if v.pid == pid or s is None or not v.works or s.category in _MODEL_OR_COMM:
            continue
        f = project_frame(s.frames)
        if f is None:
            continue
        out.append(f"rank {v.rank} (pid {v.pid}) still moves, in its own code: `{f.name}` "
                   f"({short_path(f.filename)}:{f.line}), no model step or collective in its newest sample: if it "
                   "never reaches the collective, it is the rank the others wait for")
    return out


def _close(a: Finding, b: Finding) -> bool:
    """``a`` ranked ahead of ``b`` on cost, but not by enough to swap them."""
    if (a.severity is Severity.CRITICAL) != (b.severity is Severity.CRITICAL):
        return False
    if SEVERITY_RANK.get(a.severity, 3) != SEVERITY_RANK.get(b.severity, 3) and a.cost_s == b.cost_s:
        return False
    return a.cost_s <= b.cost_s * RANK_MARGIN


def changed(old: Finding | None, new: Finding) -> bool:
    """Worth recording again: new, or a different verdict (not only fresher numbers)."""
    if old is None:
        return True
    return (old.title, old.severity, old.action) != (new.title, new.severity, new.action)


# Findings are re-recorded at least this often, so a replay shows their numbers evolving.
RECORD_REFRESH_S = 10.0


class AdvisorSource:
    """The advisor's part of the session's job stage (advisor.stage): from a tick's evidence
    window it makes a ``Verdict`` (the ranked findings and the breakdowns, for the panes and the
    exporter), then the findings that are new or changed (and, every ``RECORD_REFRESH_S``, the
    current ones again) so a recorder subscribed to the pipeline writes them; a finding that
    clears becomes an Event. ``poll`` reads windows of its own, for the advisor run alone.
    """

    name = "advisor"

    def __init__(
        self,
        store,
        interval: float = 1.0,
        window_s: float = DEFAULT_WINDOW_S,
        stuck_after_s: float = DEFAULT_STUCK_AFTER_S,
        target_pid: int | Callable[[], int | None] | None = None,
        advisor: Advisor | None = None,
        unattached_every: float = 0.0,
    ) -> None:
        self.store = store
        self.unattached_every = unattached_every  # seconds between evaluations with no target
        self.interval = interval
        # A callable follows the session when the user attaches to another process.
        self._target = target_pid if callable(target_pid) else (lambda: target_pid)
        self.advisor = advisor or Advisor(window_s=window_s, stuck_after_s=stuck_after_s, target_pid=self._target())
        self._emitted: dict[str, tuple[Finding, float]] = {}
        self._reported_errors: set[str] = set()
        self.history: dict[str, tuple[float, float]] = {}  # id -> (first shown, last shown)
        self.evaluations = 0
        self._last_eval: float | None = None
        self._resets_seen = store.resets
        self._enough = False  # an evaluation since the attach (or the replay's jump) had enough evidence

    def window_at(self, target: int | None, now: float | None = None) -> JobWindow:
        """A window of its own, as the advisor's parameters say (the advisor run alone)."""
        return read_window(self.store, target, self.advisor.stuck_after_s, self.advisor.window_s, now)

    def poll(self) -> list[object]:
        if self.store.now <= 0:
            return []  # nothing collected yet
        target = self._target()
        return self.advise(target, lambda now=None: self.window_at(target, now))

    def advise(self, target: int | None, window_at: Callable[..., JobWindow]) -> list[object]:
        """One evaluation for ``target``: ``window_at(now=None)`` gives the tick's window (at the
        store's clock) or, on a fresh start, the one as it stood ``appear_after_s`` earlier."""
        if target != self.advisor.target_pid:
            self.advisor.target_pid = target
            self.advisor.reset()  # another job: its findings start over
            self._last_eval = None
            self._enough = False
        if (
            target is None
            and self._last_eval is not None
            and 0 <= self.store.now - self._last_eval < self.unattached_every
        ):
            return []
        if self.store.resets != self._resets_seen:
            # A replay jumped: what held before the jump does not hold after,
            # and nothing "cleared" or appeared at the new position because of the jump: what was
            # shown before it is forgotten, not reported cleared (a seek to the recording's start
            # said "cleared: ..." of a finding that appeared only a minute later).
            self._resets_seen = self.store.resets
            self.advisor.reset()
            self._emitted.clear()
            self._enough = False
        if self.advisor.fresh:
            self._look_back(window_at)
        elif self._last_eval is not None and self.store.now - self._last_eval > self.advisor.appear_after_s + ADVISOR_EVERY_S:
            # The data moved on further than the evaluations' cadence since the last one (a replay
            # at 60x: a minute of data a tick): the window as it stood appear_after_s earlier is
            # evaluated too, as a second-by-second run would have, so a cause that held over that
            # span shows now, whatever the playback speed (at 60x a file's last finding stayed
            # "confirming" at its end, where 1x and `advise` showed it).
            self._look_back(window_at)
        window = window_at()
        now = window.now
        self._last_eval = now
        findings = self.advisor.evaluate_window(window)
        self.evaluations += 1
        ctx = self.advisor.last_context
        breakdowns = tuple(g.breakdown for g in ctx.gpus) if ctx is not None else ()
        collecting = None
        if not self._enough and ctx is not None:
            collecting = evidence(ctx, window, attached=target is not None)
            self._enough = collecting.enough()
        out: list[object] = [Verdict(now, tuple(findings), breakdowns, tuple(self.advisor.pending),
                                     None if self._enough else collecting, target)]
        current = {f.id: f for f in findings}
        for f in findings:
            first, _ = self.history.get(f.id, (f.first_seen or now, now))
            self.history[f.id] = (first, now)
            prev = self._emitted.get(f.id)
            if prev is None or changed(prev[0], f) or now - prev[1] >= RECORD_REFRESH_S:
                self._emitted[f.id] = (f, now)
                out.append(f)
        for fid in list(self._emitted):
            if fid not in current:
                old, _ = self._emitted.pop(fid)
                out.append(Event(now, self.name, f"cleared: {old.title}", "info"))
        for rid, err in self.advisor.errors.items():
            if rid not in self._reported_errors:
                self._reported_errors.add(rid)
                out.append(Event(now, self.name, f"rule {rid} failed: {err}", "error"))
        return out

    def _look_back(self, window_at: Callable[..., JobWindow]) -> None:
        """On a fresh start (attach, a replay's jump) the store already holds history: evaluate
        the window as it stood ``appear_after_s`` ago too, so a cause that held over that span is
        shown at once, from the evidence, instead of after seconds of watching (a paused replay
        would otherwise never show what was there)."""
        then = self.store.now - self.advisor.appear_after_s
        if then > 0 and self.store.has_data_before(then):
            self.advisor.evaluate_window(window_at(then))

    def close(self) -> None:
        pass


# The advisor runs once a second in every mode (the UI, advise, record, replay), whatever the
# sampling interval: stacks arrive several times a second and NVML's 200 ms buffer comes with each
# poll, so each second has new evidence, and the 2 s hysteresis then shows a cause ~2 s after its
# evidence is enough instead of waiting for the next poll of a 2 s interval (the H100 real-jobs
# run: first findings at 6-8 s after attaching, all on even seconds). An evaluation costs a few
# milliseconds over a 60 s window.
ADVISOR_EVERY_S = 1.0


def advisor_every() -> float:
    """Seconds between evaluations, the same in every mode whatever the sampling interval."""
    return ADVISOR_EVERY_S
