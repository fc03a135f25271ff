"""NCCL settings that slow a multi-rank job's communication, read from each rank's environment.

Each entry is a fact about the setting, not a rate: the finding says what the setting does (as
NCCL's own documentation puts it) and how much of the ranks' time went to collectives in the
window, the most the job could gain if communication became free. Settings that the target-only
rules already report for the target (``slow-env``: NCCL_DEBUG=TRACE; ``cuda-launch-blocking``) are
reported here only for the other ranks, so one variable never makes two findings.

The environment values come redacted from the host source; a secret-looking value is shown as
``***`` and never matches a setting below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from ...model import Severity
from ..context import AnalysisContext
from .base import Hit, bounded, gain, pct, sampled_upper, uses
from .threshold import JUDGEMENT, IntThreshold, Threshold

Env = Mapping[str, str]

# NCCL_MAX_NCHANNELS at or below this caps a collective's bandwidth: NCCL spreads a collective
# over channels (one SM each), 2 to 32 of them on NVLink machines.
FEW_CHANNELS = IntThreshold(
    2, "channels", JUDGEMENT,
    "NCCL_MAX_NCHANNELS at or below this is a cap someone set to debug or to save SMs, far below what the "
    "links carry (NCCL uses 2 to 32 channels on NVLink machines).")


def _true(v: str | None) -> bool:
    return v is not None and v.strip().lower() in ("1", "true", "yes", "on", "y")


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def multi_node(env: Env) -> bool:
    """The job spans nodes: more ranks in all than on this node, or a node count above one."""
    world, local = _int(env.get("WORLD_SIZE")), _int(env.get("LOCAL_WORLD_SIZE"))
    if world is not None and local is not None and world > local:
        return True
    return any((_int(env.get(k)) or 0) > 1 for k in ("NNODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"))


@dataclass(frozen=True)
class Setting:
    key: str
    bad: Callable[[str, Env], bool]  # (value, the rank's environment) -> it slows this job
    why: str
    fix: str
    transport: bool = True  # it changes how bytes travel (a warning), not only overhead (info)
    target_rule: bool = False  # a target-only rule reports it for the target


SETTINGS: tuple[Setting, ...] = (
    Setting("NCCL_P2P_DISABLE", lambda v, e: _true(v),
            "GPUs of one node stop talking directly over NVLink/PCIe P2P and go through host memory",
            "unset NCCL_P2P_DISABLE"),
    Setting("NCCL_P2P_LEVEL", lambda v, e: v.strip().upper() in ("LOC", "0"),
            "P2P is never used, NVLink included: traffic goes through host memory",
            "unset NCCL_P2P_LEVEL (NCCL picks the level from the topology)"),
    Setting("NCCL_SHM_DISABLE", lambda v, e: _true(v) and _true(e.get("NCCL_P2P_DISABLE")),
            "with P2P also disabled, GPUs of one node exchange data through the network stack",
            "unset NCCL_SHM_DISABLE and NCCL_P2P_DISABLE"),
    Setting("NCCL_IB_DISABLE", lambda v, e: _true(v) and multi_node(e),
            "traffic between nodes goes over TCP sockets instead of InfiniBand/RoCE",
            "unset NCCL_IB_DISABLE (if the nodes have IB/RoCE; check NCCL_DEBUG=INFO's 'NET/IB' line)"),
    Setting("NCCL_NET_GDR_LEVEL", lambda v, e: v.strip().upper() in ("LOC", "0") and multi_node(e),
            "GPUDirect RDMA is off: every inter-node transfer is staged through host memory",
            "unset NCCL_NET_GDR_LEVEL"),
    Setting("NCCL_SOCKET_IFNAME",
            lambda v, e: v.strip().lstrip("=^").startswith(("lo", "docker", "virbr"))
            and (multi_node(e) or _true(e.get("NCCL_P2P_DISABLE"))),
            "names a loopback or virtual interface: traffic that goes through sockets takes it",
            "NCCL_SOCKET_IFNAME=<the node's data interface> (see `ip -br addr`), or unset it"),
    Setting("NCCL_MAX_NCHANNELS", lambda v, e: (_int(v) or FEW_CHANNELS + 1) <= FEW_CHANNELS,
            "caps every collective at a few channels: a fraction of the links' bandwidth",
            "unset NCCL_MAX_NCHANNELS"),
    Setting("NCCL_ALGO", lambda v, e: bool(v.strip()),
            "forces one algorithm for every message size NCCL would otherwise tune per size",
            "unset NCCL_ALGO outside experiments", transport=False),
    Setting("NCCL_PROTO", lambda v, e: bool(v.strip()),
            "forces one protocol for every message size NCCL would otherwise tune per size",
            "unset NCCL_PROTO outside experiments", transport=False),
    Setting("NCCL_DEBUG", lambda v, e: v.strip().upper() == "TRACE"
            or (v.strip().upper() == "INFO" and any(w in e.get("NCCL_DEBUG_SUBSYS", "").upper() for w in ("COLL", "ALL"))),
            "logs every collective call", "NCCL_DEBUG=WARN (INFO only while diagnosing)", transport=False,
            target_rule=True),
    Setting("CUDA_LAUNCH_BLOCKING", lambda v, e: _true(v),
            "every kernel launch waits for the kernel: the rank can never queue work, its peers wait for it",
            "unset CUDA_LAUNCH_BLOCKING", transport=False, target_rule=True),
)


def _envs(ctx: AnalysisContext) -> dict[int, tuple[int | None, Env]]:
    """pid -> (rank, environment) of every rank whose environment is known; the target's own
    (``ctx.env``) stands in for a rank with none read yet."""
    out: dict[int, tuple[int | None, Env]] = {}
    for v in ctx.ranks:
        env = dict(v.env) if v.env else (dict(ctx.env) if v.pid == ctx.target_pid else None)
        if env:
            out[v.pid] = (v.rank, env)
    if not out and ctx.env and ctx.target_pid is not None and multi_node(ctx.env):
        out[ctx.target_pid] = (_int(ctx.env.get("RANK")), dict(ctx.env))  # one local rank of a multi-node job
    return out


@uses(FEW_CHANNELS)
def check_nccl_env(ctx: AnalysisContext) -> Hit | None:
    envs = _envs(ctx)
    if not envs:
        return None  # one process: NCCL carries nothing
    found: dict[str, tuple[Setting, str, list[str]]] = {}
    for pid, (rank, env) in sorted(envs.items(), key=lambda x: (x[1][0] is None, x[1][0])):
        for st in SETTINGS:
            v = env.get(st.key)
            if v is None or v == "***" or not st.bad(v, env):
                continue
            if st.target_rule and pid == ctx.target_pid:
                continue  # its own rule says it for the target
            who = f"rank {rank}" if rank is not None else f"pid {pid}"
            found.setdefault(f"{st.key}={v}", (st, v, []))[2].append(who)
    if not found:
        return None
    n = len(envs)
    ev = []
    for text, (st, _, who) in found.items():
        on = "every rank" if len(who) == n and n > 1 else ", ".join(who)
        ev.append(f"{text} on {on}: {st.why}")
    coll = [v.collective for v in ctx.ranks if v.samples]
    share = sum(coll) / len(coll) if coll else None
    # The stated bound only: the ranks' mean share at its upper confidence limit. A mean of R
    # shares from n_i samples each varies as one share from R^2 / sum(1 / n_i) samples (all of
    # them when the ranks have as many; fewer, so a wider limit, when they differ).
    seen = [v for v in ctx.ranks if v.samples]
    n_eff = int(len(seen) ** 2 / sum(1 / v.samples for v in seen)) if seen else 0
    upper = sampled_upper(share, n_eff) if share and n_eff else None
    if share is not None:
        ev.append(f"the ranks spend {pct(share)} of their time in collectives over the window "
                  "(" + ", ".join(f"rank {v.rank} {pct(v.collective)}" for v in ctx.ranks if v.samples) + ")")
    if multi_node(next(iter(envs.values()))[1]):
        ev.append("the job spans nodes (WORLD_SIZE above LOCAL_WORLD_SIZE)")
    transport = any(st.transport for st, _, _ in found.values())
    keys = ", ".join(found)
    window = ctx.t1 - ctx.t0
    return Hit(
        evidence=tuple(ev),
        action="; ".join(dict.fromkeys(st.fix for st, _, _ in found.values()))
        + "; then compare the ranks' collective share here (NCCL_DEBUG=INFO once shows the transport chosen)",
        expected_gain=(gain(share, upper=upper) if share else "faster collectives: their share of the time is not measured yet"),
        gain_bound=bounded(share, upper=upper) if share else None,
        cost_s=(share or 0.0) * window * len(coll),
        confidence=1.0 if transport else 0.9,
        severity=Severity.WARNING if transport else Severity.INFO,
        title=f"NCCL settings slow the ranks' communication: {keys}",
    )


# --------------------------------------------------------------------------- NVLink left unused

# A GPU with NVLinks up whose links carry less than this (sent and received, median over the
# window) carries none of its ranks' collectives: a data-parallel step moves its gradients,
# gigabytes a second on any model worth two GPUs (the fifth held-out set's healthy T5: 4.9 GB/s a
# GPU). Judgement.
NVLINK_IDLE_BPS = Threshold(
    100e6, "B/s", JUDGEMENT,
    "A GPU whose NVLinks carry less than this (median, both ways) carries none of its ranks' collectives: a "
    "data-parallel step moves gigabytes a second (a healthy 2-GPU T5 job: 4.9 GB/s a GPU).",
    "bench/results/multi_rank.md")
# ... while its PCIe link carries at least this each way: the GPU sends as much as it receives,
# the signature of traffic between GPUs through host memory. Loading data is received, a
# checkpoint is sent; neither both at once at this rate. Judgement.
PCIE_BOTH_WAYS_BPS = Threshold(
    1e9, "B/s", JUDGEMENT,
    "PCIe at least this each way (median) while NVLink idles: GPU-to-GPU traffic through host memory; loading "
    "data is received, a checkpoint sent, neither both ways at this rate.")
MIN_LINK_POLLS = IntThreshold(5, "polls", JUDGEMENT, "Link readings in the window before a verdict on them.")


@uses(NVLINK_IDLE_BPS, PCIE_BOTH_WAYS_BPS, MIN_LINK_POLLS)
def check_collectives_off_nvlink(ctx: AnalysisContext) -> Hit | None:
    """Two or more of the job's GPUs have NVLinks up, and the links idle while the GPUs trade
    gigabytes a second both ways over PCIe: the ranks' collectives go through host memory. NCCL
    chose that because something turned peer-to-peer off, often where /proc cannot see it (an
    os.environ line in the script, a launcher's export, a container without IPC)."""
    if ctx.stuck is not None and ctx.stuck.stuck:
        return None
    indices = sorted({v.gpu for v in ctx.ranks if v.gpu is not None} | {g.index for g in ctx.gpus if g.index >= 0})
    links = [(i, ctx.links[i]) for i in indices if i in ctx.links]
    seen = [(i, t) for i, t in links if t.polls >= MIN_LINK_POLLS and t.nvlink_bps is not None]
    if len(seen) < 2:
        return None
    off = [(i, t) for i, t in seen if t.nvlink_bps < NVLINK_IDLE_BPS and (t.pcie_tx_bps or 0.0) >= PCIE_BOTH_WAYS_BPS
           and (t.pcie_rx_bps or 0.0) >= PCIE_BOTH_WAYS_BPS]
    if len(off) < 2:
        return None
    gb = lambda b: f"{b / 1e9:.1f} GB/s"  # noqa: E731
    ev = [f"GPU {i}: NVLink {gb(t.nvlink_bps)} while PCIe carries {gb(t.pcie_tx_bps)} out and "
          f"{gb(t.pcie_rx_bps)} in (medians over the window)" for i, t in off]
    ev.append("a GPU sending as much as it receives over PCIe, its NVLinks idle, is the ranks' collectives going "
              "through host memory (NCCL's SHM or socket transport, or a gloo process group copying CUDA tensors to the "
              "host and back): loading data is received, a checkpoint sent")
    set_here = sorted({f"{k}={v}" for _, env in _envs(ctx).values() for k, v in env.items()
                       if k in ("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE", "NCCL_CUMEM_ENABLE")})
    ev.append("the ranks' environment at start: " + (", ".join(set_here) if set_here else
                                                     "no NCCL_P2P_* setting, at start or in the script's own "
                                                     "os.environ lines (one made in a library, or in code the script's "
                                                     "top level does not call, is not visible here)"))
    nccl_fix = ("let NCCL use NVLink: remove NCCL_P2P_DISABLE=1 (or NCCL_P2P_LEVEL=LOC/NVL limits) wherever the job "
                "sets it: the script's os.environ, a launcher or job script's export, the container's environment; "
                "in a container, give it CUDA IPC (docker run --ipc=host); then NCCL_DEBUG=INFO says `via P2P` (or "
                "NVLS) for the rings where it now says `via SHM` or NET")
    # A gloo process group given CUDA tensors looks the same on the links (each bucket copied to
    # the host, summed by gloo's threads, copied back), and is what PyTorch's DDP tutorial writes:
    # a held-out job did so on two H200s, NCCL measured 4.7x (bench/results/multi_rank.md). No
    # setting seen makes it the likelier one.
    gloo_fix = ("if the process group is gloo (init_process_group(\"gloo\"), as PyTorch's DDP tutorial writes it) and "
                "the tensors are on the GPU, NCCL is not used at all: init_process_group(\"nccl\", device_id=...) (or "
                "backend=\"cuda:nccl,cpu:gloo\" where CPU collectives are needed too)")
    return Hit(
        evidence=tuple(ev),
        action=(f"{nccl_fix}; {gloo_fix}" if set_here else f"{gloo_fix}; otherwise {nccl_fix}"),
        expected_gain=("the collectives' time at NVLink's rate instead of PCIe's through host memory: several times "
                       "faster communication; how much of the step that is, the stacks do not show (the GPUs look "
                       "busy copying)"),
        cost_s=0.0,
        confidence=0.8,
        gpu_index=off[0][0],
        title=f"Collectives avoid NVLink: GPUs {', '.join(str(i) for i, _ in off)} trade "
              f"{gb(min(t.pcie_tx_bps for _, t in off))}+ each way over PCIe, NVLink idle",
    )
