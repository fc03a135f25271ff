"""Multivariate sensor forecasting: a Transformer encoder reads 256 steps of 64 sensor channels and
predicts the next 48 steps of all channels (plain PyTorch, one GPU).

The recordings come out of pandas (``DataFrame.to_numpy()``), i.e. as float64 arrays, and the
windows are cut from them as they are. The first run failed with "mat1 and mat2 must have the
same dtype, but got Double and Float", and the model was made to match with ``model.double()``.
The loop runs under ``torch.autocast(dtype=torch.bfloat16)``, as the team's other jobs do.

``--float32`` casts the recordings to float32 once after loading (so the batches are float32) and
drops ``model.double()``: the model stays float32 and autocast runs it in bf16.

Prints ``step <n> samples/s <x>`` about once a second.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from common import Progress, log, parser, watchdog


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--horizon", type=int, default=48)
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: train forever)")
    ap.add_argument("--float32", action="store_true",
                    help="cast the recordings to float32 at load and keep the model in float32 (autocast to bf16)")
    args = ap.parse_args(argv)
    if args.device == "cpu" or args.tiny:
        args.batch, args.window, args.horizon, args.channels = 8, 32, 8, 8
        args.d_model, args.layers, args.heads, args.workers = 32, 2, 4, 0
    return args


def load_recordings(n_steps: int, channels: int, seed: int = 0) -> np.ndarray:
    """The plant's sensor log as pandas hands it over: (time, channel), float64, normalized per channel."""
    rng = np.random.default_rng(seed)
    t = np.arange(n_steps, dtype=np.float64)[:, None]
    periods = rng.uniform(20, 2000, size=(1, channels))
    phases = rng.uniform(0, 2 * np.pi, size=(1, channels))
    series = np.sin(2 * np.pi * t / periods + phases)
    series += np.cumsum(rng.normal(0, 0.02, size=(n_steps, channels)), axis=0)
    series += rng.normal(0, 0.1, size=(n_steps, channels))
    series -= series.mean(axis=0, keepdims=True)
    series /= series.std(axis=0, keepdims=True) + 1e-8
    return series  # float64, like DataFrame.to_numpy()


class Windows(torch.utils.data.Dataset):
    """Sliding windows over the recordings: ``window`` steps in, the next ``horizon`` steps out."""

    def __init__(self, series: np.ndarray, window: int, horizon: int, stride: int = 8) -> None:
        self.series, self.window, self.horizon, self.stride = series, window, horizon, stride
        self.n = (len(series) - window - horizon) // stride

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        s = i * self.stride
        x = self.series[s:s + self.window]
        y = self.series[s + self.window:s + self.window + self.horizon]
        return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y))


class Forecaster(nn.Module):
    def __init__(self, channels: int, window: int, horizon: int, d_model: int, layers: int, heads: int) -> None:
        super().__init__()
        self.horizon, self.channels = horizon, channels
        self.inp = nn.Linear(channels, d_model)
        self.pos = nn.Parameter(torch.randn(1, window, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model, dropout=0.1,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, horizon * channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x) + self.pos
        h = self.norm(self.encoder(h))
        return self.head(h[:, -1]).view(-1, self.horizon, self.channels)


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)

    series = load_recordings(400_000 if cuda else 4_000, args.channels)
    if args.float32:
        series = series.astype(np.float32)
    data = Windows(series, args.window, args.horizon)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True,
                                         num_workers=args.workers, pin_memory=cuda,
                                         persistent_workers=args.workers > 0)

    model = Forecaster(args.channels, args.window, args.horizon, args.d_model, args.layers, args.heads).to(device)
    if not args.float32:
        # the batches are float64 (straight from the recordings); match them
        model = model.double()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    warmup = 500
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    log(f"forecaster {n_params:.1f}M parameters, dtype {next(model.parameters()).dtype}, batch {args.batch} x "
        f"{args.window} steps x {args.channels} channels, {args.workers} workers")

    progress = Progress(args.batch)
    model.train()
    step, seen, t_last, n_last = 0, 0, time.perf_counter(), 0
    while True:
        for x, y in loader:
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                pred = model(x)
                loss = F.mse_loss(pred, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            progress.step(samples=x.shape[0])
            step += 1
            seen += x.shape[0]
            now = time.perf_counter()
            if now - t_last >= 1.0:
                loss_val = loss.item()
                now = time.perf_counter()
                log(f"step {step} samples/s {(seen - n_last) / (now - t_last):.1f} loss {loss_val:.4f}")
                t_last, n_last = now, seen
                if not math.isfinite(loss_val):
                    raise RuntimeError("loss is not finite")
            if args.steps and step >= args.steps:
                log(f"step {step} samples/s {(seen - n_last) / max(1e-9, time.perf_counter() - t_last):.1f}")
                return 0


if __name__ == "__main__":
    raise SystemExit(main())
