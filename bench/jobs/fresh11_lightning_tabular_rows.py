"""Loan-default scoring: an MLP over 96 numeric features and 20 categorical features (one embedding
table with per-feature offsets, 16 dimensions each; hidden 1024-512-256 with batch norm and dropout),
trained with PyTorch Lightning on one GPU (bf16-mixed, AdamW), batches of 8,192 rows drawn from 4
million applications held in memory.

The feature matrix is already in RAM as three tensors (numeric float32, categorical codes int64, the
label), so the data module wraps them in ``torch.utils.data.TensorDataset`` and hands it to a
``DataLoader(batch_size=8192, shuffle=True, num_workers=4, pin_memory=True)``, as in the Lightning
tabular examples. The ``DataLoader`` builds every batch row by row: the sampler yields 8,192 indices,
the fetcher calls ``dataset[i]`` for each (three tensor indexings and a tuple per row), and
``default_collate`` stacks the 8,192 row tensors of each of the three fields: ~25,000 tiny tensor
indexings and three 8,192-way ``torch.stack`` calls, ~60 ms of Python per batch in a worker, so the
4 workers deliver a batch every ~15 ms, while the model needs well under a millisecond of GPU time per
batch and Lightning's step a few milliseconds of CPU.

``--batched-sampler`` keeps the ``DataLoader`` and its workers but draws whole batches: a
``BatchSampler(RandomSampler(...), 8192)`` passed as the sampler with ``batch_size=None``, so the
dataset is indexed once per batch with the 8,192 indices (one gather per field, no collation).

Prints ``step <n> samples/s <x>`` about once a second.
"""

from __future__ import annotations

import math
import time

import lightning as L
import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

from common import Progress, log, parser, watchdog

N_NUM = 96
CARDINALITIES = [3, 5, 7, 12, 31, 52, 100, 250, 400, 1_000, 2_500, 4_000, 8, 16, 24, 60, 365, 7_000, 20_000, 50_000]


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--emb-dim", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--batched-sampler", action="store_true",
                    help="index the dataset once per batch (BatchSampler as sampler, batch_size=None)")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.batch, args.rows, args.workers = 256, 20_000, 1
    return args


def make_table(rows: int, seed: int = 0):
    """Applications: standardized numeric features, categorical codes, and a default label drawn from
    a logistic model of both (so the network has something to fit)."""
    rng = np.random.default_rng(seed)
    x_num = rng.standard_normal((rows, N_NUM), dtype=np.float32)
    x_cat = np.stack([rng.integers(0, c, rows) for c in CARDINALITIES], 1).astype(np.int64)
    w = rng.standard_normal(N_NUM).astype(np.float32) / math.sqrt(N_NUM)
    cat_effect = sum(rng.standard_normal(c).astype(np.float32)[x_cat[:, j]] * 0.3
                     for j, c in enumerate(CARDINALITIES))
    logit = x_num @ w + np.tanh(x_num[:, 0] * x_num[:, 1]) + cat_effect - 2.0
    y = (rng.random(rows, dtype=np.float32) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return torch.from_numpy(x_num), torch.from_numpy(x_cat), torch.from_numpy(y)


class BatchedRows(TensorDataset):
    """The same tensors, indexed with a whole batch of row indices at once."""

    def __getitem__(self, indices):
        idx = torch.as_tensor(indices)
        return tuple(t[idx] for t in self.tensors)


class LoanData(L.LightningDataModule):
    def __init__(self, args, cuda: bool) -> None:
        super().__init__()
        self.args, self.cuda = args, cuda

    def setup(self, stage: str) -> None:
        t0 = time.perf_counter()
        self.tensors = make_table(self.args.rows)
        log(f"table: {self.args.rows:,} rows x ({N_NUM} numeric + {len(CARDINALITIES)} categorical) "
            f"in {time.perf_counter() - t0:.1f}s")

    def train_dataloader(self):
        a = self.args
        common = dict(num_workers=a.workers, pin_memory=self.cuda, persistent_workers=a.workers > 0)
        if a.batched_sampler:
            data = BatchedRows(*self.tensors)
            sampler = BatchSampler(RandomSampler(data), batch_size=a.batch, drop_last=True)
            return DataLoader(data, sampler=sampler, batch_size=None, **common)
        data = TensorDataset(*self.tensors)
        return DataLoader(data, batch_size=a.batch, shuffle=True, drop_last=True, **common)


class DefaultMLP(L.LightningModule):
    def __init__(self, emb_dim: int, lr: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        offsets = np.concatenate([[0], np.cumsum(CARDINALITIES)[:-1]])
        self.register_buffer("offsets", torch.tensor(offsets, dtype=torch.long), persistent=False)
        self.embed = nn.Embedding(sum(CARDINALITIES), emb_dim)
        self.num_norm = nn.BatchNorm1d(N_NUM)
        width = N_NUM + emb_dim * len(CARDINALITIES)
        layers = []
        for h in (1024, 512, 256):
            layers += [nn.Linear(width, h), nn.BatchNorm1d(h), nn.ReLU(), nn.Dropout(0.1)]
            width = h
        self.mlp = nn.Sequential(*layers, nn.Linear(width, 1))
        self.loss_fn = nn.BCEWithLogitsLoss()

    def forward(self, x_num: torch.Tensor, x_cat: torch.Tensor) -> torch.Tensor:
        emb = self.embed(x_cat + self.offsets).flatten(1)
        return self.mlp(torch.cat([self.num_norm(x_num), emb], 1)).squeeze(1)

    def training_step(self, batch, batch_idx):
        x_num, x_cat, y = batch
        loss = self.loss_fn(self(x_num, x_cat), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=1e-5)


class Throughput(L.Callback):
    def __init__(self, batch: int) -> None:
        self.progress = Progress(batch)
        self.t_last, self.n_last, self.seen, self.steps = time.perf_counter(), 0, 0, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        n = batch[0].shape[0]
        self.progress.step(samples=n)
        self.seen += n
        self.steps += 1
        now = time.perf_counter()
        if now - self.t_last >= 1.0:
            loss = float(outputs["loss"])
            now = time.perf_counter()
            log(f"step {self.steps} samples/s {(self.seen - self.n_last) / (now - self.t_last):.1f} bce {loss:.4f}")
            self.t_last, self.n_last = now, self.seen
            if not math.isfinite(loss):
                raise RuntimeError("loss is not finite")


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    cuda = args.device == "cuda"
    L.seed_everything(0, verbose=False)
    model = DefaultMLP(args.emb_dim, args.lr)
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    log(f"default MLP: {n_params:.2f}M parameters, batch {args.batch}, workers {args.workers}, "
        f"{'batched sampler' if args.batched_sampler else 'per-row TensorDataset + default_collate'}")
    trainer = L.Trainer(accelerator="gpu" if cuda else "cpu", devices=1,
                        precision="bf16-mixed" if cuda else "32-true", max_epochs=-1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0,
                        callbacks=[Throughput(args.batch)])
    trainer.fit(model, datamodule=LoanData(args, cuda))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
