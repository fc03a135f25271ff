"""The report's per-rank section: for a recording of a multi-rank job, each local rank's time by
group (compute, data, communication, checkpoint, other) over the whole recording, the collective
it waits in, its hot function and its GPU. Read an hour at a time, like the rest of the report."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..analysis import project_frame, short_path
from ..analysis import collective_fn
from ..analysis import GROUPS, RANKS_SOURCE, as_ranks, rank_map
from ..model import Category
from ..record import Reader


@dataclass(frozen=True)
class RankSummary:
    rank: int
    pid: int
    gpu: int | None
    samples: int  # main-thread stack samples recorded
    groups: tuple[tuple[str, float], ...]  # (group, share of its samples), GROUPS' order
    collective_fn: str | None
    hot: str | None  # "load_batch (job/train.py:41)"
    hot_share: float

    @property
    def comm(self) -> float:
        return dict(self.groups).get("comm", 0.0)


def collect_ranks(reader: Reader, chunk_s: float = 3600.0) -> tuple[RankSummary, ...]:
    """Every rank the recording names (a restarted rank's PIDs each get a row), () for a
    recording of one process."""
    pid_rank: dict[int, int] = {}
    for e in reader.events(float("-inf"), float("inf")):
        if e.source == RANKS_SOURCE:
            pid_rank.update(rank_map([e]))
    if not pid_rank:
        return ()
    cats: dict[int, Counter] = {p: Counter() for p in pid_rank}
    fns: dict[int, Counter] = {p: Counter() for p in pid_rank}
    places: dict[int, Counter] = {p: Counter() for p in pid_rank}
    gpu: dict[int, int] = {}
    has_gpus = bool(reader.gpu_indices())
    t, end = reader.start_ts - 1e-6, reader.end_ts
    while t < end:
        e = min(end, t + chunk_s)
        gpu_procs = reader.gpu_processes(t, e)
        # judged as the ranks view and the advisor judge them: a CPU rank off the CPU in backward
        # waits in DDP's all-reduce (analysis.ranks.as_ranks)
        stacks = as_ranks(reader.stack_samples(t, e, main_only=True), pid_rank, gpu_procs, has_gpus)
        for s in stacks:
            if s.pid not in cats:
                continue
            cats[s.pid][s.category] += 1
            if s.category is Category.COLLECTIVE:
                fns[s.pid][collective_fn(s)] += 1
            elif s.category is not Category.IDLE:
                f = project_frame(s.frames)
                if f is not None:
                    places[s.pid][f"{f.name} ({short_path(f.filename)}:{f.line})"] += 1
        gpu.update({p.pid: p.gpu_index for p in gpu_procs if p.pid in cats})
        t = e
    out = []
    for pid, rank in pid_rank.items():
        n = sum(cats[pid].values())
        groups = tuple((name, sum(cats[pid][c] for c in members) / n if n else 0.0) for name, members in GROUPS)
        hot = places[pid].most_common(1)
        fn = [f for f, _ in fns[pid].most_common() if f]
        out.append(RankSummary(rank, pid, gpu.get(pid), n, groups, fn[0] if fn else None,
                               hot[0][0] if hot else None, hot[0][1] / n if hot and n else 0.0))
    return tuple(sorted(out, key=lambda r: (r.rank, r.pid)))


def rank_text_lines(ranks: tuple[RankSummary, ...]) -> list[str]:
    """The text report's section (empty for one process)."""
    if not ranks:
        return []
    head = "".join(f"{name:>8}" for name, _ in GROUPS)
    out = [f"ranks ({len(ranks)})", f"  {'rank':>4} {'pid':>8} {'gpu':>4} {'samples':>8}{head}  hot function"]
    for r in ranks:
        gpu = "-" if r.gpu is None else str(r.gpu)
        shares = "".join(f"{100 * sh:7.0f}%" for _, sh in r.groups) if r.samples else "".join(f"{'-':>8}" for _ in GROUPS)
        hot = f"{r.hot} {100 * r.hot_share:.0f}%" if r.hot else ""
        out.append(f"  {r.rank:>4} {r.pid:>8} {gpu:>4} {r.samples:>8}{shares}  {hot}".rstrip())
    seen = [r for r in ranks if r.samples]
    if len(seen) >= 2:
        low = min(seen, key=lambda r: r.comm)
        waits = [r for r in seen if r is not low]
        fn = next((r.collective_fn for r in waits if r.collective_fn), None) or "collectives"
        out.append(f"  communication: " + ", ".join(f"rank {r.rank} {100 * r.comm:.0f}%" for r in seen)
                   + f"; the others wait in {fn} for rank {low.rank} most" if min(r.comm for r in waits) > low.comm
                   else "  communication: " + ", ".join(f"rank {r.rank} {100 * r.comm:.0f}%" for r in seen))
    return out


def rank_html(ranks: tuple[RankSummary, ...], esc) -> list[str]:
    """The HTML report's section (``esc``: the report's escaping); empty for one process."""
    if not ranks:
        return []
    head = "".join(f"<th>{name}</th>" for name, _ in GROUPS)
    out = [f"<h2>Ranks ({len(ranks)})</h2>", "<table><tr><th>rank</th><th>pid</th><th>GPU</th><th>samples</th>"
           f"{head}<th>waits in</th><th>hot function</th></tr>"]
    for r in ranks:
        cells = "".join(f"<td>{100 * sh:.0f}%</td>" if r.samples else "<td>-</td>" for _, sh in r.groups)
        hot = f"{esc(r.hot)} ({100 * r.hot_share:.0f}%)" if r.hot else ""
        out.append(f"<tr><td>{r.rank}</td><td>{r.pid}</td><td>{'-' if r.gpu is None else r.gpu}</td>"
                   f"<td>{r.samples}</td>{cells}<td>{esc(r.collective_fn or '')}</td><td>{hot}</td></tr>")
    out.append("</table>")
    return out
