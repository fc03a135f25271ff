"""The fresh6 jobs: how to run each as-is on one H100, the change that fixes it (or, for the
healthy control, the changes a false alarm would most likely name), and what a right diagnosis
says. One literal ``SPEC`` list, readable with ``ast.literal_eval``."""

SPEC = [
    {
        "name": "fresh6-torch-float64-model",
        "framework": "torch",
        "script": "fresh6_float64.py",
        "args": ["--batch", "128"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Cast the recordings to float32 once after loading (so the batches are float32) and drop "
                        "model.double(): the model stays float32 and the existing bf16 autocast applies to it.",
                "args": ["--float32"],
                "label": "model and data in float64, which autocast leaves alone",
            },
        ],
        "truth": "The model was converted to float64 with model.double() to match float64 batches cut from a "
                 "pandas/numpy array. Autocast does not touch float64 tensors, so the bf16 autocast in the loop does "
                 "nothing: every matmul runs as an FP64 GEMM (about 60 TFLOPS peak on an H100 against about 990 for "
                 "bf16), attention falls back from flash attention to the unfused math path (no fused kernel takes "
                 "float64), and every activation is 8 bytes wide. The GPU is busy, but with slow FP64 work; float32 "
                 "data and a float32 model under bf16 autocast fix it.",
        "expected_gain": "about 7x (4x to 10x): a step is about 4 TFLOP (6 x 19M parameters x 32,768 tokens = 3.7 "
                         "TFLOP, plus 0.3 TFLOP of attention). In FP64 that is about 75 ms of GEMMs at ~50 TFLOPS, "
                         "~12 ms of small fp64 batched attention matmuls, and ~25-30 ms of memory traffic over fp64 "
                         "activations and the 128 x 8 x 256 x 256 score tensors (softmax, dropout, their backward): "
                         "~115 ms, ~1,100 samples/s. In bf16 the matmuls take ~9 ms at ~450 TFLOPS, flash attention "
                         "~1 ms and the elementwise work ~5 ms: ~15 ms, ~8,500 samples/s.",
    },
    {
        "name": "fresh6-transformers-pad-max-length",
        "framework": "transformers",
        "script": "fresh6_pad_max_length.py",
        "args": ["--batch", "32", "--max-length", "512"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Tokenize without padding (truncation at 512 only), pad each batch to its longest review with "
                        "DataCollatorWithPadding(pad_to_multiple_of=8), and group reviews of similar length into "
                        "batches (the Trainer's group-by-length sampler).",
                "args": ["--dynamic-padding"],
                "label": "every example padded to max_length=512",
            },
        ],
        "truth": "Every review is padded to 512 tokens when it is tokenized (padding='max_length'), while the mean "
                 "review has 126 tokens and the median 99, so about three quarters of the encoder's work (every "
                 "linear layer's rows for the pad tokens, and even more of the attention) goes to padding. The GPU "
                 "is busy, with useless work. Padding each batch only to its longest review, with batches grouped by "
                 "length, cuts the tokens per step about 3.8x.",
        "expected_gain": "about 2.5x (2x to 3.5x): BERT-base on 32 x 512 = 16,384 tokens is about 9.3 TFLOP (6 x 85M "
                         "x 16,384 + attention), ~35 ms per step in bf16 (~900 samples/s). Grouped batches pad to "
                         "~134 tokens on average (computed on this corpus with the Trainer's LengthGroupedSampler), "
                         "~4,300 tokens per step: ~9-11 ms of GPU work, but the step cannot get much below ~12-15 ms, "
                         "the CPU time to launch the ~1,000 kernels of forward, backward and optimizer and the "
                         "Trainer's per-step work. 35 / 13 = ~2.7x.",
    },
    {
        "name": "fresh6-lightning-cudnn-benchmark",
        "framework": "lightning",
        "script": "fresh6_cudnn_benchmark.py",
        "args": ["--batch", "32", "--workers", "6"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Pad each batch to a whole number of seconds (a multiple of 16,000 samples) instead of to the "
                        "exact longest clip, so only a handful of input lengths ever occur and cuDNN's autotuned "
                        "choices are reused.",
                "args": ["--pad-multiple", "16000"],
                "label": "cudnn.benchmark re-autotunes every step: a new input length every batch",
            },
            {
                "text": "Turn cudnn.benchmark off: Trainer(benchmark=False), padding unchanged.",
                "args": ["--no-benchmark"],
                "label": "cudnn.benchmark off (no autotuning trials; heuristics per new shape)",
            },
        ],
        "truth": "cudnn.benchmark=True with an input length that changes at every batch: each batch is padded to its "
                 "longest clip, to the sample, so nearly every step shows the 7 Conv1d layers a length never seen "
                 "before, and cuDNN autotunes every convolution again (forward, data gradient and weight gradient: "
                 "about 20 searches, each building and timing up to 10 candidate kernels with synchronizations in "
                 "between). The time goes to autotuning trials and the CPU's plan building, not to training. "
                 "Padding to a few fixed lengths (whole seconds) lets the tuned kernels be reused; turning "
                 "benchmark off removes the trials.",
        "expected_gain": "about 15x (5x to 30x) for whole-second padding: with cached kernels a step is ~37 ms (the "
                         "conv encoder is ~4.9 GFLOP per second of audio forward, x3 for training, over 32 clips "
                         "padded to 11.8 s on average = ~5.5 TFLOP, ~22 ms at ~250 TFLOPS; ~10 ms of GroupNorm and "
                         "GELU traffic over ~1.1 G activations; ~5 ms for the transformer), ~850 samples/s. A new "
                         "length costs ~20 cuDNN searches, each timing up to 10 engines at 1-3x the best one's time "
                         "(the convolutions take ~22 ms in all) plus plan building: ~0.4-1 s per step, and 599 of "
                         "600 batches have a length not seen before. Whole-second padding adds 4 % of samples "
                         "(12.25 s instead of 11.76 s on average) and leaves 10 lengths, each tuned once. For "
                         "benchmark=False: about 10x (4x to 25x): no trials, but cuDNN's heuristics still build a "
                         "plan for every new shape (~1-2 ms of CPU per convolution call, ~20 per step), so the step "
                         "lands near 40-60 ms.",
    },
    {
        "name": "fresh6-accelerate-cpu-metrics",
        "framework": "accelerate",
        "script": "fresh6_cpu_metrics.py",
        "args": ["--batch", "8", "--context", "1024"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Compute the response-token accuracy on the GPU (argmax, compare, masked sum into two GPU "
                        "counters) and read the counters only when the progress line is printed, instead of moving "
                        "the logits to the CPU and using numpy every step.",
                "args": ["--gpu-metrics"],
                "label": "full logits copied to the CPU and argmax'ed in numpy every step",
            },
        ],
        "truth": "Every step the whole logits tensor (8 x 1024 x 32,000 in fp32, 1.05 GB) is copied to the host "
                 "(synchronously, into freshly allocated pageable memory) and numpy takes its argmax on one core, "
                 "just to count correct response tokens for the progress line. The copy waits for the step to "
                 "finish and nothing is queued on the GPU while the copy and the numpy work run, so the GPU idles "
                 "for most of every step. The same counts computed on the GPU and read once per print fix it.",
        "expected_gain": "about 3.5x (2.5x to 5x): the training step is ~41 TFLOP (6 x 787M matmul parameters x 8,192 "
                         "tokens + ~2 TFLOP of attention), ~85 ms at ~480 TFLOPS, plus ~15 ms for AdamW over 0.85B "
                         "fp32 parameters and the fp32 logits and loss: ~100 ms, ~80 samples/s. The metric adds a 1.05 "
                         "GB device-to-host copy into pageable memory (~80-150 ms at 7-13 GB/s, page faults included) "
                         "and a numpy argmax over 262M floats (~130-250 ms at 4-8 GB/s): ~250-400 ms per step in "
                         "which the GPU has nothing to do.",
    },
    {
        "name": "fresh6-torch-healthy-gpt",
        "framework": "torch",
        "script": "fresh6_healthy_gpt.py",
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
        "truth": "Healthy: the GPU is kept busy by a 1.39B-parameter GPT step in bf16 (~165 ms) made mostly of large "
                 "matmuls (8,192 rows by width 2,560 / 7,680 / 10,240) and flash attention; the 4 workers only slice "
                 "2,049-token windows out of a memory-mapped file, and the loop has no per-step host sync (the loss "
                 "is read once per progress line). Nothing needs changing.",
        "expected_gain": "none (under 1.1x for any change): a step is ~73 TFLOP, ~105 ms of matmuls at ~650 TFLOPS, "
                         "~13 ms of flash attention, ~23 ms of LayerNorm/GELU/cast/residual traffic, ~14 ms of fused "
                         "AdamW over 1.39B fp32 parameters (39 GB of traffic), ~6 ms of gradient clipping and ~3 ms "
                         "for the loss. Workers: a batch is 4 windows read from the page cache, microseconds of work, "
                         "so 8 workers change nothing (1.00x). Batch 8: only the ~20 ms of optimizer and clipping are "
                         "paid per step, so doubling the batch saves ~20 ms per 8 samples (~1.06x). torch.compile "
                         "leaves the matmuls and flash attention as they are and can only fuse the ~25 ms of "
                         "elementwise and loss work; saving ~40 % of it is ~10 ms (~1.06x).",
    },
]
