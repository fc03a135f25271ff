"""The machine and the job's environment: clocks held down, a slow PCIe link, persistence mode,
ECC errors, CUDA_LAUNCH_BLOCKING and other debug settings, which no code change in the training
loop fixes.
"""

from __future__ import annotations

from ...analysis import CPU_DEVICE, Bucket
from ...model import SET_IN_SCRIPT, Severity
from ...analysis import POWER_MASK, THERMAL_MASK
from ..context import AnalysisContext, GpuView
from .base import MIN_BUSY_POLLS, Hit, bounded, gain, pct, secs, times, uses, worst
from .threshold import JUDGEMENT, Threshold

# --------------------------------------------------------------------------- clocks

THROTTLE_MIN_FRACTION = Threshold(
    0.20, "share", JUDGEMENT, "Clocks throttled (power, heat, hardware) in at least this share of busy polls is a "
    "pattern.")
# The power cap alone is how a fully loaded GPU runs: the fp32 loop and the healthy bf16 trainer
# both drew ~692-695 W of the H100 SXM's 700 W (bench/results/harness.json); a one-off NVML
# reading of the fp32 loop during development (not kept in bench/results) showed the power cap
# as the only reason, throughout, at an SM clock ~96 % of max. Only clocks far below max under
# it point at a lowered power limit, and even then it is a note, not a fault. 0.6 is judgement.
POWER_CAP_CLOCK_RATIO = Threshold(
    0.6, "share", JUDGEMENT,
    "At the power cap alone, only SM clocks below this share of max point at a lowered power limit: a fully "
    "loaded GPU runs at its cap near full clocks.", "bench/results/harness.json")
DEFAULT_THROTTLED_CLOCK_RATIO = Threshold(
    0.85, "share", JUDGEMENT, "The clock share assumed for a throttled GPU whose clocks were not read.")


@uses(THROTTLE_MIN_FRACTION, POWER_CAP_CLOCK_RATIO, DEFAULT_THROTTLED_CLOCK_RATIO, MIN_BUSY_POLLS)
def check_throttling(ctx: AnalysisContext) -> Hit | None:
    def cost(g: GpuView) -> float:
        e = g.efficiency
        if e.busy_polls < MIN_BUSY_POLLS or e.throttle_fraction < THROTTLE_MIN_FRACTION:
            return 0.0
        ratio = e.clock_ratio if e.clock_ratio is not None else DEFAULT_THROTTLED_CLOCK_RATIO
        power_only = not (e.throttle_mask & ~POWER_MASK)
        if power_only and ratio >= POWER_CAP_CLOCK_RATIO:
            return 0.0  # running at the power limit at near-full clocks: how a loaded GPU works
        return g.breakdown.busy_s * e.throttle_fraction * max(0.01, 1.0 - ratio)

    found = worst(ctx, cost, gpu_only=True)
    if found is None or found[1] <= 0:
        return None
    g, c = found
    e = g.efficiency
    reasons = ", ".join(f"{w} {pct(f)}" for w, f in e.throttle_reasons)
    ev = [f"{g.name} clocks held down in {pct(e.throttle_fraction)} of busy polls: {reasons}"]
    if e.clock_ratio is not None:
        ev.append(f"SM clock at {pct(e.clock_ratio)} of its maximum while limited")
    if e.temperature_max is not None:
        ev.append(f"temperature up to {e.temperature_max:.0f} °C")
    if e.power_mean is not None and e.power_limit:
        ev.append(f"power {e.power_mean:.0f} W of a {e.power_limit:.0f} W limit while busy")
    if e.throttle_mask & THERMAL_MASK:
        action = (
            "cooling: check airflow, fans and inlet temperature (nvidia-smi -q -d TEMPERATURE,PERFORMANCE "
            "shows the slowdown temperature); keep the GPU below it"
        )
    elif e.throttle_mask & ~POWER_MASK:
        action = (
            "hardware slowdown or power brake: check the power supply and cables, and "
            "nvidia-smi -q -d PERFORMANCE for the active reason; report to the machine's operator"
        )
    else:
        action = (
            "the power limit holds the clocks far below max: compare nvidia-smi -q -d POWER "
            "(Current vs Default Power Limit) and restore it: sudo nvidia-smi -pl <default W>"
        )
    power_only = not (e.throttle_mask & ~POWER_MASK)
    return Hit(
        evidence=tuple(ev),
        action=action,
        # Upper bound: the throttled busy time shortened by the clock ratio (work scaling with
        # the clock at best); the cost already counts that time.
        expected_gain=f"clocks back to maximum: about {secs(c)} of GPU time in this window, at most "
        f"{times(bounded(c / g.breakdown.total_s))} steps/s (an upper bound: work scaling with the clock)",
        gain_bound=bounded(c / g.breakdown.total_s),
        cost_s=c,
        confidence=0.9,
        gpu_index=g.index,
        severity=Severity.INFO if power_only else None,
        title=f"{g.name} throttled: {e.throttle_reasons[0][0] if e.throttle_reasons else 'clocks limited'}",
    )


