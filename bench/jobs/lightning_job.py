"""A Lightning job as its docs write one: a LightningModule, a DataLoader, ``Trainer(precision=...)``.
``--item-sync`` reads the loss on the host every step (``loss.item()`` for a running average), a
habit of hand-written training_steps."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from common import Progress, log, parser, watchdog
from vision import Images, build_model


class Tokens(torch.utils.data.Dataset):
    def __init__(self, seq: int, vocab: int) -> None:
        self.ids = torch.randint(0, vocab, (2048, seq + 1), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int):
        row = self.ids[i % len(self.ids)]
        return row[:-1], row[1:]


class SmallLM(torch.nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        layer = torch.nn.TransformerEncoderLayer(dim, max(1, dim // 64), 4 * dim, batch_first=True, norm_first=True)
        self.body = torch.nn.TransformerEncoder(layer, layers)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, x):
        return self.head(self.body(self.emb(x), is_causal=False))


class Module(L.LightningModule):
    def __init__(self, net: torch.nn.Module, item_sync: bool, normalize: bool) -> None:
        super().__init__()
        self.net, self.item_sync, self.normalize = net, item_sync, normalize
        self.running = 0.0
        self.progress: Progress | None = None

    def training_step(self, batch, idx):
        x, y = batch
        if self.normalize and x.dtype == torch.uint8:
            x = (x.float() - 127.5) / 64.0
        out = self.net(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        if self.item_sync:
            self.running = 0.98 * self.running + 0.02 * loss.item()
        return loss

    def on_train_batch_end(self, outputs, batch, idx):
        self.progress.step()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--model", default="torchvision:resnet18", help="torchvision:/timm: name, or lm")
    p.add_argument("--precision", default="32-true")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--augment", action="store_true")
    p.add_argument("--item-sync", action="store_true")
    args = p.parse_args()
    watchdog(args.seconds)
    batch = 8 if args.tiny else args.batch
    if args.model == "lm":
        vocab, seq = (1000, 16) if args.tiny else (8192, 128)
        net = SmallLM(vocab, 64 if args.tiny else 256, 2 if args.tiny else 4)
        data = Tokens(seq, vocab)
    else:
        net = build_model(args.model, args.tiny)
        data = Images(256 if args.tiny else 1024, 32 if args.tiny else 224, args.augment)
    loader = DataLoader(data, batch_size=batch, num_workers=args.workers, pin_memory=args.device == "cuda",
                        persistent_workers=args.workers > 0, drop_last=True)
    module = Module(net, args.item_sync, normalize=args.model != "lm")
    module.progress = Progress(batch)
    log(f"lightning: {args.model} precision {args.precision} batch {batch} workers {args.workers}")
    trainer = L.Trainer(
        accelerator="gpu" if args.device == "cuda" else "cpu", devices=1, precision=args.precision,
        max_steps=-1, max_epochs=-1, enable_progress_bar=False, logger=False, enable_checkpointing=False,
        enable_model_summary=False, limit_train_batches=10**7,
    )
    trainer.fit(module, loader)


if __name__ == "__main__":
    main()
