"""A healthy language-model pretraining job in PyTorch Lightning, a control: a Llama-style decoder
of about 540M parameters (8 layers, width 2048, SDPA attention) trained with
``precision="bf16-mixed"``, AdamW (multi-tensor) and gradient clipping at 1.0, on 8 sequences of
1,024 tokens a step. Its data is a pre-tokenized shard in RAM (a uint16 token array, as a
memory-mapped ``.bin`` file would be), read by an IterableDataset that cuts random windows, in 4
DataLoader workers with pinned memory; the loop reads no value back from the GPU except a loss
printed every 100 steps. Nothing in it should be worth changing: more workers or a larger batch
gain little.

Hugging Face ``LlamaForCausalLM`` built from a LlamaConfig (no download); Lightning's progress bar,
logger and checkpointing are off (progress goes to stderr). A tiny decoder stands in for ``--tiny``."""

from __future__ import annotations

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from transformers import LlamaConfig, LlamaForCausalLM, get_cosine_schedule_with_warmup

from common import Progress, log, parser, watchdog


class TokenWindows(IterableDataset):
    def __init__(self, tokens: np.ndarray, context: int) -> None:
        self.tokens, self.context = tokens, context

    def __iter__(self):
        info = get_worker_info()
        r = np.random.default_rng(1234 + (info.id if info else 0))
        n = len(self.tokens) - self.context
        while True:
            i = int(r.integers(0, n))
            yield torch.from_numpy(self.tokens[i:i + self.context].astype(np.int64))


class DecoderLM(L.LightningModule):
    def __init__(self, config: LlamaConfig, lr: float) -> None:
        super().__init__()
        self.model = LlamaForCausalLM(config)
        self.lr = lr

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.model(input_ids=batch, labels=batch).loss
        if batch_idx % 100 == 0:
            log(f"step {batch_idx} loss {loss.item():.4f}")
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr, betas=(0.9, 0.95), weight_decay=0.1)
        sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=500, num_training_steps=100_000)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class CountSteps(L.Callback):
    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.progress: Progress | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.progress is None:
            self.progress = Progress(self.batch)
        self.progress.step()


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--workers", type=int, default=4)
    args = p.parse_args()
    watchdog(args.seconds)
    if args.tiny:
        config = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128)
        batch, context, shard = 4, 64, 200_000
    else:
        config = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
                             num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=4096)
        batch, context, shard = args.batch, args.context, 50_000_000
    config._attn_implementation = "sdpa"
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, shard, dtype=np.uint16)
    loader = DataLoader(TokenWindows(tokens, context), batch_size=batch, num_workers=args.workers,
                        pin_memory=args.device == "cuda", persistent_workers=args.workers > 0,
                        prefetch_factor=4 if args.workers > 0 else None)
    torch.set_float32_matmul_precision("high")
    module = DecoderLM(config, lr=3e-4)
    trainer = L.Trainer(accelerator="gpu" if args.device == "cuda" else "cpu", devices=1, precision="bf16-mixed",
                        max_epochs=1, max_steps=-1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, gradient_clip_val=1.0,
                        callbacks=[CountSteps(batch)])
    log(f"fresh5_healthy_lightning: llama 8x2048 bf16-mixed batch {batch} context {context} workers {args.workers}")
    trainer.fit(module, train_dataloaders=loader)


if __name__ == "__main__":
    main()
