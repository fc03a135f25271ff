#!/usr/bin/env bash
# Record the held-out NCCL jobs of bench/jobs/multi_rank_fresh.py (gputop record on the launcher,
# attached as bench/multi_rank.py attaches) for a look at what gputop saw. Usage: OUTDIR MODE...
set -u
res=${1:?out dir}; shift
mkdir -p "$res"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD/bench/jobs:${PYTHONPATH:-}"
for mode in "$@"; do
  log="$res/$mode.log"
  python3 -m torch.distributed.run --standalone --nproc-per-node 2 bench/jobs/multi_rank_fresh.py --job "$mode" \
      --device cuda > "$log" 2>&1 &
  launcher=$!
  t0=$(date +%s)
  for _ in $(seq 240); do [ "$(grep -c ready "$log")" -ge 2 ] && break; sleep 0.5; done
  sleep $(( 12 - ($(date +%s) - t0) > 0 ? 12 - ($(date +%s) - t0) : 0 ))
  python3 -m gputop record -o "$res/$mode.gputop" --pid "$launcher" --duration 20s > "$res/$mode.rec.txt" 2>&1
  nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv >> "$res/$mode.rec.txt" 2>&1
  timeout 8 ncclras >> "$res/$mode.rec.txt" 2>&1
  pkill -9 -P "$launcher" 2>/dev/null; kill -9 "$launcher" 2>/dev/null; pkill -9 -f multi_rank_fresh 2>/dev/null; wait 2>/dev/null
done
