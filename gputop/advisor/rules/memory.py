"""GPU memory: too close to the card's limit, so much to spare that a larger batch fits, growing
towards the limit (with a forecast), or what ended a job that ran out."""

from __future__ import annotations

from ...analysis import (COPY_ON_READ, CPU_DEVICE, MAIN_LEAK, MIN_POINTS, MIN_SPAN_S, Growth, LeakLine, MemoryView, eta_text,
                         rate_text)
from ...units import fmt_bytes
from ..context import AnalysisContext, GpuView
from ...model import Severity
from .base import MIN_BUSY_POLLS, MIN_COST_FRACTION, SPIN_EXPLAINS, Hit, data_wait_s, pct, spinning, times, uses
from .threshold import JUDGEMENT, IntThreshold, Threshold

MEM_NEAR_LIMIT = Threshold(
    0.95, "share", JUDGEMENT,
    "Above this share of the card the caching allocator has no slack: one larger batch or fragmentation means "
    "an OOM, or cudaMalloc retries that flush the cache (each a full sync).")
# launch-bound also reads it to say a larger batch fits.
MEM_HEADROOM = Threshold(
    0.35, "share", JUDGEMENT,
    "Below this share of the card, a batch twice as large fits with room to spare (activations scale with it).")
HEADROOM_SM_ACTIVE_PCT = Threshold(
    60.0, "%", JUDGEMENT,
    "A larger batch helps a GPU that is not already full: SMs active below this (the healthy bf16 trainer ran "
    "at 92.6 %).", "bench/results/harness.md")
# The batch factor suggested aims the peak at this share of MEM_NEAR_LIMIT (activations are not
# all of the memory, so the scaling is rough), and is never above MAX_BATCH_FACTOR.
BATCH_TARGET_SHARE = Threshold(
    0.8, "share", JUDGEMENT,
    "The batch factor aims the peak at this share of MEM_NEAR_LIMIT: activations are not all of the memory.")
MAX_BATCH_FACTOR = IntThreshold(8, "x", JUDGEMENT, "The largest batch factor suggested: the scaling is rough.")


def larger_batch(g: GpuView, ctx: AnalysisContext | None = None) -> tuple[int, float] | None:
    """The batch factor that fits in ``g``'s spare memory, and the samples/s it can give at most;
    None without a memory reading that says it fits.

    The bound: a step of factor x the samples takes at least as long as the work that does not
    grow with the batch (the time the GPU idled per step: launching, waiting; the CPU may
    overlap it with the GPU's work, so it is a floor, not a sum) and at least as long as the
    GPU's busy time grown by the batch (factor x the share of it the SMs were active, SMs full
    at best; without GPM, at least what it was)."""
    e = g.efficiency
    frac = e.mem_peak_fraction
    if frac is None or frac >= MEM_HEADROOM or growing(ctx, g):
        return None
    factor = max(2, int(MEM_NEAR_LIMIT * BATCH_TARGET_SHARE / max(0.01, frac)))
    factor = min(factor, MAX_BATCH_FACTOR)
    bd = g.breakdown
    busy = bd.busy_s / bd.total_s if bd.total_s else 1.0
    growth = max(1.0, factor * e.sm_active / 100.0) if e.sm_active is not None else 1.0
    bound = factor / max(1e-9, 1.0 - busy, busy * growth)
    return factor, bound


@uses(MEM_NEAR_LIMIT)
def check_memory_near_limit(ctx: AnalysisContext) -> Hit | None:
    cands = [g for g in ctx.gpus if (g.efficiency.mem_peak_fraction or 0.0) >= MEM_NEAR_LIMIT]
    if not cands:
        return None
    g = max(cands, key=lambda x: x.efficiency.mem_peak_fraction or 0.0)
    e = g.efficiency
    alloc = ctx.env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    first = (
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (less fragmentation); "
        if "expandable_segments" not in alloc
        else ""
    )
    return Hit(
        evidence=(
            f"{g.name} memory peaked at {fmt_bytes(e.mem_used_peak)} of {fmt_bytes(e.mem_total)} "
            f"({pct(e.mem_peak_fraction)}) in the window",
            f"PYTORCH_CUDA_ALLOC_CONF={alloc}" if alloc else "PYTORCH_CUDA_ALLOC_CONF is not set",
        ),
        action=(
            first + "activation checkpointing of the largest blocks: "
            "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False); bf16 autocast halves "
            "activations; or halve the batch and accumulate: (loss / 2).backward() with "
            "optimizer.step() every 2 micro-batches"
        ),
        expected_gain="room for the peak: no OOM and no allocator retries (each flushes the cache and syncs)",
        cost_s=0.0,
        confidence=0.9,
        gpu_index=g.index,
        title=f"{g.name} memory near its limit ({pct(e.mem_peak_fraction)})",
    )


