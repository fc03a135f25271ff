"""The classes the twelfth held-out sets showed (2 x H200, NCCL 2.28; one H200), each on the
recording of the job that showed it and on made-up evidence that tells it from its look-alikes.

- A rank alone in a host-side collective (a gloo barrier under ``if rank == 0:``) while its peer's
  GPU spins in the step's all-reduce: a desync, stuck; the peer, blocked in a launch behind that
  kernel, is no straggler (it was named one for 15 s).
- FSDP2's CPU offload with no sharding frame on the main thread: the GPU sees no kernel while the
  optimizer step runs (20x without the offload); launch-bound and the unfused optimizer were said.
- A tensor made on the CPU every step and copied to the GPU (an ALiBi bias: 5.57x made once on
  the GPU): host-sync (its ``float("-inf")`` read as a sync) and pageable copies were said.
- Validation on rank 0 alone: one finding (the straggler's), not two.
"""

from __future__ import annotations

import re
from pathlib import Path

from gputop.analysis import built_on_cpu
from gputop.analysis.classify import _SYNC_CODE
from gputop.analysis.hang import GPU_COLLECTIVE, Party, _collective
from gputop.model import Category as C
from gputop.model import Frame, StackSample

from test_nccl_real import replay_findings
from test_rule_evaluation import replay

RECORDINGS = Path(__file__).parent / "fixtures" / "recordings"
MODEL = "/home/u/model.py"


def sample(*frames: Frame, ts: float = 0.0, category: C = C.FORWARD) -> StackSample:
    return StackSample(ts=ts, pid=10, thread_id=1, thread_name="MainThread", is_main=True, active=True,
                       frames=frames, category=category)


CALL = Frame("Attn.forward", MODEL, 93, code="bias = alibi_bias(self.heads, t).to(q.device, q.dtype)")
INSIDE = Frame("alibi_bias", MODEL, 72, code="bias = slopes[:, None, None] * relative[None]")
IMPL = Frame("Module._call_impl", "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py", 1790)


# --------------------------------------------------------------------------- pure pieces


def test_a_function_whose_result_is_moved_to_the_device_is_read_as_made_on_the_cpu():
    b = built_on_cpu([sample(INSIDE, CALL, IMPL), sample(INSIDE, CALL, IMPL), sample(CALL, IMPL),
                      sample(Frame("Linear.forward", MODEL, 5), IMPL, CALL)])
    assert b is not None and b.fn == "alibi_bias" and b.site == "u/model.py:93"
    assert (b.building, b.copying, b.samples) == (2, 1, 4)


def test_a_model_called_on_the_line_or_a_dtype_cast_is_not_a_tensor_made_on_the_cpu():
    model_line = Frame("train", MODEL, 40, code="out = model(x).to(device)")
    assert built_on_cpu([sample(Frame("Net.forward", MODEL, 9), IMPL, model_line)]) is None
    cast = Frame("Attn.forward", MODEL, 93, code="bias = alibi_bias(self.heads, t).to(q.dtype)")
    assert built_on_cpu([sample(INSIDE, cast, IMPL)]) is None
    plain = Frame("train", MODEL, 41, code="x = x.to(device, non_blocking=True)")
    assert built_on_cpu([sample(plain)]) is None


def test_a_float_literal_is_no_sync_but_float_of_a_tensor_is():
    assert not re.search(_SYNC_CODE, 'return bias.masked_fill(causal, float("-inf"))')
    assert not re.search(_SYNC_CODE, "m = torch.full(shape, float('nan'))")
    assert re.search(_SYNC_CODE, "total += float(loss)")


def _party(rank: int, collective: str | None, waits: str = "collective") -> Party:
    return Party(pid=100 + rank, tid=100 + rank, label=f"rank {rank} (pid {100 + rank})",
                 where=f"train.py:{500 + rank} in train", code=None, waits=waits, what="waits", main=rank == 0,
                 worker=rank != 0, collective=collective)


def test_a_rank_in_a_host_collective_while_the_others_wait_on_their_gpus_is_the_one_that_never_arrives():
    ps = (_party(0, "barrier"), _party(1, GPU_COLLECTIVE))
    d = _collective(ps, ps, (), {100: 0, 101: 1}, "idle", "timeout")
    assert "rank 1 (pid 101) waits in a NCCL collective on its GPU for rank 0 (pid 100), which never arrives" in d.summary
    assert "barrier at train.py:500" in d.summary and "desync" in d.summary
    assert "same collectives in the same order" in d.action


def test_two_ranks_in_different_named_collectives_stay_a_plain_desync():
    ps = (_party(0, "barrier"), _party(1, "all_reduce"))
    d = _collective(ps, ps, (), {100: 0, 101: 1}, "unknown", "timeout")
    assert d.summary.startswith("collective desync:") and "never arrives" not in d.summary


