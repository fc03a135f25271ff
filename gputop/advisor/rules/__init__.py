"""The advisor's rules: a table, one function per rule, each reading one ``AnalysisContext``.

A rule's function returns a ``Hit`` (the evidence in numbers, the exact change, what it should
bring, and the GPU-seconds the cause cost in the window) or ``None``; ``Rule.evaluate`` turns it
into a ``Finding``. Adding a rule means writing one function in the module of its theme and one
row of ``RULES`` below.

The modules, by theme: ``base`` (Rule, Hit, the shared cost bar and wording), ``stuck``, ``data``
(the input pipeline), ``host`` (syncs, copies, launches), ``precision``, ``fusion`` (memory-bound kernels between the matmuls), ``memory``,
``checkpoint`` (saves), ``convolution`` (cuDNN re-tuning), ``debug_modes`` (anomaly detection, a profiler left on), ``recompute`` (activation checkpointing where the memory fits), ``repeated_backward`` (one backward per loss), ``optimizer`` (unfused
optimizer steps), ``evaluation`` (evaluation inside the training loop), ``distributed``, ``parallel`` (nn.DataParallel), ``model_parallel`` (tensor parallelism where data parallelism fits), ``nccl`` (the ranks' NCCL settings), ``system`` (clocks, PCIe, ECC, persistence, environment) and
``unattributed``; ``threshold`` holds the type of their numbers. Each threshold is a named
``Threshold`` beside the rule that uses it, carrying its unit, how its number was chosen, why and
its source (a comment above it keeps whatever more there is to say); each check names the ones it
decides with (``@uses``), which its ``Rule`` lists and ``gputop rules`` shows. Shares of the
window ("idle 41 %") are shares of the time the breakdown covers: since the stack sampler
attached, up to the window length.
"""

from __future__ import annotations

from ...model import Severity
from .base import Check, Hit, Rule
from .checkpoint import check_checkpoint_stall
from .convolution import check_cudnn_disabled, check_cudnn_retune
from .debug_modes import check_anomaly_detection, check_profiler_in_loop
from .data import (
    check_cpu_oversubscribed,
    check_data_starved,
    check_io_bound,
    check_loader_respawn,
    check_attached_to_worker,
    check_small_shm,
    check_workers_blocked,
    check_workers_saturated,
    workers_for,
)
from .distributed import (
    check_accumulation_sync, check_batch_loaded_on_every_rank, check_collective_bound, check_collective_wait,
    check_manual_gradient_sync, check_rank_straggler,
)
from .evaluation import check_eval_every_step
from .host import (check_blocking_in_loop, check_copies_to_host, check_cpu_work_in_loop, check_host_sync, check_launch_bound,
                   check_pageable_h2d, sync_pattern)
from .memory import (check_memory_growth, check_memory_headroom, check_memory_near_limit, check_memory_rising,
                     check_oom_exit)
from .nccl import check_collectives_off_nvlink, check_nccl_env
from .fusion import check_memory_bound_kernels
from .gil import check_gil_held
from .host_tensor import check_tensor_built_on_cpu
from .parallel import check_data_parallel
from .model_parallel import check_tensor_parallel_fits
from .optimizer import check_optimizer_offload, check_unfused_optimizer
from .precision import check_float64_math, check_fp32_training, check_no_tensor_cores
from .recompute import check_activation_checkpointing
from .repeated_backward import check_backward_per_loss
from .stuck import check_stuck
from .system import (
    check_cuda_launch_blocking,
    check_ecc_errors,
    check_pcie_degraded,
    check_persistence_off,
    check_slow_env,
    check_throttling,
)
from .unattributed import check_idle_unattributed

__all__ = ["Check", "Hit", "Rule", "RULES", "RULES_BY_ID", "THROUGHPUT_IDS", "sync_pattern", "workers_for"]

# What a hung job makes moot: a job that makes no progress is not a slow one.
THROUGHPUT_IDS = (
    "data-parallel",
    "data-starved",
    "workers-saturated",
    "cpu-oversubscribed",
    "io-bound",
    "workers-blocked",
    "host-sync",
    "gil-held",
    "tensor-built-on-cpu",
    "pageable-h2d",
    "copies-to-host",
    "checkpoint-stall",
    "collective-wait",
    "rank-straggler",
    "collective-bound",
    "manual-grad-sync",
    "accumulation-sync",
    "batch-on-every-rank",
    "tensor-parallel-fits",
    "cpu-work-in-loop",
    "eval-every-step",
    "blocking-in-loop",
    "cudnn-retune",
    "anomaly-detection",
    "profiler-in-loop",
    "launch-bound",
    "unfused-optimizer",
    "float64-math",
    "no-tensor-cores",
    "mixed-precision",
    "memory-bound-kernels",
    "activation-checkpointing",
    "backward-per-loss",
    "memory-headroom",
)

W, I, C = Severity.WARNING, Severity.INFO, Severity.CRITICAL

