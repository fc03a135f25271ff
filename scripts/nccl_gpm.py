"""Print, every 0.25 s for N seconds, each GPU's utilisation, power and GPM SM / tensor activity:
what a rank spinning in a collective looks like next to one that computes."""
import sys
import time

import pynvml as nv

nv.nvmlInit()
n = nv.nvmlDeviceGetCount()
hs = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(n)]


def gpm_sample(h):
    s = nv.nvmlGpmSampleAlloc()
    nv.nvmlGpmSampleGet(h, s)
    return s


def gpm_metrics(h, a, b):
    m = nv.c_nvmlGpmMetricsGet_t()
    m.version = nv.NVML_GPM_METRICS_GET_VERSION
    m.numMetrics = 2
    m.sample1, m.sample2 = a, b
    m.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_UTIL
    m.metrics[1].metricId = nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL
    nv.nvmlGpmMetricsGet(m)
    return m.metrics[0].value, m.metrics[1].value


end = time.time() + float(sys.argv[1] if len(sys.argv) > 1 else 5)
prev = [gpm_sample(h) for h in hs]
while time.time() < end:
    time.sleep(0.25)
    row = []
    for i, h in enumerate(hs):
        cur = gpm_sample(h)
        try:
            sm, tc = gpm_metrics(h, prev[i], cur)
        except Exception as exc:  # noqa: BLE001
            sm = tc = float("nan")
        prev[i] = cur
        u = nv.nvmlDeviceGetUtilizationRates(h).gpu
        p = nv.nvmlDeviceGetPowerUsage(h) / 1000
        row.append(f"gpu{i} util {u:3d} sm {sm:5.1f} tc {tc:5.1f} pwr {p:6.1f}W")
    print(f"{time.time():.2f}  " + " | ".join(row), flush=True)
