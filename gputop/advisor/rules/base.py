"""What every rule shares: ``Hit`` and ``Rule``, the bar a cause must clear to be reported, and
the helpers that pick the worst GPU and word the evidence alike across themes.

A number used by one theme lives beside its rule, not here; only thresholds that several themes
apply the same way (the cost bar, how many stacks make a claim) are here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

from ...analysis import BUCKET_LABELS, CPU_DEVICE, EVAL, Bucket
from ...analysis import exact_upper
from ...model import Category, Finding, Severity
from ..context import AnalysisContext, GpuView
from .threshold import DERIVED, JUDGEMENT, AnyThreshold, IntThreshold, Threshold

# A cause must cost at least this share of the covered time, and this many seconds, to be
# reported. Judgement, with a measurement under it: the same job's step rate differs by about
# ±5 % from one window to the next (bench/results/pyspy_overhead.md: the windows without
# sampling spread -5.2 % … +5.6 %), so a cause must be about twice that before its fix is worth
# a user's attention; a second or two is one or two stalls, not a pattern.
MIN_COST_FRACTION = Threshold(
    0.10, "share", JUDGEMENT,
    "About twice the ±5 % a job's step rate varies between windows by itself: less is not worth a fix.",
    "bench/results/pyspy_overhead.md")
MIN_COST_S = Threshold(1.0, "s", JUDGEMENT, "A second or two lost is one or two stalls, not a pattern.")
# ... unless it came back this many separate times: then it is a pattern already, though the
# window is young (the seconds bar binds only in the first seconds after attaching: over a full
# window the share bar asks for more). A data wait in every 0.1 s step shows as many short
# waits within a second or two; one long stall is one.
MIN_RECURRENCES = IntThreshold(
    4, "waits", JUDGEMENT,
    "A wait that came back this many separate times is a pattern though it has not cost MIN_COST_S yet.")
# Stack-based claims need this many main-thread samples: 2 s at the sampler's default 5 Hz (the
# rate bench/results/pyspy_overhead.md recommends: within the 1 % overhead budget, 10 Hz is not).
# The two seconds are judgement.
MIN_MAIN_SAMPLES = IntThreshold(
    10, "samples", JUDGEMENT,
    "A claim from the stacks needs 2 s of the main thread at the sampler's default 5 Hz.",
    "bench/results/pyspy_overhead.md")
FULL_CONFIDENCE_SAMPLES = IntThreshold(
    25, "samples", JUDGEMENT, "A finding's confidence reaches its full weight at this many samples (~5 s at 5 Hz).")
# Busy polls (GPU utilisation at or above analysis.efficiency.BUSY_UTIL_PCT) a clock, link or
# memory reading needs before it counts.
MIN_BUSY_POLLS = IntThreshold(
    3, "polls", JUDGEMENT, "A clock, link or memory reading counts after this many busy polls: one or two can "
    "catch a ramp up or down.")
# GPM activity (SM, tensor cores, fp32 pipes) is read only for a GPU whose busy polls average at
# least this utilisation (launch-bound, no-tensor-cores).
GPM_BUSY_UTIL_PCT = Threshold(
    60.0, "%", JUDGEMENT,
    "GPM activity is judged only on a GPU this busy: ten points above the busy bar, so a GPU that only "
    "flickers across it is not judged by its GPM numbers.")


@dataclass(frozen=True)
class Hit:
    evidence: tuple[str, ...]
    action: str
    expected_gain: str = ""
    cost_s: float = 0.0
    confidence: float = 0.8
    gpu_index: int | None = None
    severity: Severity | None = None  # overrides the rule's default
    title: str | None = None  # overrides the rule's default
    gain_bound: float | None = None  # Finding.gain_predicted: the upper bound the gain text states


@dataclass(frozen=True)
class Withdraw:
    """A check's answer when the pattern it names is there but the evidence no longer tells its
    cause from another (syncs seen, too few yet to count; a rank that may never arrive rather
    than straggle): what it showed is taken back at once. Silence (None) lets a shown finding
    linger for the engine's CLEAR_AFTER_S, right for a cause that comes and goes, wrong for one
    the evidence now doubts: a held-out job's launch-bound warning, withdrawn by its rule after
    one second, stayed on screen nine more with that second's evidence."""
    why: str


