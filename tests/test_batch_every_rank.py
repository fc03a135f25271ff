"""Every rank loading the whole global batch and keeping its part (``x.chunk(world)[rank]``): read
from the loop's source, carried on the loop's frame and in a recording, and judged with the
ranks' time loading data (advisor.rules.distributed)."""

import json
import textwrap

from gputop.advisor.context import AnalysisContext
from gputop.advisor.rules.distributed import check_batch_loaded_on_every_rank
from gputop.analysis.ranks import rank_views
from gputop.model import Category, Frame, StackSample
from gputop.record import codec
from gputop.sources.loop_source import loops_of, shard_at

LOOP = """\
import torch.distributed as dist

def train(model, loader, world, rank):
    for x, y in loader:
        x = x.chunk(world)[rank]
        y = y.chunk(world)[rank]
        loss = model(x).sum()
        loss.backward()
"""


def _shard(text: str, line: int = 7):
    return shard_at(loops_of(textwrap.dedent(text)), line)


def test_keeping_the_ranks_part_of_a_split_batch_is_read_with_its_line():
    assert _shard(LOOP) == (5, "x = x.chunk(world)[rank]")
    assert _shard(LOOP.replace("x.chunk(world)[rank]", "torch.tensor_split(x, world)[dist.get_rank()]"))[0] == 5
    assert _shard(LOOP.replace("x.chunk(world)[rank]", "x[rank::world]")) == (5, "x = x[rank::world]")
    assert _shard(LOOP.replace("x.chunk(world)[rank]", "x[self.local_rank * n:(self.local_rank + 1) * n]"))[0] == 5
    # Not the rank's part: a split kept by another index, a slice from 0, a chunk of the output.
    none = LOOP.replace("x = x.chunk(world)[rank]\n", "").replace("y = y.chunk(world)[rank]", "y = y.chunk(2)[0]")
    assert _shard(none) is None
    assert _shard(LOOP.replace("x = x.chunk(world)[rank]\n        y = y.chunk(world)[rank]", "x = x[0::2]")) is None


def test_a_split_under_a_flag_beside_a_distributed_sampler_is_not_read():
    # A new user's fixed job: `if not args.sampler: x = x[rank::world]` never ran (--sampler made a
    # DistributedSampler), and "drop line 36" was shown for 13 s; the split runs for microseconds,
    # so the stacks cannot say which branch runs.
    flagged = ("from torch.utils.data import DistributedSampler\n" + LOOP).replace(
        "        x = x.chunk(world)[rank]\n        y = y.chunk(world)[rank]\n",
        "        if not sampler:\n            x = x[rank::world]\n")
    assert _shard(flagged) is None
    assert _shard(flagged.replace("DistributedSampler", "RandomSampler")) == (7, "x = x[rank::world]")
    # Unconditional, it runs whatever else the file makes.
    assert _shard("from torch.utils.data import DistributedSampler\n" + LOOP, 8) == (6, "x = x.chunk(world)[rank]")


def test_the_loops_frame_carries_it_and_a_recording_keeps_it():
    f = Frame("train", "/home/u/train.py", 7, loop=4, shard=(5, "x = x.chunk(world)[rank]"))
    back = codec.loop_fields(codec.keeps_text(f))
    assert back["shard"] == f.shard
    assert codec.loop_fields(json.dumps({"loop": 4, "keeps": [], "shard": [0, "x"]}))["shard"] == ()
    assert codec.loop_fields(json.dumps({"loop": 4, "keeps": [], "shard": ["5", "x"]}))["shard"] == ()


T0 = 1_700_000_000.0
PROJ = "/home/u/train.py"
FETCH = Frame("__getitem__", "/home/u/data.py", 30)
LIB_FETCH = Frame("_next_data", "/venv/lib/python3.12/site-packages/torch/utils/data/dataloader.py", 757)


def _loop(line: int, sharded: bool = True) -> Frame:
    return Frame("train", PROJ, line, loop=4, shard=(5, "x = x.chunk(world)[rank]") if sharded else ())


def _stacks(load: float, sharded: bool = True, n: int = 60):
    out = []
    for pid in (10, 11):
        for i in range(n):
            if i < round(load * n):
                frames, cat = (FETCH, LIB_FETCH, _loop(4, sharded)), Category.DATA_FETCH
            else:
                frames, cat = (Frame("forward", "/venv/lib/python3.12/site-packages/torch/nn/modules/conv.py", 548),
                               _loop(7, sharded)), Category.FORWARD
            out.append(StackSample(ts=T0 + i / 5, pid=pid, thread_id=pid, thread_name="MainThread", frames=frames,
                                   active=True, is_main=True, category=cat, os_thread_id=pid))
    return out


def _check(stacks, env=()):
    views = rank_views({10: 0, 11: 1}, stacks, T0)
    main = tuple(s for s in stacks if s.pid == 10)
    return check_batch_loaded_on_every_rank(AnalysisContext(now=T0 + 12, t0=T0, t1=T0 + 12, gpus=(), ranks=views,
                                                            main_stacks=main, env=dict(env)))


def test_named_with_the_line_distributed_sampler_and_the_share_that_goes():
    hit = _check(_stacks(0.6))
    assert hit is not None and "keeps 1/2" in hit.title
    assert "DistributedSampler(dataset, shuffle=True)" in hit.action and "drop line 5" in hit.action
    ev = " ".join(hit.evidence)
    assert "`x = x.chunk(world)[rank]` (line 5)" in ev and "1 of every 2 loaded for nothing" in ev
    assert "1 of 2 loads go" in hit.expected_gain
    # 60 % loading, half of it goes: 1 / (1 - 0.3) = 1.4x, stated at the share's upper limit.
    assert 1.4 < hit.gain_bound < 2.0
    # The bound follows the rank that loads most: the others wait for it.
    uneven = [s for s in _stacks(0.6) if s.pid == 10] + [s for s in _stacks(0.8) if s.pid == 11]
    assert _check(uneven).gain_bound > hit.gain_bound
    # Eight ranks over nodes (WORLD_SIZE above the local ranks): seven in eight go.
    assert "keeps 1/8" in _check(_stacks(0.6), env=(("WORLD_SIZE", "8"),)).title


def test_not_named_without_the_split_or_with_little_loading():
    assert _check(_stacks(0.6, sharded=False)) is None
    assert _check(_stacks(0.05)) is None
