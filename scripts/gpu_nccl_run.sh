#!/usr/bin/env bash
# One batch on a 2-GPU machine: the multi-rank benchmark on NCCL (the modes and held-out jobs
# given), and optionally a screenshot of the Ranks and Advisor tabs and a recording of one job.
# Usage: scripts/gpu_nccl_run.sh OUTDIR MODES FRESH [shots|-] [measure-fixes|fixes-only]
#   MODES / FRESH: comma lists for bench/multi_rank.py --modes / --fresh ('' for none)
set -u
res=${1:?out dir}; modes=${2-}; fresh=${3-}; extra=${4-}; fixes=${5-}
mkdir -p "$res"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 bench/multi_rank.py --device cuda --duration 20 --out "$res" --modes "$modes" --fresh "$fresh" \
    ${fixes:+--$fixes} > "$res/bench_log.txt" 2>&1
echo "bench rc $?" >> "$res/bench_log.txt"
if [ "$extra" = "shots" ]; then
  log="$res/compute_job.log"
  OMP_NUM_THREADS=1 python3 -m torch.distributed.run --standalone --nproc-per-node 2 bench/multi_rank.py \
      --job "${SHOT_JOB:-compute}" --device cuda > "$log" 2>&1 &
  launcher=$!
  for _ in $(seq 120); do [ "$(grep -c ready "$log")" -ge 2 ] && break; sleep 0.5; done
  sleep 6
  python3 -m gputop record -o "$res/${SHOT_JOB:-compute}-h100x2.gputop" --pid "$launcher" --duration 20s --interval 0.5 \
      > "$res/record_log.txt" 2>&1 &
  rec=$!
  python3 scripts/screenshot.py --pid "$launcher" --out "$res" --name ranks-nccl-${SHOT_JOB:-compute} --size 160x48 \
      --seconds 10 --keys 4 > "$res/shot_log.txt" 2>&1
  python3 scripts/screenshot.py --pid "$launcher" --out "$res" --name advisor-nccl-${SHOT_JOB:-compute} --size 160x48 \
      --seconds 8 --keys 2 >> "$res/shot_log.txt" 2>&1
  wait $rec
  pkill -9 -P "$launcher" 2>/dev/null; kill -9 "$launcher" 2>/dev/null; wait 2>/dev/null
fi
ls -la "$res"