Check = Callable[[AnalysisContext], "Hit | Withdraw | None"]


def uses(*thresholds: AnyThreshold) -> Callable[[Check], Check]:
    """Names the thresholds a check decides with, above its definition: ``@uses(MIN_COST_S, ...)``.
    The check is returned as it is (no wrapper); its ``Rule`` lists them (``gputop rules``).
    tests/test_thresholds.py holds the list to the code: every threshold the check reaches (its
    body, its lambdas, the rules' helpers it calls), less ``STATEMENT_THRESHOLDS``, is listed, and
    nothing it cannot reach."""

    def mark(check: Check) -> Check:
        USES[check] = thresholds
        return check

    return mark


# Each check's ``@uses(...)``, by the check: a table rather than an attribute set on the function,
# so a ``Rule`` reads it without probing the function for it.
USES: dict[Check, tuple[AnyThreshold, ...]] = {}


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    severity: Severity
    check: Check
    # Seconds a finding must hold before it is shown; None: the engine's default. Zero for
    # conditions that are facts, not rates (an environment variable) or that already include
    # their own duration (stuck).
    appear_after_s: float | None = None
    # Findings this one makes moot: a hung job is not a slow one.
    supersedes: tuple[str, ...] = ()
    # The thresholds its check decides with, most specific first; by default the ones the check
    # names in ``@uses(...)``. The numbers behind how every finding is stated (its confidence,
    # its bound) are STATEMENT_THRESHOLDS, shared, not listed per rule.
    thresholds: tuple[AnyThreshold, ...] = ()

    def __post_init__(self) -> None:
        if not self.thresholds:
            object.__setattr__(self, "thresholds", USES.get(self.check, ()))

    def evaluate(self, ctx: AnalysisContext) -> Finding | None:
        f = self.run(ctx)
        return None if isinstance(f, Withdraw) else f

    def run(self, ctx: AnalysisContext) -> Finding | Withdraw | None:
        """``evaluate``, with a check's withdrawal passed on (the engine takes the finding back)."""
        hit = self.check(ctx)
        if hit is None or isinstance(hit, Withdraw):
            return hit
        return Finding(
            id=self.id,
            title=hit.title or self.title,
            severity=hit.severity or self.severity,
            confidence=round(min(1.0, max(0.0, hit.confidence)), 2),
            evidence=hit.evidence,
            action=hit.action,
            expected_gain=hit.expected_gain,
            cost_s=round(max(0.0, hit.cost_s), 2),
            gpu_index=hit.gpu_index,
            ts=ctx.now,
            gain_predicted=stated_bound(hit.gain_bound),
        )


def stated_bound(bound: float | None) -> float | None:
    """``Finding.gain_predicted``: the upper bound on steps/s the gain's text states, rounded as
    it is kept, or None where the text states none. A bound at the cap (MIN_REMAINING: a wait of
    nearly all the time, or an upper confidence limit reaching it) is said as "no bound stated"
    (``gain``), so the number is not kept either: a 100 beside those words would be read, by a
    dashboard or the verdict line, as the promise the words refuse to make."""
    if bound is None or bound >= wait_bound(1.0):
        return None
    return round(bound, 2)


# --------------------------------------------------------------------------- wording


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f} %"


def secs(x: float) -> str:
    return f"{x:.0f} s" if x >= 10 else f"{x:.1f} s"


def device_name(g: GpuView) -> str:
    return "the training loop (no GPU)" if g.index == CPU_DEVICE else g.name


