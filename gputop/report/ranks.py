"""The report's per-rank section: for a recording of a multi-rank job, each local rank's time by
group (compute, data, communication, checkpoint, other) over the whole recording, the collective
it waits in, its hot function and its GPU. Read an hour at a time, like the rest of the report.

A rank's hot function is the Ranks tab's (``analysis.hot_line`` over ``analysis.rank_views``), one
choice for both: the report once counted its own on-CPU places and named a straggler by the loop
line it ran 2 % of the time, not the `load_batch` it slept in 88 %."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..analysis import collective_fn
from ..analysis import GROUPS, RANKS_SOURCE, as_ranks, hot_line, rank_map, rank_views
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
    # ``hot`` is the rank's own work (not where its code waits in a collective: a rank that only
    # waits is named by the user's frame under the wait, as the Ranks tab dims it).
    hot_own: bool = True

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
    # Per chunk, each rank's hot place as the Ranks tab chooses it, weighed by its samples there:
    # the recording's hot place is the one over most samples (a recording within a chunk: the
    # Ranks tab's choice over that span exactly).
    places: dict[int, Counter] = {p: Counter() for p in pid_rank}
    own: dict[tuple[int, str], bool] = {}
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
        # The ranks sampled in this chunk only: a restarted rank's old PID is no peer of its new one.
        sampled = {s.pid for s in stacks}
        for v in rank_views({p: r for p, r in pid_rank.items() if p in sampled}, stacks, t, gpu_procs, t1=e):
            place, share, mine = hot_line(v)
            if place:
                places[v.pid][place] += share * v.samples
                own[(v.pid, place)] = mine
        gpu.update({p.pid: p.gpu_index for p in gpu_procs if p.pid in cats})
        t = e
    out = []
    for pid, rank in pid_rank.items():
        n = sum(cats[pid].values())
        groups = tuple((name, sum(cats[pid][c] for c in members) / n if n else 0.0) for name, members in GROUPS)
        hot = places[pid].most_common(1)
        fn = [f for f, _ in fns[pid].most_common() if f]
        out.append(RankSummary(rank, pid, gpu.get(pid), n, groups, fn[0] if fn else None,
                               hot[0][0] if hot else None, hot[0][1] / n if hot and n else 0.0,
                               own.get((pid, hot[0][0]), True) if hot else True))
    return tuple(sorted(out, key=lambda r: (r.rank, r.pid)))


def _hot_text(r: RankSummary, share: str = "{:.0f}%") -> str:
    """Its hot function and share; where it only waits, said as a wait (the Ranks tab dims it)."""
    if not r.hot:
        return ""
    return f"{'' if r.hot_own else 'waits at '}{r.hot} {share.format(100 * r.hot_share)}"


def waited_for(ranks: tuple[RankSummary, ...]) -> RankSummary | None:
    """The rank the others wait for most: the one in collectives least, when every other rank
    is in them more (None with fewer than two ranks sampled)."""
    seen = [r for r in ranks if r.samples]
    if len(seen) < 2:
        return None
    low = min(seen, key=lambda r: r.comm)
    return low if min(r.comm for r in seen if r is not low) > low.comm else None


def _communication(ranks: tuple[RankSummary, ...]) -> str:
    """"communication: rank 0 98%, rank 1 10%; the others wait in all_reduce for rank 1 most"."""
    seen = [r for r in ranks if r.samples]
    out = "communication: " + ", ".join(f"rank {r.rank} {100 * r.comm:.0f}%" for r in seen)
    low = waited_for(ranks)
    if low is None:
        return out
    fn = next((r.collective_fn for r in seen if r is not low and r.collective_fn), None) or "collectives"
    return out + f"; the others wait in {fn} for rank {low.rank} most"


def rank_text_lines(ranks: tuple[RankSummary, ...]) -> list[str]:
    """The text report's section (empty for one process)."""
    if not ranks:
        return []
    head = "".join(f"{name:>8}" for name, _ in GROUPS)
    out = [f"ranks ({len(ranks)})", f"  {'rank':>4} {'pid':>8} {'gpu':>4} {'samples':>8}{head}  hot function"]
    for r in ranks:
        gpu = "-" if r.gpu is None else str(r.gpu)
        shares = "".join(f"{100 * sh:7.0f}%" for _, sh in r.groups) if r.samples else "".join(f"{'-':>8}" for _ in GROUPS)
        out.append(f"  {r.rank:>4} {r.pid:>8} {gpu:>4} {r.samples:>8}{shares}  {_hot_text(r)}".rstrip())
    if sum(1 for r in ranks if r.samples) >= 2:
        out.append("  " + _communication(ranks))
    return out


def rank_html(ranks: tuple[RankSummary, ...], esc) -> list[str]:
    """The HTML report's section (``esc``: the report's escaping); empty for one process."""
    if not ranks:
        return []
    head = "".join(f"<th>{name}</th>" for name, _ in GROUPS)
    out = [f"<h2>Ranks ({len(ranks)})</h2>", "<table><tr><th>rank</th><th>pid</th><th>GPU</th><th>samples</th>"
           f"{head}<th>waits in</th><th>hot function</th></tr>"]
    # The rank the others wait for is not said to wait: its few collective samples are where it
    # meets them (a straggler sleeping 88 % in load_batch read "waits in all_reduce").
    low = waited_for(ranks)
    for r in ranks:
        cells = "".join(f"<td>{100 * sh:.0f}%</td>" if r.samples else "<td>-</td>" for _, sh in r.groups)
        waits = "(the others wait for it)" if r is low else (r.collective_fn or "")
        out.append(f"<tr><td>{r.rank}</td><td>{r.pid}</td><td>{'-' if r.gpu is None else r.gpu}</td>"
                   f"<td>{r.samples}</td>{cells}<td>{esc(waits)}</td><td>{esc(_hot_text(r, '({:.0f}%)'))}</td></tr>")
    out.append("</table>")
    if sum(1 for r in ranks if r.samples) >= 2:
        out.append(f"<p class=\"small\">{esc(_communication(ranks))}</p>")
    return out