def memory_to_spare(g: GpuView, ctx: AnalysisContext | None = None) -> bool:
    """The job's peak on ``g`` is far from the card's limit: below MEM_HEADROOM of it, read over
    enough busy polls to be the job at work, and not growing (today's spare memory is tomorrow's
    OOM when it grows). What memory-headroom and activation-checkpointing both stand on."""
    e = g.efficiency
    frac = e.mem_peak_fraction
    if frac is None or frac >= MEM_HEADROOM or e.busy_polls < MIN_BUSY_POLLS:
        return False
    return not growing(ctx, g)


@uses(MEM_HEADROOM, HEADROOM_SM_ACTIVE_PCT, BATCH_TARGET_SHARE, MAX_BATCH_FACTOR, MEM_NEAR_LIMIT, MIN_BUSY_POLLS,
      MIN_COST_FRACTION, SPIN_EXPLAINS)
def check_memory_headroom(ctx: AnalysisContext) -> Hit | None:
    def fits(g: GpuView) -> bool:
        if not memory_to_spare(g, ctx) or spinning(g):
            return False
        e = g.efficiency
        # A bigger batch helps a GPU that is not full; one starved of data it does not help.
        if data_wait_s(g) > MIN_COST_FRACTION * g.breakdown.total_s:
            return False
        return e.sm_active is not None and e.sm_active < HEADROOM_SM_ACTIVE_PCT

    cands = [g for g in ctx.gpus if g.index != CPU_DEVICE and fits(g)]
    if not cands:
        return None
    g = min(cands, key=lambda x: x.efficiency.mem_peak_fraction or 1.0)
    e = g.efficiency
    found = larger_batch(g, ctx)
    if found is None:
        return None
    factor, bound = found
    action = f"raise batch_size {factor}x (and scale the learning rate, e.g. linearly with warm-up)"
    title = f"{g.name} has memory to spare: a larger batch fits"
    evidence = (
        f"{g.name} memory peaked at {fmt_bytes(e.mem_used_peak)} of {fmt_bytes(e.mem_total)} "
        f"({pct(e.mem_peak_fraction)})",
        f"SMs active {e.sm_active:.0f} % while busy: the GPU is not full",
    )
    if ctx.recompute.seen:
        # The spare memory is first the room for the activations checkpointing recomputes: spent
        # on a larger batch, it would keep the recomputation for good. activation-checkpointing
        # says how; the batch factor is from today's peak, which grows once it is off.
        title = f"{g.name} has memory to spare: activation checkpointing can go first, then a larger batch"
        evidence += ("activation checkpointing is on: the stacks show checkpointed blocks",)
        action = ("first turn activation checkpointing off (activation-checkpointing says how): the spare memory is "
                  "room for the activations it recomputes; then measure the peak again and raise batch_size with "
                  f"what is still spare (today's peak, with checkpointing, would allow {factor}x; scale the "
                  "learning rate with it)")
    return Hit(
        evidence=evidence,
        action=action,
        gain_bound=bound,
        expected_gain=f"more work per kernel launch and per step: at most {times(bound)} samples/s (an upper bound: "
        f"{factor}x the samples per step, with SMs active {e.sm_active:.0f} % while busy, can at best fill them, "
        "and the step's idle time stays)",
        cost_s=0.0,
        confidence=0.6,
        gpu_index=g.index,
        title=title,
    )



def growing(ctx: AnalysisContext | None, g: GpuView) -> bool:
    """The job's memory on ``g`` grows steadily (memory-growth's verdict)."""
    return ctx is not None and ctx.memory is not None and ctx.memory.growing_on(g.index)


# --------------------------------------------------------------------------- growth and its forecast

# Growth that reaches the limit within this long is a finding at all; sooner than WARN_WITHIN_S it
# is a warning.
HORIZON_S = Threshold(
    24 * 3600.0, "s", JUDGEMENT,
    "Growth that reaches the limit within a day is a finding: past that the forecast rests on minutes of history "
    "stretched too far.")
