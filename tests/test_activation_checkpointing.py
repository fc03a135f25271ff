"""Activation checkpointing where the model and its activations fit (``activation-checkpointing``):
named from the forward recomputed inside backward (on autograd's own thread on a GPU, on the main
thread on the CPU) with memory to spare on the job's GPU, before memory-headroom's larger batch;
never for a job near its memory limit or one that does not checkpoint.

The real case: a 2-rank FSDP2 job on 2 x H200 (a ~300M Qwen2, ``gradient_checkpointing_enable()``
left on from a 7B recipe, 8 x 2048 tokens per rank) peaked at 8 % of the card and ran 1.15x faster
with checkpointing off; gputop said only "memory to spare: a larger batch fits"
(tests/fixtures/nccl/fsdp_qwen_ckpt-h200x2.gputop, recorded by `advise --record` on the launcher).
"""

import pytest

from gputop.advisor.engine import Advisor
from gputop.advisor.rules.base import share_upper, wait_bound
from gputop.analysis import CKPT_HF, CKPT_PLAIN, CKPT_WRAPPER, recompute_of
from gputop.analysis.recompute import checkpoint_entry, recomputing
from gputop.model import Category as C
from gputop.model import Frame, Severity, StackSample

from synth import LIB, STACKS, T0, GiB, Job, rule_findings
from test_nccl_real import replay_findings

HF_LIB = "/usr/lib/python3.11/site-packages/transformers"
USER = Frame("train", "/home/u/train.py", 40)
STEP = Frame("step", "/home/u/train.py", 55)
# The first forward of a Hugging Face decoder layer under gradient_checkpointing_enable(), as
# py-spy read it on the H200 (transformers 5.x, torch 2.11): checkpoint() under the layer's __call__.
HF_CKPT_FORWARD = (
    Frame("Linear.forward", f"{LIB}/nn/modules/linear.py", 134),
    Frame("Module._call_impl", f"{LIB}/nn/modules/module.py", 1790),
    Frame("Qwen2DecoderLayer.forward", f"{HF_LIB}/models/qwen2/modeling_qwen2.py", 260),
    Frame("Module._call_impl", f"{LIB}/nn/modules/module.py", 1885),
    Frame("checkpoint", f"{LIB}/utils/checkpoint.py", 512),
    Frame("DisableContext.__call__.<locals>._fn", f"{LIB}/_dynamo/eval_frame.py", 1263),
    Frame("_disable_dynamo.<locals>.inner", f"{LIB}/_compile.py", 54),
    Frame("GradientCheckpointingLayer.__call__", f"{HF_LIB}/modeling_layers.py", 108),
    Frame("Qwen2Model.forward", f"{HF_LIB}/models/qwen2/modeling_qwen2.py", 388),
    STEP, USER,
)
# The same layer with checkpointing off: GradientCheckpointingLayer is every HF decoder layer's
# base class, in its stack whether checkpointing is on or not.
HF_PLAIN_FORWARD = HF_CKPT_FORWARD[:4] + HF_CKPT_FORWARD[7:]
# Autograd's engine thread recomputing a checkpointed layer (non-reentrant torch.utils.checkpoint).
RECOMPUTE = (
    Frame("Qwen2Attention.forward", f"{HF_LIB}/models/qwen2/modeling_qwen2.py", 200),
    Frame("Module._call_impl", f"{LIB}/nn/modules/module.py", 1790),
    Frame("_checkpoint_without_reentrant_generator.<locals>.recompute_fn", f"{LIB}/utils/checkpoint.py", 1607),
    Frame("_run_fn_with_dynamo_disabled", f"{LIB}/utils/checkpoint.py", 1139),
    Frame("_checkpoint_hook.__init__.<locals>.unpack_hook", f"{LIB}/utils/checkpoint.py", 1173),
)
# The engine thread in an op's backward (FSDP's post-backward): not recomputation.
ENGINE_BACKWARD = (
    Frame("FSDPParamGroup.post_backward", f"{LIB}/distributed/fsdp/_fully_shard/_fsdp_param_group.py", 527),
    Frame("RegisterPostBackwardFunction.backward", f"{LIB}/distributed/fsdp/_fully_shard/_fsdp_param_group.py", 902),
    Frame("BackwardCFunction.apply", f"{LIB}/autograd/function.py", 317),
)
GPM = {"sm_active": 50.0, "sm_occupancy": 30.0, "tensor_active": 40.0, "fp32_active": 5.0}


