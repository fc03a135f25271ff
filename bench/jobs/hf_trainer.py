"""A Hugging Face Trainer job as its examples write one: a model built from its config (no
download), a map-style dataset of token ids, a data collator, TrainingArguments for precision and
loader workers. ``--collate-ms`` makes the collator do Python work per batch the way on-the-fly
tokenization and padding do."""

from __future__ import annotations

import tempfile
import time

import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments

from common import Progress, log, parser, watchdog


class Tokens(Dataset):
    def __init__(self, seq: int, vocab: int, n: int = 4096) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return 1 << 20  # long enough; the Trainer shuffles, so not endless

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i % len(self.ids)].tolist()}


class Collator:
    """Pads and builds labels in Python, as a tokenizer's collator does; ``busy_ms`` of Python
    work per batch stands for tokenizing raw text on the fly."""

    def __init__(self, task: str, busy_ms: float) -> None:
        self.task, self.busy_s = task, busy_ms / 1000.0

    def __call__(self, rows: list[dict]) -> dict:
        end = time.perf_counter() + self.busy_s
        acc = 0
        while time.perf_counter() < end:  # tokenizing text in Python
            acc += sum(len(str(t)) for t in rows[0]["input_ids"][:64])
        ids = torch.tensor([r["input_ids"] for r in rows])
        if self.task == "lm":
            return {"input_ids": ids, "labels": ids.clone()}
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids[:, 0] % 2}


class Count(TrainerCallback):
    def __init__(self, progress: Progress) -> None:
        self.progress = progress

    def on_step_end(self, args, state, control, **kwargs):
        self.progress.step()


def build(arch: str, tiny: bool):
    if arch == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000) if tiny else GPT2Config()
        return GPT2LMHeadModel(cfg), "lm", cfg.vocab_size
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128,
                     vocab_size=1000) if tiny else BertConfig()
    return BertForSequenceClassification(cfg), "cls", cfg.vocab_size


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--arch", choices=("bert", "gpt2"), default="bert")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--collate-ms", type=float, default=0.0)
    args = p.parse_args()
    watchdog(args.seconds)
    model, task, vocab = build(args.arch, args.tiny)
    batch = 4 if args.tiny else args.batch
    seq = 16 if args.tiny else args.seq
    out = tempfile.mkdtemp(prefix="hf-job-")
    targs = TrainingArguments(
        output_dir=out, max_steps=10**7, per_device_train_batch_size=batch, bf16=args.bf16,
        dataloader_num_workers=args.workers, dataloader_persistent_workers=args.workers > 0,
        logging_steps=50, save_strategy="no", report_to=[], disable_tqdm=True,
        use_cpu=args.device == "cpu", learning_rate=1e-4,
    )
    progress = Progress(batch)
    log(f"hf_trainer: {args.arch} bf16={args.bf16} batch {batch} workers {args.workers} collate {args.collate_ms} ms")
    trainer = Trainer(model=model, args=targs, train_dataset=Tokens(seq, vocab),
                      data_collator=Collator(task, args.collate_ms), callbacks=[Count(progress)])
    trainer.train()


if __name__ == "__main__":
    main()