WARN_WITHIN_S = Threshold(
    2 * 3600.0, "s", JUDGEMENT,
    "Growth that reaches the limit within two hours is a warning: a job told that far ahead can be checkpointed "
    "and fixed.")
# Sooner than this the job dies before any other change could be measured: critical, ranked
# above every throughput finding (a job told "the loop sleeps" 40 s before its OOM was told the
# wrong thing first).
CRITICAL_WITHIN_S = Threshold(
    600.0, "s", JUDGEMENT,
    "Growth that reaches the limit within ten minutes is critical and ranked first: the job dies before any other "
    "change could be measured.")
# A named pattern in the job's stacks gets this confidence, a forecast alone this.
NAMED_CONFIDENCE = Threshold(
    0.85, "confidence", JUDGEMENT, "The confidence of growth whose cause the job's stacks name (a kept tensor).")
FORECAST_CONFIDENCE = Threshold(0.7, "confidence", JUDGEMENT, "The confidence of a forecast alone.")

_FIND_IT = ("find what is kept across steps: a loss or output summed or appended without .item() / "
            ".detach(), a list or dict that grows, a cache without a bound; "
            "torch.cuda.memory._record_memory_history() then torch.cuda.memory._dump_snapshot('mem.pickle') "
            "shows the allocating lines (pytorch.org/memory_viz)")
_FIND_IT_HOST = ("find what the job keeps across steps in host memory: a list or dict that grows, a cache "
                 "without a bound, tensors moved to the CPU and kept; tracemalloc.start() then "
                 "tracemalloc.take_snapshot().statistics('lineno') names the allocating lines")
_COPY_ON_READ = ("a Dataset holding Python lists or dicts is copied page by page into every forked worker as "
                 "refcounts touch it (copy-on-read): store it as a numpy array or an Arrow table; or fewer "
                 "workers")


def _growth_line(who: str, gr: Growth, used: str | None = None) -> str:
    """``used``: what is used, said where ``gr.used`` is not ``who``'s own (the host's)."""
    if used is None:
        used = (f"{fmt_bytes(int(gr.used))} of {fmt_bytes(int(gr.limit))} used" if gr.limit else
                f"{fmt_bytes(int(gr.used))} used")
    return (f"{who} grows {rate_text(gr.rate)} (95 %: {rate_text(gr.rate_low)}-{rate_text(gr.rate_high)}) "
            f"over the last {gr.span_s / 60:.0f} min; {used}")


def _host_used(gr: Growth, mem: MemoryView) -> str:
    """The host's used memory and the job's, each named: the forecast is the job's growth against
    what the host has free, and "2.0G of 23.5G used" beside the job's rate read as the job's own
    (its RSS was 1.0G)."""
    host = f"the host: {fmt_bytes(int(gr.used))} of {fmt_bytes(int(gr.limit))} used" if gr.limit else \
        f"the host: {fmt_bytes(int(gr.used))} used"
    if mem.job_host is None:
        return host
    what = ("its main process's RSS and its workers' private memory (USS)" if any(w.uss is not None for w in mem.workers)
            else "its main process's RSS")
    return f"{host}; the job {fmt_bytes(int(mem.job_host))} ({what})"