def gpu_index(g: GpuView) -> int | None:
    """The finding's GPU, or None for a CPU-only job."""
    return None if g.index == CPU_DEVICE else g.index


def window_text(g: GpuView) -> str:
    """'the last 6.3 s', saying so when that is within one step. A window in which nothing but
    one wait was seen (no busy time, every main-thread sample in one bucket) saw no step end: a
    48 s step watched for 6 s reads "100 % of the last 6 s", a share of part of one step, not of
    the job's steps. Said as possible: steps too short to be sampled look the same."""
    bd = g.breakdown
    text = f"the last {secs(bd.total_s)}"
    seq = bd.sequence
    if len(seq) >= MIN_MAIN_SAMPLES and bd.busy_s <= 0 and len(set(seq)) == 1 and seq[0] is not Bucket.BUSY:
        text += " (no step seen to end in it: it may be part of one longer step)"
    return text


def idle_line(g: GpuView, parts: Sequence[Bucket]) -> str:
    bd = g.breakdown
    share = sum(bd.get(b) for b in parts) / bd.total_s if bd.total_s else 0.0
    what = " + ".join(BUCKET_LABELS[b] for b in parts if bd.get(b) > 0) or BUCKET_LABELS[parts[0]]
    if g.index == CPU_DEVICE:
        return (
            f"{device_name(g)} not computing {pct(bd.idle_fraction)} of {window_text(g)}; "
            f"{pct(share)} {what}"
        )
    return f"{g.name} idle {pct(bd.idle_fraction)} of {window_text(g)}; {pct(share)} {what}"


def labels_line(g: GpuView, bucket: Bucket, what: str = "main thread in") -> str | None:
    top = g.breakdown.top_labels(bucket, 2)
    if not top:
        return None
    when = "while computing nothing" if g.index == CPU_DEVICE else "during idle"
    return f"{when}, {what} " + ", ".join(f"{lab} {pct(sh)} of samples" for lab, sh in top)


def workers_cpu_line(ctx: AnalysisContext) -> str:
    w = ctx.workers
    cpus = [c.cpu_mean for c in w.current if c.cpu_mean is not None]
    if not cpus:
        return f"{w.count} loader workers"
    lo, hi = min(cpus), max(cpus)
    span = f"{lo:.0f} %" if abs(hi - lo) < 5 else f"{lo:.0f}-{hi:.0f} %"
    return f"{w.count} loader worker{'s' if w.count != 1 else ''} at {span} CPU each"


MIN_REMAINING = Threshold(
    0.01, "share", JUDGEMENT,
    "A wait of (nearly) all the time bounds nothing: the bound is capped as if 1 % were left; beyond 100x "
    "the number says only 'the device does almost nothing'.")
# A change whose own bound is below this is not worth naming: the bar for a healthy job
# (its best change gains under 10 %), the same 10 % as MIN_COST_FRACTION.
WORTHWHILE_GAIN = Threshold(
    1.1, "x", JUDGEMENT, "A change that can give less than 10 % is not worth naming: the bar of a healthy job, "
    "as MIN_COST_FRACTION.")


# A share of the time read from k of n stack samples is an estimate: the bound a finding states
# uses its upper confidence limit (Clopper-Pearson's exact interval, one-sided), not the estimate
# itself. Measured on the H100 (bench/results/real_jobs.md, "Bounds"): from 20-60 samples early in
# a session, bounds from the share itself fell below the measured gain (data-starved 1.83 vs
# 1.93x; unfused-optimizer read live at 1.6x from 38 % of ~40 samples vs 1.77x). On a CPU job
# (a new user's, time.sleep(0.05) every step, 95 % of the samples), "at most" 21x-63x from the
# share against 77-105x measured without the sleep. The level, 95 % one-sided, is judgement: a
# benchmark round states ~17 bounds, so at 90 % about two would undershoot from sampling alone,
# and samples 0.2 s apart in a periodic step loop are not independent draws (the nominal level
# overstates the coverage); what it costs is a looser stated bound (18 of 40: 2.4x at 95 %, 2.2x
# at 90 %, 1.8x from the share itself), which decides nothing. Exact rather than Wilson's score
# limit: near a share of 1, where 1 / (1 - f) is steepest, Wilson's covers the truth in as few
# as 82 % of draws (tests/test_gain_upper_limit.py), the exact one in at least 95 %.
SHARE_UPPER_LEVEL = Threshold(
    0.95, "confidence", JUDGEMENT,
    "A bound from sampled shares is stated at the share's one-sided 95 % upper limit: bounds from the share "
    "itself fell below the measured gains.",
    "bench/results/real_jobs.md (Bounds)")
