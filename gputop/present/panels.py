"""Render GPU, host and header panels as Rich text from plain samples.

Pure functions of their inputs (no Textual, no store): the UI calls them on each tick and the
tests call them with hand-made samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from rich.text import Text

from ..units import (
    NA, SPARK, bar, bridge_gaps, fmt_bytes, fmt_growth, fmt_pct, fmt_rate, short_gpu_name, sparkline, truncate,
)
from ..model import GpuInfo, GpuSample, HostSample, SamplingCost, SystemInfo, UtilPoint
from ..analysis import (
    IDLE_UTIL_PCT, Bucket, GpuMemory, WorkersPrivate, decode_throttle, is_performance_limiting, throttle_label,
)
from .gpu_charts import chart_lines
from .memory import forecast_text, forecast_texts
from .plot import minmax

# The software power cap bit alone, and the share of the limit from which it really bites.
POWER_CAP_ONLY = 0x4
POWER_CAP_NEAR = 0.9

# Panel sizes, largest first; the app picks the largest that fits every GPU. Full and charts
# panels add their chart rows and legend to these lines: full keeps the three lines of numbers,
# charts keeps one (the compact line) so that four GPUs still get multi-row charts at 120x40.
FULL, CHARTS, MEDIUM, COMPACT = "full", "charts", "medium", "compact"
PANEL_LINES = {FULL: 3, CHARTS: 1, MEDIUM: 3, COMPACT: 1}
# The narrowest the utilisation and memory bars of line 1 become to make room for a memory
# forecast: below this a bar no longer reads as a level.
BAR_MIN = 6
# The widths line 1's figures are padded to, so that the panels' columns line up: memory used
# ("512.0M", "61.0G"), temperature ("61°C"), power ("432W"; "1000W" is one wider).
MEM_W = 6
TEMP_W = 4
POWER_W = 4


def level_style(fraction: float | None, warn: float = 0.75, crit: float = 0.92) -> str:
    if fraction is None:
        return "dim"
    if fraction >= crit:
        return "bold red"
    if fraction >= warn:
        return "yellow"
    return "green"


def util_style(pct: float | None) -> str:
    # Low utilisation is what a training user worries about, so low is the warning colour.
    if pct is None:
        return "dim"
    if pct < IDLE_UTIL_PCT:
        return "bold red"
    if pct < 60:
        return "yellow"
    return "green"


@dataclass(frozen=True)
class History:
    """What a panel's charts draw: (ts, value) series over a window ending at ``t1``."""

    t0: float
    t1: float
    util: Sequence[UtilPoint] = ()
    samples: Sequence[GpuSample] = ()
    # When attached: each utilisation chart column's idle cause (None where it has none).
    causes: Sequence[Bucket | None] | None = None
    attached: bool = False


def header_text(
    system: SystemInfo | None, version: str, interval: float, state: str, width: int
) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f" gputop {version} ", style="bold reverse")
    # The state goes first: it is what must survive truncation on a narrow terminal.
    style = {"live": "bold green", "paused": "bold yellow", "recording": "bold red", "replay": "bold cyan"}
    state_style = next((v for k, v in style.items() if state.lower().startswith(k)), "bold magenta")
    t.append(" ● " + state.upper(), style=state_style)
    if system is None:
        t.append("  starting…", style="dim")
    else:
        t.append(f"  {system.hostname}", style="bold")
        if system.nvml_error and "replay" in state.lower():
            # The recording's machine had no NVML then: nothing is missing on this one now.
            t.append(f"  recorded without NVML ({system.nvml_error})", style="yellow")
        elif system.nvml_error:
            t.append(f"  NVML unavailable: {system.nvml_error}", style="bold yellow")
        else:
            t.append(f"  driver {system.driver_version or NA}")
            t.append(f"  CUDA {system.cuda_driver_version or NA}")
            t.append(f"  NVML {system.nvml_version or NA}", style="dim")
    t.append(f"  every {interval:g}s", style="dim")
    t.truncate(width, overflow="ellipsis")
    return t