def _median_rate(growths: list[Growth]) -> str:
    rates = sorted(g.rate for g in growths)
    return rate_text(rates[len(rates) // 2])


def _host_evidence(mem: MemoryView) -> list[str]:
    """Whose host memory grows: the workers' private memory (USS) where the host source read
    it, their RSS, and the main process's RSS."""
    out: list[str] = []
    n = len(mem.workers)
    read, grow = mem.uss_read, mem.uss_growing
    if grow:
        line = (f"{len(grow)} of {n} DataLoader workers' private memory (USS) grows "
                f"{_median_rate([w.uss for w in grow if w.uss is not None])} each (median)")
        if mem.host_cause == COPY_ON_READ:
            alike = any(w.rss_alike for w in grow)
            line += (": the Dataset's Python objects are copied into each worker as their refcounts are touched "
                     "(copy-on-read)" + ("; their RSS grows alike, so they also allocate (a cache filled in each "
                                         "worker grows the same way)" if alike else
                                         ", while their RSS stays flat (those pages were shared, now private)"))
        out.append(line)
    elif read:
        out.append(f"the {len(read)} DataLoader workers' private memory (USS) is flat: no copy-on-read")
    else:
        rss_grow = [w.growth for w in mem.workers if w.growth.growing]
        if mem.early_copy is not None:
            # What the host forecast was bounded on (memory_window.early_copying): said as such.
            out.append(f"the {n} DataLoader workers' private memory (USS) rose {rate_text(mem.early_copy)} together "
                       "over its first readings while their RSS stayed flat: the growth is theirs, likely copy-on-read "
                       f"(too few readings to judge yet: a minute and {MIN_POINTS} readings a worker)")
        elif rss_grow:
            out.append(f"{len(rss_grow)} of {n} DataLoader workers' RSS grows {_median_rate(rss_grow)} each (median)")
        elif mem.workers and any(w.uss is not None for w in mem.workers):
            # Read, too few times yet: a worker's read is paced by its cost (host.USS_LOCK_SHARE).
            out.append(f"the {n} DataLoader workers' RSS is flat; their private memory (USS), where copy-on-read "
                       "shows, is being read but has too few readings to judge yet (a minute and "
                       f"{MIN_POINTS} readings a worker)")
        elif mem.workers:
            out.append(f"the {n} DataLoader workers' RSS is flat, and their private memory (USS) is not read (a "
                       "kernel before 4.14 or another user's job): copy-on-read shows in USS, not in RSS")
    if mem.main is not None and mem.main.growing:
        out.append(f"the main process's RSS grows {rate_text(mem.main.rate)}"
                   + (": the growth is in the main process, not the workers" if mem.host_cause == MAIN_LEAK else ""))
    elif mem.main is not None and mem.main.judged:
        out.append("the main process's RSS is flat")
    return out


def _leak_evidence(top: LeakLine) -> str:
    if top.called:
        where = f", in `{top.called}`, which the training loop calls every step (read from its source),"
    else:
        where = ", in the training loop the stacks show (read from its source)," if top.read else ""
    if top.graph and top.freed:
        return (f"{top.where}: `{top.code}`{where} keeps each step's `{top.kept}` after its backward: backward freed "
                "the activations its graph held, so the line keeps the graph's nodes and a number, a few KB a step, "
                "too little for this growth on its own")
    if top.graph:
        return f"{top.where}: `{top.code}`{where} keeps each step's tensor with its autograd graph"
    taker = "the function" if top.called else "the loop"
    return f"{top.where}: `{top.code}`{where} adds to `{top.kept}` every step, and nothing in {taker} takes from it"


def _leak_action(top: LeakLine, find_it: str) -> str:
    """The line's fix; for a sum of losses a backward ran on (KB a step), the fix and then how to
    find what keeps the rest."""
    if top.freed:
        return f"{top.where}: {top.fix}; it keeps little, so if memory still grows: {find_it}"
    return f"{top.where}: {top.fix}"


@uses(HORIZON_S, WARN_WITHIN_S, CRITICAL_WITHIN_S, NAMED_CONFIDENCE, FORECAST_CONFIDENCE)
def check_memory_growth(ctx: AnalysisContext) -> Hit | None:
    mem = ctx.memory
    if mem is None:
        return None
    soon: list[tuple[float, str, object]] = []
    for gm in mem.gpus:
        gr = gm.growth
        if gr.growing and gr.eta_s is not None and gr.eta_s <= HORIZON_S:
            soon.append((gr.eta_s, "gpu", gm))
    if mem.host is not None and mem.host.growing and mem.host.eta_s is not None and mem.host.eta_s <= HORIZON_S:
        soon.append((mem.host.eta_s, "host", mem.host))
    if not soon:
        return _short_of_limit(mem)
    eta, kind, what = min(soon, key=lambda x: x[0])
    if kind == "gpu":
        gr, name = what.growth, f"GPU {what.index}"
        evidence = [_growth_line(f"{name}: the job's memory", gr),
                    f"at this rate it runs out in {eta_text(gr)} (the card's total; a cap set in the job, "
                    "torch.cuda.set_per_process_memory_fraction, comes sooner)"]
        if what.source != "process":
            evidence.append("NVML gives no per-process figure here: this is the whole card's used memory")
        if gr.sawtooth:
            evidence.append("it also rises and falls (eval or variable shapes): the lows it falls back to rise")
        leaks = mem.leaks
        if leaks:
            top = leaks[0]
            evidence.append(_leak_evidence(top))
            action = _leak_action(top, _FIND_IT)
        else:
            evidence.append("the job's stacks, and the loop they show, hold no line that keeps a step's tensor "
                            "(such a line runs for microseconds: the samples may miss it)")
            action = _FIND_IT
        title = f"{name} memory grows {rate_text(gr.rate)}: out of memory in {eta_text(gr)}"
        gpu = what.index
    else:
        gr, gpu = what, None
        # Copy-on-read slows as the shared pages run out: not "at this rate" (memory_window._copying).
        pace = "at this rate" if gr.ceiling is None else _slowing(gr)
        evidence = [_host_evidence_head(mem, gr),
                    f"{pace} the group reaches its limit (memory.max) in {eta_text(gr)}: the OOM killer then ends a "
                    "process in it, whatever the host has free" if mem.host_cgroup else
                    f"{pace} the host runs out (the OOM killer) in {eta_text(gr)}; swap not counted"]
        evidence.extend(_host_evidence(mem))
        # The workers' USS tells copy-on-read from a leak elsewhere (the main process): growing,
        # the Dataset's remedy; read and flat, not that. Not read (no history yet, no
        # smaps_rollup), a job with workers keeps the likelier copy-on-read.
        action = _COPY_ON_READ if mem.uss_growing or (mem.workers and not mem.uss_read) else _FIND_IT_HOST
        if mem.leaks and not mem.uss_growing and (mem.main is None or mem.main.growing or not mem.workers):
            # The main process grows (or a job on the CPU device, whose tensors are host memory):
            # the training loop's keeper is the likely line, as on a GPU.
            evidence.append(_leak_evidence(mem.leaks[0]))
            action = _leak_action(mem.leaks[0], _FIND_IT_HOST)
        who = "the job's cgroup" if mem.host_cgroup else "host"
        title = f"{who} memory grows {rate_text(gr.rate)}: out of memory in {eta_text(gr)}"
    return Hit(
        evidence=tuple(evidence),
        action=action,
        expected_gain="the job finishes instead of dying out of memory",
        confidence=(NAMED_CONFIDENCE if kind == "gpu" and mem.leaks and mem.leaks[0].graph and not mem.leaks[0].freed
                    else FORECAST_CONFIDENCE),
        gpu_index=gpu,
        severity=(Severity.CRITICAL if eta <= CRITICAL_WITHIN_S else
                  Severity.WARNING if eta <= WARN_WITHIN_S else Severity.INFO),
        title=title,
    )


def _slowing(gr: Growth) -> str:
    """How a bounded (copy-on-read) forecast is made, said before it."""
    return (f"slowing as the workers copy what they still share with the main process (at most "
            f"{fmt_bytes(gr.ceiling)} more: a page is copied once, and the rate falls as fewer are left),")


def _host_evidence_head(mem: MemoryView, gr: Growth) -> str:
    if mem.host_cgroup:
        return _growth_line("the job's control group's memory (its container's limit, where the OOM killer acts first)",
                            gr)
    return _growth_line("the job's memory on the host (its own processes: other processes' use is left out)", gr,
                        _host_used(gr, mem))


def _short_of_limit(mem: MemoryView) -> Hit | None:
    """The workers' copy-on-read grows the job's host memory, but what they still share (all
    that copying can add) is less than the room to the limit: no OOM to forecast from it, yet the
    copies are memory the job wastes, and the Dataset's remedy is the same."""
    gr = mem.host
    if gr is None or not gr.growing or gr.ceiling is None or gr.limit is None:
        return None
    # The main process's RSS may drift beside the copying (a KB/s, forecast as a line): days away
    # at most, or memory-growth would have forecast it.
    short = max(0.0, gr.limit - gr.used) - gr.ceiling
    if short <= 0 or (gr.eta_s is not None and gr.eta_s <= HORIZON_S):
        return None
    where = "the group's limit (memory.max)" if mem.host_cgroup else "the host's total"
    who = "the job's cgroup" if mem.host_cgroup else "host"
    evidence = [_host_evidence_head(mem, gr),
                f"the workers' private memory can grow by at most {fmt_bytes(gr.ceiling)} more (what they still share "
                f"with the main process: a page is copied once): short of {where} by {fmt_bytes(short)}, so their "
                "copying alone does not run it out of memory; it slows as the shared pages run out",
                *_host_evidence(mem)]
    return Hit(
        evidence=tuple(evidence),
        action=_COPY_ON_READ,
        expected_gain=f"the memory each worker's copy of the Dataset takes (up to {fmt_bytes(gr.ceiling)} more), "
                      "and room for anything else that grows",
        confidence=FORECAST_CONFIDENCE,
        severity=Severity.INFO,
        title=f"{who} memory grows {rate_text(gr.rate)} (copy-on-read): at most {fmt_bytes(gr.ceiling)} more, "
              f"{fmt_bytes(short)} short of the limit",
    )


@uses(HORIZON_S)
def check_memory_rising(ctx: AnalysisContext) -> Hit | None:
    """What is weighed before memory-growth can judge: the job's memory rises in its training
    loop (or, with none known, while its main thread goes round a loop of its code: a CPU job's),
    but less than a minute of history says nothing of when it would run out unless that is soon
    (then memory-growth speaks early). Said, so a watch shorter than the minute is not taken for
    "memory is fine"; never a forecast, never a warning."""
    mem = ctx.memory
    if mem is None:
        return None
    # Rising outside a known training loop (a CPU job's loop does no forward, backward or
    # optimizer step, so none is known) is weighed only while the main thread goes round a loop
    # of its own code, line to line, and warms up on nothing: one line held (a load, a read) or
    # an import or compile grows memory and then stops.
    own_loop = (not ctx.step.stepping and ctx.step.loop is not None and ctx.step.loop_lines >= 2
                and ctx.warmup is None)

    def weighed(gr: Growth) -> bool:
        # A rise that would not reach the limit within HORIZON_S could never be memory-growth's
        # finding: nothing to weigh (a healthy NCCL job's host memory read 0.1 MB/min).
        if gr.limit is not None and gr.rising > 0 and (gr.limit - gr.used) / gr.rising > HORIZON_S:
            return False
        return not gr.judged and gr.rising > 0 and (gr.rising_in_loop or own_loop)

    rising: list[tuple[str, Growth, int | None]] = []
    for gm in mem.gpus:
        if weighed(gm.growth):
            rising.append((f"GPU {gm.index}", gm.growth, gm.index))
    if mem.host is not None and weighed(mem.host):
        rising.append(("the job's cgroup" if mem.host_cgroup else "host", mem.host, None))
    if not rising:
        return None
    who, gr, gpu = max(rising, key=lambda r: r[1].rising)
    need = max(0.0, MIN_SPAN_S - gr.span_s)
    where = ("of its training loop" if gr.rising_in_loop else
             f"while its main thread went round the loop at `{ctx.step.loop}` (no forward, backward or optimizer "
             "step seen: a loop on the CPU, or one loading)")
    return Hit(
        evidence=(f"{who}: the job's memory rose at about {rate_text(gr.rising)} over the last {gr.span_s:.0f} s "
                  f"{where}",
                  f"less than {MIN_SPAN_S:.0f} s of history says nothing of a trend (an allocator warms up, a cache "
                  f"fills) unless the limit is minutes away: judged in about {need:.0f} s more, with a forecast if it "
                  "keeps rising"),
        action="nothing yet: keep watching (advise --duration 90 s, or the live view) for the verdict on memory",
        expected_gain="",
        confidence=1.0,
        gpu_index=gpu,
        severity=Severity.INFO,
        title=f"Weighing: {who} memory rises about {rate_text(gr.rising)} (judged once it has a minute of history)",
    )


@uses()
def check_oom_exit(ctx: AnalysisContext) -> Hit | None:
    cause = ctx.memory.exit_cause if ctx.memory is not None else None
    if cause is None:
        return None
    gpu = "CUDA" in cause
    return Hit(
        evidence=(cause, "likely, not certain: read from the memory readings just before the exit"),
        action=("the job's error output says for sure (torch.OutOfMemoryError); then the remedies of "
                "memory-near-limit, or the leak memory-growth named" if gpu else
                "the kernel log says for sure (journalctl -k | grep -i 'killed process'); then fewer DataLoader "
                "workers or a Dataset in numpy/Arrow instead of Python objects, or more host memory"),
        expected_gain="the job finishes",
        confidence=0.7,
        title="Job ended: likely CUDA out of memory" if gpu else "Job ended: likely the OOM killer",
    )
