"""The fresh10 jobs: how to run each as-is on one H100, the change that fixes it (or, for the
healthy control, the changes a false alarm would most likely name), and what a right diagnosis
says. One literal ``SPEC`` list, readable with ``ast.literal_eval``."""

SPEC = [
    {
        "name": "fresh10-transformers-trainer-default-batch",
        "framework": "transformers",
        "script": "fresh10_hf_default_batch.py",
        "args": [],
        "tiny_args": [],
        "changes": [
            {
                "text": "Set per_device_train_batch_size=128 in the TrainingArguments instead of leaving the "
                        "Trainer's default of 8 (scale the learning rate with it).",
                "args": ["--batch", "128"],
                "label": "Trainer's default per_device_train_batch_size=8: 1,024 tokens per step through BERT-base, the step is CPU/launch-bound",
            },
        ],
        "truth": "The Trainer runs with its default per_device_train_batch_size of 8, so every step is 8 tickets x "
                 "128 tokens = 1,024 tokens through a 110M-parameter BERT-base. That much work takes the H100 a few "
                 "milliseconds, but the step costs ~20 ms of CPU: HF's Python module calls and ~1,000 kernel "
                 "launches forward and backward, the bf16 weight casts, gradient clipping, the fused optimizer, "
                 "the scheduler and callbacks, and the Trainer's per-step NaN/Inf check on the loss, which "
                 "synchronizes with the GPU so the CPU cannot run ahead. The GPU idles most of the time between "
                 "tiny kernels; throughput is set by the CPU, whatever the batch. A per-device batch of 128 (or "
                 "more) keeps the same per-step CPU cost and gives the GPU 16x the work per step.",
        "expected_gain": "about 7x (4x to 12x): at batch 8 the step is CPU-bound at ~20 ms (12 encoder layers of ~25 "
                         "kernels forward and ~50 backward plus HF's Python overhead, ~15 ms; clipping, fused AdamW, "
                         "scheduler, callbacks, the single-process data loading of 8 samples and the NaN-check "
                         "synchronization, ~4 ms), ~400 tickets/s; the GPU's share is ~5 ms (6 x 85M x 1,024 = 0.5 "
                         "TFLOP in small GEMMs). At batch 128 (16,384 tokens) the GPU work is 6 x 85M x 16,384 = 8.4 "
                         "TFLOP of matmuls (~16 ms at ~520 TFLOPS), ~0.3 TFLOP of attention over 128 tokens (~1 ms), "
                         "~300 bytes per hidden unit per token and layer of fp32 LayerNorms, casts, dropout masks, "
                         "GELU and residuals over forward and backward (45 GB, ~18 ms), embedding gradient and fused "
                         "AdamW over 110M parameters (~2 ms): ~37 ms; the per-step NaN-check synchronization and the "
                         "main-process collation of 128 samples leave the GPU idle ~5 ms per step: ~42 ms, ~3,000 "
                         "tickets/s. 3,000 / 400 = 7.5x.",
    },
    {
        "name": "fresh10-lightning-lstmcell-loop",
        "framework": "lightning",
        "script": "fresh10_lightning_lstm_cells.py",
        "args": ["--batch", "512", "--workers", "4"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Replace the nn.LSTMCell stacks driven by Python loops over the 336 encoder and 96 decoder "
                        "steps with 2-layer nn.LSTM modules run over the whole sequences (cuDNN); with teacher "
                        "forcing the decoder inputs are known up front, and the head is applied once to all 96 "
                        "outputs.",
                "args": ["--cudnn-lstm"],
                "label": "seq2seq LSTM unrolled in Python with nn.LSTMCell: ~864 cell calls and ~10,000 tiny kernels per step",
            },
        ],
        "truth": "The forecaster's encoder and decoder are nn.LSTMCell stacks stepped by Python for-loops: 336 "
                 "encoder steps and 96 decoder steps, 2 layers each, the output head called at every decoder "
                 "step. Each cell call launches two small matmuls (512 x 256 by 256 x 1,024 in TF32) and a fused "
                 "gate kernel and records autograd nodes; the backward pass replays ~11 kernels per cell call, "
                 "plus the gradient sums for weights used 432 times. One step is ~864 cell calls, ~10,000 kernels "
                 "of a few microseconds each: the training step is bound by the CPU issuing them (Python "
                 "module calls, dispatch, the autograd engine), and the GPU idles between kernels. Running the "
                 "same layers as nn.LSTM (cuDNN), whose recurrence runs inside cuDNN with the input projections "
                 "batched over all time steps, fixes it; teacher forcing makes the decoder's inputs available up "
                 "front, so the model computes the same function.",
        "expected_gain": "about 5x (3x to 8x): per cell call ~40 us of CPU forward (the LSTMCell module call, "
                         "dispatch and 3 launches) and ~60 us backward (~11 kernels from the autograd engine: the "
                         "fused-cell backward, 4 matmuls, gradient sums), so 864 cell calls plus 96 head calls and "
                         "the decoder's concatenations cost ~95 ms of CPU per step, while the GPU needs ~40 ms for the "
                         "same ~10,000 kernels (~4 us each): ~95 ms per step, ~5,400 windows/s. With cuDNN: the "
                         "input projections are one GEMM per layer; the recurrence is 432 steps x 2 layers of one "
                         "512 x 256 x 1,024 GEMM and a gate kernel issued inside cuDNN (~7 us per step and layer "
                         "forward, ~2x that backward): ~6 ms forward, ~12 ms backward, plus the head, loss, Adam and "
                         "Lightning's per-step overhead (~1 ms on the GPU, ~2 ms of CPU that overlaps): ~19 ms, "
                         "~27,000 windows/s. 95 / 19 = ~5x. The 4 workers build 512 windows of 432 x 5 floats in "
                         "~10 ms per batch each, far ahead.",
    },
    {
        "name": "fresh10-timm-cudnn-disabled",
        "framework": "timm",
        "script": "fresh10_timm_cudnn_off.py",
        "args": ["--batch", "256", "--workers", "8"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Leave cuDNN enabled: drop torch.backends.cudnn.enabled = False (and cudnn.deterministic = "
                        "True) from seed_everything, so the script's cudnn.benchmark = True takes effect.",
                "args": ["--keep-cudnn"],
                "label": "torch.backends.cudnn.enabled = False in the seeding helper: convolutions fall back to per-image im2col + GEMM",
            },
        ],
        "truth": "A reproducibility helper, seed_everything(), sets torch.backends.cudnn.deterministic = True and "
                 "torch.backends.cudnn.enabled = False. With cuDNN disabled, PyTorch runs every convolution with "
                 "its fallback slow_conv2d (im2col + cuBLAS GEMM), which loops over the images of the batch in "
                 "C++: for each of ResNet-50's 53 convolutions and each of the 256 images, an im2col and a small "
                 "GEMM forward, a GEMM and a col2im for the input gradient, and an im2col and a GEMM for the "
                 "weight gradient (1x1 stride-1 convolutions skip the im2col). That is ~64,000 small kernel "
                 "launches per step, each a few microseconds of CPU and of GPU, instead of ~160 cuDNN "
                 "convolution calls. The GPU is busy, but with tiny, poorly-filled GEMMs and im2col/col2im "
                 "copies; the CPU thread is saturated issuing them. Leaving cuDNN on (the channels_last bf16 "
                 "cuDNN kernels, cudnn.benchmark) fixes it.",
        "expected_gain": "about 6x (3.5x to 9x): per image, the 20 convolutions that need columns (the 7x7 stem, "
                         "16 3x3 and 3 strided 1x1 downsamples) launch 2 kernels forward, 2 for the input gradient "
                         "(none for the stem) and 2 for the weight gradient; the 33 stride-1 1x1 convolutions 1, 2 "
                         "and 1: ~250 launches per image, ~64,000 per 256-image step. A cuBLAS GEMM call costs ~5 us "
                         "on the host and an im2col/col2im launch ~3 us; on the GPU the per-image GEMMs (e.g. 64 x "
                         "3,136 x 576 or 1,024 x 196 x 256, 0.1-0.25 GFLOP) and the column copies take ~3-6 us "
                         "each: ~4.5 us per launch, ~290 ms, plus ~30 ms of batch norms, ReLUs and the rest: ~320 "
                         "ms per step, ~800 images/s. With cuDNN: 6.3 TFLOP of channels_last bf16 convolutions "
                         "(~22 ms at ~290 TFLOPS), ~28 bytes per activation of batch norm / ReLU / residual traffic "
                         "over forward and backward (77 GB, ~30 ms), SGD over 25.6M parameters (<1 ms): ~55 ms, "
                         "~4,600 images/s; the 8 workers crop and flip 256 stored uint8 images in ~20 ms per batch "
                         "each, far ahead. 320 / 55 = ~5.8x.",
    },
    {
        "name": "fresh10-torch-triplet-anchor-loop",
        "framework": "torch",
        "script": "fresh10_triplet_anchor_loop.py",
        "args": ["--speakers-per-batch", "64", "--utts-per-speaker", "4", "--workers", "6"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Mine the hardest positive and negative of all anchors at once: "
                        "dist.masked_fill(~mask, -inf).amax(1) and dist.masked_fill(mask, inf).amin(1), instead of "
                        "a Python loop over the 256 anchors with boolean-mask indexing.",
                "args": ["--vectorized-mining"],
                "label": "batch-hard triplet loss mined in a Python loop over 256 anchors with boolean-mask indexing (a nonzero sync each)",
            },
        ],
        "truth": "The batch-hard triplet loss loops over the 256 anchors in Python and, for each, indexes its "
                 "row of the distance matrix with boolean masks (dist[i][mask[i]].max(), "
                 "dist[i][mask[i] == 0].min()). Boolean-mask indexing on the GPU runs nonzero and copies the "
                 "number of selected elements back to the host, so each of the 512 indexings synchronizes the "
                 "CPU with the GPU, and the backward pass's index_put with the same masks synchronizes again. "
                 "The loss is ~2,000 tiny kernels forward and ~5,000 backward (per-anchor max/min backward, "
                 "index backward, select backward, gradient sums), issued one at a time with ~1,000 host "
                 "round trips in between: the CPU cannot run ahead, and the GPU idles through most of the loss "
                 "while the x-vector model itself needs only ~20 ms per step. Masked max/min over the whole "
                 "distance matrix gives the same loss in a handful of kernels.",
        "expected_gain": "about 4.5x (3x to 7x): the model is 10.9M convolution parameters applied over ~290 frames: "
                         "6.3 GFLOP per utterance forward, 4.8 TFLOP per 256-utterance step forward and backward "
                         "(~12 ms at ~400 TFLOPS in cuDNN's bf16 1-D convolutions), ~530M activations of batch "
                         "norm and ReLU at ~28 bytes each over forward and backward (15 GB, ~6 ms), the pooling, "
                         "embedding and fused AdamW over 14M parameters (~1 ms): ~19 ms, ~13,000 utterances/s. The "
                         "anchor loop costs ~130 us per anchor forward (~12 Python-level tensor ops and 2 "
                         "synchronizing nonzeros, ~20 us each) and ~5,000 kernels plus 512 synchronizations backward "
                         "(~35 ms): ~70 ms per step during which the GPU mostly waits, on top of the model's ~19 ms, "
                         "which can no longer overlap with the CPU: ~90 ms per step, ~2,800 utterances/s. 90 / 19 = "
                         "~4.7x. The 6 workers cut 256 crops of 80 x 300 in ~15 ms per batch each, far ahead.",
    },
    {
        "name": "fresh10-torch-healthy-parallel-gpt",
        "framework": "torch",
        "script": "fresh10_healthy_parallel_gpt.py",
        "args": ["--micro-batch", "4", "--accum", "8", "--workers", "2"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Use more DataLoader workers: num_workers=8.",
                "args": ["--workers", "8"],
                "label": "more DataLoader workers (false alarm)",
            },
            {
                "text": "Double the micro-batch to 8 sequences of 2,048 tokens (GPU memory is ~50 GB of 80 GB used).",
                "args": ["--micro-batch", "8"],
                "label": "larger micro-batch (false alarm)",
            },
            {
                "text": "Wrap the model in torch.compile.",
                "args": ["--compile"],
                "label": "torch.compile (false alarm)",
            },
        ],
        "truth": "Healthy: a 1.7B-parameter GPT with GPT-J-style parallel blocks (width 2,560, 20 layers, no "
                 "biases or dropout) trained with bf16 autocast, flash attention via SDPA and fused AdamW; a "
                 "micro-batch is 8,192 tokens and the GPU spends ~80 % of its ~195 ms on large bf16 matmuls and "
                 "flash attention. The 2 workers only slice 2,049-token windows out of a memory-mapped shard, and "
                 "the only host synchronization is the once-a-second loss read. Nothing needs changing.",
        "expected_gain": "none (under 1.1x for any change): a micro-batch is 6 x 1.70B x 8,192 = 83.6 TFLOP of matmuls "
                         "(~139 ms at ~600 TFLOPS), 6.0 TFLOP of causal flash attention over 2,048 tokens (~17 ms), "
                         "~130 bytes per hidden unit per token and layer of LayerNorm, casts, the attention-output "
                         "transpose, GELU and fp32 residual traffic over forward and backward (55 GB, ~20 ms), the "
                         "fp32 cross entropy over 50,304 logits (~11 GB, ~4 ms), the per-micro-batch bf16 casts of "
                         "the weights and fp32 gradient accumulation (~41 GB, ~15 ms) and 1/8 of a fused AdamW "
                         "step (~2 ms): ~196 ms, ~20 sequences/s. Workers: 4 windows per 196 ms, each a ~20 us "
                         "slice, so 8 workers change nothing (1.00x). Micro-batch 8: only the ~15 ms of "
                         "per-micro-batch weight casts and gradient accumulation is amortized: 196 / 4 = 49 ms per "
                         "sequence against (2 x 181 + 15) / 8 = 47 ms, ~1.04x (memory ~50 GB -> ~67 GB). "
                         "torch.compile cannot touch the matmuls, flash attention, weight casts or gradient "
                         "accumulation; fusing the ~20 ms of elementwise work and the cross entropy saves ~10-12 "
                         "ms: ~1.06x.",
    },
]
