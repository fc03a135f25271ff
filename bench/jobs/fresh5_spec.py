"""The fresh5 jobs: how to run each as-is on one H100, the change that fixes it (or, for the
healthy control, the changes a false alarm would most likely name), and what a right diagnosis
says. One literal ``SPEC`` list, readable with ``ast.literal_eval``."""

SPEC = [
    {
        "name": "fresh5-torch-manual-attention",
        "framework": "torch",
        "script": "fresh5_manual_attention.py",
        "args": ["--batch", "8", "--context", "2048"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Replace the hand-written attention (q @ k^T, masked_fill, softmax, @ v) with "
                        "F.scaled_dot_product_attention(q, k, v, is_causal=True), a fused flash-attention kernel.",
                "args": ["--sdpa"],
                "label": "unfused attention materializing the score matrix",
            },
        ],
        "truth": "The GPU is busy but spends most of each step in memory-bound elementwise and softmax kernels "
                 "over the batch x heads x 2048 x 2048 attention scores of the hand-written attention; a fused "
                 "attention (F.scaled_dot_product_attention / flash attention) removes them.",
        "expected_gain": "about 2.5x (2x to 3x): per layer and step the eager path writes and reads roughly 25-30 GB "
                         "of scores (8x12x2048x2048 in bf16 and fp32, forward and backward), about 120 ms of HBM "
                         "traffic over 12 layers against about 55 ms for the rest of a 124M-parameter step on 16k "
                         "tokens; flash attention adds under 10 ms.",
    },
    {
        "name": "fresh5-transformers-loop-loss",
        "framework": "transformers",
        "script": "fresh5_loop_loss.py",
        "args": ["--batch", "256", "--max-length", "64"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Compute the loss for the whole batch at once: cross_entropy with reduction='none', "
                        "masked by attention_mask and averaged per sentence, instead of a Python loop over "
                        "sentences that reads each length with int(mask[i].sum()).",
                "args": ["--vectorized-loss"],
                "label": "per-sample Python loop in the loss with a host sync per sample",
            },
        ],
        "truth": "The loss is computed in a Python loop over the batch's 256 sentences with an int() (a GPU sync) "
                 "and a few tiny kernels per sentence, forward and backward, so the GPU idles while the CPU "
                 "walks the loop; a vectorized masked cross-entropy fixes it.",
        "expected_gain": "about 1.8x (1.5x to 2.2x): the BERT-base step on 256x64 tokens is about 30-35 ms of GPU "
                         "work, while the loop costs about 256 x (a sync plus ~4 small ops forward and ~8 in "
                         "backward), roughly 25-40 ms of CPU time during which the GPU has nothing queued.",
    },
    {
        "name": "fresh5-accelerate-save-state",
        "framework": "accelerate",
        "script": "fresh5_save_state.py",
        "args": ["--batch", "8", "--context", "1024", "--save-every", "50"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Checkpoint with accelerator.save_state() every 2,000 steps instead of every 50.",
                "args": ["--save-every", "2000"],
                "label": "synchronous checkpointing too often",
            },
        ],
        "truth": "Every 50 steps training stops for accelerator.save_state(), which copies the 355M-parameter "
                 "model and its AdamW state (about 4.3 GB) off the GPU and writes them to disk; the GPU idles "
                 "during the save, and saving far less often (or asynchronously) fixes it.",
        "expected_gain": "about 1.7x (1.4x to 2x, more on a slow disk): 50 GPT-2-medium steps on 8x1024 tokens take "
                         "about 3.5 s, and each save moves 4.3 GB GPU->host (pageable) and through torch.save / "
                         "safetensors to the file system, about 2-4 s.",
    },
    {
        "name": "fresh5-lightning-healthy-llama",
        "framework": "lightning",
        "script": "fresh5_healthy_lightning.py",
        "args": ["--batch", "8", "--context", "1024", "--workers", "4"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Use more DataLoader workers: num_workers=8.",
                "args": ["--workers", "8"],
                "label": "more DataLoader workers (false alarm)",
            },
            {
                "text": "Double the batch to 16 sequences per step.",
                "args": ["--batch", "16"],
                "label": "larger batch (false alarm)",
            },
        ],
        "truth": "Healthy: the GPU is kept busy by a 540M-parameter bf16 decoder step (about 80 ms), the 4 "
                 "workers only slice token windows from RAM and the loop has no per-step host sync; nothing "
                 "needs changing.",
        "expected_gain": "none (under 1.05x for either change): the loader delivers 8 windows of 1,024 tokens per "
                         "80 ms step with 4 workers that each need well under 1 ms per batch, and the step's "
                         "matmuls (8,192 rows by width 2048/5632) already run near the GPU's peak, so a larger "
                         "batch only amortizes a few ms of fixed cost.",
    },
]
