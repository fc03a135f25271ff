"""A keyword-spotting classifier trained with Lightning in the shape of its audio examples and the
Speech Commands tutorials: a ``LightningDataModule`` whose dataset turns each clip into features on
the CPU in ``__getitem__`` (resample 48 kHz -> 16 kHz, random shift and background noise, a log-mel
spectrogram, SpecAugment masks: what torchaudio's ``Resample``, ``MelSpectrogram``,
``AmplitudeToDB``, ``FrequencyMasking`` and ``TimeMasking`` compute, written in torch because
torchaudio is not installed), a small conv net, ``Trainer(precision="bf16-mixed")``.

The clips are synthetic int16 waveforms held in RAM (decoded WAVs), so no download and no disk."""

from __future__ import annotations

import math

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common import Progress, log, parser, watchdog

SOURCE_HZ, TARGET_HZ = 48000, 16000
N_FFT, HOP, N_MELS = 480, 160, 64  # 30 ms windows, 10 ms hop


def sinc_kernel(orig: int, new: int, width: int = 6, rolloff: float = 0.99) -> torch.Tensor:
    """torchaudio.functional.resample's windowed-sinc kernel (Hann window), one phase per output."""
    g = math.gcd(orig, new)
    orig, new = orig // g, new // g
    base = min(orig, new) * rolloff
    w = math.ceil(width * orig / base)
    idx = torch.arange(-w, w + orig, dtype=torch.float64)[None, None] / orig
    t = (-torch.arange(new, dtype=torch.float64)[None, :, None] / new + idx) * base
    t = t.clamp(-width, width)
    window = torch.cos(t * math.pi / width / 2) ** 2
    t = t * math.pi
    k = torch.where(t == 0, torch.tensor(1.0, dtype=torch.float64), t.sin() / t)
    return (k * window * base / orig).to(torch.float32).view(new, 1, -1), orig, w


