"""The fresh14 jobs: how to run each as-is on one H100/H200, the change that fixes it (or, for the
healthy control, the changes a false alarm would most likely name), what a right diagnosis says, and the
problem's class. One literal ``SPEC`` list, readable with ``ast.literal_eval``. For the four jobs with a
problem, the core of each figure was measured once on an H200 with a stand-in of the same shapes
(synthetic tensors, no DataLoader, Trainer or Lightning loop around it; mean of 5-10 timed steps after 3
warm-ups): the GPT with vocabularies 50,257 and 50,304, the Llama with eager and SDPA attention, ViT-B/16
with and without the hooks, and the per-photo v2 loop against a batched augmentation (with a ResNet-18
behind it). The rest, the H100 figures and the healthy control, were reasoned out."""

SPEC = [
    {
        "name": "fresh14-torch-gpt2-unpadded-vocab-50257",
        "framework": "torch",
        "class": "unaligned-gemm-dimension",
        "script": "fresh14_torch_gpt_odd_vocab.py",
        "args": ["--batch", "32"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Pad the vocabulary of the embedding / LM head from the tokenizer's 50,257 up to a multiple "
                        "of 64 (50,304; the extra rows are never a target and their logits are driven down), so that "
                        "the logits' rows and the LM-head matrices have 16-byte-aligned leading dimensions and "
                        "cuBLAS can use its Hopper tensor-core kernels for the three LM-head GEMMs.",
                "args": ["--pad-vocab"],
                "label": "vocabulary of 50,257 (odd) in the tied embedding / LM head: the three LM-head GEMMs run in slow narrow-alignment cuBLAS kernels",
            },
        ],
        "truth": "A GPT-2-small-sized model (124M parameters, 12 x 768, 1,024 tokens, tied wte / lm_head) is "
                 "trained with the GPT-2 tokenizer's vocabulary as the row count: 50,257, an odd number. Each "
                 "step does three GEMMs with that dimension: the logits h[32,768 x 768] @ W^T (output rows "
                 "50,257 long), dh = dlogits @ W (reduction over 50,257) and dW = dlogits^T @ h (dlogits read "
                 "with a leading dimension of 50,257). A bf16 matrix whose leading dimension is not a multiple "
                 "of 8 elements is not 16-byte aligned, so cuBLAS cannot use its TMA / wgmma Hopper kernels "
                 "and falls back to narrow-alignment (align1/align2) Ampere-style tensor-core kernels. The "
                 "three GEMMs are 7.6 TFLOP a step (29 % of the step's ~26 TFLOP); measured in a stand-in on an "
                 "H200 they take ~52 ms (~145 TFLOPS) against ~14 ms (~540 TFLOPS) at 50,304, and the cross "
                 "entropy over the 32,768 x 50,257 logits also runs on unaligned rows. Nothing else is wrong: "
                 "bf16 autocast, flash attention, fused AdamW, the next batch pinned and copied while the GPU "
                 "works, the loss read once a second. The GPU is busy all the time; the kernel time is "
                 "dominated by the slow GEMM kernels for the LM head.",
        "expected_gain": "about 1.6x (1.4x to 1.8x): a stand-in of this model on an H200 (same shapes, tied head, "
                         "autocast cross entropy, fused AdamW) ran a step in 136 ms with vocabulary 50,257 and "
                         "84 ms with 50,304: 1.62x; the LM-head forward + backward alone went from 52 to 14 ms. "
                         "On an H100 the GEMM rates are the same and the memory-bound parts (cross entropy over "
                         "3.3 GB of logits, LayerNorms, AdamW) ~1.4x slower: ~142 ms against ~90 ms, 1.58x "
                         "(~225 against ~355 sequences/s). The host issues ~600 kernels a step (~6 ms), far "
                         "behind the GPU in both variants.",
    },
    {
        "name": "fresh14-hf-llama-eager-attention",
        "framework": "transformers",
        "class": "eager-attention-implementation",
        "script": "fresh14_hf_llama_eager_attention.py",
        "args": ["--batch", "6"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Build the model with attn_implementation=\"sdpa\" (or drop the argument: SDPA is the "
                        "default) instead of \"eager\", which was kept from a probing experiment that needed "
                        "output_attentions. SDPA runs flash attention and never materialises the 2,048 x 2,048 "
                        "score and probability matrices.",
                "args": ["--attn-implementation", "sdpa"],
                "label": "attn_implementation=\"eager\": every layer materialises [6, 16, 2,048, 2,048] scores, an fp32 softmax and bf16 probabilities, forward and backward, instead of flash attention",
            },
        ],
        "truth": "The Llama model (16 layers, 1,024 wide, 16 heads of 64, ~271M parameters) is built from its "
                 "config with attn_implementation=\"eager\", so every layer's attention is the Python "
                 "reference path: q @ k^T into a [6, 16, 2,048, 2,048] bf16 score tensor (403M elements, "
                 "0.8 GB), the 4-D causal mask added, softmax in fp32 (1.6 GB) cast back to bf16, then "
                 "probabilities @ v; all of it is saved for the backward, which re-reads it and runs the "
                 "softmax backward and two more batched GEMMs over the full square (the causal half is "
                 "computed and masked, not skipped). That is well over 10 GB of HBM traffic per layer per step "
                 "(forward and backward) and ~54 GB of activations at the peak (sdpa: ~18 GB). With SDPA the same attention is one flash kernel "
                 "forward and one backward per layer, over the causal half only, on-chip. Nothing else is "
                 "wrong: Trainer with bf16 autocast, fused AdamW, full 2,048-token packed sequences (no "
                 "padding), 4 pinned workers that keep up easily, logging off. The GPU is busy all the time; "
                 "the time goes to the attention's softmax/mask/copy kernels and batched GEMMs.",
        "expected_gain": "about 2.6x (2.0x to 3.2x): a stand-in of this model on an H200 (forward + backward under "
                         "bf16 autocast, batch 8 x 2,048) took 331 ms with eager attention and 125 ms with SDPA "
                         "(2.66x; at 1,024 tokens 1.84x), peak memory 72 GB against 24 GB. At batch 6 that is "
                         "~248 ms against ~94 ms, plus ~5 ms in both for clipping, fused AdamW over 271M "
                         "parameters and the Trainer's per-step isnan check: ~253 against ~99 ms, 2.55x (~24 "
                         "against ~61 sequences/s). On an H100 eager's memory-bound attention traffic is ~1.4x "
                         "slower and flash attention about as fast, so the ratio is a little higher (~2.8x). "
                         "Eager at batch 6 needs ~57-60 GB with the AdamW state: it fits an 80 GB H100.",
    },
    {
        "name": "fresh14-timm-vit-activation-stat-hooks",
        "framework": "timm",
        "class": "forward-hooks-on-every-module",
        "script": "fresh14_timm_vit_activation_hooks.py",
        "args": ["--batch", "256", "--workers", "8"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Sample the activation statistics on one step in 100 (the hooks return at once on the "
                        "others), or register the monitor's hooks only on the steps that are logged, instead of "
                        "computing mean / std / max |x| of every module's output on every step.",
                "args": ["--stats-every", "100"],
                "label": "activation-statistics forward hooks on all ~237 leaf modules run every step: an fp32 copy, mean, std, abs and amax of every activation, ~1.5 GB of extra HBM traffic per image",
            },
        ],
        "truth": "ActivationMonitor registers a forward hook on every leaf module of the ViT-B/16 (~237: the "
                 "patch-embedding conv, every LayerNorm, qkv / proj / fc1 / fc2 Linear, GELU, Dropout, "
                 "DropPath and Identity) and, with --stats-every 1, each hook runs on every step: it makes an "
                 "fp32 copy of the module's output (bf16 under autocast), then mean, std, abs and amax "
                 "reductions over it, a stack and an add into a GPU accumulator. Per image that touches ~58M "
                 "output elements at ~26 bytes each, ~1.5 GB, i.e. ~390 GB of extra HBM traffic per step of "
                 "256 chips, and ~1,700 extra small kernels. It has no host sync (the sums are copied out "
                 "every 200 steps), so the GPU stays busy, a good half of its time in the monitor's "
                 "reduction, abs and copy kernels rather than in the model. Everything else is in order: "
                 "bf16 autocast, fused attention, fused AdamW, 8 pinned workers cutting uint8 crops, "
                 "normalisation on the GPU, the loss read once a second.",
        "expected_gain": "about 2.4x (1.9x to 2.9x): a stand-in on an H200 (timm vit_base_patch16_224, batch 256, "
                         "bf16 autocast, fused AdamW) ran a step in 93 ms without hooks and 218 ms with the same "
                         "hooks on its 237 leaf modules: 2.36x. With --stats-every 100 the hooks cost ~0.3 ms of "
                         "Python on 99 steps in 100 and ~125 ms on the hundredth: ~1.3 ms a step on average, so "
                         "~95 against ~218 ms, 2.3x (~2,700 against ~1,170 chips/s). On an H100 the model is a "
                         "little slower (~100 ms) and the hooks' memory-bound traffic ~1.4x slower (~165 ms): "
                         "~2.6x. The data path (8 workers, a batch every ~6 ms) is not a limit in either case.",
    },
    {
        "name": "fresh14-lightning-resnet50-per-photo-gpu-augment",
        "framework": "lightning",
        "class": "per-sample-gpu-augmentation-loop",
        "script": "fresh14_lightning_per_image_augment.py",
        "args": ["--batch", "256", "--workers", "8"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Augment the whole batch at once in on_after_batch_transfer: draw the per-photo crop boxes, "
                        "flip mask and jitter factors as tensors, crop and resize with one roi_align (or "
                        "affine_grid + grid_sample), and apply flip, brightness, contrast, saturation and the "
                        "normalisation as batched elementwise ops; or keep torchvision's per-image transforms but "
                        "run them in the DataLoader workers. Not a Python loop that calls the v2 pipeline once "
                        "per photo on the GPU in the main process.",
                "args": ["--batched-augment"],
                "label": "GPU augmentation called photo by photo in a Python loop (torchvision v2 Compose per image in on_after_batch_transfer): ~6,000 tiny kernels and ~165 ms of host time per batch, the GPU waiting",
            },
        ],
        "truth": "on_after_batch_transfer runs torch.stack([self.augment(img) for img in x]): the torchvision v2 "
                 "pipeline (RandomResizedCrop with antialias, RandomHorizontalFlip, ColorJitter of brightness, "
                 "contrast and saturation, ToDtype, Normalize) is called once per photo, 256 times a batch, on "
                 "CUDA tensors, so that every photo gets its own random parameters. Each call costs ~0.6 ms of "
                 "Python (v2's dispatch, parameter sampling, ~20-25 kernel launches of a 3 x 256 x 256 image: "
                 "resize passes, flip, blends, grayscale, means, clamps, casts): ~165 ms of main-thread work "
                 "per batch, before Lightning can run the training step, and ~6,000 kernels of a few "
                 "microseconds each. The ResNet-50 step itself (bf16-mixed, channels_last, fused SGD, no "
                 "per-step logging or sync) is ~80-90 ms of GPU work, so the job is bound by the host: the GPU "
                 "idles about half the time, between bursts of tiny augmentation kernels. The workers (8, "
                 "persistent, pinned) only index uint8 frames and are far ahead.",
        "expected_gain": "about 2x (1.6x to 2.6x): measured on an H200 with a ResNet-18 behind it, a step with the "
                         "per-photo v2 loop over 256 photos took 165 ms (512: 341 ms, ~0.64 ms a photo) against "
                         "20.5 ms with a batched crop + normalise: the loop alone is ~160-165 ms of host time. With "
                         "ResNet-50 (~6.3 TFLOP a step of 256 at 224 px plus BatchNorm/ReLU traffic: ~80-90 ms "
                         "on an H100 in eager bf16 channels_last) the step as-is is the loop plus the model's "
                         "~12-15 ms of launches and Lightning's loop: ~180 ms, ~1,420 photos/s; batched, the "
                         "augmentation is ~15 kernels over the batch (~1-2 ms of GPU, ~1 ms of host) and the step "
                         "is GPU-bound at ~85-90 ms, ~2,900 photos/s: ~2.0x.",
    },
    {
        "name": "fresh14-torch-healthy-dit-b2-latents",
        "framework": "torch",
        "class": "healthy",
        "script": "fresh14_healthy_dit_latents.py",
        "args": ["--batch", "256", "--workers", "4"],
        "tiny_args": [],
        "changes": [
            {
                "text": "Use more DataLoader workers: num_workers=8.",
                "args": ["--workers", "8"],
                "label": "more DataLoader workers (false alarm)",
            },
            {
                "text": "Train with a larger batch (512 latents) to use the GPU better.",
                "args": ["--batch", "512"],
                "label": "a larger batch (false alarm)",
            },
            {
                "text": "Update the EMA weights every 10 steps instead of every step.",
                "args": ["--ema-every", "10"],
                "label": "a less frequent EMA update (false alarm)",
            },
        ],
        "truth": "Healthy: a DiT-B/2 (130M parameters, 12 adaLN-Zero blocks of width 768, 256 tokens per latent) "
                 "trained on precomputed VAE latents with bf16 autocast, flash attention, fused AdamW and a "
                 "foreach EMA, batches of 256. A step is ~36 TFLOP of bf16 GEMMs (M = 65,536 tokens, K/N "
                 "768-3,072) plus LayerNorm / modulate / gate / GELU / residual traffic (~120 GB forward and "
                 "backward) and small flash-attention kernels over 256-token sequences: ~110 ms of GPU work on "
                 "an H100, against ~1,000 kernels and ~10 ms of host work. The 4 persistent workers only index "
                 "8 KB fp16 latents (a batch in ~3 ms each, one needed every ~110 ms); the batch is pinned and "
                 "copied asynchronously; timesteps, noise and the label drop are drawn on the GPU; the loss is "
                 "read once a second. There is no per-step host sync and the GPU runs back to back. Nothing "
                 "needs changing.",
        "expected_gain": "none (under 1.1x for any change): ~36 TFLOP a step at ~500 TFLOPS (~72 ms) plus ~120 GB "
                         "of elementwise traffic (~35 ms) and ~3 ms of flash attention: ~110 ms, ~2,300 "
                         "latents/s on an H100. Workers: 4 deliver a batch every ~1 ms, so 8 change nothing "
                         "(1.00x). Batch 512 (~56 GB of activations against ~28 GB, fits) doubles kernels that "
                         "already fill the GPU (65,536-row GEMMs); only the per-step fixed costs are amortised: "
                         "fused AdamW over 130M parameters (~3.6 GB of traffic, ~1.1 ms) and the EMA lerp (~1.6 "
                         "GB, ~0.5 ms), ~1.5 % of the step: ~1.01x. EMA every 10 steps saves ~0.45 ms a step: "
                         "~1.004x.",
    },
]