SHARE_UPPER_Z = Threshold(
    1.6449, "z", DERIVED, "The standard normal's 95th percentile: SHARE_UPPER_LEVEL, one-sided.")


def share_upper(k: float, n: int, z: float = SHARE_UPPER_Z) -> float:
    """Clopper-Pearson's exact upper confidence limit of a share seen in ``k`` of ``n`` samples,
    one-sided at the level ``z`` stands for (SHARE_UPPER_LEVEL by default): it covers the true
    share at least at that level whatever the share and n. In [k/n, 1], and tends to k/n as n
    grows; 1 without samples."""
    return max(k / n if n else 1.0, exact_upper(int(round(k)), n, float(z)))


class ShareLimit(NamedTuple):
    """The share of time a stated bound uses, and the stack samples it comes from."""

    upper: float  # the upper confidence limit (or the share itself where it is not sampled)
    samples: int  # 0: not from stack samples (a GPU's idle share): no interval to state


def sampled_upper(share: float, n: int, gpu_fraction: float = 0.0) -> ShareLimit:
    """The upper limit of a share read from ``n`` stack samples (``share`` = k / n), or, where
    the GPU's idle share (``gpu_fraction``: NVML's many polls, no interval) is larger, that."""
    loop = ShareLimit(share_upper(share * n, n), n)
    return loop if loop.upper > gpu_fraction else ShareLimit(gpu_fraction, 0)


def wait_bound(fraction: float) -> float:
    """Steps/s if a wait of ``fraction`` of the time disappeared entirely: 1 / (1 - f)."""
    return 1.0 / max(MIN_REMAINING, 1.0 - fraction)


def times(x: float) -> str:
    return f"{x:.0f}x" if x >= 10 else f"{x:.2f}x" if x < 1.1 else f"{x:.1f}x"


def loop_wait(ctx: AnalysisContext, gpu_fraction: float, *cats: Category) -> float:
    """The share of time a wait costs, for its bound: the GPU's idle share in it, or the
    training loop's own share of samples blocked in it (``cats``), whichever is larger.

    NVML counts a sampled period busy when any kernel ran in it, so while the loop waits a
    trailing kernel or a small copy keeps the GPU "busy": its idle share understates the wait.
    Measured on the H100 (bench/results/real_jobs.md): bounds from the GPU's idle share of
    1.15-4.15x against measured gains of 1.57-4.71x for more workers and fewer checkpoints.
    The cost that ranks the finding stays the GPU's."""
    if not enough_stacks(ctx):
        return gpu_fraction
    return max(gpu_fraction, main_share(ctx, *cats))


def loop_wait_upper(ctx: AnalysisContext, gpu_fraction: float, *cats: Category) -> ShareLimit:
    """``loop_wait`` for the stated bound only: the loop's share of samples at its upper
    confidence limit (share_upper); the GPU's idle share, from NVML's many polls, as it is.
    Whether a finding fires, its cost and its ranking stay with ``loop_wait``."""
    if not enough_stacks(ctx):
        return ShareLimit(gpu_fraction, 0)
    return sampled_upper(main_share(ctx, *cats), len(ctx.main_stacks), gpu_fraction)


