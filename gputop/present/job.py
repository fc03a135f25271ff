"""Text of the job view (``gputop job``): one distributed job across its hosts, as Prometheus
holds it. Pure: the job model and its judgement in (``fleet``), (text, style) lines out, with the
ranks pane's style names ("grp.<phase>", "title", "dim", "bad", "warn", "num", "head").

The verdict lines (straggler, never-arrives, missing ranks) come first and stay on screen; the
ranks follow, grouped by host, one line each, so 64 ranks on 8 hosts are 72 lines to scroll.
"""

from __future__ import annotations

from typing import Sequence

from ..fleet import PHASES, Held, Job, JobSummary, Judgement, RankState, key, starting_of
from ..units import fmt_duration, fmt_share, truncate

Seg = tuple[str, str]
Line = tuple[Seg, ...]

# A phase at or above this share is coloured (the ranks pane's threshold).
HIGH_SHARE = 0.30
COL_W = 5
HEAD = {"compute": "COMP", "data": "DATA", "comm": "COMM", "ckpt": "CKPT", "other": "OTHR"}
FIXED_W = 5 + 1 + 5 + COL_W * (len(PHASES) + 1) + 2  # RANK, STATE, the phases, WAIT, the gap


def _ranges(ks: Sequence[int]) -> str:
    """0,1,2,5 -> '0-2, 5'."""
    out, start, prev = [], None, None
    for k in sorted(ks):
        if start is None:
            start = prev = k
        elif k == prev + 1:
            prev = k
        else:
            out.append(f"{start}-{prev}" if prev != start else str(start))
            start = prev = k
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else str(start))
    return ", ".join(out)


def _held_for(j: Judgement, h: Held | None) -> str:
    """" for 40s", and " · not seen for 5s" when the newest evaluation no longer has it (it is
    still named: the rule clears it only once gone long enough); '' without the rule."""
    if h is None or j.at is None:
        return ""
    text = f" for {fmt_duration(j.at - h.since)}"
    if h.last_seen < j.at:
        text += f" · not seen for {fmt_duration(j.at - h.last_seen)}"
    return text


_WEIGHED = {"slow": "slow", "never": "never arrives", "stuck": "stuck", "missing": "not reported"}


def _weighing_line(j: Judgement, width: int) -> Line | None:
    """What the newest evaluations show but the rule does not name yet, with how long it has
    held of the time it needs."""
    if not j.weighing or j.rule is None or j.at is None:
        return None
    need = fmt_duration(j.rule.appear_s)
    parts = [f"rank {h.key[2]}" + (f" on {h.key[1]}" if h.key[1] else "")
             + f" {_WEIGHED.get(h.key[0], h.key[0])} {fmt_duration(h.last_seen - h.since)} of {need}"
             for h in j.weighing]
    return (("Weighing: ", "warn"), (truncate(" · ".join(parts), max(0, width - 10)), "dim"))


def _starting_line(ranks: Sequence[RankState], width: int) -> Line:
    """The ranks not judged yet, by what they still do."""
    by_what: dict[str, list[int]] = {}
    for r in ranks:
        by_what.setdefault(starting_of(r), []).append(r.rank)
    n = len(ranks)
    head = f"rank{'s' if n != 1 else ''} {_ranges([r.rank for r in ranks])} not judged yet"
    if len(by_what) == 1:
        text = f"{head} ({next(iter(by_what))})"
    else:
        groups = sorted(by_what.items(), key=lambda kv: min(kv[1]))
        text = f"{head}: " + " · ".join(f"{w} {_ranges(ks)}" for w, ks in groups)
    return (("Starting: ", "warn"), (truncate(text, max(0, width - 10)), ""))


# NVML's limiting reasons as the state of a GPU ("rank 5's GPU is power-capped").
_THROTTLED = {"power cap": "power-capped", "hw power brake": "power-braked", "hw slowdown": "slowed by the hardware",
              "hw thermal": "thermal-throttled", "sw thermal": "thermal-throttled", "board limit": "board-limited",
              "reliability limit": "reliability-limited"}


