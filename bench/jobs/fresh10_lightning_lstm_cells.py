"""Electricity load forecasting: a sequence-to-sequence LSTM (2-layer encoder and 2-layer decoder, hidden
256) that reads two weeks of hourly load plus calendar covariates (336 steps) and predicts the next 96
hours, trained with PyTorch Lightning on one GPU (fp32 with TF32 matmuls, Adam, gradient clipping),
batches of 512 windows cut from 320 customers' hourly series (an ECL-like data set generated in memory).

The model was written step by step, as in the seq2seq tutorials: the encoder and the decoder are
``nn.LSTMCell`` stacks driven by a Python ``for t in range(...)`` loop over the 336 input and 96 output
steps, with teacher forcing (the decoder is fed the true previous load during training) and the output
head applied at each step. Every cell call is a few tiny kernels (two 512 x 256 x 1,024 matmuls and a
fused gate kernel) launched from Python, and autograd records a node for each, so one training step is
~864 cell calls forward and ~10,000 small kernels in all: the step takes as long as the CPU takes to
issue them, and the GPU, which runs each kernel in a few microseconds, waits between them.

``--cudnn-lstm`` runs the same 2-layer encoder and decoder as ``nn.LSTM`` modules over the whole
sequence (cuDNN's fused recurrent kernels; teacher forcing makes the decoder inputs known up front) and
applies the head once to all 96 decoder outputs.

Prints ``step <n> samples/s <x>`` about once a second.
"""

from __future__ import annotations

import math
import time

import lightning as L
import numpy as np
import torch
import torch.nn as nn

from common import Progress, log, parser, watchdog

N_COV = 4  # hour-of-day sin/cos, day-of-week sin/cos


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--lookback", type=int, default=336)
    ap.add_argument("--horizon", type=int, default=96)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--cudnn-lstm", action="store_true", help="nn.LSTM over whole sequences instead of LSTMCell loops")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.batch, args.lookback, args.horizon, args.hidden, args.workers = 16, 24, 8, 32, 0
    return args


def make_series(customers: int, hours: int, seed: int = 0) -> np.ndarray:
    """Hourly load per customer (daily and weekly seasonality, a trend, noise), standardized, plus the
    calendar covariates: (customers, hours, 1 + N_COV) float32."""
    rng = np.random.default_rng(seed)
    t = np.arange(hours, dtype=np.float32)
    day, week = 2 * np.pi * t / 24, 2 * np.pi * t / 168
    base = rng.uniform(0.5, 2.0, (customers, 1)).astype(np.float32)
    load = (base * (1 + 0.4 * np.sin(day - rng.uniform(0, 6, (customers, 1))) + 0.2 * np.sin(week))
            + 0.0002 * t * rng.normal(size=(customers, 1)) + 0.1 * rng.normal(size=(customers, hours)))
    load = (load - load.mean(1, keepdims=True)) / load.std(1, keepdims=True)
    cov = np.stack([np.sin(day), np.cos(day), np.sin(week), np.cos(week)], -1)
    return np.concatenate([load[..., None], np.broadcast_to(cov, (customers, hours, N_COV))], -1).astype(np.float32)


class Windows(torch.utils.data.Dataset):
    def __init__(self, series: np.ndarray, lookback: int, horizon: int) -> None:
        self.series, self.lookback, self.horizon = series, lookback, horizon
        self.per_customer = series.shape[1] - lookback - horizon

    def __len__(self) -> int:
        return self.series.shape[0] * self.per_customer

    def __getitem__(self, i: int):
        c, s = divmod(i, self.per_customer)
        w = self.series[c, s:s + self.lookback + self.horizon]
        return torch.from_numpy(w[:self.lookback].copy()), torch.from_numpy(w[self.lookback:].copy())


class Seq2SeqLSTM(L.LightningModule):
    def __init__(self, hidden: int, lr: float, cudnn_lstm: bool) -> None:
        super().__init__()
        self.hidden, self.lr, self.cudnn_lstm = hidden, lr, cudnn_lstm
        n_in = 1 + N_COV
        if cudnn_lstm:
            self.encoder = nn.LSTM(n_in, hidden, num_layers=2, batch_first=True)
            self.decoder = nn.LSTM(n_in, hidden, num_layers=2, batch_first=True)
        else:
            self.enc = nn.ModuleList([nn.LSTMCell(n_in, hidden), nn.LSTMCell(hidden, hidden)])
            self.dec = nn.ModuleList([nn.LSTMCell(n_in, hidden), nn.LSTMCell(hidden, hidden)])
        self.head = nn.Linear(hidden, 1)

    def forward(self, past: torch.Tensor, future: torch.Tensor) -> torch.Tensor:
        # decoder input at step t: the load at t-1 (teacher forcing) and the calendar at t
        prev_load = torch.cat([past[:, -1:, :1], future[:, :-1, :1]], 1)
        dec_in = torch.cat([prev_load, future[:, :, 1:]], -1)
        if self.cudnn_lstm:
            _, state = self.encoder(past)
            out, _ = self.decoder(dec_in, state)
            return self.head(out).squeeze(-1)
        b = past.shape[0]
        h = [past.new_zeros(b, self.hidden) for _ in range(2)]
        c = [past.new_zeros(b, self.hidden) for _ in range(2)]
        for t in range(past.shape[1]):
            x = past[:, t]
            for layer, cell in enumerate(self.enc):
                h[layer], c[layer] = cell(x, (h[layer], c[layer]))
                x = h[layer]
        preds = []
        for t in range(dec_in.shape[1]):
            x = dec_in[:, t]
            for layer, cell in enumerate(self.dec):
                h[layer], c[layer] = cell(x, (h[layer], c[layer]))
                x = h[layer]
            preds.append(self.head(x))
        return torch.cat(preds, 1)

    def training_step(self, batch, batch_idx):
        past, future = batch
        pred = self(past, future)
        loss = nn.functional.mse_loss(pred, future[:, :, 0])
        self.log("train_mse", loss, on_step=True, on_epoch=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


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
            log(f"step {self.steps} samples/s {(self.seen - self.n_last) / (now - self.t_last):.1f} mse {loss:.4f}")
            self.t_last, self.n_last = now, self.seen
            if not math.isfinite(loss):
                raise RuntimeError("loss is not finite")


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    cuda = args.device == "cuda"
    torch.set_float32_matmul_precision("high")
    L.seed_everything(0, verbose=False)

    series = make_series(320 if cuda else 8, 26_304 if cuda else 600)
    data = Windows(series, args.lookback, args.horizon)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True,
                                         num_workers=args.workers, pin_memory=cuda,
                                         persistent_workers=args.workers > 0)
    model = Seq2SeqLSTM(args.hidden, args.lr, args.cudnn_lstm)
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    log(f"seq2seq LSTM: {n_params:.2f}M parameters, batch {args.batch}, {args.lookback} -> {args.horizon} steps, "
        f"{'nn.LSTM (cuDNN)' if args.cudnn_lstm else 'LSTMCell loops'}")
    trainer = L.Trainer(accelerator="gpu" if cuda else "cpu", devices=1, precision="32-true",
                        max_epochs=-1, gradient_clip_val=1.0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        callbacks=[Throughput(args.batch)])
    trainer.fit(model, loader)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