def ckpt_job(recompute_every=(3, 4), period=10, mem_gib=8.0, checkpointing=True, **kw):
    """A step of ``period`` samples (5 Hz): three in forward, six in backward (the main thread off
    the CPU in autograd's engine), one in the optimizer; autograd's thread recomputes checkpointed
    layers in the samples ``recompute_every`` of each step. 80 GiB cards."""
    def cat(t):
        k = round(t * 5) % period
        return C.FORWARD if k < 3 else C.OPTIMIZER if k == period - 1 else C.BACKWARD

    def frames(t):
        c = cat(t)
        if c is C.FORWARD:
            return HF_CKPT_FORWARD if checkpointing else HF_PLAIN_FORWARD
        return STACKS[c]

    def engine(t):
        if cat(t) is not C.BACKWARD:
            return None
        return RECOMPUTE if checkpointing and round(t * 5) % period in recompute_every else ENGINE_BACKWARD

    return Job(main=cat, main_frames=frames, thread_frames=engine,
               main_active=lambda t: cat(t) is not C.BACKWARD,
               gpu={**GPM, "mem_used": int(mem_gib * GiB)}, **kw)


# --------------------------------------------------------------------------- the evidence


def test_the_recomputation_is_read_from_every_thread_of_the_process_at_the_same_instant():
    found, ctx = rule_findings(ckpt_job())
    rc = ctx.recompute
    assert rc.samples == 100 and rc.recompute == 20 and rc.share == pytest.approx(0.2)
    assert rc.api == CKPT_HF and rc.caller == "step (u/train.py:55)"
    # the main thread itself shows none of it: it waits in backward meanwhile
    assert not any(recomputing(s.frames) for s in ctx.main_stacks)


def test_frames_of_each_checkpointing_api():
    lib = "/usr/lib/python3.11/site-packages"
    assert recomputing([Frame("CheckpointFunction.backward", f"{lib}/torch/utils/checkpoint.py", 300)])
    assert recomputing([Frame("_checkpoint_without_reentrant.<locals>.recompute_fn", f"{lib}/torch/utils/checkpoint.py", 1)])
    assert recomputing([Frame("non_reentrant_checkpoint.<locals>.checkpoint_unpack",
                              f"{lib}/deepspeed/runtime/activation_checkpointing/checkpointing.py", 1)])
    assert recomputing([Frame("CheckpointFunction.backward", f"{lib}/megatron/core/tensor_parallel/random.py", 1)])
    # the first forward's pack hook is not recomputation; nor is a user's own CheckpointFunction
    assert not recomputing([Frame("_checkpoint_hook.__init__.<locals>.pack_hook", f"{lib}/torch/utils/checkpoint.py", 1150)])
    assert not recomputing([Frame("CheckpointFunction.backward", "/home/u/model.py", 10)])
    assert checkpoint_entry(HF_CKPT_FORWARD) == (CKPT_HF, "step (u/train.py:55)")
    assert checkpoint_entry(HF_PLAIN_FORWARD) is None
    wrapped = (Frame("Block.forward", "/home/u/model.py", 17), Frame("checkpoint", f"{lib}/torch/utils/checkpoint.py", 519),
               Frame("CheckpointWrapper.forward", f"{lib}/torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py", 169),
               Frame("Sequential.forward", f"{lib}/torch/nn/modules/container.py", 253), USER)
    assert checkpoint_entry(wrapped) == (CKPT_WRAPPER, "train (u/train.py:40)")
    plain = (Frame("Block.forward", "/home/u/model.py", 17), Frame("checkpoint", f"{lib}/torch/utils/checkpoint.py", 519),
             Frame("Net.forward", "/home/u/model.py", 88), USER)
    assert checkpoint_entry(plain) == (CKPT_PLAIN, "Net.forward (u/model.py:88)")


def test_ranks_are_pooled_and_kept_apart():
    def s(pid, ts, main, frames):
        return StackSample(ts=ts, pid=pid, thread_id=pid + (0 if main else 1), frames=frames, is_main=main)

    stacks = []
    for i in range(20):
        for pid in (10, 11):
            stacks.append(s(pid, float(i), True, STACKS[C.BACKWARD]))
        if i % 4 == 0:
            stacks.append(s(10, float(i), False, RECOMPUTE))  # rank 0: 5 of 20
        if i % 2 == 0:
            stacks.append(s(11, float(i), False, RECOMPUTE))  # rank 1: 10 of 20
    # a CPU job recomputes on its main thread (torch 2.13's checkpoint_wrapper, captured on CPU)
    stacks.append(s(11, 20.0, True, RECOMPUTE + STACKS[C.BACKWARD]))
    rc = recompute_of(stacks, [10, 11], 0.0, {10: 0, 11: 1})
    assert [(p.rank, p.recompute, p.samples) for p in rc.procs] == [(0, 5, 20), (1, 11, 21)]
    assert rc.share == pytest.approx(16 / 41)
    # before t0 nothing counts
    assert recompute_of(stacks, [10, 11], 100.0).samples == 0


# --------------------------------------------------------------------------- the finding