def throttled_words(reasons: Sequence[str]) -> str:
    words = list(dict.fromkeys(_THROTTLED.get(w, w) for w in reasons))
    return " and ".join(words)


def _throttle_lines(j: Judgement, width: int) -> list[Line]:
    """The ranks whose GPU's clocks are held down, grouped by host and reason (the straggler's
    own is said under it)."""
    slow = (j.straggler.slow.host, j.straggler.slow.rank) if j.straggler is not None else None
    groups: dict[tuple[str, str], list[int]] = {}
    for r in j.throttled:
        if (r.host, r.rank) != slow:
            groups.setdefault((r.host, throttled_words(r.throttled)), []).append(r.rank)
    parts = []
    for (host, words), ranks in groups.items():
        one = len(ranks) == 1
        parts.append(f"rank{'' if one else 's'} {_ranges(ranks)}'s GPU{'' if one else 's'} on {host} "
                     f"{'is' if one else 'are'} {words}")
    return [(("Throttled: ", "warn"), (truncate(" · ".join(parts), max(0, width - 11)), ""))] if parts else []


def _straggler_throttle(j: Judgement) -> list[str]:
    """Evidence under the straggler: its GPU's clocks held down, and whether the others' are."""
    s = j.straggler
    me = next((r for r in j.throttled if (r.host, r.rank) == (s.slow.host, s.slow.rank)), None) if s else None
    if me is None:
        return []
    others = len(j.throttled) - 1
    tail = "the others' are not" if others == 0 else f"so are {others} other rank{'s' if others != 1 else ''}' GPUs"
    return [f"its GPU is {throttled_words(me.throttled)}: the same work takes it longer ({tail})"]


def _evidence(lines: Sequence[str], width: int) -> list[Line]:
    return [(("  " + truncate(e, max(0, width - 2)), "dim"),) for e in lines]


def verdict_lines(job: Job, j: Judgement, width: int) -> list[Line]:
    lines: list[Line] = []
    s = j.straggler
    if s is not None:
        r = s.slow
        phase, share = r.main_phase()
        what = f"{phase} {fmt_share(share)}" if phase else "no phase seen"
        where = f", {r.hot}" if r.hot else ""
        wait_in = f" in {s.collective}" if s.collective else ""
        head = ("Straggler: ", f"rank {r.rank}", f" on {r.host}")
        held = _held_for(j, j.held.get(key("slow", r)))
        lines.append(((head[0], "bad"), (head[1], "num"), (head[2], "title"), (held, "warn" if held else ""),
                      (truncate(f" · {what}{where}", max(0, width - sum(map(len, head)) - len(held))), "")))
        if r.code:
            lines.append((("  ", ""), (truncate(r.code, width - 2), "dim")))
        lines.append((("  costs the others: ", "dim"),
                      (f"{s.waiting} rank{'s wait' if s.waiting != 1 else ' waits'} {fmt_share(s.others_wait)} "
                       f"of {'their' if s.waiting != 1 else 'its'} time{wait_in}", "warn")))
        lines += _evidence((*_straggler_throttle(j), *s.evidence), width)
    for n in j.never_arrives:
        r = n.rank
        head = ("Never arrives: ", f"rank {r.rank}", f" on {r.host}")
        # Named from NCCL's counts alone, its stack may still move (spinning, or in the CUDA driver).
        where = f" · still {fmt_duration(r.stuck_s)} at {r.stuck_where or r.hot or '?'}" if r.stuck \
            else f" · {r.hot}" if r.hot else ""
        lines.append(((head[0], "bad"), (head[1], "num"), (head[2], "title"),
                      (truncate(where, max(0, width - sum(map(len, head)))), "")))
        lines.append((("  ", ""), (f"{n.waiting} rank{'s' if n.waiting != 1 else ''} wait for it", "warn")))
        lines += _evidence(n.evidence, width)
    others = [r for r in j.stuck if all(r is not n.rank for n in j.never_arrives)]
    if others and not j.never_arrives:
        lines.append((("Stuck: ", "bad"), (truncate(f"ranks {_ranges([r.rank for r in others])} make no progress"
                                                    + (", each waiting in a collective: the rank they wait for is "
                                                       "not among those reported" if j.missing else ""), width - 7), "")))
    if j.missing:
        lines.append((("Not reported: ", "warn"),
                      (truncate(f"rank{'s' if len(j.missing) != 1 else ''} {_ranges(j.missing)} of {job.world_size} "
                                "(no exporter with --attach all sees them)", width - 14), "")))
    throttle = _throttle_lines(j, width)
    if j.starting:
        lines.append(_starting_line(j.starting, width))
    weighing = _weighing_line(j, width)
    if not lines and weighing is None:
        lines.append((("No rank holds the others up", "title"),
                      (" · no straggler, none stuck", "dim")))
    lines += throttle
    if weighing is not None:
        lines.append(weighing)
    if j.rule is not None:
        lines.append((("  " + truncate(j.rule.describe(j.step_s), width - 2), "dim"),))
    return lines


