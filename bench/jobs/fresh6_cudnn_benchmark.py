"""Sound-event classifier on raw 16 kHz waveforms, trained with PyTorch Lightning on one GPU.

The model is wav2vec2-style: a 7-layer Conv1d feature encoder (512 channels, strides 5,2,2,2,2,2,2,
GroupNorm after the first layer, GELU) turns the waveform into 50 frames per second, a 4-layer
Transformer encoder (width 512) runs over the frames, and a masked mean over the real frames feeds
a 50-way linear classifier. ``Trainer(precision="bf16-mixed", benchmark=True)``: the team turns on
``cudnn.benchmark`` in every Lightning job ("it picks the fastest conv kernels"). The clips are
1 to 15 s long (median about 4 s); each batch of 32 is zero-padded to its longest clip, to the
sample. 6 DataLoader workers with pinned memory decode the clips from an in-memory int16 store.

``--pad-multiple 16000`` pads each batch to a whole number of seconds (a multiple of 16,000
samples) instead of to the exact sample, so that only 15 input lengths ever occur.
``--no-benchmark`` keeps the exact padding and sets ``Trainer(benchmark=False)``.

Prints ``step <n> samples/s <x>`` about once a second.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from common import Progress, log, parser, watchdog

try:
    import lightning as L
except ImportError:  # the older package name
    import pytorch_lightning as L


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--classes", type=int, default=50)
    ap.add_argument("--pad-multiple", type=int, default=1,
                    help="pad each batch's length up to a multiple of this many samples (1: to the longest clip)")
    ap.add_argument("--no-benchmark", action="store_true", help="Trainer(benchmark=False)")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: train forever)")
    args = ap.parse_args(argv)
    args.tiny = args.tiny or args.device == "cpu"
    return args


CONV_SPEC = [(10, 5)] + [(3, 2)] * 4 + [(2, 2)] * 2  # (kernel, stride), wav2vec2's feature encoder


def n_frames(samples: torch.Tensor) -> torch.Tensor:
    for k, s in CONV_SPEC:
        samples = torch.div(samples - k, s, rounding_mode="floor") + 1
    return samples


class ClipStore(torch.utils.data.Dataset):
    """The decoded clips (int16 PCM) in memory; item i has its own duration (1 to 15 s)."""

    def __init__(self, n_items: int, pool: int, rate: int, classes: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.rate, self.max_len = rate, 15 * rate
        self.pcm = rng.integers(-8000, 8000, size=(pool, self.max_len), dtype=np.int16)
        dur = rng.lognormal(np.log(4.0), 0.6, size=2 * n_items)
        dur = dur[(dur >= 1.0) & (dur <= 15.0)][:n_items]  # the manifest drops clips under 1 s or over 15 s
        self.lengths = (dur * rate).astype(np.int64)
        self.offsets = rng.integers(0, pool, size=len(self.lengths))
        self.labels = rng.integers(0, classes, size=len(self.lengths))

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int):
        n = int(self.lengths[i])
        wav = torch.from_numpy(self.pcm[self.offsets[i], :n].astype(np.float32) / 32768.0)
        return wav, int(self.labels[i])


class PadCollate:
    """Zero-pad the batch's waveforms to a common length (rounded up to ``multiple`` samples)."""

    def __init__(self, multiple: int = 1) -> None:
        self.multiple = max(1, multiple)

    def __call__(self, items):
        lengths = torch.tensor([w.numel() for w, _ in items])
        longest = int(lengths.max())
        longest = -(-longest // self.multiple) * self.multiple
        wavs = torch.zeros(len(items), longest)
        for j, (w, _) in enumerate(items):
            wavs[j, :w.numel()] = w
        labels = torch.tensor([y for _, y in items])
        return wavs, lengths, labels


class SoundClassifier(L.LightningModule):
    def __init__(self, dim: int, layers: int, heads: int, classes: int, lr: float = 3e-4) -> None:
        super().__init__()
        convs, cin = [], 1
        for i, (k, s) in enumerate(CONV_SPEC):
            convs.append(nn.Conv1d(cin, dim, k, stride=s, bias=False))
            if i == 0:
                convs.append(nn.GroupNorm(dim, dim))
            convs.append(nn.GELU())
            cin = dim
        self.features = nn.Sequential(*convs)
        self.proj_norm = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, dropout=0.1, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)
        self.lr = lr

    def forward(self, wavs: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        h = self.features(wavs.unsqueeze(1)).transpose(1, 2)  # (B, frames, dim)
        h = self.encoder(self.proj(self.proj_norm(h)))
        frames = n_frames(lengths).clamp(min=1, max=h.shape[1])
        mask = (torch.arange(h.shape[1], device=h.device)[None, :] < frames[:, None]).to(h.dtype)
        pooled = (h * mask.unsqueeze(-1)).sum(1) / frames[:, None].to(h.dtype)
        return self.head(pooled)

    def training_step(self, batch, batch_idx):
        wavs, lengths, labels = batch
        logits = self(wavs, lengths)
        return F.cross_entropy(logits.float(), labels)

    def configure_optimizers(self):
        fused = torch.cuda.is_available() and self.device.type == "cuda"
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.01, fused=fused)


class Throughput(L.Callback):
    def __init__(self, batch: int, steps: int) -> None:
        self.batch, self.steps = batch, steps
        self.n, self.n_last, self.t_last = 0, 0, time.perf_counter()
        self.progress: Progress | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.progress is None:
            self.progress = Progress(self.batch)
        self.progress.step()
        self.n += 1
        now = time.perf_counter()
        if now - self.t_last >= 1.0 or self.n == self.steps:
            if pl_module.device.type == "cuda":
                torch.cuda.synchronize()
                now = time.perf_counter()
            rate = (self.n - self.n_last) * self.batch / (now - self.t_last)
            log(f"step {self.n} samples/s {rate:.1f}")
            self.n_last, self.t_last = self.n, now


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    cuda = args.device == "cuda"
    torch.manual_seed(0)
    if args.tiny:
        rate, dim, layers, heads, pool, n_items = 1600, 32, 1, 4, 32, 4096
        args.batch, args.workers = 4, 0
        pad_multiple = args.pad_multiple if args.pad_multiple == 1 else max(1, args.pad_multiple // 10)
    else:
        rate, dim, layers, heads, pool, n_items = 16000, 512, 4, 8, 256, 200_000
        pad_multiple = args.pad_multiple
    data = ClipStore(n_items, pool, rate, args.classes)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True,
                                         num_workers=args.workers, pin_memory=cuda,
                                         persistent_workers=args.workers > 0, collate_fn=PadCollate(pad_multiple))
    model = SoundClassifier(dim, layers, heads, args.classes)
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    log(f"sound classifier {n_params:.1f}M parameters, batch {args.batch}, clips 1-15 s at {rate} Hz, padded to "
        f"{'the longest clip' if pad_multiple == 1 else f'a multiple of {pad_multiple} samples'}, "
        f"cudnn.benchmark {'off' if args.no_benchmark else 'on'}")
    trainer = L.Trainer(accelerator="gpu" if cuda else "cpu", devices=1,
                        precision="bf16-mixed" if cuda else "32-true", benchmark=not args.no_benchmark,
                        max_steps=args.steps if args.steps else -1, max_epochs=-1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, callbacks=[Throughput(args.batch, args.steps)])
    trainer.fit(model, train_dataloaders=loader)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
