#!/usr/bin/env bash
# On a GPU machine: `gputop export --attach all` beside a real job (the dataloader-starved
# workload, so the scrape shows idle time with a cause), a captured scrape, a PromQL-free check
# that the GPU series and the time buckets are there, and the exporter's CPU measured twice:
# unattached (bench/export_cpu.py --real, the 1 % budget) and with the job attached.
# Results go to $1 (default examples/export); copy the scrape to examples/ to commit it.
set -u
out=${1:-examples/export}
mkdir -p "$out"
python3 -m gputop.workloads dataloader-starved --device cuda --duration 400 --exit-with-parent > "$out/workload.log" 2>&1 &
wl=$!
for _ in $(seq 90); do grep -q ready "$out/workload.log" && break; sleep 1; done

# 1. the exporter with the job attached: a scrape after a minute, then its CPU over two minutes
python3 -m gputop export --listen 127.0.0.1:10405 --attach all > "$out/export_stdout.txt" 2> "$out/export_stderr.txt" &
ex=$!
sleep 60
curl -sf http://127.0.0.1:10405/metrics > "$out/scrape-attached.txt"
python3 - "$ex" 120 > "$out/cpu-attached.txt" <<'PY'
import sys, time, psutil
p = psutil.Process(int(sys.argv[1])); secs = float(sys.argv[2])
def cpu():
    t = p.cpu_times(); tot = t.user + t.system + t.children_user + t.children_system
    for c in p.children(recursive=True):
        try:
            ct = c.cpu_times(); tot += ct.user + ct.system
        except psutil.NoSuchProcess:
            pass
    return tot
c0, t0 = cpu(), time.monotonic(); n = 0
while time.monotonic() - t0 < secs:  # a scrape every 15 s, as Prometheus would
    import urllib.request; urllib.request.urlopen("http://127.0.0.1:10405/metrics").read(); n += 1
    time.sleep(max(0, t0 + 15 * n - time.monotonic()))
print(f"exporter (--attach all, py-spy included) CPU: {100 * (cpu() - c0) / (time.monotonic() - t0):.2f} % of one core over {secs:g} s, {n} scrapes")
PY
curl -sf http://127.0.0.1:10405/metrics > "$out/scrape-attached-end.txt"
kill -TERM $ex; wait $ex
echo "exit status on SIGTERM: $?" >> "$out/cpu-attached.txt"

# 2. the unattached exporter (the default), beside the same job: the 1 % budget
timeout 300 python3 bench/export_cpu.py --real --out "$out" --name export_cpu_real \
    --label "beside the dataloader-starved workload on cuda" > "$out/bench_log.txt" 2>&1

kill $wl 2>/dev/null; wait $wl 2>/dev/null
grep -E '^gputop_gpu_time_seconds_total|^gputop_finding|^gputop_job_info|^gputop_gpu_utilization_ratio' \
    "$out/scrape-attached-end.txt" > "$out/summary.txt"
cat "$out/cpu-attached.txt" "$out/export_cpu_real.md" "$out/summary.txt"
