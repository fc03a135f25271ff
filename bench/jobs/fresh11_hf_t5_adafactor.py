"""Query generation for a search index (doc2query): a T5-base-sized encoder-decoder (12 + 12 layers,
d_model 768, 32,128-token vocabulary, 223M parameters) fine-tuned with the Hugging Face
``Seq2SeqTrainer`` on one GPU, bf16, to write a 64-token query from a 256-token passage; 32 pairs per
step.

The passages and queries are already tokenized and truncated (every passage is longer than 256 tokens,
so there is no padding). The real job starts from a pretrained checkpoint; there is no network here, so
the model is built from its configuration.

The ``Seq2SeqTrainingArguments`` follow the usual T5 fine-tuning advice: ``optim="adafactor"`` with a
constant learning rate of 1e-3. The Trainer's Adafactor is ``transformers.optimization.Adafactor``,
whose ``step()`` is a Python loop over the 257 parameter tensors that issues ~20 separate small kernels
for each (the factored second-moment row and column averages, the reconstructed preconditioner, the
update's RMS clipping, the learning-rate scaling, the parameter update): ~6,000 kernel launches from
Python per step, while the GPU needs a few milliseconds for the arithmetic. The Trainer's per-step
NaN/Inf check of the loss synchronizes with the GPU before it, so nothing overlaps the optimizer loop.

``--optim adamw_torch_fused`` uses the Trainer's default optimizer instead (fused AdamW: one
multi-tensor kernel launch for all parameters), learning rate 3e-4; T5-base's AdamW state (1.8 GB)
fits easily on the GPU.

Prints ``step <n> samples/s <x>`` about once a second.
"""

from __future__ import annotations

import math
import os
import tempfile
import time

import torch
from transformers import (Seq2SeqTrainer, Seq2SeqTrainingArguments, T5Config, T5ForConditionalGeneration,
                          TrainerCallback, default_data_collator)

from common import Progress, log, parser, watchdog


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=32, help="per_device_train_batch_size")
    ap.add_argument("--source-len", type=int, default=256)
    ap.add_argument("--target-len", type=int, default=64)
    ap.add_argument("--optim", default="adafactor", help="TrainingArguments.optim")
    ap.add_argument("--lr", type=float, default=0.0, help="learning rate (default: 1e-3 for Adafactor, 3e-4 otherwise)")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: train until killed)")
    args = ap.parse_args(argv)
    if not args.lr:
        args.lr = 1e-3 if args.optim == "adafactor" else 3e-4
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.batch, args.source_len, args.target_len = 4, 32, 8
    return args


def model_config(args) -> T5Config:
    if args.tiny:
        return T5Config(vocab_size=1000, d_model=64, d_kv=16, d_ff=256, num_layers=2, num_decoder_layers=2,
                        num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    # t5-base
    return T5Config(vocab_size=32_128, d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_decoder_layers=12,
                    num_heads=12, relative_attention_num_buckets=32, dropout_rate=0.1,
                    feed_forward_proj="relu", tie_word_embeddings=True,
                    decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)


class PassageQueries(torch.utils.data.Dataset):
    """Tokenized (passage, query) pairs: each query reuses a few spans of its passage plus some
    question words, ending in </s>."""

    def __init__(self, n: int, source_len: int, target_len: int, vocab: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.source = torch.randint(100, vocab, (n, source_len), generator=g)
        self.source[:, -1] = 1
        picks = torch.randint(0, source_len - 1, (n, target_len), generator=g)
        target = torch.gather(self.source, 1, picks)
        question_words = torch.randint(3, 100, (n, target_len), generator=g)
        self.target = torch.where(torch.rand(n, target_len, generator=g) < 0.3, question_words, target)
        self.target[:, -1] = 1
        self.mask = torch.ones(n, source_len, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.source[i], "attention_mask": self.mask[i], "labels": self.target[i]}


class Throughput(TrainerCallback):
    def __init__(self, batch: int, stop_after: int) -> None:
        self.batch, self.stop_after = batch, stop_after
        self.progress = Progress(batch)
        self.t_last, self.n_last, self.seen = time.perf_counter(), 0, 0

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        if optimizer is not None:
            inner = getattr(optimizer, "optimizer", optimizer)
            log(f"optimizer: {type(inner).__module__}.{type(inner).__name__}, "
                f"{sum(len(g['params']) for g in inner.param_groups)} parameter tensors")

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
    train = PassageQueries(100_000 if cuda else 1_000, args.source_len, args.target_len, config.vocab_size)
    # in the real job: T5ForConditionalGeneration.from_pretrained("t5-base")
    model = T5ForConditionalGeneration(config)
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    n_tensors = sum(1 for _ in model.parameters())

    out_dir = tempfile.mkdtemp(prefix="doc2query-")
    training_args = Seq2SeqTrainingArguments(
        output_dir=out_dir,
        per_device_train_batch_size=args.batch,
        optim=args.optim,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_steps=10**8,              # runs until it is stopped
        bf16=cuda,
        use_cpu=not cuda,
        logging_steps=200,
        save_strategy="no",
        eval_strategy="no",
        predict_with_generate=False,
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    log(f"doc2query T5: {n_params:.0f}M parameters in {n_tensors} tensors, batch {args.batch} x "
        f"({args.source_len} -> {args.target_len}) tokens, optim {getattr(training_args.optim, 'value', training_args.optim)}, "
        f"lr {args.lr:g}")
    trainer = Seq2SeqTrainer(model=model, args=training_args, train_dataset=train,
                             data_collator=default_data_collator,
                             callbacks=[Throughput(args.batch, args.steps)])
    trainer.train()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
