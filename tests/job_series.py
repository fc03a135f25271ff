"""Synthetic Prometheus answers for the job view: the API's instant-vector JSON for a job of N
ranks, every series the exporter publishes per rank (export.job_collector), as a scrape of many
hosts would leave them. One rank can be the straggler, one stuck, some left unreported; with
``waiters_stuck`` the straggler's peers wait in all_reduce in every sample (their stacks unchanged,
so their exporters call them stuck), as CPU ranks waiting on a slow peer look. ``starting`` maps
ranks to what their exporter says they still do ("importing"): their window is their imports'."""

from __future__ import annotations

TS = 1_732_550_400.123


def job_payload(ranks: int, per_host: int = 8, job: str = "exp-42", straggler: int | None = None,
                stuck: int | None = None, missing: tuple[int, ...] = (), waiters_stuck: bool = False,
                starting: dict[int, str] | None = None,
                nccl: dict[int, tuple[float, float]] | None = None,
                throttled: dict[int, tuple[str, ...]] | None = None) -> dict:
    """``nccl``: rank -> (AllReduce operations launched, behind the lead), as the exporters
    publish NCCL's RAS counts (only while the ranks' counts differ)."""
    starting = starting or {}
    nccl = nccl or {}
    throttled = throttled or {}  # rank -> its GPU's limiting reasons, as label values ("power_cap")
    result = []

    def add(name: str, rank: int, value: float, **labels: str) -> None:
        host = f"node-{rank // per_host:03d}"
        metric = {"__name__": name, "instance": f"{host}:10405", "job": "gputop", "job_id": job, "host": host,
                  "rank": str(rank), **labels}
        result.append({"metric": metric, "value": [TS, repr(float(value))]})

    for r in range(ranks):
        if r in missing:
            continue
        slow, hung = r == straggler, r == stuck
        if r in starting:
            phases = {"compute": 0.0, "data": 0.0, "comm": 0.0, "ckpt": 0.0, "other": 1.0}
        elif slow:
            phases = {"compute": 0.35, "data": 0.61, "comm": 0.02, "ckpt": 0.0, "other": 0.02}
        elif hung:
            phases = {"compute": 0.0, "data": 0.0, "comm": 0.0, "ckpt": 0.0, "other": 1.0}
        else:
            phases = {"compute": 0.42, "data": 0.04, "comm": 0.5, "ckpt": 0.0, "other": 0.04}
        wait = phases["comm"]
        if r in starting:
            pass
        elif (stuck is not None and not hung) or (waiters_stuck and not slow):
            phases, wait = {"compute": 0.0, "data": 0.0, "comm": 1.0, "ckpt": 0.0, "other": 0.0}, 1.0
        add("gputop_rank_info", r, 1, job_source="torchelastic", local_rank=str(r % per_host),
            world_size=str(ranks), pid=str(40000 + r), gpu=str(r % per_host))
        for p, v in phases.items():
            add("gputop_rank_phase_ratio", r, v, phase=p)
        add("gputop_rank_wait_ratio", r, wait)
        add("gputop_rank_stack_samples", r, 300)
        if r in starting:
            add("gputop_rank_hot_line", r, 0.9, place="<module> (u/train.py:3)", code="import torch", collective="")
        elif slow:
            add("gputop_rank_hot_line", r, 0.58, place="decode (u/data.py:88)", code="img = decode(buf, quality=95)",
                collective="")
        elif hung:
            add("gputop_rank_hot_line", r, 1.0, place="wait_forever (u/train.py:66)", code="lock.acquire()",
                collective="")
        else:
            add("gputop_rank_hot_line", r, 0.3, place="step (u/train.py:57)", code="loss.backward()",
                collective="all_reduce")
        stuck_now = r not in starting and (hung or stuck is not None or (waiters_stuck and not slow))
        where = ("wait_forever (u/train.py:66)" if hung
                 else "all_reduce (torch/distributed/distributed_c10d.py:2000)" if stuck_now else "")
        add("gputop_rank_stuck", r, 1 if stuck_now else 0, where=where)
        add("gputop_rank_stuck_seconds", r, 95.0 if stuck_now else 0.0)
        if starting:  # an exporter with the starting series (older ones have none)
            add("gputop_rank_starting", r, 1 if r in starting else 0, what=starting.get(r, ""))
        for reason in throttled.get(r, ()):
            add("gputop_rank_gpu_throttled", r, 1, reason=reason)
        if r in nccl:
            ops, behind = nccl[r]
            add("gputop_rank_nccl_operations_total", r, ops, comm="51dfef6fa39775b2", collective="AllReduce")
            add("gputop_rank_nccl_behind_operations", r, behind, comm="51dfef6fa39775b2", collective="AllReduce")
        if slow:
            add("gputop_rank_finding", r, 36.6, id="data-starved", severity="critical")
        elif r % 5 == 0:
            add("gputop_rank_finding", r, 4.0, id="rank-straggler", severity="warning")
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def job_matrix(steps) -> dict:
    """A subquery's answer (``{...}[60s:5s]``) from the job at each step: ``steps`` is
    ``[(ts, job_payload(...)), ...]``; each series carries its values at the steps it is in."""
    series: dict[tuple, dict] = {}
    for ts, payload in steps:
        for item in payload["data"]["result"]:
            k = tuple(sorted(item["metric"].items()))
            got = series.setdefault(k, {"metric": item["metric"], "values": []})
            got["values"].append([ts, item["value"][1]])
    return {"status": "success", "data": {"resultType": "matrix", "result": list(series.values())}}
