"""Support-ticket triage: fine-tuning a RoBERTa-base-sized encoder (12 layers, width 768, 125M parameters,
SDPA attention) for 20 routing queues with the Hugging Face ``Trainer`` on one GPU: bf16, the Trainer's
default AdamW and linear schedule, clipping at 1.0, batches of 32 tickets of 256 tokens (long e-mail
threads, truncated; already tokenized, generated here), 2 DataLoader workers with pinned memory.

The script starts the way it was left after the team chased a device-side assert (label ids out of range
in an early export): ``os.environ["CUDA_LAUNCH_BLOCKING"] = "1"`` at the top, so that a CUDA error is
raised at the call that caused it. The labels were fixed; the line stayed. With it every kernel launch
and every copy is synchronous: the host waits for each kernel to finish before it returns from the
launch, so the GPU sits idle while Python, the autograd engine and the Trainer prepare the next kernel,
and the host overheads (~1,000 launches a step) are added to the GPU time instead of overlapping it.

``--no-launch-blocking`` leaves ``CUDA_LAUNCH_BLOCKING`` unset.

Prints ``step <n> samples/s <x>`` about once a second (samples are tickets).
"""

from __future__ import annotations

import os
import sys

# Debugging aid from the label-id hunt: CUDA errors surface at the line that caused them.
if "--no-launch-blocking" not in sys.argv:
    os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import math  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from transformers import (RobertaConfig, RobertaForSequenceClassification, Trainer,  # noqa: E402
                          TrainerCallback, TrainingArguments)

from common import Progress, log, parser, watchdog  # noqa: E402


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--tickets", type=int, default=120_000)
    ap.add_argument("--queues", type=int, default=20)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50_265)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--no-launch-blocking", action="store_true",
                    help="do not set CUDA_LAUNCH_BLOCKING=1 (the debugging leftover)")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.batch, args.seq, args.tickets, args.layers, args.width, args.heads = 4, 32, 512, 2, 64, 4
        args.vocab, args.workers = 1000, min(args.workers, 1)
    return args


class Tickets(torch.utils.data.Dataset):
    """Tokenized tickets (<s> ... </s>, truncated to the context) and their queue ids."""

    def __init__(self, n: int, seq: int, vocab: int, queues: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(3, vocab, (n, seq), generator=g, dtype=torch.int32)
        self.ids[:, 0], self.ids[:, -1] = 0, 2
        self.labels = torch.randint(0, queues, (n,), generator=g)
        # a queue-specific keyword early in the thread, so that there is something to learn
        self.ids[:, 1] = 3 + self.labels.to(torch.int32)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i].long(), "labels": self.labels[i]}


class Throughput(TrainerCallback):
    """Progress lines for the bench, and a loss line about once a second (the Trainer's own logging is off)."""

    def __init__(self, batch: int) -> None:
        self.progress = Progress(batch)
        self.batch = batch
        self.t_last, self.n_last, self.seen = time.perf_counter(), 0, 0

    def on_step_end(self, args, state, control, **kwargs):
        self.progress.step()
        self.seen += self.batch
        now = time.perf_counter()
        if now - self.t_last >= 1.0:
            log(f"step {state.global_step} samples/s {(self.seen - self.n_last) / (now - self.t_last):.1f}")
            self.t_last, self.n_last = now, self.seen
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs and not math.isfinite(logs["loss"]):
            raise RuntimeError("loss is not finite")
        return control


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    cuda = args.device == "cuda"
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True

    config = RobertaConfig(vocab_size=args.vocab, hidden_size=args.width, num_hidden_layers=args.layers,
                           num_attention_heads=args.heads, intermediate_size=4 * args.width,
                           max_position_embeddings=args.seq + 2, num_labels=args.queues, pad_token_id=1)
    config._attn_implementation = "sdpa"
    model = RobertaForSequenceClassification(config)
    data = Tickets(args.tickets, args.seq, args.vocab, args.queues)
    out_dir = os.path.join(tempfile.gettempdir(), "ticket-triage-trainer")  # nothing is saved there
    training_args = TrainingArguments(
        output_dir=out_dir,
        per_device_train_batch_size=args.batch,
        learning_rate=args.lr,
        weight_decay=0.01,
        warmup_steps=500,
        max_steps=10_000_000,
        max_grad_norm=1.0,
        bf16=cuda,
        use_cpu=not cuda,
        logging_steps=500,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=args.workers,
        dataloader_pin_memory=cuda,
        dataloader_persistent_workers=args.workers > 0,
        seed=0,
    )
    callback = Throughput(args.batch)
    trainer = Trainer(model=model, args=training_args, train_dataset=data, callbacks=[callback])
    log(f"RoBERTa {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, batch {args.batch} x {args.seq}, "
        f"CUDA_LAUNCH_BLOCKING={os.environ.get('CUDA_LAUNCH_BLOCKING', 'unset')}")
    trainer.train()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