# --------------------------------------------------------------------------- PCIe

PCIE_DEGRADED_FRACTION = Threshold(
    0.5, "share", JUDGEMENT,
    "A PCIe link below its maximum in this share of busy polls is degraded (links downshift when idle: that is "
    "normal).")


@uses(PCIE_DEGRADED_FRACTION, MIN_BUSY_POLLS)
def check_pcie_degraded(ctx: AnalysisContext) -> Hit | None:
    cands = [
        g for g in ctx.gpus
        if g.index != CPU_DEVICE
        and g.efficiency.busy_polls >= MIN_BUSY_POLLS
        and g.efficiency.pcie_degraded_fraction >= PCIE_DEGRADED_FRACTION
    ]
    if not cands:
        return None
    g = max(cands, key=lambda x: x.breakdown.get(Bucket.H2D))
    e = g.efficiency
    (gen, width), (mgen, mwidth) = e.pcie_link, e.pcie_max
    return Hit(
        evidence=(
            f"{g.name} PCIe link gen {gen} x{width} while busy in {pct(e.pcie_degraded_fraction)} of busy polls; "
            f"the link can do gen {mgen} x{mwidth}",
            "links slow down when idle to save power; this one stays slow under load",
        ),
        action=(
            "check the link: nvidia-smi -q -d PCIE and sudo lspci -vv | grep -E 'LnkCap|LnkSta'; "
            "reseat the card or use a x16 slot, and check the BIOS PCIe generation setting"
        ),
        expected_gain="full host-device bandwidth for copies and data loading",
        cost_s=g.breakdown.get(Bucket.H2D),
        confidence=0.85,
        gpu_index=g.index,
        title=f"{g.name} PCIe link below its maximum (gen {gen} x{width} of gen {mgen} x{mwidth})",
    )


# --------------------------------------------------------------------------- driver and memory health


@uses()
def check_persistence_off(ctx: AnalysisContext) -> Hit | None:
    off = [g for g in ctx.gpus if g.info is not None and g.info.persistence_mode is False]
    if not off:
        return None
    names = ", ".join(g.name for g in off)
    return Hit(
        evidence=(f"persistence mode is off on {names}",
                  "the driver tears the GPU down when no process holds it: every job start pays seconds of init"),
        action="sudo nvidia-smi -pm 1  (or enable the nvidia-persistenced service)",
        expected_gain="faster job starts and steadier clocks between jobs",
        cost_s=0.0,
        confidence=1.0,
        gpu_index=off[0].index,
    )


@uses()
def check_ecc_errors(ctx: AnalysisContext) -> Hit | None:
    bad = [g for g in ctx.gpus if (g.efficiency.ecc_uncorrected or 0) > 0]
    if bad:
        g = bad[0]
        return Hit(
            evidence=(f"{g.name}: {g.efficiency.ecc_uncorrected} uncorrectable ECC errors since the driver loaded",),
            action=(
                "stop using this GPU for training until checked: nvidia-smi -q -d ECC,ROW_REMAPPER; "
                "drain the node, reset the GPU (sudo nvidia-smi -r -i "
                f"{g.index}) or reboot; report it to the provider if it recurs"
            ),
            expected_gain="results you can trust: uncorrectable errors can corrupt training silently or crash it",
            cost_s=0.0,
            confidence=1.0,
            gpu_index=g.index,
            severity=Severity.CRITICAL,
        )
    rising = [g for g in ctx.gpus if (g.efficiency.ecc_corrected_delta or 0) > 0]
    if rising:
        g = rising[0]
        return Hit(
            evidence=(f"{g.name}: {g.efficiency.ecc_corrected_delta} corrected ECC errors in the window",),
            action="watch it: nvidia-smi -q -d ECC,ROW_REMAPPER; a steady rise precedes row remapping or failure",
            expected_gain="early warning of a failing memory",
            cost_s=0.0,
            confidence=0.8,
            gpu_index=g.index,
            severity=Severity.INFO,
            title=f"{g.name} corrected ECC errors rising",
        )
    return None


