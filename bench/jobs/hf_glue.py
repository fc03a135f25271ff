"""A sentence-pair classifier fine-tuned with the Hugging Face Trainer in the shape of the course's
chapter 3 and ``examples/pytorch/text-classification/run_glue.py``: a BERT tokenizer, sentence
pairs tokenized once up front (``truncation=True``, no padding), ``DataCollatorWithPadding`` for
dynamic padding per batch, and ``TrainingArguments`` with ``gradient_accumulation_steps``.

No download: the tokenizer's vocabulary is written locally and the model is built from its config
(BERT-Small, 4 layers of 512, the size of google's ``bert_uncased_L-4_H-512_A-8``); the sentences
are synthetic, MRPC-like in length."""

from __future__ import annotations

import os
import random
import tempfile

import torch
from transformers import (BertConfig, BertForSequenceClassification, BertTokenizerFast, DataCollatorWithPadding,
                          Trainer, TrainerCallback, TrainingArguments)

from common import Progress, log, parser, watchdog


def local_tokenizer(words: int, seed: int = 0):
    """A WordPiece vocabulary saved to a folder and loaded the way a downloaded one is."""
    r = random.Random(seed)
    vocab: set[str] = set()
    while len(vocab) < words:
        vocab.add("".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(r.randint(2, 9))))
    folder = tempfile.mkdtemp(prefix="hf-glue-tok-")
    with open(os.path.join(folder, "vocab.txt"), "w") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted(vocab)]) + "\n")
    return BertTokenizerFast.from_pretrained(folder), sorted(vocab)


class Pairs(torch.utils.data.Dataset):
    """The tokenized dataset: one dict of lists per example, as ``dataset.map(tokenize)`` leaves it."""

    def __init__(self, tokenizer, words: list[str], n: int, max_len: int, seed: int = 0) -> None:
        r = random.Random(seed)

        def sentence() -> str:
            return " ".join(r.choice(words) for _ in range(r.randint(8, 40)))

        s1 = [sentence() for _ in range(n)]
        s2 = [sentence() for _ in range(n)]
        enc = tokenizer(s1, s2, truncation=True, max_length=max_len)
        self.rows = [{k: enc[k][i] for k in enc} | {"labels": r.randint(0, 1)} for i in range(n)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return self.rows[i]


class Count(TrainerCallback):
    """Counts samples per optimizer step: each one is ``batch * gradient_accumulation_steps``."""

    def __init__(self, progress: Progress, per_step: int) -> None:
        self.progress, self.per_step = progress, per_step

    def on_step_end(self, args, state, control, **kwargs):
        self.progress.step(self.per_step)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--batch", type=int, default=32, help="per_device_train_batch_size")
    p.add_argument("--grad-accum", type=int, default=4, help="gradient_accumulation_steps")
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--workers", type=int, default=0, help="dataloader_num_workers")
    args = p.parse_args()
    watchdog(args.seconds)
    tokenizer, words = local_tokenizer(2000 if args.tiny else 30517)
    if args.tiny:
        cfg = BertConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=128, num_labels=2)
    else:
        cfg = BertConfig(vocab_size=len(tokenizer), hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                         intermediate_size=2048, num_labels=2)
    model = BertForSequenceClassification(cfg)
    batch = 4 if args.tiny else args.batch
    train = Pairs(tokenizer, words, 256 if args.tiny else 8192, 32 if args.tiny else args.max_len)
    targs = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-glue-"), max_steps=10**7, per_device_train_batch_size=batch,
        gradient_accumulation_steps=args.grad_accum, learning_rate=2e-5, weight_decay=0.01, warmup_steps=100,
        bf16=args.bf16, dataloader_num_workers=args.workers, dataloader_persistent_workers=args.workers > 0,
        logging_steps=50, save_strategy="no", report_to=[], disable_tqdm=True, use_cpu=args.device == "cpu",
    )
    progress = Progress(batch * args.grad_accum)
    log(f"hf_glue: bert-small bf16={args.bf16} batch {batch} x accum {args.grad_accum} workers {args.workers}")
    trainer = Trainer(model=model, args=targs, train_dataset=train, data_collator=DataCollatorWithPadding(tokenizer),
                      callbacks=[Count(progress, batch * args.grad_accum)])
    trainer.train()


if __name__ == "__main__":
    main()