def device_upper(ctx: AnalysisContext, g: GpuView, fraction: float) -> ShareLimit | None:
    """The stated bound's share of ``g``'s window where that share is itself read from samples: a
    job on no GPU has the training thread as its device, its time line built from the main
    thread's stack samples (analysis.breakdown.stack_slices), so a share of it is k of n samples
    and is taken at its upper limit (share_upper). None for a GPU: NVML's many polls."""
    if g.index != CPU_DEVICE:
        return None
    return sampled_upper(fraction, len(ctx.main_stacks))


def share_lower(k: float, n: int, z: float = SHARE_UPPER_Z) -> float:
    """The exact lower confidence limit of a share seen in ``k`` of ``n`` samples, one-sided at
    the same level as ``share_upper``: for a limit that falls as the share rises (n workers load
    at most n / f as fast as one thread loading f of the time), whose upper bound needs f at its
    lowest. 0 without samples."""
    if n <= 0:
        return 0.0
    return max(0.0, 1.0 - share_upper(n - k, n, z))


def loop_wait_lower(ctx: AnalysisContext, g: GpuView, gpu_fraction: float, *cats: Category) -> float:
    """``loop_wait`` at its lower confidence limit where it is read from the stacks: the GPU's
    idle share (NVML's polls) as it is, or the loop's share of samples at share_lower, whichever
    is larger, and never above ``loop_wait`` itself. On no GPU the device's own share is one of
    samples too (``device_upper``), so it is taken at its lower limit as well."""
    whole = loop_wait(ctx, gpu_fraction, *cats)
    n = len(ctx.main_stacks)
    device = share_lower(gpu_fraction * n, n) if g.index == CPU_DEVICE else gpu_fraction
    if not enough_stacks(ctx):
        return min(whole, device)
    return min(whole, max(device, share_lower(main_share(ctx, *cats) * n, n)))


def bounded(fraction: float, limit: float | None = None, upper: ShareLimit | None = None) -> float:
    """The smaller of the wait's bound and the change's own (``limit``). With ``upper`` the
    wait's bound is taken at the share's upper confidence limit; ``limit`` is unaffected."""
    b = wait_bound(fraction if upper is None else max(fraction, upper.upper))
    return b if limit is None else min(b, limit)


def _costs(fraction: float, upper: ShareLimit | None) -> str:
    """The phrase "the 45 % of the time this costs", with the upper limit the bound uses where
    that is from samples and reads differently."""
    text = f"the {pct(fraction)} of the time this costs"
    if upper is not None and upper.samples and pct(upper.upper) != pct(fraction):
        text += (f", up to {pct(upper.upper)} at {100 * SHARE_UPPER_LEVEL:.0f} % confidence "
                 f"from {_count(upper.samples)} stack samples,")
    return text


def _takes(fraction: float, upper: ShareLimit | None) -> str:
    """'the wait takes 97 % of the time', with the upper limit where ``_costs`` gives one."""
    text = f"the wait takes {pct(fraction)} of the time"
    if upper is not None and upper.samples and pct(upper.upper) != pct(fraction):
        text += (f" (up to {pct(upper.upper)} at {100 * SHARE_UPPER_LEVEL:.0f} % confidence "
                 f"from {_count(upper.samples)} stack samples)")
    return text


def _count(n: int) -> str:
    """A sample count as the text states it: exact while it is small (it grows as the window
    fills), to two figures beyond that, so a full window's count moving by a sample or two does
    not change the words (a recording starts a new finding row when they change)."""
    if n < 100:
        return str(n)
    return f"about {round(n, 2 - len(str(n))):,}"