def test_checkpointing_with_memory_to_spare_is_a_warning_before_a_larger_batch():
    found, ctx = rule_findings(ckpt_job())
    f = found["activation-checkpointing"]
    assert f.severity is Severity.WARNING
    assert "gradient_checkpointing_enable()" in f.action and "gradient_checkpointing_disable()" in f.action
    assert "checkpoint fewer blocks" in f.action
    assert any("20 %" in e and "recomputes" in e for e in f.evidence)
    assert any("Hugging Face" in e and "step (u/train.py:55)" in e for e in f.evidence)
    assert any("10 %" in e and "8.0G of 80.0G" in e for e in f.evidence)
    # the bound: the recomputation gone entirely, at its share's upper confidence limit
    assert f.gain_predicted == pytest.approx(wait_bound(share_upper(20, 100)), rel=0.02)
    assert "at most" in f.expected_gain and "steps/s" in f.expected_gain
    # memory-headroom still offers its batch, but after checkpointing goes
    mh = found["memory-headroom"]
    assert "activation checkpointing can go first" in mh.title
    assert mh.action.startswith("first turn activation checkpointing off")
    # ranked first: it costs the step its share, memory-headroom costs nothing
    assert f.cost_s > mh.cost_s


def test_the_advisor_shows_it_first():
    store = ckpt_job().store()
    adv = Advisor()
    for t in (18.0, 19.0, 20.0):
        shown = adv.evaluate(store, now=T0 + t)
    assert [f.id for f in shown][:2] == ["activation-checkpointing", "memory-headroom"]


def test_hugging_face_trainer_gets_its_own_switch():
    trainer = Frame("Trainer.training_step", "/usr/lib/python3.11/site-packages/transformers/trainer.py", 3800)
    job = ckpt_job()
    inner = job.main_frames
    job.main_frames = lambda t: inner(t) + (trainer,)
    found, _ = rule_findings(job)
    assert found["activation-checkpointing"].action.startswith("TrainingArguments(..., gradient_checkpointing=False)")


def test_a_small_share_is_info_and_a_tiny_one_nothing():
    # 7 of 100 samples: 1.08x alone, under the 10 % bar; its upper limit (13 %) over it: info
    found, ctx = rule_findings(ckpt_job(recompute_every=(3,), period=14))
    assert (ctx.recompute.recompute, ctx.recompute.samples) == (7, 100)
    assert found["activation-checkpointing"].severity is Severity.INFO
    # 12 of 300: even its upper limit (6.6 %) bounds less than 10 %: nothing
    found, ctx = rule_findings(ckpt_job(recompute_every=(3,), period=25, seconds=60.0))
    assert (ctx.recompute.recompute, ctx.recompute.samples) == (12, 300)
    assert "activation-checkpointing" not in found
    # twice in the window: not named
    found, _ = rule_findings(ckpt_job(recompute_every=(3,), period=50))
    assert "activation-checkpointing" not in found


def test_a_checkpointing_job_near_its_memory_limit_is_not_told_to_stop():
    for gib in (60.0, 78.5):  # 75 % (no headroom), 98 % (near the limit)
        found, ctx = rule_findings(ckpt_job(mem_gib=gib))
        assert ctx.recompute.share == pytest.approx(0.2)
        assert "activation-checkpointing" not in found
    assert "memory-near-limit" in found


def test_a_job_without_checkpointing_is_silent_and_keeps_the_larger_batch():
    found, ctx = rule_findings(ckpt_job(checkpointing=False))
    assert not ctx.recompute.seen
    assert "activation-checkpointing" not in found
    assert found["memory-headroom"].title.endswith("a larger batch fits")


# --------------------------------------------------------------------------- real recordings


@pytest.fixture(scope="module")
def qwen():
    return replay_findings("fsdp_qwen_ckpt-h200x2.gputop", every_s=1.0)


def test_the_real_fsdp_job_is_told_to_turn_checkpointing_off(qwen):
    shown_at = [t for t, _, shown in qwen if shown and shown[0].id == "activation-checkpointing"]
    assert shown_at and shown_at[0] <= 5.0
    first = shown_at[0]
    assert all(shown and shown[0].id == "activation-checkpointing" for t, _, shown in qwen if t >= first)
    t, ctx, shown = qwen[-1]
    f = shown[0]
    assert f.severity is Severity.WARNING
    assert "gradient_checkpointing_enable()" in f.action
    # both ranks recompute, on autograd's thread: the share is theirs together
    assert len(ctx.recompute.procs) == 2 and all(p.recompute > 0 for p in ctx.recompute.procs)
    assert any("rank 0" in e and "rank 1" in e for e in f.evidence)
    assert any("(8 %)" in e for e in f.evidence)
    # the measured gain (1.15x with checkpointing off) is within the stated bound
    assert f.gain_predicted >= 1.15
    ids = [x.id for x in shown]
    assert ids.index("activation-checkpointing") < ids.index("memory-headroom")
    assert "checkpointing can go first" in shown[ids.index("memory-headroom")].title


@pytest.mark.parametrize("name", ["healthy-h100x2.gputop", "compute-h100x2.gputop", "fsdp_slow-h100x2.gputop",
                                  "straggler-h100x2.gputop"])
def test_jobs_that_do_not_checkpoint_never_get_it(name):
    for t, ctx, shown in replay_findings(name):
        assert not ctx.recompute.seen, t
        assert "activation-checkpointing" not in {f.id for f in shown}, t
