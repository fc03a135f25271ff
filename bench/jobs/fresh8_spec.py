"""The fresh8 jobs: how to run each as-is on one H100, the change that fixes it (or, for the
healthy control, the changes a false alarm would most likely name), and what a right diagnosis
says. One literal ``SPEC`` list, readable with ``ast.literal_eval``."""

SPEC = [
    {
        "name": "fresh8-torch-dlrm-dense-adam",
        "framework": "torch",
        "script": "fresh8_dlrm_dense_adam.py",
        "args": ["--batch", "8192"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Make the 26 embedding tables nn.Embedding(sparse=True) and train them with "
                        "torch.optim.SparseAdam (only the rows a batch looked up are read and written), the MLPs "
                        "with Adam(fused=True).",
                "args": ["--sparse"],
                "label": "dense Adam over 945M embedding parameters every step, for ~1% of rows touched",
            },
            {
                "text": "Keep the dense tables but use Adam(fused=True) for all parameters (one fused kernel "
                        "instead of the foreach Adam's seven passes over the parameters).",
                "args": ["--fused-adam"],
                "label": "fused Adam (partial fix: same dense update, fewer passes over memory)",
            },
        ],
        "truth": "The DLRM's 26 embedding tables hold 14.8M rows x 64 = 945M parameters and are trained with a plain "
                 "torch.optim.Adam over model.parameters(). A batch of 8,192 samples looks up at most 26 x 8,192 = "
                 "213k rows (about 1.4 % of them, fewer with the skewed ids), but the dense embedding backward "
                 "materializes a full-size zero-filled gradient for every table and Adam (the default foreach "
                 "implementation: lerp, mul, addcmul, sqrt, div, add, addcdiv) then reads and writes the parameters, "
                 "both moment buffers and a temporary for all 945M of them. The GPU is busy, but with memory-bound "
                 "optimizer kernels over rows that had no gradient; the MLPs and the lookups are a few percent of "
                 "the step. Sparse gradients with SparseAdam (lazy Adam over the looked-up rows) fix it; a fused "
                 "dense Adam only cuts the passes over memory.",
        "expected_gain": "about 3.5x (2.5x to 5x) for --sparse on an H100: foreach Adam moves ~72 bytes per parameter "
                         "(lerp 12, mul 8, addcmul 12, sqrt 8, div 8, add 8, addcdiv 16), 945M x 72 B = 68 GB, ~24 ms "
                         "at ~2.8 TB/s; the dense embedding backward zero-fills 3.8 GB of gradients (~1.4 ms) and "
                         "sort-reduces 26 x 8,192 ids (~1.5 ms); the MLPs (~2.3M multiply-adds per sample, 0.11 TFLOP "
                         "per step for forward and backward) and the interaction take ~1.5-2 ms: ~29 ms per step, "
                         "~280k samples/s. With --sparse the GPU work is ~3 ms, and the step is bound by the CPU: "
                         "~0.7 ms to launch the ~110 forward ops, ~1 ms for the backward, and SparseAdam's per-table "
                         "loop (coalesce with a host sync, two sparse_mask, three sparse adds, ~10 elementwise ops: "
                         "~25 launches, ~0.2 ms per table, ~5.5 ms for 26 tables): ~7.5 ms, ~1.1M samples/s. 29 / 7.5 "
                         "= ~3.9x. On an H200 (4.8 TB/s) the dense step is ~19 ms, so ~2.5x. For --fused-adam: "
                         "about 2x (1.7x to 2.4x): the fused kernel moves 28 B per parameter (26.5 GB, ~9.5 ms), so "
                         "the step is ~14 ms.",
    },
    {
        "name": "fresh8-transformers-unfrozen-encoder",
        "framework": "transformers",
        "script": "fresh8_unfrozen_encoder.py",
        "args": ["--batch", "64", "--seq-len", "256"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Freeze the encoder for real: model.bert.requires_grad_(False), so autograd records nothing "
                        "for it and the backward pass only runs through the classification head (the optimizer "
                        "already holds only the head's parameters).",
                "args": ["--freeze-encoder"],
                "label": "full backward through an encoder that is never updated (head-only optimizer)",
            },
        ],
        "truth": "A linear probe: only the classifier of BertForSequenceClassification is trained (the optimizer is "
                 "built from model.classifier.parameters()), but the encoder's parameters still require grad, so "
                 "every step runs the full backward pass through the 12 BERT-base layers (data and weight "
                 "gradients, about twice the forward's work) and accumulates 110M parameter gradients that no "
                 "optimizer ever reads (they are not even zeroed). The GPU is busy, two thirds of the time with "
                 "useless backward kernels. requires_grad_(False) on model.bert (or running the encoder under "
                 "torch.no_grad()) fixes it: the step becomes the forward pass plus a tiny head backward.",
        "expected_gain": "about 2.8x (2.2x to 3.3x): 64 x 256 = 16,384 tokens through BERT-base. Forward: 2 x 85M x "
                         "16,384 = 2.8 TFLOP of matmuls (~7 ms at ~400 TFLOPS), 0.16 TFLOP of attention (~0.5 ms), "
                         "and ~98 bytes per hidden unit per token and layer of casts (q, k and v each cast the fp32 "
                         "hidden state), dropout, residual adds, LayerNorm and GELU, 14.8 GB, ~5.5 ms: ~13 ms. The "
                         "backward is about twice that (~14 ms of matmuls, ~1.3 ms attention, ~11 ms elementwise) plus "
                         "~0.5 ms to add into the never-zeroed encoder gradients: ~40 ms per step, ~1,600 samples/s. "
                         "Frozen, the step is the forward (~13 ms, GPU-bound: the ~3-4 ms of Python and launches for "
                         "the HF forward run ahead) plus a negligible head backward: ~13.5 ms, ~4,700 samples/s.",
    },
    {
        "name": "fresh8-lightning-detect-anomaly",
        "framework": "lightning",
        "script": "fresh8_detect_anomaly.py",
        "args": ["--batch", "16", "--context", "1024", "--workers", "4"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Turn autograd anomaly detection off: Trainer(detect_anomaly=False), the default.",
                "args": ["--no-detect-anomaly"],
                "label": "Trainer(detect_anomaly=True) left on: stack capture per op, NaN check with a sync per backward output",
            },
        ],
        "truth": "Trainer(detect_anomaly=True), switched on to hunt a NaN, is still on, so the whole fit loop runs "
                 "under torch.autograd.set_detect_anomaly(True). In the forward pass every autograd node created "
                 "(about 635 per step for this 8-block GPT, autocast casts and AccumulateGrad nodes included) "
                 "records the Python stack that created it (traceback.extract_stack and format_list over the ~40 "
                 "frames of Lightning's loop and the model), and in the backward pass the engine runs "
                 "isnan(output).any().item() on every gradient each node returns: a host sync per output, so the "
                 "GPU waits on the CPU between backward kernels. The step is bound by Python stack formatting and "
                 "synchronizations; the GPU is mostly idle. detect_anomaly=False fixes it.",
        "expected_gain": "about 7x (4x to 12x): healthy, a step is 16 x 1,024 = 16,384 tokens through a 25M-parameter "
                         "GPT: 6 x 25.3M x 16,384 = 2.5 TFLOP of matmuls (~7-9 ms at width 512), 0.5 TFLOP of causal "
                         "flash attention (~2 ms), ~132 bytes per hidden unit per token and layer of LayerNorm, "
                         "cast, GELU, dropout and residual traffic (17 GB, ~7 ms), under 1 ms of optimizer and "
                         "clipping: ~18 ms on the GPU with ~7 ms of CPU launching ahead of it, ~900 samples/s. With "
                         "anomaly mode: 635 stack captures at ~100-250 us each (measured on the development CPU: "
                         "~140 us for format_stack at Lightning's training_step depth of 31 frames, ~270 us per node "
                         "with the model's frames) = 65-160 ms of forward; ~750 NaN checks in the backward (isnan, "
                         "any, item: ~25-40 us each with the GPU serialized behind them) plus the ~11 ms of backward "
                         "kernels that no longer overlap: ~30-40 ms. ~100-200 ms per step, ~80-160 samples/s.",
    },
    {
        "name": "fresh8-timm-ema-cpu",
        "framework": "timm",
        "script": "fresh8_ema_cpu.py",
        "args": ["--batch", "128", "--workers", "8"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Keep the EMA copy of the weights on the GPU: ModelEmaV3(model, decay, device=None), so the "
                        "update is one torch._foreach_lerp_ queued after the optimizer step.",
                "args": ["--ema-on-gpu"],
                "label": "EMA kept on the CPU: every step copies 346 MB of weights to the host and lerps on the CPU",
            },
        ],
        "truth": "The model EMA is kept on the CPU (timm ModelEmaV3 with device='cpu', timm's --model-ema-force-cpu) "
                 "and updated after every optimizer step. For each of the 152 tensors of ViT-B/16 the update copies "
                 "the weights to the host with a blocking, pageable device-to-host copy (346 MB per step in all; "
                 "the first copy also waits for the whole step to finish) and then runs lerp_ on the CPU. Nothing "
                 "is queued on the GPU meanwhile, so the GPU idles for the whole update, about two thirds of every "
                 "step. Keeping the EMA on the GPU (a foreach lerp of ~1 GB of traffic, under a millisecond) fixes "
                 "it.",
        "expected_gain": "about 2.8x (2x to 4x): ViT-B/16 at batch 128 is 25,216 tokens: 6 x 85M x 25,216 = 12.9 TFLOP "
                         "of matmuls (~31 ms at ~420 TFLOPS), 0.64 TFLOP of attention over 197 tokens (~2.5 ms), "
                         "~257 bytes per hidden unit per token and layer of LayerNorm, cast, GELU, drop-path and "
                         "residual traffic (60 GB, ~21 ms), foreach AdamW and clipping over 86M parameters (~3 ms): "
                         "~58 ms, ~2,200 samples/s. The CPU EMA adds 346 MB of pageable device-to-host copies (4-10 "
                         "GB/s: 35-85 ms, plus ~25 us of fixed cost for each of the 152 copies) and lerp_ over 86.6M "
                         "floats on the CPU (1.04 GB of memory traffic at 15-40 GB/s: 26-70 ms): 70-160 ms, ~110 ms, "
                         "during which the GPU has nothing queued: ~170 ms per step, ~750 samples/s. 170 / 58.5 = "
                         "~2.9x.",
    },
    {
        "name": "fresh8-accelerate-healthy-lm",
        "framework": "accelerate",
        "script": "fresh8_healthy_accelerate.py",
        "args": ["--batch", "4", "--context", "2048", "--workers", "4"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Use more DataLoader workers: num_workers=8.",
                "args": ["--workers", "8"],
                "label": "more DataLoader workers (false alarm)",
            },
            {
                "text": "Double the batch to 8 sequences per step (GPU memory is only about half used).",
                "args": ["--batch", "8"],
                "label": "larger batch (false alarm)",
            },
            {
                "text": "Wrap the model in torch.compile.",
                "args": ["--compile"],
                "label": "torch.compile (false alarm)",
            },
        ],
        "truth": "Healthy: Accelerate with bf16 mixed precision keeps the GPU busy with a 1.27B-parameter GPT step "
                 "(width 2,048, 24 blocks, no biases or dropout, flash attention, fused AdamW) of ~160 ms, made "
                 "mostly of large matmuls (8,192 rows by widths 2,048 / 6,144 / 8,192 and the 32,768-token head); "
                 "the 4 workers only slice 2,049-token windows out of a memory-mapped file, and the loop has no "
                 "per-step host sync beyond Accelerate's blocking copy of the 64 KB batch (the loss is read once "
                 "per progress line). Nothing needs changing.",
        "expected_gain": "none (under 1.1x for any change): a step is 6 x 1.27B x 8,192 = 62.6 TFLOP of matmuls (~101 "
                         "ms at ~620 TFLOPS) plus 5.8 TFLOP of causal flash attention (~13 ms), ~184 bytes per hidden "
                         "unit per token and layer of LayerNorm, cast, GELU and residual traffic (74 GB, ~26 ms), "
                         "~13 ms of fused AdamW over 1.27B fp32 parameters (36 GB), ~5 ms of gradient clipping and ~2 "
                         "ms for the fp32 logits and loss: ~160 ms, ~25 samples/s. Workers: 4 windows per 160 ms, "
                         "each a 4 KB read from the page cache, so 8 workers change nothing (1.00x). Batch 8: only the "
                         "~18 ms of optimizer and clipping are paid per step: 160 / 4 = 40 ms per sequence against "
                         "(2 x 142 + 18) / 8 = 37.8 ms, ~1.06x; memory grows from ~40 GB to ~62 GB (activations ~78 KB per token and "
                         "layer). torch.compile leaves the matmuls and flash attention as they are and can only fuse "
                         "the elementwise work: saving ~40 % of its ~26 ms is ~10 ms (~1.06x).",
    },
]
