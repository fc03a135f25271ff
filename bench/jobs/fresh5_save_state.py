"""A GPT-2 medium language model trained with Hugging Face Accelerate that checkpoints with
``accelerator.save_state()`` every 50 steps, "so that a preempted job loses little": each save
stops training while the fp32 weights (1.4 GB, safetensors) and the AdamW state (2.8 GB,
``torch.save``) are copied off the GPU and written to disk, along with the scheduler and RNG
states -- several seconds of writing for every few seconds of training. ``--save-every 2000`` is
the fix: checkpoint every 2,000 steps (a few minutes), as a run of this length needs.

``GPT2LMHeadModel`` built from a GPT-2 medium config (24 layers, width 1024, 355M parameters; no
download), Accelerate with ``mixed_precision="bf16"``, AdamW with a cosine schedule, random token
batches on the GPU. Checkpoints overwrite one folder under the temporary directory, which is
removed at start if an earlier run left it."""

from __future__ import annotations

import glob
import os
import shutil
import tempfile

import torch
from accelerate import Accelerator
from transformers import GPT2Config, GPT2LMHeadModel, get_cosine_schedule_with_warmup

from common import Progress, log, parser, watchdog

CKPT_PREFIX = "fresh5_save_state_ckpt_"


def checkpoint_dir() -> str:
    """A folder of this process's own; folders of processes no longer alive are removed."""
    for old in glob.glob(os.path.join(tempfile.gettempdir(), CKPT_PREFIX + "*")):
        try:
            pid = int(old.rsplit("_", 1)[1])
            os.kill(pid, 0)
        except (ValueError, ProcessLookupError):
            shutil.rmtree(old, ignore_errors=True)
        except PermissionError:
            pass
    return os.path.join(tempfile.gettempdir(), f"{CKPT_PREFIX}{os.getpid()}")


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--save-every", type=int, default=50, help="steps between accelerator.save_state()")
    args = p.parse_args()
    watchdog(args.seconds)
    accelerator = Accelerator(mixed_precision="bf16", cpu=args.device == "cpu")
    dev = accelerator.device
    if args.tiny:
        config = GPT2Config(vocab_size=1000, n_positions=64, n_embd=64, n_layer=2, n_head=2)
        batch, context = 4, 64
    else:
        config = GPT2Config(n_embd=1024, n_layer=24, n_head=16)  # gpt2-medium
        batch, context = args.batch, args.context
    model = GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=200, num_training_steps=100_000)
    model, opt, sched = accelerator.prepare(model, opt, sched)
    g = torch.Generator(device=dev).manual_seed(0)
    data = torch.randint(0, config.vocab_size, (4 * batch, context), device=dev, generator=g)
    ckpt = checkpoint_dir()
    progress = Progress(batch)
    log(f"fresh5_save_state: gpt2-medium batch {batch} context {context} save_state every {args.save_every} steps")
    model.train()
    step = 0
    while True:
        ids = data[(step % 4) * batch:(step % 4 + 1) * batch]
        loss = model(input_ids=ids, labels=ids).loss
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step % 200 == 0:
            log(f"step {step} loss {loss.item():.4f}")
        if step % args.save_every == 0:
            accelerator.save_state(ckpt)
        progress.step()


if __name__ == "__main__":
    main()
