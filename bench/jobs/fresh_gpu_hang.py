"""A BERT masked-LM pretraining loop that hangs on the GPU: after some seconds of normal steps a
kernel is launched that never finishes, and the loop's next ``loss.item()`` waits on it for ever.
The GPU shows busy (the kernel spins), the process shows alive, and no step completes.

The kernel that never finishes is ``torch.cuda._sleep`` with a cycle count of hours: the stand-in
for a custom kernel spinning on a flag that is never set, or a collective whose peer is gone.
Nothing the job could change makes it faster; the right report is that it is stuck.

Hugging Face ``BertForMaskedLM`` built from a BERT-base config (no download), bf16 autocast,
AdamW, synthetic token batches on the GPU. On ``--device cpu`` the hang is a blocking wait."""

from __future__ import annotations

import threading
import time

import torch
from transformers import BertConfig, BertForMaskedLM

from common import Progress, log, parser, watchdog

HANG_CYCLES = 10**13  # about 80 minutes at 2 GHz: longer than any bench run


def spin_forever(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda._sleep(HANG_CYCLES)  # queued on the current stream; returns at once
    else:
        threading.Event().wait()  # the CPU smoke test's stand-in: blocks here


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--hang-after-s", type=float, default=6.0, help="seconds of normal steps before the hang")
    args = p.parse_args()
    watchdog(args.seconds)
    dev = torch.device(args.device)
    if args.tiny:
        config = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=128, max_position_embeddings=64)
        batch, seq = 4, 32
    else:
        config = BertConfig()  # bert-base-uncased's shape
        batch, seq = args.batch, args.seq
    model = BertForMaskedLM(config).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    ids = torch.randint(5, config.vocab_size, (64, seq), device=dev)
    progress = Progress(batch)
    log(f"fresh_gpu_hang: bert batch {batch} seq {seq}; hangs after {args.hang_after_s:g} s")
    model.train()
    step, started = 0, None  # started: when the first step returned
    while True:
        i = (step * batch) % (len(ids) - batch)
        input_ids = ids[i:i + batch]
        mask = torch.rand(input_ids.shape, device=dev) < 0.15
        labels = input_ids.masked_fill(~mask, -100)
        input_ids = input_ids.masked_fill(mask, 4)  # [MASK]
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        hang = started is not None and time.time() - started > args.hang_after_s
        if hang:
            spin_forever(dev)
        step += 1
        if step % 10 == 0 or hang:
            log(f"step {step} loss {loss.item():.4f}")  # waits for the GPU: for ever, once the spin is queued
        progress.step()
        if started is None:
            started = time.time()


if __name__ == "__main__":
    main()
