"""Text of the ranks pane: a row per local rank of a multi-rank job, which rank owns each GPU and
where that GPU's time went, and the links between the ranks' GPUs. Pure: views in, lines out.

Lines are tuples of (text, style) segments with semantic style names ("title", "dim", "num",
"bad", "warn", "grp.<group>", "bucket.<bucket>"), as in ``present.stacks`` and ``present.advice``.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ..analysis import BUCKET_LABELS, Breakdown, Bucket
from ..advisor import MIN_MAIN_SAMPLES
from ..advisor import GPU_OTHERS_WAIT_MIN, GPU_STRAGGLER_GAP, OTHERS_WAIT_MIN, STRAGGLER_GAP, STRAGGLER_LEVEL
from ..analysis import GROUPS, JobView, RankView, doing_now, group_shares, hot_line, straggler
from ..model import Category
from ..units import fmt_rate, fmt_seconds, fmt_share, truncate

Seg = tuple[str, str]
Line = tuple[Seg, ...]

# A share of the time at or above this is shown in its group's colour (judgement: the same
# third of the time the rank-straggler rule calls a pattern of waiting).
HIGH_SHARE = 0.30
GROUP_W = 6  # each group column: a share ("100%") under a short name
GROUP_HEAD = {"compute": "COMP", "data": "DATA", "comm": "COMM", "ckpt": "CKPT", "other": "OTHER"}
FIXED_W = 5 + 1 + 8 + 1 + 4 + 1  # RANK PID GPU and their gaps


def _header(now_w: int) -> Line:
    cols = "".join(f"{GROUP_HEAD[name]:>{GROUP_W}}" for name, _ in GROUPS)
    return ((f"{'RANK':>5} {'PID':>8} {'GPU':>4} {'NOW':<{now_w}}{cols}  HOT", "head"),)


def rank_line(v: RankView, now_w: int, hot_w: int, straggler: bool = False) -> Line:
    gpu = "-" if v.gpu is None else str(v.gpu)
    segs: list[Seg] = [(f"{v.rank:>5} ", "num"), (f"{v.pid:>8} ", ""), (f"{gpu:>4} ", "")]
    now = truncate(doing_now(v), now_w - 1) if now_w > 1 else ""
    waiting = v.latest is not None and v.latest.category is Category.COLLECTIVE
    segs.append((f"{now:<{now_w}}", "grp.comm" if waiting else ("bad" if straggler else "")))
    for name, share in group_shares(v.shares) if v.samples else ((n, 0.0) for n, _ in GROUPS):
        text = fmt_share(share) if v.samples else "-"
        segs.append((f"{text:>{GROUP_W}}", f"grp.{name}" if share >= HIGH_SHARE else "dim" if not share else ""))
    # Where its time goes: what only it runs, or its hottest place outside waits; for a rank that
    # only waits, where in its own code it waits (the user's frame under torch's), dimmed. The
    # same choice as the exporter's hot line and the straggler finding (analysis.hot_line).
    place, share, own = hot_line(v)
    style = "project" if own else "dim"
    hot = truncate(f"{place} {fmt_share(share)}", hot_w) if place and hot_w > 0 else ""
    segs.append(("  " + hot, style if hot else ""))
    return tuple(segs)


def _straggler(ranks: Sequence[RankView]) -> int | None:
    """The rank the others wait for, by the advisor's own rank-straggler decision (the pane
    highlights it; the Advisor names it and why): one decision, so the two never disagree."""
    found = straggler(ranks, OTHERS_WAIT_MIN, STRAGGLER_GAP, min_samples=MIN_MAIN_SAMPLES, level=STRAGGLER_LEVEL,
                      gpu_bars=(GPU_OTHERS_WAIT_MIN, GPU_STRAGGLER_GAP))
    return found.slow.rank if found is not None else None


def ranks_waiting_lines() -> list[Line]:
    """The pane before the first view of the job is in (the views stage looks each second)."""
    return [(("reading the ranks' stacks …", "dim"),)]


def ranks_pane_lines(job: JobView | None, width: int, breakdowns: Sequence[object] = (),
               nvlink_bps: Mapping[int, tuple[float, float]] | None = None) -> list[Line]:
    """The ranks pane for ``width`` columns. ``breakdowns``: the advisor's per-GPU breakdowns
    (``analysis.breakdown.Breakdown``); ``nvlink_bps``: GPU -> (tx, rx) bytes/s of the latest GPU samples."""
    if job is None:
        return [(("Not attached to a multi-rank job.", "title"),),
                (("Attach to a torchrun launcher's PID or any rank's: gputop --pid PID", "dim"),)]
    n = len(job.ranks)
    head: Line = ((f"{n} local rank{'s' if n != 1 else ''}", "title"),
                  (f" of the job{f' launched by PID {job.launcher}' if job.launcher else ''}", ""),
                  (f" · main threads over the last {fmt_seconds(job.window_s)}", "dim"))
    rest = max(0, width - FIXED_W - GROUP_W * len(GROUPS) - 2)
    now_w = max(12, min(32, rest * 9 // 20))
    hot_w = max(0, rest - now_w)
    slow = _straggler(job.ranks)
    lines: list[Line] = [head, (), _header(now_w)]
    lines += [rank_line(v, now_w, hot_w, straggler=v.rank == slow) for v in job.ranks]
    if slow is not None:
        lines.append((("rank ", "dim"), (str(slow), "bad"),
                      (" spends the least time in collectives: the others wait for it (see the Advisor)", "dim")))
    comm = [v for v in job.ranks if v.samples]
    if comm:
        lines.append((("communication share: ", "dim"),
                      (", ".join(f"rank {v.rank} {fmt_share(v.collective)}"
                                 + (f" in {v.collective_fn}" if v.collective_fn else "") for v in comm), "")))
    gpu_wait = [v for v in job.ranks if v.gpu_wait is not None]
    if gpu_wait and any((v.gpu_wait or 0.0) > 0 for v in gpu_wait):
        # NCCL waits in a kernel on the GPU, not in the host's stacks: the GPUs show it.
        lines.append((("GPU waits for peers (a NCCL kernel spinning): ", "dim"),
                      (", ".join(f"rank {v.rank} {fmt_share(v.gpu_wait or 0.0)}"
                                 + (f" (busy {v.gpu_util:.0f}%, SMs {v.gpu_sm:.0f}%)"
                                    if v.gpu_util is not None and v.gpu_sm is not None else "")
                                 for v in gpu_wait), "")))
    lines += _gpu_lines(job, breakdowns, width)
    lines += _link_lines(job, nvlink_bps or {}, width)
    return lines


def _gpu_lines(job: JobView, breakdowns: Sequence[object], width: int) -> list[Line]:
    """Each GPU's breakdown under the rank that owns it (NVML lists the rank on it)."""
    owner = {v.gpu: v for v in job.ranks if v.gpu is not None}
    # The store hands the verdict's breakdowns on untyped (it sits below analysis): the GPUs' ones.
    bds = [b for b in breakdowns if isinstance(b, Breakdown) and b.gpu_index >= 0 and b.total_s > 0]
    if not bds:
        return []
    out: list[Line] = [(), (("GPUs", "head"),)]
    for bd in sorted(bds, key=lambda b: b.gpu_index):
        v = owner.get(bd.gpu_index)
        who = f"rank {v.rank} (pid {v.pid})" if v is not None else "no rank of this job"
        parts = [(b, bd.get(b) / bd.total_s) for b in Bucket if bd.get(b) > 0]
        text = " · ".join(f"{BUCKET_LABELS[b]} {fmt_share(sh)}" for b, sh in sorted(parts, key=lambda x: -x[1])[:4])
        out.append(((f"GPU {bd.gpu_index}", "num"), (f" · {who}: ", "" if v is not None else "dim"),
                    (truncate(text, max(10, width - 30)), "")))
    return out


def _link_lines(job: JobView, nvlink: Mapping[int, tuple[float, float]], width: int) -> list[Line]:
    """The links between the ranks' GPUs (NVML topology and P2P status), NVLink rates if read."""
    t = job.topology
    gpus = sorted({v.gpu for v in job.ranks if v.gpu is not None})
    out: list[Line] = []
    if t is not None:
        for i, a in enumerate(gpus):
            for b in gpus[i + 1:]:
                link = t.between(a, b)
                if link is None:
                    continue
                kind, p2p = link
                out.append(((f"GPU {a} ↔ GPU {b}: ", ""), (kind, "num"),
                            (f", P2P {p2p}", "" if p2p == "ok" else "warn")))
        for g in gpus:
            if t.nvlinks.get(g):
                rate = nvlink.get(g)
                # Units that fit the rate: a modest gradient all-reduce spread over 18 links read
                # "0.0 GB/s" in fixed GB/s.
                tail = f", {fmt_rate(rate[0])} out, {fmt_rate(rate[1])} in" if rate else ""
                out.append(((f"GPU {g}: {t.nvlinks[g]} NVLinks up{tail}", "dim"),))
    if not out:
        return []
    return [(), (("Links", "head"),), *out]
