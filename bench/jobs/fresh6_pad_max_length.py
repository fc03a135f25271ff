"""Review-rating classifier: a BERT-base encoder (``BertForSequenceClassification`` from a
``BertConfig``, 5 classes) fine-tuned with the Hugging Face ``Trainer`` on one GPU.

The preprocessing is the one from the course notebook the project started from: every review is
tokenized with ``tokenizer(texts, truncation=True, max_length=512, padding="max_length")``, so
every example is 512 tokens long, whatever the review. Most reviews are short (median about 100
tokens, a few run past 512). ``Trainer`` with ``bf16=True``, fused AdamW, 32 reviews per step,
4 DataLoader workers with pinned memory, no evaluation or checkpoints inside the run.

``--dynamic-padding`` tokenizes without padding (truncation at 512 only), pads each batch to its
longest review (``DataCollatorWithPadding(pad_to_multiple_of=8)``) and groups reviews of similar
length into batches (the ``Trainer``'s group-by-length sampler).

Prints ``step <n> samples/s <x>`` about once a second.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time

import numpy as np
import torch

from common import Progress, log, parser, watchdog


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--reviews", type=int, default=20_000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: train forever)")
    ap.add_argument("--dynamic-padding", action="store_true",
                    help="no padding at tokenization; pad per batch to its longest review, group by length")
    args = ap.parse_args(argv)
    args.tiny = args.tiny or args.device == "cpu"
    if args.tiny:
        args.batch, args.max_length, args.reviews, args.workers = 8, 64, 256, 0
    return args


def build_tokenizer(vocab_size: int):
    """The project's word-level tokenizer (a fixed vocabulary; unknown words map to [UNK])."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    vocab.update({f"w{i}": i for i in range(5, vocab_size)})
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]",
                                   model_input_names=["input_ids", "attention_mask"])


def load_reviews(n: int, vocab_size: int, max_words: int, seed: int = 0):
    """The review corpus: texts and star ratings (0-4). Lengths are long-tailed."""
    rng = np.random.default_rng(seed)
    median = 100 if max_words >= 512 else 12
    lengths = np.clip(rng.lognormal(np.log(median), 0.7, size=n), 8, 1.5 * max_words).astype(int)
    words = rng.integers(5, vocab_size, size=int(lengths.sum()))
    texts, pos = [], 0
    for length in lengths:
        texts.append(" ".join(f"w{w}" for w in words[pos:pos + length]))
        pos += length
    labels = rng.integers(0, 5, size=n).tolist()
    return texts, labels


class Reviews(torch.utils.data.Dataset):
    def __init__(self, encodings, labels) -> None:
        self.input_ids = encodings["input_ids"]
        self.attention_mask = encodings["attention_mask"]
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return {"input_ids": self.input_ids[i], "attention_mask": self.attention_mask[i], "labels": self.labels[i]}


def training_arguments(args, out_dir: str):
    from transformers import TrainingArguments

    cuda = args.device == "cuda"
    kw = {"output_dir": out_dir, "per_device_train_batch_size": args.batch,
          "max_steps": args.steps if args.steps else 10_000_000, "learning_rate": 2e-5, "weight_decay": 0.01,
          "warmup_steps": 500, "lr_scheduler_type": "linear", "max_grad_norm": 1.0, "bf16": cuda,
          "optim": "adamw_torch_fused" if cuda else "adamw_torch", "logging_steps": 500, "save_strategy": "no",
          "eval_strategy": "no", "report_to": "none", "disable_tqdm": True,
          "dataloader_num_workers": args.workers, "dataloader_pin_memory": cuda,
          "dataloader_persistent_workers": args.workers > 0, "seed": 0}
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    if "eval_strategy" not in fields:  # transformers < 4.41
        kw["evaluation_strategy"] = kw.pop("eval_strategy")
    if args.dynamic_padding:
        if "train_sampling_strategy" in fields:  # transformers >= 5
            kw["train_sampling_strategy"] = "group_by_length"
        else:
            kw["group_by_length"] = True
    if "use_cpu" in fields:
        kw["use_cpu"] = not cuda
    else:
        kw["no_cuda"] = not cuda
    return TrainingArguments(**kw)


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        DataCollatorWithPadding,
        Trainer,
        TrainerCallback,
    )

    torch.manual_seed(0)
    vocab_size = 1024 if args.tiny else 30522
    tokenizer = build_tokenizer(vocab_size)
    texts, labels = load_reviews(args.reviews, vocab_size, args.max_length)
    if args.dynamic_padding:
        enc = tokenizer(texts, truncation=True, max_length=args.max_length)
        collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)
    else:
        enc = tokenizer(texts, truncation=True, max_length=args.max_length, padding="max_length")
        collator = DataCollatorWithPadding(tokenizer)
    data = Reviews(enc, labels)
    mean_len = float(np.mean([sum(m) for m in enc["attention_mask"]]))

    if args.tiny:
        cfg = BertConfig(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=256, max_position_embeddings=args.max_length, num_labels=5)
    else:  # bert-base
        cfg = BertConfig(vocab_size=vocab_size, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                         intermediate_size=3072, max_position_embeddings=512, num_labels=5)
    try:
        model = BertForSequenceClassification(cfg, attn_implementation="sdpa")
    except (TypeError, ValueError):
        model = BertForSequenceClassification(cfg)

    class Throughput(TrainerCallback):
        def __init__(self) -> None:
            self.t_last, self.steps_last = time.perf_counter(), 0
            self.progress: Progress | None = None

        def on_train_begin(self, targs, state, control, **kwargs):
            self.progress = Progress(args.batch)
            self.t_last = time.perf_counter()

        def on_step_end(self, targs, state, control, **kwargs):
            self.progress.step()
            now = time.perf_counter()
            if now - self.t_last >= 1.0 or (args.steps and state.global_step >= args.steps):
                if torch.cuda.is_available() and args.device == "cuda":
                    torch.cuda.synchronize()
                    now = time.perf_counter()
                rate = (state.global_step - self.steps_last) * args.batch / (now - self.t_last)
                log(f"step {state.global_step} samples/s {rate:.1f}")
                self.t_last, self.steps_last = now, state.global_step

    log(f"BERT {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, {len(data)} reviews "
        f"(mean {mean_len:.0f} real tokens, max_length {args.max_length}), batch {args.batch}, "
        f"{'dynamic padding, grouped by length' if args.dynamic_padding else 'padded to max_length'}")
    kw = {"model": model, "args": training_arguments(args, tempfile.mkdtemp(prefix="reviews-bert-")),
          "train_dataset": data, "data_collator": collator, "callbacks": [Throughput()]}
    try:
        trainer = Trainer(**kw, processing_class=tokenizer)
    except TypeError:  # transformers < 4.46
        trainer = Trainer(**kw, tokenizer=tokenizer)
    trainer.train()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
