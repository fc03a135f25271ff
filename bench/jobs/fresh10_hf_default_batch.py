"""Support-ticket routing: a BERT-base-sized encoder (12 layers, width 768, 30,522-token vocabulary)
fine-tuned for 24-way ticket classification with the Hugging Face ``Trainer`` on one GPU, bf16, the
Trainer's default fused AdamW and linear schedule.

The tickets are already tokenized (subject + body, truncated to 128 tokens; almost every ticket is
longer than that, so the batches carry no padding). The real job starts from a pretrained checkpoint;
there is no network here, so the model is built from its configuration.

The ``TrainingArguments`` were copied from the quick-start example and only the output directory,
bf16 and the step count were changed: ``per_device_train_batch_size`` is left at the Trainer's default
of 8, so each step pushes 8 x 128 = 1,024 tokens through a 110M-parameter model on an H100. The GPU
finishes that in a few milliseconds; the step takes as long as Python, the Trainer and the kernel
launches take (~1,000 kernels forward and backward, clipping, the optimizer, the scheduler, and the
Trainer's per-step NaN check on the loss, which waits for the GPU).

``--batch 128`` sets ``per_device_train_batch_size=128`` (with the learning rate scaled by sqrt(16)).

Prints ``step <n> samples/s <x>`` about once a second.
"""

from __future__ import annotations

import math
import os
import tempfile
import time

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments

from common import Progress, log, parser, watchdog


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=8, help="per_device_train_batch_size (Trainer default: 8)")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--labels", type=int, default=24)
    ap.add_argument("--lr", type=float, default=2e-5, help="learning rate at batch 8 (scaled by sqrt(batch/8))")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: train until killed)")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.seq_len = 32
        args.batch = max(2, args.batch // 4)
    return args


def model_config(args) -> BertConfig:
    if args.tiny:
        return BertConfig(vocab_size=2048, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=256, max_position_embeddings=128, num_labels=args.labels,
                          attn_implementation="sdpa")
    # bert-base-uncased
    return BertConfig(vocab_size=30_522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                      intermediate_size=3072, max_position_embeddings=512, num_labels=args.labels,
                      attn_implementation="sdpa")


class Tickets(torch.utils.data.Dataset):
    """Pre-tokenized tickets: [CLS] subject/body word pieces [SEP], 128 tokens each. Every queue
    favours its own slice of the vocabulary, so there is something to learn."""

    def __init__(self, n: int, seq_len: int, vocab: int, labels: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, labels, (n,), generator=g)
        common = torch.randint(1000, vocab, (n, seq_len), generator=g)
        width = (vocab - 1000) // labels
        topical = 1000 + self.labels[:, None] * width + torch.randint(0, width, (n, seq_len), generator=g)
        self.ids = torch.where(torch.rand(n, seq_len, generator=g) < 0.15, topical, common)
        self.ids[:, 0], self.ids[:, -1] = 101, 102
        self.mask = torch.ones(n, seq_len, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


class Throughput(TrainerCallback):
    def __init__(self, batch: int, stop_after: int) -> None:
        self.batch, self.stop_after = batch, stop_after
        self.progress = Progress(batch)
        self.t_last, self.n_last, self.seen = time.perf_counter(), 0, 0

    def on_step_end(self, args, state, control, **kwargs):
        self.progress.step()
        self.seen += self.batch
        now = time.perf_counter()
        if now - self.t_last >= 1.0:
            log(f"step {state.global_step} samples/s {(self.seen - self.n_last) / (now - self.t_last):.1f}")
            self.t_last, self.n_last = now, self.seen
        if self.stop_after and state.global_step >= self.stop_after:
            control.should_training_stop = True
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            log(f"trainer log: step {state.global_step} loss {logs['loss']:.4f} lr {logs.get('learning_rate', 0):.2e}")
            if not math.isfinite(logs["loss"]):
                raise RuntimeError("loss is not finite")


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    cuda = args.device == "cuda"
    torch.manual_seed(0)

    config = model_config(args)
    train = Tickets(60_000 if cuda else 2_000, args.seq_len, config.vocab_size, args.labels)
    # in the real job: AutoModelForSequenceClassification.from_pretrained("bert-base-uncased", num_labels=24)
    model = BertForSequenceClassification(config)
    n_params = sum(p.numel() for p in model.parameters()) / 1e6

    out_dir = tempfile.mkdtemp(prefix="ticket-router-")
    training_args = TrainingArguments(
        output_dir=out_dir,
        per_device_train_batch_size=args.batch,
        learning_rate=args.lr * math.sqrt(args.batch / 8),
        weight_decay=0.01,
        warmup_steps=200,
        max_steps=10**8,              # runs until it is stopped
        bf16=cuda,
        use_cpu=not cuda,
        logging_steps=200,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    log(f"ticket router: {n_params:.0f}M parameters, per-device batch {args.batch} x {args.seq_len} tokens, "
        f"optim {training_args.optim}, workers {training_args.dataloader_num_workers}")
    trainer = Trainer(model=model, args=training_args, train_dataset=train,
                      callbacks=[Throughput(args.batch, args.steps)])
    trainer.train()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
