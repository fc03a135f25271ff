"""A BERT masked-LM pretraining loop that calls ``torch.cuda.empty_cache()`` after every step, the
line people add after one out-of-memory error and keep: each call waits for the GPU and hands every
cached block back to the driver, and the next step allocates all its activations and gradients
again with ``cudaMalloc``. ``--keep-cache`` is the fix: no ``empty_cache()`` in the loop.

Hugging Face ``BertForMaskedLM`` built from a BERT-base config (no download), bf16 autocast, AdamW,
a linear warm-up schedule, masked token batches prepared on the GPU."""

from __future__ import annotations

import torch
from transformers import BertConfig, BertForMaskedLM, get_linear_schedule_with_warmup

from common import Progress, log, parser, watchdog


def mask_tokens(ids: torch.Tensor, mask_id: int, vocab: int):
    """The 80/10/10 rule of DataCollatorForLanguageModeling, on the device."""
    chosen = torch.rand(ids.shape, device=ids.device) < 0.15
    labels = ids.masked_fill(~chosen, -100)
    r = torch.rand(ids.shape, device=ids.device)
    ids = torch.where(chosen & (r < 0.8), torch.full_like(ids, mask_id), ids)
    ids = torch.where(chosen & (r >= 0.8) & (r < 0.9), torch.randint_like(ids, vocab), ids)
    return ids, labels


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--keep-cache", action="store_true", help="don't call torch.cuda.empty_cache() each step")
    args = p.parse_args()
    watchdog(args.seconds)
    dev = torch.device(args.device)
    if args.tiny:
        config = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=128, max_position_embeddings=64)
        batch, seq = 4, 32
    else:
        config = BertConfig()
        batch, seq = args.batch, args.seq
    model = BertForMaskedLM(config).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=1000, num_training_steps=100_000)
    corpus = torch.randint(5, config.vocab_size, (512, seq), device=dev)
    progress = Progress(batch)
    log(f"fresh_empty_cache: bert batch {batch} seq {seq} keep_cache={args.keep_cache}")
    model.train()
    step = 0
    while True:
        i = (step * batch) % (len(corpus) - batch)
        input_ids, labels = mask_tokens(corpus[i:i + batch], 4, config.vocab_size)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            out = model(input_ids=input_ids, labels=labels)  # packed full-length sequences: no padding
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        del out
        if not args.keep_cache:
            torch.cuda.empty_cache()  # "to avoid OOM"
        step += 1
        progress.step()


if __name__ == "__main__":
    main()