def gain(fraction: float, limit: float | None = None, limited_by: str = "", unit: str = "steps/s",
         upper: ShareLimit | None = None) -> str:
    """The gain as an upper bound: what removing the whole wait would give, or, when the change
    itself can give less (``limit``, with ``limited_by`` saying why), that smaller bound. With
    ``upper`` (a share read from stack samples) the wait's bound is taken at the share's upper
    confidence limit and the text says so; the limit is unaffected."""
    b = bounded(fraction, upper=upper)
    costs = _costs(fraction, upper)
    # A wait of (nearly) all the time bounds nothing: 1 / (1 - f) runs to the cap (MIN_REMAINING),
    # and "at most 100x" for a rank that sleeps reads as a promise. Said as what it is.
    capped = b >= wait_bound(1.0)
    takes = _takes(fraction, upper)
    if limit is not None and limit < b:
        rest = f"{takes}, nearly all of it: alone it bounds nothing" if capped else f"{costs} would allow {times(b)}"
        return f"at most {times(limit)} {unit} (an upper bound), limited by {limited_by}; {rest}"
    if capped:
        return (f"no bound stated: {takes}, nearly all of it, so the gain is limited by what the fix gives back, "
                "not by the wait")
    return f"at most {times(b)} {unit} (an upper bound: if {costs} came back in full)"


# --------------------------------------------------------------------------- weighing


def confidence(dominance: float, samples: int) -> float:
    """How sure: the evidence's dominance (0..1), scaled down while samples are few."""
    weight = 0.5 + 0.5 * min(1.0, samples / FULL_CONFIDENCE_SAMPLES)
    return (0.5 + 0.45 * min(1.0, max(0.0, dominance))) * weight


def worst(ctx: AnalysisContext, cost: Callable[[GpuView], float], gpu_only: bool = False) -> tuple[GpuView, float] | None:
    best: tuple[GpuView, float] | None = None
    for g in ctx.gpus:
        if gpu_only and g.index == CPU_DEVICE:
            continue
        if g.breakdown.total_s <= 0:
            continue
        c = cost(g)
        if best is None or c > best[1]:
            best = (g, c)
    return best


def significant(g: GpuView, cost_s: float, min_fraction: float = MIN_COST_FRACTION, min_s: float = MIN_COST_S,
                buckets: Sequence[Bucket] = ()) -> bool:
    """Whether a cause costing ``cost_s`` of ``g``'s window is worth reporting: a share of the
    window, and either enough seconds or (for idle time in ``buckets``) a wait that recurs."""
    total = g.breakdown.total_s
    if total <= 0 or cost_s <= 0 or cost_s / total < min_fraction:
        return False
    return cost_s >= min_s or (bool(buckets) and g.breakdown.recurrences(*buckets) >= MIN_RECURRENCES)


# A GPU 'busy' spinning (analysis.spin: a NCCL kernel waiting for a peer, a kernel that never
# ends) for at least this share of the window: its few active SMs, idle tensor cores and low power
# are the wait's, and say nothing of kernel sizes, precision or batch. Judgement: a healthy DDP
# rank overlaps its all-reduce with backward and spins a few % of a step; a third is a wait
# worth its own finding (rank-straggler, stuck), which the busy-GPU findings must not hide.
SPIN_EXPLAINS = Threshold(
    0.30, "share", JUDGEMENT,
    "A GPU spinning 'busy' (a kernel waiting) this share of the window says nothing of its kernels, precision "
    "or batch: a healthy DDP rank spins a few %, a third is a wait.")


def spinning(g: GpuView) -> bool:
    return g.spin >= SPIN_EXPLAINS


def idle_unless_spinning(g: GpuView) -> float:
    """The GPU's idle seconds in the window, unless it spins (a collective waiting is not idle)."""
    return 0.0 if spinning(g) else g.breakdown.idle_s


def waits_for_peers(ctx: AnalysisContext, g: GpuView) -> bool:
    """A rank's GPU that waits for its peers (spinning, or computing less than its busiest peer
    while 'busy': analysis.spin's wait per poll) SPIN_EXPLAINS of the window: NCCL's kernel
    waiting for a peer keeps a few SMs busy, which reads like small kernels. A held-out DDP job's
    rank 0 (its GPU 'busy' 100 %, SMs 26 %, waiting 73 % beside its peer) was told launch-bound for a
    second before its accumulation without no_sync() was named (2 x H200)."""
    return any(v.gpu == g.index and (v.gpu_wait or 0.0) >= SPIN_EXPLAINS for v in ctx.ranks)