def header_lines(job: Job, refreshed: str, interval: float) -> list[Line]:
    n, hosts = len(job.ranks), len(job.hosts)
    of = f" of {job.world_size}" if job.world_size else ""
    return [((f"job {job.job}", "title"),
             (f" · {n}{of} ranks on {hosts} host{'s' if hosts != 1 else ''}", ""),
             (f" · {refreshed}, every {interval:g} s", "dim"))]


def _col_head() -> Line:
    cols = "".join(f"{HEAD[p]:>{COL_W}}" for p in PHASES)
    return ((f"{'RANK':>5} {'STATE':<5}{cols}{'WAIT':>{COL_W}}  HOT LINE · TOP FINDING", "head"),)


def state_of(r: RankState, j: Judgement) -> tuple[str, str]:
    """A rank's state as the verdict has it: the findings on show (upper case), those being
    weighed (lower case), matched by host and rank (a finding held from an earlier evaluation
    carries that evaluation's copy of the rank), so a rank line never says more than the verdict."""
    me = (r.host, r.rank)
    if j.straggler is not None and (j.straggler.slow.host, j.straggler.slow.rank) == me:
        return "SLOW", "bad"
    if any((n.rank.host, n.rank.rank) == me for n in j.never_arrives):
        return "NEVER", "bad"
    stuck = any((s.host, s.rank) == me for s in j.stuck)
    # A rank stuck in a collective while another never arrives, or while the straggler still
    # moves, is its victim: it waits.
    if r.stuck and (j.never_arrives or (j.straggler and not stuck)):
        return "wait", "grp.comm"
    if stuck:
        return "STUCK", "warn"
    if any((s.host, s.rank) == me for s in j.starting):
        return "start", "dim"
    for h in j.weighing:
        if h.key[1:] == me and h.key[0] in ("slow", "never", "stuck"):
            return h.key[0], "warn"
    if r.stuck or r.wait >= HIGH_SHARE:
        return "wait", "grp.comm"
    return "ok", "dim"


