"""The nccl-env rule from synthetic contexts: what each setting means for this job (one node or
several), per rank, never twice with the target-only rules, and no secret shown."""

from __future__ import annotations

from dataclasses import replace

from gputop.advisor.context import AnalysisContext
from gputop.advisor.rules import RULES_BY_ID
from gputop.advisor.rules.base import share_upper, wait_bound
from gputop.advisor.rules.nccl import check_nccl_env, multi_node
from gputop.analysis.ranks import rank_view
from gputop.model import Category, Frame, Severity, StackSample
from gputop.sources.host import job_env

DIST = "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py"
COLL = (Frame("all_reduce", DIST, 10), Frame("main", "/p/train.py", 50))
WORK = (Frame("forward", "/p/model.py", 10), Frame("main", "/p/train.py", 48))
BASE = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}


def view(rank, pid, env, coll_every=2):
    samples = [StackSample(ts=float(i), pid=pid, thread_id=pid, frames=COLL if i % coll_every == 0 else WORK,
                           is_main=True, category=Category.COLLECTIVE if i % coll_every == 0 else Category.FORWARD)
               for i in range(20)]
    return replace(rank_view(rank, pid, samples), env=tuple(sorted(env.items())))


def ctx(*envs, target_env=None):
    ranks = tuple(view(i, 100 + i, dict(BASE, RANK=str(i), **e)) for i, e in enumerate(envs))
    env = dict(ranks[0].env) if target_env is None else target_env
    return AnalysisContext(now=60.0, t0=0.0, t1=60.0, gpus=(), target_pid=100, env=env, ranks=ranks)


def test_p2p_disabled_on_every_rank_is_a_warning_with_the_communication_share():
    f = RULES_BY_ID["nccl-env"].evaluate(ctx({"NCCL_P2P_DISABLE": "1"}, {"NCCL_P2P_DISABLE": "1"}))
    assert f is not None and f.severity is Severity.WARNING
    assert f.title == "NCCL settings slow the ranks' communication: NCCL_P2P_DISABLE=1"
    assert f.evidence[0].startswith("NCCL_P2P_DISABLE=1 on every rank: GPUs of one node stop talking directly")
    assert "the ranks spend 50 % of their time in collectives" in f.evidence[1]
    # 50 % allows 2.0x; the bound takes the share at its upper limit from the ranks' 40 samples
    assert f.action.startswith("unset NCCL_P2P_DISABLE") and f.gain_predicted == round(wait_bound(share_upper(20, 40)), 2)
    assert "up to 64 % at 95 % confidence from 40 stack samples" in f.expected_gain


def test_ib_disabled_matters_only_across_nodes():
    assert check_nccl_env(ctx({"NCCL_IB_DISABLE": "1"}, {"NCCL_IB_DISABLE": "1"})) is None
    hit = check_nccl_env(ctx({"NCCL_IB_DISABLE": "1", "WORLD_SIZE": "16"}, {"NCCL_IB_DISABLE": "1", "WORLD_SIZE": "16"}))
    assert hit is not None and "TCP sockets instead of InfiniBand" in hit.evidence[0]
    assert "the job spans nodes" in hit.evidence[-1]
    assert multi_node({"SLURM_NNODES": "4"}) and not multi_node({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"})


def test_loopback_interface_and_forced_algorithm():
    hit = check_nccl_env(ctx({"NCCL_SOCKET_IFNAME": "lo", "WORLD_SIZE": "4"}, {"NCCL_SOCKET_IFNAME": "lo", "WORLD_SIZE": "4"}))
    assert hit is not None and "loopback or virtual interface" in hit.evidence[0]
    info = check_nccl_env(ctx({"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"}, {}))
    assert info is not None and info.severity is Severity.INFO
    assert [e.split(":")[0] for e in info.evidence[:2]] == ["NCCL_ALGO=Tree on rank 0", "NCCL_PROTO=Simple on rank 0"]


def test_target_only_settings_are_said_here_for_the_other_ranks_only():
    # The target's CUDA_LAUNCH_BLOCKING and NCCL_DEBUG=TRACE are the cuda-launch-blocking and
    # slow-env rules' to report; rank 1's are seen only here.
    assert check_nccl_env(ctx({"CUDA_LAUNCH_BLOCKING": "1", "NCCL_DEBUG": "TRACE"}, {})) is None
    hit = check_nccl_env(ctx({}, {"CUDA_LAUNCH_BLOCKING": "1"}))
    assert hit is not None and hit.evidence[0].startswith("CUDA_LAUNCH_BLOCKING=1 on rank 1:")
    assert check_nccl_env(ctx({"NCCL_DEBUG": "INFO"}, {})) is None  # INFO logs at start-up only
    assert check_nccl_env(ctx({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "COLL"}, {})) is None  # the target's
    assert check_nccl_env(ctx({}, {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,COLL"})) is not None


def test_one_process_and_secrets():
    lone = AnalysisContext(now=60.0, t0=0.0, t1=60.0, gpus=(), target_pid=100, env={"NCCL_P2P_DISABLE": "1"})
    assert check_nccl_env(lone) is None  # no ranks, one node: NCCL carries nothing
    env = dict(job_env({"NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_HCA": "hf_" + "a" * 30, "WORLD_SIZE": "4",
                        "LOCAL_WORLD_SIZE": "2", "NCCL_SECRET_TOKEN": "abc"}))
    assert env["NCCL_IB_HCA"] == "***" and env["NCCL_SECRET_TOKEN"] == "***"
    hit = check_nccl_env(AnalysisContext(now=60.0, t0=0.0, t1=60.0, gpus=(), target_pid=100, env=env))
    assert hit is not None and "hf_" not in " ".join(hit.evidence) + hit.action