# --------------------------------------------------------------------------- the recordings


def test_the_checkpoint_barrier_on_rank_0_alone_is_stuck_naming_rank_0_and_never_a_straggler():
    evals = replay_findings("claims_router-h200x2.gputop", every_s=1.0)
    ids = [(t, [f.id for f in shown]) for t, _, shown in evals]
    assert not any("rank-straggler" in i for _, i in ids), ids
    stuck = [(t, next(f for f in shown if f.id == "stuck")) for t, _, shown in evals if any(f.id == "stuck" for f in shown)]
    assert stuck and stuck[0][0] <= 9.0, ids  # the barrier entered ~2.3 s in
    f = stuck[-1][1]
    assert "rank 0 (pid" in f.title and "never arrives" in f.title and "barrier" in f.title, f.title
    # One wait still going on is not yet a wait of every step; once a hang forms with every peer
    # spinning, the ranks' step findings wait too.
    assert not any("collective-wait" in i for _, i in ids), ids
    assert any("weighing-hang" in i for _, i in ids), ids


def test_fsdp2_cpu_offload_without_fsdp_frames_on_the_main_thread_is_offload_from_the_first_look():
    evals = replay_findings("patent_lm-h200x2.gputop", every_s=1.0)
    first = next(t for t, _, shown in evals if shown)
    shown = [f.id for t, _, s in evals for f in s]
    assert "launch-bound" not in shown and "unfused-optimizer" not in shown, shown
    _, _, last = evals[-1]
    f = last[0]
    assert f.id == "optimizer-offload" and first <= 5.0
    assert "CPUOffloadPolicy()" in f.action and "host memory" in f.evidence[0]


def test_the_alibi_bias_made_on_the_cpu_every_step_is_named_with_its_line():
    shown, seen, _ = replay(RECORDINGS / "h200-alibi-bias-built-on-cpu.gputop")
    assert seen.get("tensor-built-on-cpu") is not None and seen["tensor-built-on-cpu"] <= 3.0, seen
    assert "host-sync" not in seen and "pageable-h2d" not in seen and "launch-bound" not in seen, seen
    f = shown["tensor-built-on-cpu"]
    assert "`alibi_bias`" in f.title and "fresh12_torch_dna_alibi_cpu_bias.py:93" in f.title
    assert "register_buffer" in f.action and "device=" in f.action
    assert f.gain_predicted is not None and f.gain_predicted >= 5.0  # measured 5.57x


def test_rank_0s_validation_is_the_stragglers_finding_alone():
    evals = replay_findings("leaf_disease-h200x2.gputop", every_s=1.0)
    shown = {f.id for _, _, s in evals for f in s}
    assert "rank-straggler" in shown and "eval-every-step" not in shown, shown
    _, _, last = evals[-1]
    f = next(f for f in last if f.id == "rank-straggler")
    assert "rank 0 is the straggler" in f.title and "evaluate" in f.evidence[0]
    assert "share it" in f.action and "less often" in f.action


def _view(gpu_waits, latest, works=True, gpu_util=100.0):
    from gputop.analysis.ranks import RankView
    from gputop.analysis.spin import WaitPoll

    return RankView(rank=1, pid=101, gpu=1, samples=40, shares=((C.FORWARD, 1.0),), collective=0.0,
                    collective_fn=None, hot="Attn.forward (model.py:93)", hot_share=1.0, latest=latest,
                    gpu_waits=tuple(WaitPoll(float(i), 1.0, w) for i, w in enumerate(gpu_waits)),
                    gpu_util=gpu_util, works=works)


def test_a_rank_whose_gpu_spins_is_said_to_wait_in_nccl_and_is_not_a_straggler():
    from gputop.analysis.ranks import _does_something, doing_now

    spinning = _view([1.0, 1.0, 1.0], sample(CALL, IMPL))
    assert doing_now(spinning).startswith("GPU waits in NCCL; host at Attn.forward")
    assert not _does_something(spinning)
    computing = _view([0.0, 0.1, 0.0], sample(CALL, IMPL))
    assert doing_now(computing).startswith("Attn.forward (")
    assert _does_something(computing)


def _ranked(rank, waits, own=None, own_share=0.0, samples=16):
    from dataclasses import replace
    v = _view(waits, sample(CALL, IMPL))
    return replace(v, rank=rank, pid=100 + rank, gpu=rank, samples=samples, only_here=own, only_here_share=own_share)


