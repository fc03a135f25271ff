"""A causal LM pre-trained from scratch with accelerate in the shape of transformers'
``examples/pytorch/language-modeling/run_clm_no_trainer.py``: ``Accelerator(gradient_accumulation_steps=...,
mixed_precision=...)``, ``AutoModelForCausalLM.from_config`` (a ~130M-parameter Llama), texts
grouped into blocks of ``block_size`` tokens (lists of ids, as ``dataset.map(group_texts)`` leaves
them), ``default_data_collator``, AdamW with the weight-decay groups, a linear schedule, and
``with accelerator.accumulate(model):`` around each step. Synthetic token ids, no download."""

from __future__ import annotations

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, LlamaConfig, default_data_collator, get_scheduler

from common import Progress, log, parser, watchdog


class Blocks(Dataset):
    """``group_texts``' output: each row a dict of ``block_size`` token ids, mask and labels as lists."""

    def __init__(self, n: int, block_size: int, vocab: int) -> None:
        ids = torch.randint(0, vocab, (n, block_size), generator=torch.Generator().manual_seed(0)).tolist()
        self.rows = [{"input_ids": r, "attention_mask": [1] * block_size, "labels": list(r)} for r in ids]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return self.rows[i]


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--mixed-precision", default="bf16")
    p.add_argument("--batch", type=int, default=8, help="per_device_train_batch_size")
    p.add_argument("--grad-accum", type=int, default=4, help="gradient_accumulation_steps")
    p.add_argument("--block-size", type=int, default=1024)
    p.add_argument("--workers", type=int, default=0, help="DataLoader num_workers (the script sets none)")
    args = p.parse_args()
    watchdog(args.seconds)
    accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum, mixed_precision=args.mixed_precision,
                              cpu=args.device == "cpu")
    if args.tiny:
        config = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
        batch, block = 2, 32
    else:
        config = LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                             num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=args.block_size)
        batch, block = args.batch, args.block_size
    model = AutoModelForCausalLM.from_config(config)
    train_dataset = Blocks(128 if args.tiny else 2048, block, config.vocab_size)
    train_dataloader = DataLoader(train_dataset, shuffle=True, collate_fn=default_data_collator, batch_size=batch,
                                  num_workers=args.workers, persistent_workers=args.workers > 0)
    no_decay = ["bias", "layer_norm.weight", "norm.weight"]
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=3e-4)
    max_train_steps = 10**7
    lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=100,
                                 num_training_steps=max_train_steps * accelerator.num_processes)
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(model, optimizer, train_dataloader,
                                                                           lr_scheduler)
    progress = Progress(batch)
    progress_bar = tqdm(range(max_train_steps), disable=not accelerator.is_local_main_process, mininterval=1.0)
    log(f"accelerate_clm: {args.mixed_precision} batch {batch} x accum {args.grad_accum} block {block} "
        f"workers {args.workers}")
    completed_steps = 0
    model.train()
    while True:  # epochs
        total_loss = 0
        for step, batch_ in enumerate(train_dataloader):
            with accelerator.accumulate(model):
                outputs = model(**batch_)
                loss = outputs.loss
                total_loss += loss.detach().float()  # --with_tracking
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                progress_bar.update(1)
                completed_steps += 1
            progress.step()


if __name__ == "__main__":
    main()