# Order breaks ties between equal costs: the more specific cause first.
RULES: tuple[Rule, ...] = (
    Rule("stuck", "Job stuck: no progress", C, check_stuck, appear_after_s=0.0, supersedes=THROUGHPUT_IDS),
    # A worker's own view is not the job's: every finding of its would be about the fetch, and a
    # worker waiting on its index queue for a slow training process reads as stuck.
    Rule("attached-to-worker", "Attached to a DataLoader worker, not the training process", W,
         check_attached_to_worker, appear_after_s=0.0, supersedes=("stuck", *THROUGHPUT_IDS)),
    Rule("cuda-launch-blocking", "CUDA_LAUNCH_BLOCKING=1 makes every launch synchronous", W,
         check_cuda_launch_blocking, appear_after_s=0.0, supersedes=("host-sync", "launch-bound")),
    # One process's Python drives every GPU: the precision, launches and batch size the other
    # findings would name are each GPU's, seen through that bottleneck.
    Rule("data-parallel", "nn.DataParallel: one process drives several GPUs", W, check_data_parallel,
         supersedes=("launch-bound", "no-tensor-cores", "mixed-precision", "memory-headroom", "unfused-optimizer",
                     "cpu-work-in-loop", "host-sync")),
    Rule("data-starved", "GPU waits for data: no DataLoader workers", W, check_data_starved),
    # Every rank loads the global batch and keeps its part: the loading itself is W times what it
    # needs, before any worker count.
    Rule("batch-on-every-rank", "Every rank loads the whole global batch (no DistributedSampler)", W,
         check_batch_loaded_on_every_rank, supersedes=("data-starved", "workers-saturated")),
    Rule("cpu-oversubscribed", "CPU oversubscribed by loader threads", W, check_cpu_oversubscribed,
         supersedes=("workers-saturated",)),
    Rule("workers-saturated", "GPU waits for data: loader workers saturated", W, check_workers_saturated),
    Rule("io-bound", "GPU waits for storage: input is IO-bound", W, check_io_bound),
    Rule("workers-blocked", "GPU waits for data: loader workers blocked, not computing", W, check_workers_blocked),
    # The training thread cannot run: what it would launch, copy or sync waits for the thread holding the GIL.
    Rule("gil-held", "A thread of the job holds the GIL while the training thread waits", W, check_gil_held,
         supersedes=("launch-bound", "host-sync", "cpu-work-in-loop", "unfused-optimizer")),
    # The copy and the CPU work before it are one cause with one change (make it on the GPU, or
    # once): pinning the copy, removing a sync or graphs would not touch the making.
    Rule("tensor-built-on-cpu", "A tensor made on the CPU every step and copied to the GPU", W,
         check_tensor_built_on_cpu, supersedes=("pageable-h2d", "host-sync", "launch-bound", "cpu-work-in-loop")),
    Rule("pageable-h2d", "GPU waits for host-to-device copies", W, check_pageable_h2d),
    # The same wait with PCIe saying the bytes go the other way: pinning the batches would not touch it.
    Rule("copies-to-host", "GPU waits while the loop copies tensors to the host", W, check_copies_to_host,
         supersedes=("host-sync",)),
    Rule("host-sync", "Host-device syncs every step", W, check_host_sync),
    Rule("checkpoint-stall", "Checkpoint saves stall the GPU", W, check_checkpoint_stall),
    # The straggler's phase (its checkpoint save) is named in it, and the others' wait in
    # collectives is its symptom: one finding for the job, not three.
    Rule("rank-straggler", "One rank holds the others back", W, check_rank_straggler,
         supersedes=("collective-wait", "checkpoint-stall")),
    # Every rank waits alike because every micro-batch all-reduces: the change that fits is to skip
    # the sync of all but the last, before moving fewer bytes.
    Rule("accumulation-sync", "Gradient accumulation all-reduces every micro-batch (no no_sync())", W,
         check_accumulation_sync, supersedes=("collective-bound", "collective-wait")),
    # The ranks wait alike in the activations' collectives: splitting the layers is the cost, not
    # the bytes' route or a slow rank.
    Rule("tensor-parallel-fits", "Tensor parallelism where data parallelism fits", W, check_tensor_parallel_fits,
         supersedes=("collective-bound", "collective-wait", "launch-bound", "no-tensor-cores", "mixed-precision")),
    # Every rank waits alike: the job moves too many bytes per sample, nobody is waited for.
    Rule("collective-bound", "Communication-bound: every rank waits on collectives", W, check_collective_bound,
         supersedes=("collective-wait",)),
    Rule("manual-grad-sync", "Gradients all-reduced by hand, one tensor at a time", W, check_manual_gradient_sync,
         supersedes=("collective-wait",)),
    Rule("collective-wait", "GPU waits on collectives", W, check_collective_wait),
    Rule("nccl-env", "NCCL settings slow the ranks' communication", W, check_nccl_env, appear_after_s=0.0),
    # Measured where nccl-env reads the environment: what the links carry says P2P is off even
    # when the setting was made from Python after start.
    # The GPUs idle while the collectives crawl through host memory: that idle time is theirs, not
    # the launches' (a gloo job was told launch-bound; its main thread waited in backward).
    Rule("collectives-off-nvlink", "Collectives go through host memory, NVLink idle", W,
         check_collectives_off_nvlink, supersedes=("launch-bound",)),
    # Offloaded, the CPU step is the cost and the GPU has nothing to launch: fusing it or a larger
    # batch are not the change.
    Rule("optimizer-offload", "The optimizer runs on the CPU (offloaded) while the GPU idles", W,
         check_optimizer_offload, supersedes=("unfused-optimizer", "launch-bound")),
    Rule("unfused-optimizer", "Unfused optimizer: per-tensor launches while the GPU waits", W, check_unfused_optimizer),
    Rule("cpu-work-in-loop", "CPU work in the training loop while the GPU waits", W, check_cpu_work_in_loop,
         supersedes=("launch-bound",)),
    # Its samples (a forward, .item() reads) are left out of host-sync's, launch-bound's and
    # cpu-work-in-loop's evidence (base.in_evaluation): each names only what training does.
    Rule("eval-every-step", "Evaluation inside the training loop, every step or nearly", W, check_eval_every_step),
    Rule("blocking-in-loop", "The training loop blocks in a call of its own", W, check_blocking_in_loop),
    # The CPU time is inside convolution calls (cuDNN's algorithm search), not the dispatching:
    # compile or a larger batch would not touch it.
    Rule("cudnn-retune", "cuDNN re-tunes convolutions for each new input shape", W, check_cudnn_retune,
         supersedes=("launch-bound",)),
    # cuDNN off in the job's code: the convolutions' fallback is the launches and the idle tensor
    # cores; with cuDNN off there is no benchmark mode to re-tune.
    Rule("cudnn-disabled", "cuDNN turned off in the job's code", W, check_cudnn_disabled,
         supersedes=("launch-bound", "cudnn-retune", "no-tensor-cores", "mixed-precision", "cpu-work-in-loop")),
    # The forward's launches wait behind a Python stack walk each: compile, a larger batch or more
    # workers would not touch it.
    Rule("anomaly-detection", "Autograd anomaly detection left on", W, check_anomaly_detection,
         supersedes=("launch-bound", "cpu-work-in-loop", "host-sync", "no-tensor-cores", "mixed-precision")),
    # Its start/stop/export is Python of torch's own in the user's loop: CPU work in the loop
    # would name the loop's line with a change that does not touch it.
    Rule("profiler-in-loop", "A torch.profiler left running in the training loop", W, check_profiler_in_loop,
         supersedes=("launch-bound", "cpu-work-in-loop", "host-sync", "no-tensor-cores", "mixed-precision")),
    # The GPU's time goes to the repeated backward: precision or kernel-fusion knobs do not touch it.
    Rule("backward-per-loss", "One backward per loss through the same graph (retain_graph)", W,
         check_backward_per_loss, supersedes=("no-tensor-cores", "mixed-precision", "memory-bound-kernels")),
    Rule("launch-bound", "Launch-bound: the CPU cannot keep the GPU fed", W, check_launch_bound),
    # float64 is the cause before any precision knob: autocast does not touch it.
    Rule("float64-math", "The GPU computes in float64", W, check_float64_math,
         supersedes=("no-tensor-cores", "mixed-precision")),
    Rule("no-tensor-cores", "GPU busy but tensor cores idle", W, check_no_tensor_cores),
    Rule("mixed-precision", "compute-bound in fp32: bf16 mixed precision", W, check_fp32_training),
    Rule("memory-bound-kernels", "GPU full, tensor cores idle: memory-bound kernels", W, check_memory_bound_kernels),
    Rule("throttling", "GPU clocks throttled", W, check_throttling),
    Rule("ecc-errors", "Uncorrectable ECC errors", C, check_ecc_errors, appear_after_s=0.0),
    Rule("oom-exit", "Job ended out of memory", C, check_oom_exit, appear_after_s=0.0),
    Rule("memory-growth", "Memory grows towards its limit", W, check_memory_growth),
    Rule("memory-rising", "Memory rises, not judged yet (under a minute of history)", I, check_memory_rising),
    Rule("memory-near-limit", "GPU memory near its limit", W, check_memory_near_limit),
    Rule("pcie-link-degraded", "PCIe link below its maximum", W, check_pcie_degraded),
    Rule("small-shm", "Small /dev/shm for DataLoader workers", W, check_small_shm, appear_after_s=0.0),
    Rule("slow-env", "Debug settings in the job's environment", I, check_slow_env, appear_after_s=0.0),
    Rule("persistence-off", "Persistence mode off", I, check_persistence_off, appear_after_s=0.0),
    # Before memory-headroom: with both, the spare memory is first the room checkpointing saves.
    Rule("activation-checkpointing", "Activation checkpointing where the memory fits: recomputation costs time", W,
         check_activation_checkpointing),
    Rule("memory-headroom", "GPU memory to spare: a larger batch fits", I, check_memory_headroom),
    Rule("loader-respawn", "DataLoader workers restart every epoch", I, check_loader_respawn),
    Rule("idle-unattributed", "GPU idle, cause unknown: attach to the job", I, check_idle_unattributed),
)

RULES_BY_ID = {r.id: r for r in RULES}