def test_a_rank_running_work_of_its_own_while_the_others_gpus_wait_is_the_straggler_before_the_polls_resolve():
    from gputop.analysis.ranks import gpu_straggler, own_work_straggler

    slow = _ranked(0, [0.0, 0.0, 0.0, 0.0], own="evaluate (train.py:367)", own_share=0.69)
    waiting = _ranked(1, [0.0, 1.0, 0.3, 1.0])
    assert gpu_straggler([slow, waiting], 0.10, 0.10) is None  # four bursty polls do not resolve the gap
    s = own_work_straggler([slow, waiting], 0.10, 0.10)
    assert s is not None and s.slow.rank == 0 and s.own_low is not None and 0.4 < s.own_low < 0.69
    # Without work of its own, or with the others not waiting, or work of its own too rare to
    # tell from sampling, nothing is said.
    assert own_work_straggler([_ranked(0, [0.0] * 4), waiting], 0.10, 0.10) is None
    assert own_work_straggler([slow, _ranked(1, [0.0, 0.05, 0.0, 0.0])], 0.10, 0.10) is None
    rare = _ranked(0, [0.0] * 4, own="log (train.py:9)", own_share=0.25, samples=8)
    assert own_work_straggler([rare, waiting], 0.10, 0.10) is None
    # A waiting rank standing still is a hang forming (its peer may never arrive), weighed elsewhere.
    from dataclasses import replace
    assert own_work_straggler([slow, replace(waiting, works=False)], 0.10, 0.10) is None


# --------------------------------------------------------------------------- a thread holding the GIL
# (the thirteenth NCCL set's crop_yield, measured before this was built: "rank 0 is the straggler,
# in Attention.forward"; its status thread busy-polled a deque and held the GIL in 54 of 55 samples)


def _thread(name: str, ts: float, gil: bool, active: bool, frame: Frame, main: bool = False) -> StackSample:
    return StackSample(ts=ts, pid=10, thread_id=hash(name) % 1000, thread_name=name, is_main=main, active=active,
                       owns_gil=gil, frames=(frame,), category=C.FORWARD if main else C.OTHER)


DRAIN = Frame("StatusBoard._drain", "/home/u/train.py", 88, code="while not self.q: continue")
FWD = Frame("Net.forward", "/home/u/train.py", 40)


def test_a_thread_holding_the_gil_while_the_main_thread_waits_is_named_and_a_busy_pool_is_not():
    from gputop.analysis import gil_holder_of

    ss = [s for i in range(12) for s in (_thread("MainThread", i, False, False, FWD, main=True),
                                          _thread("status-board", i, True, True, DRAIN))]
    h = gil_holder_of(ss, 10)
    assert h is not None and h.thread == "status-board" and h.where.startswith("StatusBoard._drain (")
    # The main thread running (it holds the GIL itself most of the time): no holder to name.
    running = [s for i in range(12) for s in (_thread("MainThread", i, True, True, FWD, main=True),
                                              _thread("status-board", i, i % 4 == 0, True, DRAIN))]
    assert gil_holder_of(running, 10) is None
    # A thread seen a few times only is no pattern.
    assert gil_holder_of(ss[:8], 10) is None


def test_the_gil_holder_replaces_launch_bound_with_the_thread_and_its_line():
    from dataclasses import replace

    from gputop.advisor.rules.gil import check_gil_held
    from gputop.advisor.rules.host import check_launch_bound
    from gputop.advisor.rules.base import Withdraw
    from gputop.analysis import GilHolder
    from synth import Job, periodic
    from test_rules import run_rules

    found, ctx = run_rules(Job(util=periodic(1.0, 0.4), main=lambda t: C.FORWARD if t % 0.4 < 0.2 else C.BACKWARD))
    assert "launch-bound" in found and "gil-held" not in found
    h = GilHolder(ctx.target_pid, "status-board", "StatusBoard._drain (train.py:88)", 0.98, 0.95, 40)
    with_gil = replace(ctx, gil_holders={ctx.target_pid: h})
    assert isinstance(check_launch_bound(with_gil), Withdraw)
    hit = check_gil_held(with_gil)
    assert hit is not None and "`status-board`" in hit.title and "queue.Queue.get" in hit.action


def test_the_rank_whose_status_thread_holds_the_gil_is_the_straggler_for_that_thread():
    evals = replay_findings("crop_yield-h200x2.gputop", every_s=1.0)
    shown = {f.id for _, _, s in evals for f in s}
    assert "launch-bound" not in shown, shown
    _, _, last = evals[-1]
    f = next(f for f in last if f.id == "rank-straggler")
    assert "rank 0 is the straggler" in f.title and "`status-board`" in f.evidence[0]
    assert "StatusBoard._drain" in f.evidence[0] and "queue.Queue.get" in f.action