def enough_stacks(ctx: AnalysisContext) -> bool:
    return len(ctx.main_stacks) >= MIN_MAIN_SAMPLES


# A busy GPU (GPM_BUSY_UTIL_PCT) whose SMs are active at most this share of the time runs
# kernels too small to fill it. Measured SM activity (bench/results/harness.md): the healthy
# bf16 trainer 92.6 %, the fp32 matmul loop 97.4 %, the launch-bound loop 0.1 %; 40 is
# judgement between them.
LAUNCH_BOUND_SM_ACTIVE_PCT = Threshold(
    40.0, "%", JUDGEMENT,
    "A busy GPU whose SMs are active at most this share runs kernels too small to fill it; between the "
    "launch-bound loop's 0.1 % and healthy jobs' 92-97 %.",
    "bench/results/harness.md")


def starved_sm_s(g: GpuView) -> float:
    """Busy seconds whose SMs sat idle: a GPU "busy" with kernels too small to fill it (GPM).
    Zero without GPM, or when the SMs are active above LAUNCH_BOUND_SM_ACTIVE_PCT."""
    e, bd = g.efficiency, g.breakdown
    if e.sm_active is None or not e.util_busy_mean or e.util_busy_mean < GPM_BUSY_UTIL_PCT:
        return 0.0
    if e.sm_active > LAUNCH_BOUND_SM_ACTIVE_PCT:
        return 0.0
    return bd.busy_s * max(0.0, 1.0 - e.sm_active / e.util_busy_mean)


# Idle time waiting for input: CPU-bound loading or storage.
DATA_BUCKETS = (Bucket.DATA, Bucket.IO)


def data_wait_s(g: GpuView) -> float:
    """Idle time spent waiting for input, CPU-bound or on storage."""
    return g.breakdown.get(Bucket.DATA) + g.breakdown.get(Bucket.IO)


def main_share(ctx: AnalysisContext, *cats: Category) -> float:
    shares = ctx.main_shares()
    return sum(shares.get(c, 0.0) for c in cats)


def in_evaluation(ctx: AnalysisContext) -> tuple[bool, ...]:
    """Per main-thread sample (``ctx.main_stacks``' order): whether the step model placed it in
    evaluation work (a validation forward, the ``.item()`` reads of its results). Those samples
    are the evaluation's finding's (eval-every-step): a rule naming what training does (a sync
    every step, launch overhead, CPU work) leaves them out. All False where the step model was
    not worked out for these samples (a context built by hand)."""
    placed = ctx.step.placed
    if len(placed) != len(ctx.main_stacks):
        return (False,) * len(ctx.main_stacks)
    return tuple(p == EVAL for p in placed)


def training_share(ctx: AnalysisContext, *cats: Category) -> float:
    """``main_share`` less the samples in evaluation work (``in_evaluation``): the share of all
    the main thread's samples that are training's, in ``cats``."""
    xs = ctx.main_stacks
    if not xs:
        return 0.0
    wanted = set(cats)
    return sum(1 for s, e in zip(xs, in_evaluation(ctx)) if not e and s.category in wanted) / len(xs)


# The numbers behind how every finding is stated, not whether it fires: its confidence (the
# samples it takes to reach full weight) and its gain's upper bound (the cap on a wait of all the
# time, the confidence level of a share read from samples). Every rule shares them, so no rule
# lists them (``Rule.thresholds``); ``gputop rules`` shows them once.
STATEMENT_THRESHOLDS: tuple[AnyThreshold, ...] = (FULL_CONFIDENCE_SAMPLES, MIN_REMAINING, SHARE_UPPER_LEVEL,
                                                  SHARE_UPPER_Z)
