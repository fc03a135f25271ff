"""Saturated loader workers that spend their time in the per-row fetch machinery (a __getitem__ per
index, default_collate stacking the rows) are told to fetch each batch in one call; workers
saturated by per-sample work (decoding, transforms) keep the workers' action."""

from pathlib import Path

from gputop.advisor.rules.base import share_upper, wait_bound
from gputop.analysis import per_row_fetch
from gputop.model import Category as C
from gputop.model import Frame
from gputop.record import Reader
from gputop.report.rejudge import judged

from synth import Job, periodic, phases, stack
from test_rules import run_rules

RECORDING = Path(__file__).parent / "fixtures" / "recordings" / "h200-lightning-per-row-fetch.gputop"
HEALTHY_GPM = {"sm_active": 85.0, "sm_occupancy": 40.0, "tensor_active": 45.0, "fp32_active": 5.0, "fp16_active": 30.0}

# A user's Dataset slicing rows from tensors in memory, called once per index (Python 3.11 frames)
from test_loader_fetch import FETCH, LISTCOMP, ROW, TORCH, WORKER_LOOP  # noqa: E402

COLLATE = (Frame("collate_tensor_fn", f"{TORCH}/_utils/collate.py", 275, code="return torch.stack(batch, 0, out=out)"),
           Frame("collate", f"{TORCH}/_utils/collate.py", 155), Frame("collate", f"{TORCH}/_utils/collate.py", 215),
           Frame("default_collate", f"{TORCH}/_utils/collate.py", 401),
           Frame("_MapDatasetFetcher.fetch", f"{TORCH}/_utils/fetch.py", 57), WORKER_LOOP)
# An image Dataset: its samples sit in PIL's decode and torchvision's transforms below __getitem__
DECODE = (Frame("ImageFile.load", "/venv/lib/python3.11/site-packages/PIL/ImageFile.py", 291,
                code="n, err_code = decoder.decode(b)"),
          Frame("Image.convert", "/venv/lib/python3.11/site-packages/PIL/Image.py", 937),
          Frame("ImageNetish.__getitem__", "/home/u/images.py", 44, code="img = Image.open(p).convert('RGB')"),
          LISTCOMP, FETCH, WORKER_LOOP)
AUGMENT = (Frame("RandomResizedCrop.forward",
                 "/venv/lib/python3.11/site-packages/torchvision/transforms/transforms.py", 980),
           Frame("Compose.__call__", "/venv/lib/python3.11/site-packages/torchvision/transforms/transforms.py", 95),
           Frame("ImageNetish.__getitem__", "/home/u/images.py", 45, code="return self.tf(img), label"),
           LISTCOMP, FETCH, WORKER_LOOP)


def loader_job(worker_frames, wait=0.4, **kw):
    """2 saturated workers on a 16-core host at 15 % CPU, the GPU waiting ``wait`` of each second;
    each worker's stack sample, one a second, cycles through ``worker_frames``."""
    return Job(util=periodic(1.0, 1.0 - wait), main=phases(1.0, 1.0 - wait, C.FORWARD, C.DATA_WAIT), gpu=HEALTHY_GPM,
               workers=2, worker_cpu=99.0, host_cpu=lambda t: 15.0,
               worker_stack=lambda t: stack(0, C.DATA_FETCH, active=True,
                                            frames=worker_frames[int(t) % len(worker_frames)]), **kw)


def test_the_recorded_per_row_job_is_told_to_fetch_batches_in_one_call():
    reader = Reader(RECORDING)
    try:
        shown = []
        for _, shown, _ in judged(reader, 1.0):
            pass
    finally:
        reader.close()
    f = next(f for f in shown if f.id == "workers-saturated")
    # the batched fetch first, more workers only as the weaker second option
    assert f.action.startswith("fetch each batch with one index operation")
    assert "sampler=BatchSampler(RandomSampler(ds), batch_size=B, drop_last=False), batch_size=None" in f.action
    assert "__getitems__(self, indices)" in f.action
    assert f.action.index("BatchSampler") < f.action.index("num_workers=")
    assert "fetching one row at a time" in f.title
    # the Dataset's __getitem__ named where it is; both worker samples in the per-row machinery
    assert any("TensorDataset.__getitem__ (torch/utils/data/dataset.py:206)" in e and "2 of 2 samples" in e
               and "default_collate" in e for e in f.evidence), f.evidence
    # two worker samples bound nothing tighter than the wait: the bound is the wait's, not the
    # 30 workers' 7.5x, and says why
    assert "bounds nothing tighter than the wait" in f.expected_gain
    assert f.gain_predicted is not None and f.gain_predicted > 7.5


def test_workers_saturated_by_decoding_and_transforms_keep_the_workers_action():
    found, _ = run_rules(loader_job((DECODE, AUGMENT, DECODE, COLLATE)))
    f = found["workers-saturated"]
    assert "num_workers=5," in f.action and "was 2" in f.action
    assert "BatchSampler" not in f.action and "__getitems__" not in f.action
    assert "one row at a time" not in f.title
    assert not any("per-row" in e for e in f.evidence)


def test_per_row_overhead_gives_the_batched_fetch_bounded_by_its_share():
    # 90 % data wait; the workers' samples: half per-row machinery (__getitem__'s own line,
    # default_collate), half in a decode: batching removes at most the per-row half
    frames = (ROW, COLLATE, DECODE, AUGMENT)
    found, ctx = run_rules(loader_job(frames, wait=0.9))
    f = found["workers-saturated"]
    assert f.action.startswith("fetch each batch with one index operation")
    assert "RowsDataset.__getitem__ then takes the list of indices" in f.action
    assert "num_workers=" in f.action.split("Second, weaker")[1]
    pr = per_row_fetch(ctx.worker_stacks)
    assert pr.samples == len(ctx.worker_stacks) >= 20
    assert pr.per_row == pr.in_getitem + pr.in_collate == pr.samples // 2
    assert pr.getitem == "RowsDataset.__getitem__ (u/tabular.py:31)"
    assert any(f"{pr.per_row} of {pr.samples} samples" in e and "`RowsDataset.__getitem__ (u/tabular.py:31)`" in e
               for e in f.evidence), f.evidence
    # the bound is the per-row share's, at its upper confidence limit: far below the 10x of the wait
    assert f.gain_predicted == round(wait_bound(share_upper(pr.per_row, pr.samples)), 2)
    assert f.gain_predicted < 3.0
    assert "limited by the per-row overhead batching removes" in f.expected_gain


def test_per_row_overhead_below_half_keeps_the_workers_action():
    found, ctx = run_rules(loader_job((ROW, DECODE, AUGMENT, DECODE)))
    pr = per_row_fetch(ctx.worker_stacks)
    assert 0 < pr.share < 0.5
    f = found["workers-saturated"]
    assert "BatchSampler" not in f.action and "num_workers=5," in f.action
