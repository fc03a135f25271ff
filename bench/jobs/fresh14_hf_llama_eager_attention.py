"""Pre-training a small Llama-style model (16 layers, 1,024 wide, 16 heads, SwiGLU 2,816, RoPE, a
32,000-token SentencePiece vocabulary: ~270M parameters) on 2,048-token packed sequences of
legal and regulatory text, with the Hugging Face ``Trainer`` on one GPU: ``bf16=True``, fused AdamW
(``optim="adamw_torch_fused"``), cosine schedule with warmup, clipping at 1.0, 6 sequences per step,
4 DataLoader workers with pinned memory.

The model is built from its config (no download). It is created with
``attn_implementation="eager"``: the recipe this script started from logged attention maps with
``output_attentions=True`` for a probing experiment, which the SDPA path did not support, and the
setting stayed when the probing was dropped. ``--attn-implementation sdpa`` builds it with
PyTorch's ``scaled_dot_product_attention`` instead.

The packed corpus is one flat token array in host memory (generated here; the real job memory-maps the
tokenised shards); each sample is a random 2,048-token window, ``labels`` = ``input_ids`` (the model
shifts them). The Trainer's own logging is off; a callback prints progress and nothing else.

Prints ``step <n> samples/s <x>`` about once a second (samples are 2,048-token sequences).
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np
import torch
from transformers import (AutoModelForCausalLM, LlamaConfig, Trainer, TrainerCallback, TrainingArguments,
                          default_data_collator)

from common import Progress, log, parser, watchdog


def parse_args(argv=None):
    ap = parser(__doc__)
    ap.add_argument("--batch", type=int, default=6)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--ffn", type=int, default=2816)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--tokens", type=int, default=64_000_000, help="packed tokens held in host memory")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--attn-implementation", default="eager", choices=("eager", "sdpa"))
    args = ap.parse_args(argv)
    if args.device == "cpu":
        args.tiny = True
    if args.tiny:
        args.batch, args.seq, args.layers, args.width, args.heads, args.ffn = 2, 128, 2, 64, 4, 176
        args.vocab, args.tokens, args.workers = 1000, 100_000, min(args.workers, 1)
    return args


class PackedWindows(torch.utils.data.Dataset):
    """Random fixed-length windows of a packed token stream (documents joined with </s>)."""

    def __init__(self, n_tokens: int, vocab: int, seq: int, length: int = 10_000_000) -> None:
        rng = np.random.default_rng(0)
        ranks = np.minimum(rng.pareto(1.2, size=n_tokens) * 30, vocab - 4).astype(np.int64) + 3
        ranks[rng.random(n_tokens) < 1 / 900] = 2  # document separators
        self.tokens = ranks.astype(np.int16 if vocab < 32768 else np.int32)
        self.seq, self.length = seq, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        start = np.random.randint(0, len(self.tokens) - self.seq)
        ids = torch.from_numpy(self.tokens[start:start + self.seq].astype(np.int64))
        return {"input_ids": ids, "labels": ids.clone()}


class Throughput(TrainerCallback):
    """Progress lines for the bench, and a rate line about once a second (the Trainer's own logging is off)."""

    def __init__(self, batch: int) -> None:
        self.progress = Progress(batch)
        self.batch = batch
        self.t_last, self.n_last = time.perf_counter(), 0

    def on_step_end(self, args, state, control, **kwargs):
        self.progress.step()
        now = time.perf_counter()
        if now - self.t_last >= 1.0:
            step = state.global_step
            log(f"step {step} samples/s {(step - self.n_last) * self.batch / (now - self.t_last):.1f}")
            self.t_last, self.n_last = now, step
        return control


def main(argv=None) -> int:
    args = parse_args(argv)
    watchdog(args.seconds)
    cuda = args.device == "cuda"
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True

    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.width, intermediate_size=args.ffn,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.heads, max_position_embeddings=args.seq,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=args.attn_implementation)
    log(f"llama {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, attention "
        f"{args.attn_implementation}, batch {args.batch} x {args.seq}")

    data = PackedWindows(args.tokens, args.vocab, args.seq)
    targs = TrainingArguments(
        output_dir=os.path.join(tempfile.gettempdir(), "legal-llama-pretrain"),
        per_device_train_batch_size=args.batch,
        learning_rate=3e-4,
        weight_decay=0.1,
        adam_beta1=0.9,
        adam_beta2=0.95,
        max_grad_norm=1.0,
        lr_scheduler_type="cosine",
        warmup_steps=2000,
        max_steps=500_000,
        dataloader_num_workers=args.workers,
        dataloader_persistent_workers=args.workers > 0,
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        remove_unused_columns=False,
        seed=0,
        **({"bf16": True, "optim": "adamw_torch_fused", "dataloader_pin_memory": True} if cuda else
           {"use_cpu": True, "optim": "adamw_torch", "dataloader_pin_memory": False}),
    )
    trainer = Trainer(model=model, args=targs, train_dataset=data, data_collator=default_data_collator,
                      callbacks=[Throughput(args.batch)])
    trainer.train()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
