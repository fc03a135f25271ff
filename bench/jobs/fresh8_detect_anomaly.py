"""Byte-level language model for log files: a small GPT (8 blocks, width 512, 1,024-byte context)
trained with PyTorch Lightning on one GPU, bf16 mixed precision.

A few weeks ago the loss went to NaN (it was an fp16 overflow; the job has since moved to
bf16-mixed). To find the op that produced it, ``Trainer(detect_anomaly=True)`` was switched on,
and it is still on.

``--no-detect-anomaly`` builds the Trainer with ``detect_anomaly=False`` (the default); nothing else
changes.

Prints ``step <n> samples/s <x>`` about once a second.
"""

from __future__ import annotations

import math
import time

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from common import Progress, log, parser, watchdog


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--no-detect-anomaly", action="store_true", help="Trainer(detect_anomaly=False)")
    args = ap.parse_args(argv)
    if args.device == "cpu" or args.tiny:
        args.batch, args.context, args.d_model, args.layers, args.heads, args.workers = 4, 64, 64, 2, 4, 0
    return args


def make_corpus(n_bytes: int, seed: int = 0) -> np.ndarray:
    """Log-file-like text: lines of words drawn with Zipf frequencies from a random vocabulary."""
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789_-.:/=", dtype=np.uint8)
    vocab = [bytes(rng.choice(letters, size=rng.integers(2, 10))) for _ in range(5000)]
    ranks = np.arange(1, len(vocab) + 1, dtype=np.float64)
    p = 1.0 / ranks
    p /= p.sum()
    out, size = [], 0
    while size < n_bytes:
        words = rng.choice(len(vocab), size=4096, p=p)
        chunk = b" ".join(vocab[w] + (b"\n" if i % 12 == 11 else b"") for i, w in enumerate(words))
        out.append(chunk)
        size += len(chunk)
    return np.frombuffer(b"".join(out)[:n_bytes], dtype=np.uint8).copy()


class Windows(torch.utils.data.Dataset):
    def __init__(self, corpus: np.ndarray, context: int) -> None:
        self.corpus, self.context = corpus, context

    def __len__(self) -> int:
        return (len(self.corpus) - 1) // self.context - 1

    def __getitem__(self, i: int):
        s = i * self.context + int(np.random.randint(0, self.context))
        chunk = torch.from_numpy(self.corpus[s:s + self.context + 1].astype(np.int64))
        return chunk[:-1], chunk[1:]


class Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc_out = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, d)))
        x = x + self.drop(self.fc_out(F.gelu(self.fc(self.ln2(x)))))
        return x


class ByteGPT(L.LightningModule):
    def __init__(self, context: int, d: int, layers: int, heads: int, lr: float, dropout: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.tok = nn.Embedding(256, d)
        self.pos = nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, 256, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1))
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, betas=(0.9, 0.95), weight_decay=0.1,
                                fused=self.device.type == "cuda")
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 200))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Throughput(L.Callback):
    def __init__(self, batch: int) -> None:
        self.progress = Progress(batch)
        self.t_last, self.n_last, self.seen = time.perf_counter(), 0, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        n = batch[0].shape[0]
        self.progress.step(samples=n)
        self.seen += n
        now = time.perf_counter()
        if now - self.t_last >= 1.0:
            loss_val = outputs["loss"].item()
            now = time.perf_counter()
            log(f"step {trainer.global_step} samples/s {(self.seen - self.n_last) / (now - self.t_last):.1f} "
                f"loss {loss_val:.4f}")
            self.t_last, self.n_last = now, self.seen
            if not math.isfinite(loss_val):
                raise RuntimeError("loss is not finite")


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    cuda = args.device == "cuda"
    torch.manual_seed(0)
    torch.set_float32_matmul_precision("high")

    corpus = make_corpus(64_000_000 if cuda else 400_000)
    loader = torch.utils.data.DataLoader(Windows(corpus, args.context), batch_size=args.batch, shuffle=True,
                                         drop_last=True, num_workers=args.workers, pin_memory=cuda,
                                         persistent_workers=args.workers > 0)
    model = ByteGPT(args.context, args.d_model, args.layers, args.heads, args.lr)
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    log(f"byte GPT {n_params:.1f}M parameters, batch {args.batch} x {args.context} bytes, "
        f"detect_anomaly={not args.no_detect_anomaly}")

    trainer = L.Trainer(
        accelerator="gpu" if cuda else "cpu",
        devices=1,
        precision="bf16-mixed",
        max_epochs=-1,
        # no gradient_clip_val: Lightning refuses to clip with a fused optimizer under mixed precision
        # (the job as first written stopped there at its first step).
        detect_anomaly=not args.no_detect_anomaly,  # left on since the NaN hunt
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Throughput(args.batch)],
    )
    trainer.fit(model, loader)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