def mel_filterbank(n_freqs: int, n_mels: int, sr: int) -> torch.Tensor:
    """HTK mel triangles, as torchaudio.functional.melscale_fbanks builds them."""
    def mel(f):
        return 2595.0 * math.log10(1.0 + f / 700.0)

    m = torch.linspace(mel(0.0), mel(sr / 2), n_mels + 2)
    f_pts = 700.0 * (10 ** (m / 2595.0) - 1.0)
    all_freqs = torch.linspace(0, sr // 2, n_freqs)
    slopes = f_pts[None, :] - all_freqs[:, None]
    down = -slopes[:, :-2] / (f_pts[1:-1] - f_pts[:-2])
    up = slopes[:, 2:] / (f_pts[2:] - f_pts[1:-1])
    return torch.clamp(torch.min(down, up), min=0.0)  # (n_freqs, n_mels)


class SpeechClips(Dataset):
    """1.2 s clips at 48 kHz as int16 (decoded WAVs), 35 keywords; each item is a (1, 64, 101) log-mel."""

    def __init__(self, n: int, train: bool = True) -> None:
        g = torch.Generator().manual_seed(0)
        length = int(SOURCE_HZ * 1.2)
        t = torch.arange(length) / SOURCE_HZ
        self.labels = torch.randint(0, 35, (n,), generator=g)
        freqs = 200.0 + 40.0 * self.labels.float()
        tone = torch.sin(2 * math.pi * freqs[:, None] * t[None]) * 8000
        self.clips = (tone + torch.randn(n, length, generator=g) * 2000).clamp(-32768, 32767).to(torch.int16)
        self.noise = torch.randn(8, TARGET_HZ * 2, generator=g) * 0.05  # background-noise recordings
        self.kernel, self.stride, self.pad = sinc_kernel(SOURCE_HZ, TARGET_HZ)
        self.window = torch.hann_window(N_FFT)
        self.fbank = mel_filterbank(N_FFT // 2 + 1, N_MELS, TARGET_HZ)
        self.train = train

    def __len__(self) -> int:
        return 1 << 30  # endless: the job runs until it is stopped

    def resample(self, wav: torch.Tensor) -> torch.Tensor:
        x = F.pad(wav[None, None], (self.pad, self.pad + self.stride))
        y = F.conv1d(x, self.kernel, stride=self.stride)  # (1, new, frames)
        return y.transpose(1, 2).reshape(-1)[: math.ceil(wav.numel() * TARGET_HZ / SOURCE_HZ)]

    def __getitem__(self, i: int):
        j = i % len(self.clips)
        gen = torch.Generator().manual_seed(i)
        wav = self.clips[j].float() / 32768.0
        wav = self.resample(wav)
        # random time shift, crop to 1 s, mix in background noise at a random level
        start = int(torch.randint(0, wav.numel() - TARGET_HZ + 1, (1,), generator=gen))
        wav = wav[start:start + TARGET_HZ]
        k = int(torch.randint(0, len(self.noise), (1,), generator=gen))
        off = int(torch.randint(0, self.noise.shape[1] - TARGET_HZ, (1,), generator=gen))
        wav = wav + torch.rand(1, generator=gen) * self.noise[k, off:off + TARGET_HZ]
        spec = torch.stft(wav, N_FFT, HOP, window=self.window, center=True, return_complex=True).abs().pow(2)
        mel = torch.matmul(spec.T, self.fbank).T  # (n_mels, frames)
        mel = 10.0 * torch.log10(mel.clamp(min=1e-10))
        mel = mel.clamp(min=mel.max() - 80.0)  # AmplitudeToDB(top_db=80)
        if self.train:  # SpecAugment: two frequency masks, two time masks
            for size, dim in ((8, 0), (8, 0), (20, 1), (20, 1)):
                w = int(torch.randint(0, size + 1, (1,), generator=gen))
                s = int(torch.randint(0, mel.shape[dim] - w + 1, (1,), generator=gen))
                mel.narrow(dim, s, w).fill_(mel.mean())
        mel = (mel - mel.mean()) / (mel.std() + 1e-5)
        return mel[None], self.labels[j]


class SpeechCommands(L.LightningDataModule):
    def __init__(self, batch_size: int, num_workers: int, n: int, pin: bool) -> None:
        super().__init__()
        self.batch_size, self.num_workers, self.n, self.pin = batch_size, num_workers, n, pin

    def setup(self, stage: str | None = None) -> None:
        self.train_set = SpeechClips(self.n)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, num_workers=self.num_workers,
                          pin_memory=self.pin, persistent_workers=self.num_workers > 0, drop_last=True)


def conv_block(cin: int, cout: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 3, padding=1, bias=False), torch.nn.BatchNorm2d(cout),
                               torch.nn.ReLU(inplace=True), torch.nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                               torch.nn.BatchNorm2d(cout), torch.nn.ReLU(inplace=True), torch.nn.MaxPool2d(2))


class KeywordNet(L.LightningModule):
    def __init__(self, width: int, n_classes: int = 35) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            conv_block(1, width), conv_block(width, 2 * width), conv_block(2 * width, 4 * width),
            conv_block(4 * width, 8 * width), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
            torch.nn.Dropout(0.2), torch.nn.Linear(8 * width, n_classes))
        self.progress: Progress | None = None

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.progress.step()

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=1e-2)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=10**7)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--precision", default="bf16-mixed")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    watchdog(args.seconds)
    batch = 8 if args.tiny else args.batch
    data = SpeechCommands(batch, args.workers, 64 if args.tiny else 2048, pin=args.device == "cuda")
    model = KeywordNet(8 if args.tiny else 32)
    model.progress = Progress(batch)
    log(f"lightning_audio: precision {args.precision} batch {batch} workers {args.workers}")
    trainer = L.Trainer(
        accelerator="gpu" if args.device == "cuda" else "cpu", devices=1, precision=args.precision,
        max_steps=-1, max_epochs=-1, enable_progress_bar=False, logger=False, enable_checkpointing=False,
        enable_model_summary=False, limit_train_batches=10**7,
    )
    trainer.fit(model, datamodule=data)


if __name__ == "__main__":
    main()