# --------------------------------------------------------------------------- the environment


def _env_true(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("1", "true", "yes", "on")


@uses()
def check_cuda_launch_blocking(ctx: AnalysisContext) -> Hit | None:
    if not _env_true(ctx.env.get("CUDA_LAUNCH_BLOCKING")):
        return None
    idle = sum(g.breakdown.idle_s for g in ctx.gpus if g.index != CPU_DEVICE)
    total = sum(g.breakdown.total_s for g in ctx.gpus if g.index != CPU_DEVICE)
    idle_frac = idle / total if total else 0.0
    value, where = ctx.env.get("CUDA_LAUNCH_BLOCKING"), ctx.env.get("CUDA_LAUNCH_BLOCKING" + SET_IN_SCRIPT)
    # Set by the script itself (os.environ[...] = "1" at its top): the process's environment does
    # not show it, the script's line does, and the fix is that line.
    seen = (f"the script sets CUDA_LAUNCH_BLOCKING={value} for itself at {where}, before CUDA starts" if where else
            f"CUDA_LAUNCH_BLOCKING={value} in the environment of PID {ctx.target_pid}")
    action = (f"delete the os.environ CUDA_LAUNCH_BLOCKING line at {where} (or set it only while debugging): every "
              "launch is synchronous while it stands" if where else
              "unset CUDA_LAUNCH_BLOCKING (remove it from the launch script or job spec): it is for debugging only")
    return Hit(
        evidence=(
            seen,
            "every kernel launch waits for the kernel to finish: the CPU can never queue work ahead",
        ),
        action=action,
        expected_gain="asynchronous launches" + (": " + gain(idle_frac).replace("this costs", "the GPU idles") if total else ""),
        gain_bound=bounded(idle_frac) if total else None,
        cost_s=idle,
        confidence=1.0,
    )


# Environment settings that slow a job; (variable, bad values or None for any, why, fix). Each
# effect is the one the variable's own documentation (PyTorch, NCCL, CUDA) gives it.
SLOW_ENV: tuple[tuple[str, tuple[str, ...] | None, str, str], ...] = (
    ("PYTORCH_NO_CUDA_MEMORY_CACHING", ("1",), "disables the caching allocator: every tensor is a cudaMalloc/cudaFree",
     "unset PYTORCH_NO_CUDA_MEMORY_CACHING"),
    ("TORCH_DISTRIBUTED_DEBUG", ("DETAIL", "INFO"), "wraps every collective in consistency checks",
     "unset TORCH_DISTRIBUTED_DEBUG (or OFF) outside debugging"),
    ("NCCL_DEBUG", ("TRACE",), "logs every NCCL call", "NCCL_DEBUG=WARN (INFO only while diagnosing)"),
    ("CUDA_CACHE_DISABLE", ("1",), "recompiles PTX kernels at every start", "unset CUDA_CACHE_DISABLE"),
    ("TORCH_COMPILE_DEBUG", ("1",), "dumps every compiled graph to disk", "unset TORCH_COMPILE_DEBUG"),
    ("TORCH_USE_CUDA_DSA", ("1",), "device-side assertions add checks to kernels", "unset TORCH_USE_CUDA_DSA"),
)


@uses()
def check_slow_env(ctx: AnalysisContext) -> Hit | None:
    found = []
    for key, bad, why, fix in SLOW_ENV:
        v = ctx.env.get(key)
        if v is None or (bad is not None and v.strip().upper() not in {b.upper() for b in bad}):
            continue
        found.append((key, v, why, fix))
    if not found:
        return None
    return Hit(
        evidence=tuple(f"{k}={v}" + (f" (set by the script at {ctx.env[k + SET_IN_SCRIPT]})" if k + SET_IN_SCRIPT in ctx.env
                                       else "") + f": {why}" for k, v, why, _ in found),
        action="; ".join(fix for *_, fix in found),
        expected_gain="the debugging overhead goes away",
        cost_s=0.0,
        confidence=1.0,
        title="Debug settings in the job's environment: " + ", ".join(k for k, *_ in found),
    )
