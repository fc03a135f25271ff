"""Distributed training: the GPU waits on collectives (slow transport, a straggler, no overlap).

It uses only the shared cost bar (``base``); rules that reason across ranks belong here.
"""

from __future__ import annotations

from ...analysis.breakdown import Bucket
from ..context import AnalysisContext
from .base import Hit, confidence, gain, idle_line, labels_line, pct, significant, worst


def check_collective_wait(ctx: AnalysisContext) -> Hit | None:
    found = worst(ctx, lambda g: g.breakdown.get(Bucket.COLLECTIVE), gpu_only=True)
    if found is None or not significant(found[0], found[1]):
        return None
    g, cost = found
    frac = cost / g.breakdown.total_s
    ev = [idle_line(g, [Bucket.COLLECTIVE])]
    line = labels_line(g, Bucket.COLLECTIVE)
    if line:
        ev.append(line)
    nccl = {k: v for k, v in ctx.env.items() if k.startswith("NCCL_")}
    if nccl:
        ev.append("NCCL settings: " + " ".join(f"{k}={v}" for k, v in sorted(nccl.items())))
    return Hit(
        evidence=tuple(ev),
        action=(
            "NCCL_DEBUG=INFO shows the transport (NET/Socket between GPUs of one node means P2P/NVLink "
            "is off: check NCCL_P2P_DISABLE, NCCL_SOCKET_IFNAME, NCCL_IB_DISABLE); compare step times "
            "across ranks for a straggler; overlap communication: DDP(..., bucket_cap_mb=25, gradient_as_bucket_view=True)"
        ),
        expected_gain=gain(frac),
        cost_s=cost,
        confidence=confidence(g.breakdown.idle_sample_share(Bucket.COLLECTIVE) or frac, g.breakdown.idle_samples),
        gpu_index=g.index,
        title=f"{g.name} waits on collectives {pct(frac)} of the time",
    )

