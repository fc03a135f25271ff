"""Fleet-wide sensor forecasting: a PatchTST-style Transformer (channel-independent patches of 16 steps,
stride 8, RevIN, 3 encoder layers of width 128, a flatten head predicting the next 96 steps) trained in
plain PyTorch on one GPU on the minute-level readings of 1,024 sensors over ~3.8 years (2,000,000 time
steps), bf16 autocast, fused AdamW, clipping; batches of 2,048 windows (a random sensor and a random
start each: 512 steps of context, 96 to predict).

The readings live on the GPU as one fp32 ``[time, sensor]`` matrix (8.2 GB), the way the CSV export
arrives, and the per-sensor z-score statistics come from the training span. ``SensorWindows.sample``
draws the window starts and sensors on the GPU and gathers the windows. The z-scoring sits inside it,
in front of the gather: ``(self.readings - self.mean) / self.std`` scales the whole 8.2 GB matrix
(two elementwise passes, 33 GB of memory traffic and two 8.2 GB temporaries) on every batch, to cut
out 2,048 x 608 values of it.

``--scale-once`` z-scores the readings once, when the data set is built, and only gathers in
``sample``.

Prints ``step <n> samples/s <x>`` about once a second (samples are windows).
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import Progress, log, parser, watchdog


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--sensors", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=2_000_000, help="time steps of readings per sensor")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--horizon", type=int, default=96)
    ap.add_argument("--patch", type=int, default=16)
    ap.add_argument("--stride", type=int, default=8)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--scale-once", action="store_true",
                    help="z-score the readings once when the data set is built, not on every batch")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.batch, args.sensors, args.steps, args.context, args.horizon = 32, 8, 20_000, 64, 16
        args.patch, args.stride, args.width, args.layers, args.heads, args.ffn = 8, 4, 32, 2, 4, 64
    return args


def synth_readings(steps: int, sensors: int, device: torch.device, g: torch.Generator) -> torch.Tensor:
    """[steps, sensors] fp32: daily and weekly cycles, a drifting level and noise, each sensor with its
    own offset, amplitude and phase (temperatures, pressures, flows: very different scales)."""
    offset = torch.randn(sensors, device=device, generator=g) * 50
    amp_day = torch.rand(sensors, device=device, generator=g) * 10 + 1
    amp_week = torch.rand(sensors, device=device, generator=g) * 5
    phase = torch.rand(sensors, device=device, generator=g) * 2 * math.pi
    noise = torch.rand(sensors, device=device, generator=g) + 0.1
    out = torch.empty(steps, sensors, device=device)
    level = torch.zeros(sensors, device=device)
    chunk = 65_536
    for s in range(0, steps, chunk):
        n = min(chunk, steps - s)
        t = torch.arange(s, s + n, device=device, dtype=torch.float32)[:, None]
        drift = torch.randn(n, sensors, device=device, generator=g).mul_(0.02).cumsum(0) + level
        level = drift[-1]
        out[s:s + n] = (offset + amp_day * torch.sin(2 * math.pi * t / 1440 + phase)
                        + amp_week * torch.sin(2 * math.pi * t / 10080 + 0.5 * phase) + drift
                        + noise * torch.randn(n, sensors, device=device, generator=g))
    return out


class SensorWindows:
    """Random (sensor, start) windows of the fleet's readings, z-scored with the training-span statistics."""

    def __init__(self, readings: torch.Tensor, context: int, horizon: int, scale_once: bool) -> None:
        train_span = readings[: int(0.7 * len(readings))]
        self.mean = train_span.mean(0)
        self.std = train_span.std(0) + 1e-5
        self.scale_once = scale_once
        if scale_once:
            readings.sub_(self.mean).div_(self.std)
        self.readings = readings
        self.context, self.horizon = context, horizon
        self.offsets = torch.arange(context + horizon, device=readings.device)

    def sample(self, batch: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        steps, sensors = self.readings.shape
        dev = self.readings.device
        start = torch.randint(0, int(0.7 * steps) - self.context - self.horizon, (batch, 1), device=dev, generator=g)
        sensor = torch.randint(0, sensors, (batch, 1), device=dev, generator=g)
        if self.scale_once:
            scaled = self.readings
        else:
            scaled = (self.readings - self.mean) / self.std  # z-score with the training statistics
        window = scaled[start + self.offsets, sensor]
        return window[:, :self.context], window[:, self.context:]


class RevIN(nn.Module):
    """Reversible instance normalisation: each window by its own mean and scale, with a learned affine."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(1))
        self.bias = nn.Parameter(torch.zeros(1))

    def norm(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mu = x.mean(-1, keepdim=True)
        sd = (x.var(-1, keepdim=True, unbiased=False) + 1e-5).sqrt()
        return (x - mu) / sd * self.weight + self.bias, mu, sd

    def denorm(self, y: torch.Tensor, mu: torch.Tensor, sd: torch.Tensor) -> torch.Tensor:
        return (y - self.bias) / (self.weight + 1e-10) * sd + mu


class EncoderLayer(nn.Module):
    def __init__(self, width: int, heads: int, ffn: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ff = nn.Sequential(nn.Linear(width, ffn), nn.GELU(), nn.Dropout(dropout), nn.Linear(ffn, width))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1 if self.training else 0.0)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.ff(self.ln2(x)))


class PatchTST(nn.Module):
    def __init__(self, context: int, horizon: int, patch: int, stride: int, width: int, layers: int, heads: int,
                 ffn: int) -> None:
        super().__init__()
        self.patch, self.stride = patch, stride
        self.n_patches = (context - patch) // stride + 2  # one more patch over the end, padded by repetition
        self.revin = RevIN()
        self.embed = nn.Linear(patch, width)
        self.pos = nn.Parameter(torch.randn(1, self.n_patches, width) * 0.02)
        self.drop = nn.Dropout(0.1)
        self.layers = nn.ModuleList(EncoderLayer(width, heads, ffn) for _ in range(layers))
        self.head = nn.Linear(self.n_patches * width, horizon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, mu, sd = self.revin.norm(x)
        x = F.pad(x, (0, self.stride), mode="replicate")
        patches = x.unfold(-1, self.patch, self.stride)  # [batch, n_patches, patch]
        h = self.drop(self.embed(patches) + self.pos)
        for layer in self.layers:
            h = layer(h)
        y = self.head(h.flatten(1)).float()
        return self.revin.denorm(y, mu, sd)


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True

    g = torch.Generator(device=device).manual_seed(0)
    t0 = time.perf_counter()
    readings = synth_readings(args.steps, args.sensors, device, g)
    data = SensorWindows(readings, args.context, args.horizon, args.scale_once)
    log(f"readings {tuple(readings.shape)} ({readings.numel() * 4 / 1e9:.1f} GB) built in {time.perf_counter() - t0:.1f}s")
    model = PatchTST(args.context, args.horizon, args.patch, args.stride, args.width, args.layers, args.heads,
                     args.ffn).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05, fused=cuda)
    warmup, total = 500, 60_000
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup else
        0.5 * (1 + math.cos(math.pi * min(1.0, (s - warmup) / (total - warmup)))))
    log(f"PatchTST {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, {model.n_patches} patches, "
        f"batch {args.batch}, readings {'z-scored once' if args.scale_once else 'z-scored per batch'}")

    progress = Progress(args.batch)
    model.train()
    step, seen, t_last, n_last = 0, 0, time.perf_counter(), 0
    while True:
        x, y = data.sample(args.batch, g)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            pred = model(x)
        loss = F.mse_loss(pred, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        progress.step()
        step += 1
        seen += args.batch
        now = time.perf_counter()
        if now - t_last >= 1.0:
            loss_val = loss.item()
            now = time.perf_counter()
            log(f"step {step} samples/s {(seen - n_last) / (now - t_last):.1f} mse {loss_val:.4f}")
            t_last, n_last = now, seen
            if not math.isfinite(loss_val):
                raise RuntimeError("loss is not finite")


if __name__ == "__main__":
    raise SystemExit(main())
