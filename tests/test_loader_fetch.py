"""Where loader workers spend their fetch (analysis.loader_fetch): the per-row machinery (a
__getitem__ per index in its own lines, default_collate), per-sample work below __getitem__, or a
wait."""

from gputop.analysis import per_row_fetch
from gputop.model import Category as C
from gputop.model import Frame

from synth import stack

TORCH = "/venv/lib/python3.11/site-packages/torch/utils/data"
FETCH = Frame("_MapDatasetFetcher.fetch", f"{TORCH}/_utils/fetch.py", 54)
LISTCOMP = Frame("_MapDatasetFetcher.fetch.<locals>.<listcomp>", f"{TORCH}/_utils/fetch.py", 54)
WORKER_LOOP = Frame("_worker_loop", f"{TORCH}/_utils/worker.py", 358)
ROW = (Frame("RowsDataset.__getitem__", "/home/u/tabular.py", 31, code="return self.x[i], self.y[i]"),
       LISTCOMP, FETCH, WORKER_LOOP)
COLLATE = (Frame("collate_tensor_fn", f"{TORCH}/_utils/collate.py", 275, code="return torch.stack(batch, 0, out=out)"),
           Frame("collate", f"{TORCH}/_utils/collate.py", 155), Frame("default_collate", f"{TORCH}/_utils/collate.py", 401),
           Frame("_MapDatasetFetcher.fetch", f"{TORCH}/_utils/fetch.py", 57), WORKER_LOOP)
DECODE = (Frame("ImageFile.load", "/venv/lib/python3.11/site-packages/PIL/ImageFile.py", 291),
          Frame("ImageNetish.__getitem__", "/home/u/images.py", 44, code="img = Image.open(p).convert('RGB')"),
          LISTCOMP, FETCH, WORKER_LOOP)


def sample(frames, active=True):
    return stack(0, C.DATA_FETCH, pid=2, active=active, frames=frames)


def test_per_row_fetch_sorts_the_workers_samples():
    sleep = (Frame("DS.__getitem__", "/home/u/train.py", 14, code="time.sleep(0.002)"), LISTCOMP, FETCH, WORKER_LOOP)
    items = (Frame("DS.__getitems__", "/home/u/train.py", 20, code="return self.x[idx]"),
             Frame("_MapDatasetFetcher.fetch", f"{TORCH}/_utils/fetch.py", 52), WORKER_LOOP)
    convert = (Frame("default_convert", f"{TORCH}/_utils/collate.py", 120),
               Frame("_MapDatasetFetcher.fetch", f"{TORCH}/_utils/fetch.py", 57), WORKER_LOOP)
    idle = (Frame("Queue.get", "/usr/lib/python3.11/multiprocessing/queues.py", 103), WORKER_LOOP)
    pr = per_row_fetch([sample(ROW), sample(COLLATE), sample(DECODE), sample(sleep), sample(sleep, active=False),
                        sample(convert), sample(idle, active=False)])
    # the idle worker is outside any fetch; the sleep is a wait (py-spy's flag or its code), not overhead
    assert (pr.samples, pr.in_getitem, pr.in_collate, pr.per_sample_work, pr.waiting) == (6, 1, 1, 3, 1)
    assert pr.per_index and not pr.batched
    # Python 3.12 inlines the comprehension: the collate sample alone shows the per-index fetch
    py312 = (ROW[0], FETCH, WORKER_LOOP)
    assert not per_row_fetch([sample(py312)]).per_index
    assert per_row_fetch([sample(py312), sample(COLLATE)]).per_index
    # a Dataset that already takes the batch's indices
    assert per_row_fetch([sample(items)]).batched