def no_gpu_text(system: SystemInfo | None, recorded: bool = False) -> Text:
    """What the GPU area says with no GPU to show: why (the header has NVML's reason) and what
    still works; ``recorded``: a replay, whose recording had no GPU (nothing continues)."""
    msg = Text()
    if system is not None and system.nvml_error:
        if recorded:
            msg.append("No GPU data: ", style="bold yellow")
            msg.append("recorded without a GPU; the host and its processes were recorded, the table lists the "
                       "busiest.", style="dim")
        else:
            msg.append("No GPU data. ", style="bold yellow")
            msg.append("Host and process monitoring continue; the table lists the busiest processes.", style="dim")
    else:
        msg.append("Waiting for GPU data…", style="dim")
    return msg


def _metric(t: Text, label: str, value: str, style: str = "") -> None:
    t.append(label, style="dim")
    t.append(value, style=style)


# From this width a GPU's name may take up to WIDE_NAME_MAX columns (the bars and figures take ~130).
WIDE_NAME_MIN_W = 160
WIDE_NAME_MAX = 32


def gpu_panel_lines(
    info: GpuInfo | None,
    s: GpuSample | None,
    history: History | None,
    width: int,
    mode: str = FULL,
    charts: int = 3,
    memory: GpuMemory | None = None,
    index_w: int = 1,
) -> list[Text]:
    """One GPU in ``width`` columns: a line (compact), three (medium), or full (three lines) and
    charts (one line) panels with ``charts`` rows of history charts and their legend under them.
    ``memory``: the attached job's memory on this GPU (its growth and forecast), said beside the
    memory figure when it grows steadily. ``index_w``: the digits of the largest GPU index shown
    (``index_width``), so that every panel's columns line up whatever its own index."""
    width = max(20, width)
    idx = s.index if s is not None else (info.index if info else 0)
    name = info.name if info else "GPU"
    lines: list[Text] = [Text(no_wrap=True, overflow="ellipsis")]
    t = lines[0]
    if s is None:
        t.append(f"[{idx}] {short_gpu_name(name)}  waiting for first sample…", style="dim")
        return [t]
    if s.error:
        t.append(f"[{idx}] {short_gpu_name(name)}  ", style="bold")
        t.append(f"⚠ {s.error}", style="bold red")
        return [t]

    mem_frac = s.mem_fraction
    power_frac = (s.power_w / s.power_limit_w) if s.power_w is not None and s.power_limit_w else None
    # Line 1 holds ~46 columns of numbers and labels beside the name; the two bars share the
    # rest. Compact lines also need room for tensor activity and throttle words.
    compact = mode in (COMPACT, CHARTS)
    name_w = 14 if width >= 100 else 9
    if width >= WIDE_NAME_MIN_W:
        # A wide terminal has room for a name longer than 14 ("Fake H100 80GB HBM3 (scripted)" was
        # cut to "Fake H100 80G…" at 200 columns). The usual names fit 14, so panels of different
        # models still line up; only a longer name widens its own panel's label.
        name_w = max(name_w, min(WIDE_NAME_MAX, len(short_gpu_name(name))))
    index_w = max(1, index_w, len(str(idx)))
    label_w = name_w + index_w + 4  # "[" index "] " name, and a space however long the name
    # "now" after UTIL where there is room: the latest poll's utilisation, not the Advisor's
    # "busy" over its window (58 % here beside "busy 78 %" there read as a contradiction).
    util_label = "UTIL now " if width >= 100 else "UTIL "
    fixed = 42 + len(util_label) + label_w + (22 if compact else 0)
    # A memory forecast takes its room from the bars (down to BAR_MIN each) before it is cut short.
    cap = 10 if compact else 24
    note = next((n for n in forecast_texts(memory) if (width - fixed - len(n) - 1) // 2 >= BAR_MIN), "")
    bar_w = max(3, min(cap, (width - fixed - (len(note) + 1 if note else 0)) // 2))

    # Line 1: identity, utilisation, memory, temperature, power.
    # Every figure is padded to its usual width: one GPU's 512.0M beside another's 61.0G, or a
    # two-digit index, must not shift the columns after it (64 GPUs at 80 columns read as a table).
    label = f"[{idx:>{index_w}}] " + truncate(short_gpu_name(name), name_w)
    t.append(label.ljust(label_w), style="bold")
    _metric(t, util_label, "")
    t.append(bar((s.util_gpu or 0) / 100 if s.util_gpu is not None else None, bar_w), style=util_style(s.util_gpu))
    t.append(f" {fmt_pct(s.util_gpu, 4)}", style=util_style(s.util_gpu))
    _metric(t, "  MEM ", "")
    t.append(bar(mem_frac, bar_w), style=level_style(mem_frac))
    t.append(f" {fmt_bytes(s.mem_used).rjust(MEM_W)}/{fmt_bytes(s.mem_total)}")
    mem_end = len(t)  # the forecast goes here, once the line's other figures are known
    temp_style = "bold red" if (s.temperature_c or 0) >= 85 else ("yellow" if (s.temperature_c or 0) >= 78 else "")
    temp = f"{s.temperature_c:.0f}°C" if s.temperature_c is not None else f"{NA}°C"
    _metric(t, "  ", temp.rjust(TEMP_W), temp_style)
    power = (f"{s.power_w:.0f}W" if s.power_w is not None else NA).rjust(POWER_W)
    if s.power_limit_w and not compact:
        power += f"/{s.power_limit_w:.0f}W"
    _metric(t, "  ", power, level_style(power_frac, 0.9, 0.98))
    if compact:
        if s.tensor_active is not None:
            _metric(t, "  TC ", fmt_pct(s.tensor_active, 3), "cyan")
        if s.throttle_reasons and is_performance_limiting(s.throttle_reasons):
            t.append("  ⚠" + throttle_label(s.throttle_reasons), style="yellow")
        t = lines[0] = _with_forecast(t, mem_end, memory, width)
        if mode == CHARTS and history is not None:
            lines.extend(chart_lines(history, s, width, charts, history.attached))
            return _fit(lines, width)
        if history is not None:
            room = width - t.cell_len - 2
            if room >= 8:
                t.append("  ")
                t.append_text(_util_spark(history, room))
        return _fit(lines, width)

    lines[0] = _with_forecast(t, mem_end, memory, width)

    # Line 2: clocks, throttle, PCIe, ECC.
    t = _newline(lines)
    t.append(" " * 4)
    _metric(t, "SM ", f"{s.sm_clock_mhz}MHz" if s.sm_clock_mhz is not None else NA)
    _metric(t, "  MEM ", f"{s.mem_clock_mhz}MHz" if s.mem_clock_mhz is not None else NA)
    reasons = decode_throttle(s.throttle_reasons) if s.throttle_reasons is not None else None
    if reasons is None:
        _metric(t, "  THROTTLE ", NA, "dim")
    elif reasons:
        # Hopper reports the software power cap even far below the limit (seen at 204 of
        # 700 W): it only costs clocks when the board is near its limit.
        limiting = is_performance_limiting(s.throttle_reasons) and not (
            s.throttle_reasons == POWER_CAP_ONLY and (power_frac or 0) < POWER_CAP_NEAR
        )
        _metric(t, "  THROTTLE ", ", ".join(reasons), "bold yellow" if limiting else "")
    else:
        _metric(t, "  THROTTLE ", "none", "green")
    link = _pcie_link(s)
    _metric(t, "  PCIe ", link[0], link[1])
    _metric(t, " rx ", fmt_rate(s.pcie_rx_bps))
    _metric(t, " tx ", fmt_rate(s.pcie_tx_bps))
    if s.ecc_uncorrected is not None or s.ecc_corrected is not None:
        ecc_bad = bool(s.ecc_uncorrected)
        _metric(
            t,
            "  ECC ",
            f"{s.ecc_corrected if s.ecc_corrected is not None else NA}/{s.ecc_uncorrected if s.ecc_uncorrected is not None else NA}",
            "bold red" if ecc_bad else "",
        )

    # Line 3: GPM activity, where the GPU has it.
    t = _newline(lines)
    t.append(" " * 4)
    if s.sm_active is None and s.tensor_active is None:
        t.append("GPM n/a on this GPU (SM/tensor activity needs Hopper or newer)", style="dim")
    else:
        tensor_style = "bold red" if (s.tensor_active or 0) < 1 and (s.util_gpu or 0) > 50 else "cyan"
        _metric(t, "SM act ", fmt_pct(s.sm_active))
        _metric(t, "  occ ", fmt_pct(s.sm_occupancy))
        _metric(t, "  tensor ", fmt_pct(s.tensor_active), tensor_style)
        _metric(t, "  dram ", fmt_pct(s.dram_active))
        _metric(t, "  fp32 ", fmt_pct(s.fp32_active))
        _metric(t, "  fp16 ", fmt_pct(s.fp16_active))

    if mode == MEDIUM or history is None:
        return _fit(lines, width)

    # Then the history charts and their legend.
    lines.extend(chart_lines(history, s, width, max(1, charts), history.attached))
    return _fit(lines, width)


def index_width(indices: Sequence[int]) -> int:
    """The digits of the largest GPU index: every panel's label is that wide (``gpu_panel_lines``)."""
    return len(str(max(indices, default=0)))


def hidden_gpus_line(hidden: Sequence[tuple[int, GpuSample | None]], width: int) -> Text:
    """The line that stands for the GPUs with no room on screen: how many, which, and what they
    do (the idle ones named, the errors counted), so none is hidden without a word."""
    t = Text(no_wrap=True, overflow="ellipsis")
    if not hidden:
        return t
    idx = [i for i, _ in hidden]
    which = f"GPU {idx[0]}" if len(idx) == 1 else (
        f"GPUs {idx[0]}-{idx[-1]}" if idx == list(range(idx[0], idx[-1] + 1)) else f"GPUs {', '.join(map(str, idx))}")
    t.append(f"+{len(idx)} more ", style="bold")
    t.append(f"({which}): ", style="dim")
    failed = [i for i, s in hidden if s is not None and s.error]
    idle = [i for i, s in hidden if s is not None and not s.error and s.util_gpu is not None
            and s.util_gpu < IDLE_UTIL_PCT]
    waiting = sum(1 for _, s in hidden if s is None)
    busy = len(hidden) - len(failed) - len(idle) - waiting
    parts = [(f"{busy} busy", "green")] if busy else []
    if idle:
        names = ", ".join(map(str, idle[:4])) + (", …" if len(idle) > 4 else "")
        parts.append((f"{len(idle)} idle ({names})", "bold red"))
    if failed:
        parts.append((f"{len(failed)} failing", "bold red"))
    if waiting:
        parts.append((f"{waiting} not polled yet", "dim"))
    for k, (text, style) in enumerate(parts):
        if k:
            t.append(", ", style="dim")
        t.append(text, style=style)
    hint = "; a taller terminal shows them"
    if t.cell_len + len(hint) <= width:
        t.append(hint, style="dim")
    t.truncate(max(20, width), overflow="ellipsis")
    return t


def sampling_text(cost: SamplingCost) -> str:
    """The status line's clause on attached stack sampling: what it costs the job, or, when far
    fewer stacks come than were asked for, that it is held back and why first (the advisor's first
    verdict then takes longer: the line must say so before it is cut at the screen's edge)."""
    text = f"sampling costs the job about {cost.job_cost_pct:.2g} %"
    why = held_back_text(cost, short=True)
    if why is None:
        return text
    return (f"sampling held back to {cost.stacks_per_s:.1f} of {cost.asked_per_s:g} stacks/s ({why}), "
            f"costing the job about {cost.job_cost_pct:.2g} %")


def held_back_text(cost: SamplingCost, short: bool = False) -> str | None:
    """Why sampling is held back, in words (``short``: for the status line); None when it is not."""
    if cost.held_back is None:
        return None
    if cost.held_back == "host-busy":
        load = (f"load {cost.load1:.1f} on {cost.cpus} CPU{'s' if cost.cpus != 1 else ''}"
                if cost.load1 is not None else None)
        if short:
            return "host CPUs saturated" + (f": {load}" if load else "")
        facts = ([load] if load else []) + ([f"tasks waited for a CPU {cost.cpu_pressure_pct:.0f} % of the time"]
                                            if cost.cpu_pressure_pct is not None else [])
        busy = f" ({', '.join(facts)})" if facts else ""
        return (f"the host's CPUs are saturated{busy}: py-spy runs at idle priority and takes no "
                "blocking dump, so the job keeps its CPU")
    if cost.held_back == "cpu-budget":
        if short:
            return "py-spy is costly here"
        return (f"py-spy costs more CPU per stack here than the {cost.sampler_cpu_pct:.1f} % of a core "
                "gputop allows itself")
    return "py-spy keeps failing" if short else "py-spy keeps failing on the job"


def gpu_panel(
    info: GpuInfo | None,
    s: GpuSample | None,
    history: History | None,
    width: int,
    mode: str = FULL,
) -> Text:
    """`gpu_panel_lines` as one text."""
    return _join(gpu_panel_lines(info, s, history, width, mode))


def _pcie_link(s: GpuSample) -> tuple[str, str]:
    cur = f"{s.pcie_gen or '?'}x{s.pcie_width or '?'}"
    if s.pcie_max_gen is None and s.pcie_max_width is None:
        return cur, ""
    mx = f"{s.pcie_max_gen or '?'}x{s.pcie_max_width or '?'}"
    # A lower generation at idle is normal power saving; a narrower width is a real fault.
    degraded = s.pcie_width is not None and s.pcie_max_width is not None and s.pcie_width < s.pcie_max_width
    return f"{cur}/{mx}", "bold yellow" if degraded else ""


def _util_spark(h: History, width: int) -> Text:
    """Utilisation from the 200 ms buffer: the highest sample per column, red where any sample
    was idle (the mean would average a short gap away)."""
    pts = [(p.ts, p.util) for p in h.util]
    if not pts:
        pts = [(x.ts, x.util_gpu) for x in h.samples if x.util_gpu is not None]
    cells = bridge_gaps(minmax(pts, h.t0, h.t1, width), pts, h.t0, h.t1)
    # One span per run of equal style, not one per cell: fewer segments to render every tick.
    t = Text()
    run: list[str] = []
    run_style = None
    top = len(SPARK) - 1
    for high, low in cells:
        if high is None:
            ch, style = " ", None
        else:
            ch = SPARK[min(top, max(0, int(high / 100.0 * len(SPARK))))]
            style = "red" if low is not None and low < IDLE_UTIL_PCT else "green"
        if style != run_style and run:
            t.append("".join(run), style=run_style)
            run = []
        run.append(ch)
        run_style = style
    if run:
        t.append("".join(run), style=run_style)
    return t


def _with_forecast(line: Text, at: int, memory: GpuMemory | None, width: int) -> Text:
    """``line`` with the memory forecast put after the memory figure (character ``at``): the
    longest wording that fits what the line leaves, else the shortest, which then pushes the
    line's last figures (temperature, power) off its end: how soon the job runs out of memory
    matters more than they do."""
    note = forecast_text(memory, width - line.cell_len - 2)
    if note is None:
        return line
    head, tail = line.divide([at]) if at < len(line) else (line, Text())
    out = Text(no_wrap=True, overflow="ellipsis")
    out.append_text(head)
    out.append(" ")
    out.append_text(note)
    out.append_text(tail)
    return out


def _newline(lines: list[Text]) -> Text:
    lines.append(Text(no_wrap=True, overflow="ellipsis"))
    return lines[-1]


def _fit(lines: list[Text], width: int) -> list[Text]:
    for line in lines:
        line.truncate(width, overflow="ellipsis")
    return lines


def _join(lines: list[Text]) -> Text:
    return Text("\n", no_wrap=True).join(lines)


def host_panel_lines(h: HostSample | None, width: int, rows: int = 3,
                     workers: WorkersPrivate | None = None) -> list[Text]:
    """``workers``: the attached job's DataLoader workers' private memory (the memory view's),
    said beside the host's memory figure: "4 workers' USS 4.8G +160M/min" (the rate while a worker's
    USS grows: the total's growth, in the warning colour when it is the workers' as copy-on-read is
    judged)."""
    lines: list[Text] = [Text(no_wrap=True, overflow="ellipsis")]
    t = lines[0]
    if h is None:
        t.append("host: waiting for first sample…", style="dim")
        return [t]
    n = len(h.cores)
    bar_w = max(10, min(30, width // 4))
    user = sum(c.user for c in h.cores) / n if n else h.cpu_percent
    system = sum(c.system for c in h.cores) / n if n else 0.0
    _metric(t, "CPU ", "")
    # Stacked bar: user (green), system (red), iowait (blue).
    u_cells = round(user / 100 * bar_w)
    s_cells = round(system / 100 * bar_w)
    w_cells = round(h.iowait_percent / 100 * bar_w)
    used = min(bar_w, u_cells + s_cells + w_cells)
    t.append("█" * u_cells, style="green")
    t.append("█" * s_cells, style="red")
    t.append("█" * w_cells, style="blue")
    t.append("░" * (bar_w - used), style="dim")
    t.append(f" {h.cpu_percent:5.1f}%", style=level_style(h.cpu_percent / 100))
    _metric(t, "  usr ", f"{user:.0f}%", "green")
    _metric(t, " sys ", f"{system:.0f}%", "red")
    _metric(t, " iowait ", f"{h.iowait_percent:.1f}%", "bold blue" if h.iowait_percent >= 10 else "blue")
    if h.steal_percent >= 1:
        _metric(t, " steal ", f"{h.steal_percent:.0f}%", "yellow")
    if h.load1 is not None:
        _metric(t, "  load ", f"{h.load1:.2f} {h.load5:.2f} {h.load15:.2f}")
    _metric(t, f"  {n} cores" if n else "", "")
    if rows >= 2:
        t = _newline(lines)
        mem_frac = h.mem_used / h.mem_total if h.mem_total else None
        _metric(t, "MEM ", "")
        t.append(bar(mem_frac, bar_w), style=level_style(mem_frac))
        t.append(f" {fmt_bytes(h.mem_used)}/{fmt_bytes(h.mem_total)}")
        if workers is not None:
            t.append_text(workers_text(workers))
        if h.cgroup_limit and h.cgroup_used is not None:
            # The job's container limit binds before the host's total: shown beside it.
            cg_frac = h.cgroup_used / h.cgroup_limit
            _metric(t, "  cgroup ", f"{fmt_bytes(h.cgroup_used)}/{fmt_bytes(h.cgroup_limit)}", level_style(cg_frac))
        swap_frac = h.swap_used / h.swap_total if h.swap_total else None
        _metric(t, "  SWP ", f"{fmt_bytes(h.swap_used)}/{fmt_bytes(h.swap_total)}", level_style(swap_frac, 0.2, 0.5))
        if h.shm_total is not None:
            _metric(t, "  shm ", f"{fmt_bytes(h.shm_used)}/{fmt_bytes(h.shm_total)}")
        _metric(t, "  DISK r ", fmt_rate(h.disk_read_bps))
        _metric(t, " w ", fmt_rate(h.disk_write_bps))
        _metric(t, "  NET rx ", fmt_rate(h.net_rx_bps))
        _metric(t, " tx ", fmt_rate(h.net_tx_bps))
    if rows >= 3 and n:
        t = _newline(lines)
        t.append_text(core_strip(h, width))
    return _fit(lines, width)


def workers_text(w: WorkersPrivate) -> Text:
    """"  4 workers' USS 4.8G +160M/min": the workers' private memory summed, and how fast the sum
    grows while any worker's grows (yellow when the workers' memory grows as copy-on-read is
    judged, dim for a worker or two of many)."""
    t = Text()
    whose = f"{w.read} worker's" if w.read == 1 else f"{w.read} workers'"
    _metric(t, f"  {whose} USS ", fmt_bytes(w.total))
    if w.growing:
        t.append(" " + fmt_growth(w.total_rate), style="yellow" if w.grows else "dim")
    return t


def host_panel(h: HostSample | None, width: int, rows: int = 3, workers: WorkersPrivate | None = None) -> Text:
    """`host_panel_lines` as one text."""
    return _join(host_panel_lines(h, width, rows, workers))


def core_strip(h: HostSample, width: int) -> Text:
    """Every core as one block: height = busy, colour = what dominates (user/system/iowait)."""
    t = Text()
    t.append("cores ", style="dim")
    room = max(0, width - 6)
    cores = h.cores[:room]
    for c in cores:
        total = c.busy + c.iowait
        ch = sparkline([total])
        if c.iowait > c.busy and c.iowait > 5:
            style = "blue"
        elif c.system > c.user:
            style = "red"
        else:
            style = "green" if total < 90 else "bold green"
        t.append(ch, style=style)
    if len(h.cores) > room:
        t.append("…", style="dim")
    return t
