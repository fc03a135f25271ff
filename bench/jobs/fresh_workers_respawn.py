"""A click-through-rate model (embedding tables + MLP, DLRM-like) trained for many short epochs:
each epoch is a few batches of a day's log, and the DataLoader has 4 workers without
``persistent_workers``, so every epoch starts 4 worker processes and shuts them down again. Each
worker, when it starts, loads the categorical vocabulary (a JSON map from raw id to index, about
two million entries) through ``worker_init_fn``, the usual way to open a per-worker resource; so
each epoch waits for the workers' start-up before its first batch. ``--persistent-workers`` is the
fix: the workers, and their loaded vocabulary, live across epochs.

Synthetic rows, the vocabulary written to a temporary folder at start; no download."""

from __future__ import annotations

import json
import os
import random
import tempfile

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, get_worker_info

from common import Progress, log, parser, watchdog

FIELDS = 26  # categorical columns
DENSE = 13  # numeric columns


def write_vocab(n: int) -> str:
    r = random.Random(0)
    vocab = {f"{r.getrandbits(40):010x}": i for i in range(n)}
    path = os.path.join(tempfile.mkdtemp(prefix="ctr-vocab-"), "vocab.json")
    with open(path, "w") as f:
        json.dump(vocab, f)
    return path


class ClickLog(Dataset):
    """Rows of raw categorical ids (hex strings) + dense features + a click label."""

    def __init__(self, vocab_path: str, rows: int, seed: int = 0) -> None:
        self.vocab_path = vocab_path
        self.vocab: dict[str, int] | None = None  # loaded in each worker (``open``)
        with open(vocab_path) as f:
            keys = list(json.load(f))  # the raw ids this day's log uses
        r = random.Random(seed)
        self.cats = [[r.choice(keys) for _ in range(FIELDS)] for _ in range(rows)]
        g = torch.Generator().manual_seed(seed)
        self.dense = torch.randn(rows, DENSE, generator=g)
        self.clicks = (torch.rand(rows, generator=g) < 0.03).float()

    def open(self) -> None:
        with open(self.vocab_path) as f:
            self.vocab = json.load(f)

    def __len__(self) -> int:
        return len(self.cats)

    def __getitem__(self, i: int):
        if self.vocab is None:
            self.open()
        ids = torch.tensor([self.vocab.get(c, 0) for c in self.cats[i]])
        return ids, self.dense[i], self.clicks[i]


def worker_init_fn(worker_id: int) -> None:
    get_worker_info().dataset.open()


class CTRModel(torch.nn.Module):
    def __init__(self, vocab: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.emb = torch.nn.EmbeddingBag(vocab, dim, mode="sum")
        self.field_emb = torch.nn.Parameter(torch.randn(FIELDS, dim) * 0.01)
        self.bottom = torch.nn.Sequential(torch.nn.Linear(DENSE, dim), torch.nn.ReLU())
        self.top = torch.nn.Sequential(
            torch.nn.Linear((FIELDS + 1) * dim, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
        self.dim = dim

    def forward(self, ids, dense):
        b = ids.shape[0]
        e = self.emb(ids.reshape(-1, 1)).view(b, FIELDS, self.dim) + self.field_emb
        x = torch.cat([e.flatten(1), self.bottom(dense)], dim=1)
        return self.top(x).squeeze(1)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--batches-per-epoch", type=int, default=8)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--persistent-workers", action="store_true")
    args = p.parse_args()
    watchdog(args.seconds)
    dev = torch.device(args.device)
    vocab_size = 20_000 if args.tiny else 2_000_000
    batch = 32 if args.tiny else args.batch
    vocab_path = write_vocab(vocab_size)
    data = ClickLog(vocab_path, batch * args.batches_per_epoch)
    loader = DataLoader(data, batch_size=batch, shuffle=True, num_workers=args.workers, pin_memory=dev.type == "cuda",
                        worker_init_fn=worker_init_fn, persistent_workers=args.persistent_workers and args.workers > 0,
                        drop_last=True)
    model = CTRModel(vocab_size, 16 if args.tiny else 64, 64 if args.tiny else 1024).to(dev)
    opt = torch.optim.Adagrad(model.parameters(), lr=0.01)
    progress = Progress(batch)
    log(f"fresh_workers_respawn: batch {batch} x {args.batches_per_epoch} per epoch, workers {args.workers} "
        f"persistent={args.persistent_workers}")
    model.train()
    epoch = 0
    while True:
        for ids, dense, clicks in loader:
            ids, dense, clicks = (t.to(dev, non_blocking=True) for t in (ids, dense, clicks))
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                logits = model(ids, dense)
            loss = F.binary_cross_entropy_with_logits(logits.float(), clicks)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            progress.step()
        epoch += 1


if __name__ == "__main__":
    main()
