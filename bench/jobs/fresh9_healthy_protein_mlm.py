"""Protein language model pretraining (ESM-2-style masked language modelling): a 1.3B-parameter
bidirectional Transformer encoder (width 2,560, 16 blocks, 20 heads, learned positions as in ESM-1b,
pre-LayerNorm, no biases, no dropout) trained with PyTorch Lightning on one GPU, bf16 mixed precision, fused AdamW.

The corpus is a concatenation of amino-acid sequences already tokenized into a flat uint8 array
(33-token ESM alphabet); DataLoader workers cut random 1,024-token crops out of it and apply BERT-style
masking (15 % of positions: 80 % <mask>, 10 % random residue, 10 % unchanged). The model is created
directly on the GPU under ``trainer.init_module()``; attention is PyTorch's fused
``scaled_dot_product_attention``. The loss is read once per progress line.

Nothing here is known to be wrong: this is a healthy control. ``--workers``, ``--batch`` and
``--compile`` are the knobs a false alarm would turn.

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

VOCAB, PAD, MASK, CLS, EOS = 33, 1, 32, 0, 2
RESIDUES = np.arange(4, 24, dtype=np.uint8)  # the 20 standard amino acids in the ESM alphabet


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--d-model", type=int, default=2560)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=20)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--lr", type=float, default=4e-4)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = ap.parse_args(argv)
    if args.device == "cpu" or args.tiny:
        args.batch, args.context, args.d_model, args.layers, args.heads, args.workers = 4, 64, 64, 2, 4, 0
    return args


def make_corpus(n_tokens: int, seed: int = 0) -> np.ndarray:
    """UniRef-like sequences: residues drawn with natural amino-acid frequencies, lengths around 350,
    each closed by <eos> and opened by <cls>."""
    rng = np.random.default_rng(seed)
    freq = np.array([8.3, 5.5, 4.1, 5.5, 1.4, 3.9, 6.8, 7.1, 2.3, 5.9, 9.7, 5.8, 2.4, 3.9, 4.7, 6.6, 5.3, 1.1, 2.9, 6.9])
    body = rng.choice(RESIDUES, size=n_tokens, p=freq / freq.sum())
    starts = np.cumsum(rng.integers(100, 600, size=n_tokens // 100 + 1))
    starts = starts[starts < n_tokens - 1]
    body[starts] = EOS
    body[starts + 1] = CLS
    return body


class MaskedCrops(torch.utils.data.Dataset):
    def __init__(self, corpus: np.ndarray, context: int, n: int = 10_000_000) -> None:
        self.corpus, self.context, self.n = corpus, context, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        s = np.random.randint(0, len(self.corpus) - self.context)
        tokens = self.corpus[s:s + self.context].astype(np.int64)
        labels = np.full_like(tokens, -100)
        pick = np.random.rand(self.context) < 0.15
        labels[pick] = tokens[pick]
        r = np.random.rand(self.context)
        inputs = tokens.copy()
        inputs[pick & (r < 0.8)] = MASK
        swap = pick & (r >= 0.8) & (r < 0.9)
        inputs[swap] = np.random.choice(RESIDUES, size=int(swap.sum()))
        return torch.from_numpy(inputs), torch.from_numpy(labels)


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d, bias=False)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d, bias=False)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.fc_out = nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class ProteinMLM(L.LightningModule):
    def __init__(self, context: int, d: int, layers: int, heads: int, lr: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(VOCAB, d, padding_idx=PAD)
        self.pos = nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, bias=False)
        self.head = nn.Linear(d, VOCAB, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def training_step(self, batch, batch_idx):
        tokens, labels = batch
        logits = self(tokens)
        return F.cross_entropy(logits.view(-1, VOCAB).float(), labels.view(-1), ignore_index=-100)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, betas=(0.9, 0.98), eps=1e-8,
                                weight_decay=0.01, fused=self.device.type == "cuda")
        warmup, total = 2000, 500_000
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min((s + 1) / warmup, max(0.1, 1 - max(0, s - warmup) / total)))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Throughput(L.Callback):
    def __init__(self, batch: int, warm_s: float) -> None:
        self.progress = Progress(batch, warm_s=warm_s)
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

    corpus = make_corpus(50_000_000 if cuda else 200_000)
    loader = torch.utils.data.DataLoader(MaskedCrops(corpus, args.context), batch_size=args.batch, shuffle=False,
                                         drop_last=True, num_workers=args.workers, pin_memory=cuda,
                                         persistent_workers=args.workers > 0)
    trainer = L.Trainer(
        accelerator="gpu" if cuda else "cpu",
        devices=1,
        precision="bf16-mixed",
        max_epochs=-1,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Throughput(args.batch, warm_s=10.0 if args.compile else 4.0)],
    )
    with trainer.init_module():
        model = ProteinMLM(args.context, args.d_model, args.layers, args.heads, args.lr)
    if args.compile:
        model = torch.compile(model)
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    log(f"protein MLM {n_params:.0f}M parameters, batch {args.batch} x {args.context} tokens, "
        f"{args.workers} workers, compile={args.compile}")
    trainer.fit(model, loader)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
