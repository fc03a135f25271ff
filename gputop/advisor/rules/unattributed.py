"""The fallback: idle GPU time and no stacks to say why. The first step is to attach."""

from __future__ import annotations

from ...model import PID_MAX_LIMIT
from ..context import AnalysisContext
from .base import MIN_COST_FRACTION, MIN_COST_S, Hit, bounded, gain, pct, secs, significant, uses, worst


@uses(MIN_COST_FRACTION, MIN_COST_S)
def check_idle_unattributed(ctx: AnalysisContext) -> Hit | None:
    """Idle GPU time and no stacks to say why: the first step is to attach."""
    found = worst(ctx, lambda g: 0.0 if g.breakdown.attributed else g.breakdown.idle_s, gpu_only=True)
    if found is None or not significant(found[0], found[1]):
        return None
    g, cost = found
    ev = [f"{g.name} idle {pct(g.breakdown.idle_fraction)} of the last {secs(g.breakdown.total_s)}"]
    fault = next((e for e in reversed(ctx.events) if e.source == "stacks" and e.level in ("warning", "error")), None)
    if fault is None and ctx.target_pid is not None and not ctx.main_stacks:
        # Attached, its stacks not in yet: "not attached" would be false, and the status line
        # already says what is being collected.
        return None
    if fault is not None:
        ev.append(f"no stacks of the training process: {fault.message}")
        action = "fix stack sampling (see above), then: gputop advise --pid PID"
    else:
        # Above Linux's largest pid_max (2^22) a PID is never a real process: the fake source's
        # (`advise --fake` told a new user to attach to PID 4194400).
        pids = sorted({p.pid for p in g.processes if p.pid <= PID_MAX_LIMIT})
        ev.append("not attached to the training process, so the idle time cannot be attributed")
        if pids:
            ev.append(f"processes on {g.name}: " + ", ".join(str(p) for p in pids[:5]))
        action = f"attach to see why it waits: gputop --pid {pids[0] if pids else 'PID'} (or gputop advise --pid {pids[0] if pids else 'PID'})"
    return Hit(
        evidence=tuple(ev),
        action=action,
        expected_gain="the cause of the idle time, and its fix; "
        + gain(g.breakdown.idle_fraction),
        gain_bound=bounded(g.breakdown.idle_fraction),
        cost_s=cost,
        confidence=0.5,
        gpu_index=g.index,
        title=f"{g.name} idle {pct(g.breakdown.idle_fraction)} of the time, cause unknown",
    )