def rank_line(r: RankState, j: Judgement, width: int) -> Line:
    state, style = state_of(r, j)
    segs: list[Seg] = [(f"{r.rank:>5} ", "num"), (f"{state:<5}", style)]
    for p in PHASES:
        share = r.phases.get(p)
        text = "-" if share is None else fmt_share(share)
        segs.append((f"{text:>{COL_W}}", f"grp.{p}" if share and share >= HIGH_SHARE else "dim" if not share else ""))
    segs.append((f"{fmt_share(r.wait):>{COL_W}}", "grp.comm" if r.wait >= HIGH_SHARE else "dim"))
    rest = max(0, width - FIXED_W)
    top = r.top_finding
    # After the hot line: its GPU's throttling, then its top finding, as many as fit (in that order).
    tail: list[Seg] = []
    if r.throttled:
        tail.append((f" · GPU {throttled_words(r.throttled)}", "warn"))
    if top:
        tail.append((f" · {top[0]}", "bad" if top[1] == "critical" else "warn"))
    kept: list[Seg] = []
    for seg in tail:
        if rest - sum(len(t) for t, _ in kept) > len(seg[0]):
            kept.append(seg)
    room = rest - sum(len(t) for t, _ in kept)
    place = r.stuck_where if r.stuck and r.stuck_where else r.hot
    hot = truncate(place, max(0, room)) if place else ""
    segs.append(("  " + hot, "project" if hot else ""))
    segs += kept
    return tuple(segs)


# A host line's counts, in this order, by the rank lines' states (so they always agree with the
# rank lines, and those with the verdict); "ok" ranks are not counted.
_COUNTED = (("SLOW", "slow", "bad"), ("NEVER", "never arrives", "bad"), ("STUCK", "stuck", "bad"),
            ("slow", "weighed", "warn"), ("never", "weighed", "warn"), ("stuck", "weighed", "warn"),
            ("wait", "waiting", "grp.comm"), ("start", "starting", "dim"))


def host_line(host: str, ranks: Sequence[RankState], j: Judgement) -> Line:
    states = [state_of(r, j)[0] for r in ranks]
    counts: dict[str, tuple[int, str]] = {}
    for state, word, style in _COUNTED:
        n = states.count(state)
        if n:
            counts[word] = (counts.get(word, (0, style))[0] + n, style)
    hot = sum(1 for r in ranks if r.throttled)
    return ((f"{host}", "title"), (f" · {len(ranks)} rank{'s' if len(ranks) != 1 else ''}", "dim"),
            *((f" · {n} {word}", style) for word, (n, style) in counts.items()),
            (f" · {hot} GPU{'s' if hot != 1 else ''} throttled" if hot else "", "warn"))


def rank_lines(job: Job, j: Judgement, width: int) -> list[Line]:
    """The ranks, grouped by host: a host line, then one line per rank."""
    lines: list[Line] = [_col_head()]
    for host, ranks in job.by_host():
        lines.append(host_line(host, ranks, j))
        lines += [rank_line(r, j, width) for r in ranks]
    return lines


def job_lines(job: Job, j: Judgement, width: int, refreshed: str, interval: float) -> list[Line]:
    """The whole view as one list (``gputop job --once`` prints it)."""
    return [*header_lines(job, refreshed, interval), *verdict_lines(job, j, width), (), *rank_lines(job, j, width)]


def jobs_lines(jobs: Sequence[JobSummary], url: str) -> list[Line]:
    """The jobs Prometheus holds rank series of, when no job is named."""
    if not jobs:
        return [((f"No job at {url}: no gputop_rank_info series (exporters need --attach all).", "warn"),)]
    out: list[Line] = [((f"{len(jobs)} job{'s' if len(jobs) != 1 else ''} at {url}:", "title"),),
                       ((f"{'RANKS':>6} {'HOSTS':>5} {'WORLD':>5} {'STUCK':>5}  JOB", "head"),)]
    for s in jobs:
        out.append(((f"{s.ranks:>6} {s.hosts:>5} {s.world_size if s.world_size else '-':>5} ", ""),
                    (f"{s.stuck:>5}", "bad" if s.stuck else "dim"), (f"  {s.job}", "title")))
    out.append((("gputop job --prometheus URL JOB shows one.", "dim"),))
    return out


def plain(lines: Sequence[Line]) -> str:
    return "\n".join("".join(t for t, _ in ln) for ln in lines)
