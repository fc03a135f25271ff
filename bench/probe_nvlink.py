#!/usr/bin/env python3
"""Which NVML counter reads NVLink traffic right? One run on a machine with two NVLink-joined GPUs
and torch settles it.

Two ranks (this script with ``--rank``) run a NCCL all_reduce of a known size at known paces:
idle, a slow pace, a faster pace, then as fast as it goes. Meanwhile this process reads every
candidate counter once a second through pynvml and, for each one-second window, sets what each
read against what the all_reduces must have moved: a ring all_reduce over n ranks sends, and
receives, 2*(n-1)/n times the buffer per rank (n = 2: the buffer's size once each way). The
ranks log when each all_reduce started and ended (after a CUDA sync), and a window's expected
bytes are the operations' bytes apportioned by their overlap with it.

Candidates, per GPU (NVML index):
  fv_data_scope0      fields 138/139 (NVLINK_THROUGHPUT_DATA_TX/RX, KiB) with scope 0, the bare
                      field id: link 0 alone (what gputop read before this probe)
  fv_data_all         fields 138/139 with scope UINT_MAX: the sum over all links (nvml.h)
  fv_data_links       fields 138/139 asked for each link up, summed (what nvitop does)
  fv_raw_all          fields 140/141 (data + protocol overhead, KiB), scope UINT_MAX
  fv_count_bytes_all  fields 202/204 (NVLINK_COUNT_XMIT/RCV_BYTES; assumed bytes), scope UINT_MAX
  fv_count_bytes_links  fields 202/204 per link up, summed
  gpm_total           GPM 61/60 (NVLINK_TOTAL_TX/RX_PER_SEC, MiB/s): DCGM's nvlink_tx/rx_bytes
                      (DCP 1011/1012) on GPUs with GPM
  gpm_links           GPM per-link rates (62.. / 212.., MiB/s), summed over the links up
  gpm_link_bytes      GPM per-link byte counts since reboot (261.., bytes), summed, differenced
  util_counter0/1     nvmlDeviceGetNvLinkUtilizationCounter (deprecated), counters 0 and 1,
                      summed over links, raw units (their unit depends on a control this probe
                      does not set)

It changes nothing on the device beyond what reading needs: no clocks, no resets, no
nvmlDeviceSetNvLinkUtilizationControl / Freeze / Reset. A counter that would need such a call to
count reads what it reads (0, or an error), and the JSON says so. NVLink multicast (NVLS) is off
in the ranks, as on every shared machine this project runs on.

    python bench/probe_nvlink.py                          # writes bench/results/probe_nvlink.json
    python bench/probe_nvlink.py --gpus 2,3 --size-mib 512 --out /tmp/probe.json

Needs: nvidia-ml-py (pynvml) and torch with CUDA and NCCL. Takes about a minute.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
KIB = 1024
ALL_LINKS = 0xFFFFFFFF  # nvmlFieldValue_t.scopeId: the sum over all links
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
WORLD = 2
# A ring all_reduce sends (and receives) this many times the buffer per rank.
RING_FACTOR = 2 * (WORLD - 1) / WORLD
# Phases the ranks run: (name, all_reduces per second; 0: none, None: as fast as they go).
PHASES = (("idle", 0), ("slow", 4), ("fast", 16), ("max", None))
# NVML ids, with nvml.h's values where an older pynvml lacks the names.
FI = {"data_tx": 138, "data_rx": 139, "raw_tx": 140, "raw_rx": 141, "count_tx": 202, "count_rx": 204}
GPM_TOTAL = {"tx": 61, "rx": 60}
# Metrics per GPM request: pynvml's request struct holds NVML_GPM_METRIC_MAX of them, which an
# older pynvml sets as low as 98; a few small requests stay within any.
GPM_CHUNK = 24


# --------------------------------------------------------------------------- one rank


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=WORLD)
    x = torch.ones(args.size_mib * MIB // 4, dtype=torch.float32, device="cuda")
    for _ in range(3):  # NCCL's connections and buffers set up before anything is timed
        dist.all_reduce(x)
    torch.cuda.synchronize()
    log: dict = {"rank": rank, "size_bytes": x.numel() * 4, "phases": [], "ops": []}
    for name, rate in PHASES:
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.time()
        end = t0 + args.phase_s
        k = 0
        while True:
            if rate == 0:
                time.sleep(max(0.0, end - time.time()))
                break
            if rate is not None:
                start_at = t0 + k / rate
                if start_at >= end:
                    break
                time.sleep(max(0.0, start_at - time.time()))
            elif time.time() >= end:
                break
            s = time.time()
            dist.all_reduce(x)
            torch.cuda.synchronize()
            log["ops"].append((s, time.time()))
            k += 1
        log["phases"].append({"name": name, "rate": rate, "t0": t0, "t1": time.time(), "ops": k})
    dist.barrier()
    dist.destroy_process_group()
    Path(args.log).write_text(json.dumps(log))


# --------------------------------------------------------------------------- reading NVML


class Reader:
    """Every candidate of one GPU, read once: {candidate: (tx, rx) cumulative or rate, ...}."""

    def __init__(self, nv, index: int) -> None:
        self.nv = nv
        self.index = index
        self.h = nv.nvmlDeviceGetHandleByIndex(index)
        self.links = links_up(nv, self.h)
        self.gpm = None
        self.gpm_error = None
        self.gpm_ids: list[tuple[str, int]] = []
        try:
            if nv.nvmlGpmQueryDeviceSupport(self.h).isSupportedDevice:
                self.gpm = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
                self.cur = 0
                self.have_prev = False
                ids = [("total_tx", GPM_TOTAL["tx"]), ("total_rx", GPM_TOTAL["rx"])]
                for link in self.links:
                    ids += [(f"link{link}_{d}", gpm_link_id(nv, link, d, True)) for d in ("rx", "tx")]
                    ids += [(f"bytes{link}_{d}", gpm_link_id(nv, link, d, False)) for d in ("rx", "tx")]
                self.gpm_ids = ids
            else:
                self.gpm_error = "GPM not supported on this GPU"
        except Exception as exc:  # an older driver or binding
            self.gpm_error = f"{type(exc).__name__}: {exc}"

    def close(self) -> None:
        for s in self.gpm or ():
            try:
                self.nv.nvmlGpmSampleFree(s)
            except Exception:
                pass

    def fields(self, ids: list[tuple[int, int]]) -> list[tuple[int, int | None, int]]:
        """(fieldId, value or None, nvmlReturn) per requested (fieldId, scopeId)."""
        got = self.nv.nvmlDeviceGetFieldValues(self.h, ids)
        return [(int(v.fieldId), int(v.value.ullVal) if v.nvmlReturn == 0 else None, int(v.nvmlReturn)) for v in got]

    def read(self) -> dict:
        out: dict = {}

        def pair(name: str, tx_id: int, rx_id: int, scopes: list[int], unit: float) -> None:
            try:
                got = self.fields([(tx_id, s) for s in scopes] + [(rx_id, s) for s in scopes])
            except Exception as exc:
                out[name] = {"error": f"{type(exc).__name__}: {exc}"}
                return
            bad = [code for _, v, code in got if v is None]
            if bad:
                out[name] = {"error": f"NVML error {bad[0]}"}
                return
            n = len(scopes)
            out[name] = {"counter": True, "unit_bytes": unit,
                         "tx": sum(v for _, v, _ in got[:n]), "rx": sum(v for _, v, _ in got[n:]),
                         "per_link_tx": [v for _, v, _ in got[:n]] if n > 1 else None,
                         "per_link_rx": [v for _, v, _ in got[n:]] if n > 1 else None}

        pair("fv_data_scope0", FI["data_tx"], FI["data_rx"], [0], KIB)
        pair("fv_data_all", FI["data_tx"], FI["data_rx"], [ALL_LINKS], KIB)
        if self.links:
            pair("fv_data_links", FI["data_tx"], FI["data_rx"], self.links, KIB)
        pair("fv_raw_all", FI["raw_tx"], FI["raw_rx"], [ALL_LINKS], KIB)
        pair("fv_count_bytes_all", FI["count_tx"], FI["count_rx"], [ALL_LINKS], 1)
        if self.links:
            pair("fv_count_bytes_links", FI["count_tx"], FI["count_rx"], self.links, 1)
        for counter in (0, 1):
            name = f"util_counter{counter}"
            try:
                rx = tx = 0
                for link in self.links:
                    r, t = self.nv.nvmlDeviceGetNvLinkUtilizationCounter(self.h, link, counter)
                    rx, tx = rx + int(r), tx + int(t)
                out[name] = {"counter": True, "unit_bytes": None, "tx": tx, "rx": rx}
            except Exception as exc:
                out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        out.update(self.read_gpm())
        return out

    def read_gpm(self) -> dict:
        if self.gpm is None:
            return {"gpm_total": {"error": self.gpm_error}}
        nv = self.nv
        cur, prev = self.gpm[self.cur], self.gpm[self.cur ^ 1]
        try:
            nv.nvmlGpmSampleGet(self.h, cur)
        except Exception as exc:
            self.have_prev = False
            return {"gpm_total": {"error": f"sample: {type(exc).__name__}: {exc}"}}
        self.cur ^= 1
        if not self.have_prev:
            self.have_prev = True
            return {}
        values: dict[str, float | str] = {}
        for i in range(0, len(self.gpm_ids), GPM_CHUNK):
            chunk = self.gpm_ids[i:i + GPM_CHUNK]
            req = nv.c_nvmlGpmMetricsGet_t()
            req.version = nv.NVML_GPM_METRICS_GET_VERSION
            req.numMetrics = len(chunk)
            req.sample1, req.sample2 = prev, cur
            for j, (_, mid) in enumerate(chunk):
                req.metrics[j].metricId = mid
            try:
                nv.nvmlGpmMetricsGet(req)
            except Exception as exc:
                for name, _ in chunk:
                    values[name] = f"{type(exc).__name__}: {exc}"
                continue
            for j, (name, _) in enumerate(chunk):
                m = req.metrics[j]
                values[name] = float(m.value) if m.nvmlReturn == 0 else f"NVML error {m.nvmlReturn}"
        out: dict = {}
        tx, rx = values.get("total_tx"), values.get("total_rx")
        out["gpm_total"] = ({"rate": True, "tx_bps": tx * MIB, "rx_bps": rx * MIB}
                            if isinstance(tx, float) and isinstance(rx, float) else {"error": str(tx if not isinstance(tx, float) else rx)})
        per = [(values.get(f"link{k}_tx"), values.get(f"link{k}_rx")) for k in self.links]
        if per and all(isinstance(a, float) and isinstance(b, float) for a, b in per):
            out["gpm_links"] = {"rate": True, "tx_bps": sum(a for a, _ in per) * MIB, "rx_bps": sum(b for _, b in per) * MIB,
                                "per_link_tx_mib_s": [a for a, _ in per], "per_link_rx_mib_s": [b for _, b in per]}
        elif per:
            out["gpm_links"] = {"error": next(str(v) for p in per for v in p if not isinstance(v, float))}
        byt = [(values.get(f"bytes{k}_tx"), values.get(f"bytes{k}_rx")) for k in self.links]
        if byt and all(isinstance(a, float) and isinstance(b, float) for a, b in byt):
            out["gpm_link_bytes"] = {"counter": True, "unit_bytes": 1, "tx": sum(a for a, _ in byt), "rx": sum(b for _, b in byt)}
        elif byt:
            out["gpm_link_bytes"] = {"error": next(str(v) for p in byt for v in p if not isinstance(v, float))}
        return out


def gpm_link_id(nv, link: int, direction: str, rate: bool) -> int:
    """GPM metric id of one link's rate (MiB/s) or byte count, by pynvml's name where it has one;
    else nvml.h's numbering (links 0-17 rates from 62, 18-35 from 212; byte counts from 261),
    RX before TX."""
    d = direction.upper()
    name = f"NVML_GPM_METRIC_NVLINK_L{link}_{d}_PER_SEC" if rate else f"NVML_GPM_METRIC_NVLINK_L{link}_{d}"
    if rate:
        base = 62 + 2 * link if link < 18 else 212 + 2 * (link - 18)
    else:
        base = 261 + 2 * link
    return int(getattr(nv, name, base + (d == "TX")))


def links_up(nv, h) -> list[int]:
    up = []
    for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            state = nv.nvmlDeviceGetNvLinkState(h, link)
        except Exception:
            if link >= 18:
                break  # past the links this GPU has
            continue
        if state == getattr(nv, "NVML_FEATURE_ENABLED", 1):
            up.append(link)
    return up


def nvlink_pair(nv) -> tuple[int, int] | None:
    idx = int(getattr(nv, "NVML_P2P_CAPS_INDEX_NVLINK", 2))
    n = nv.nvmlDeviceGetCount()
    hs = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            try:
                if nv.nvmlDeviceGetP2PStatus(hs[a], hs[b], idx) == 0:
                    return a, b
            except Exception:
                continue
    return None


# --------------------------------------------------------------------------- the run


def expected_bytes(ops: list[tuple[float, float]], size: int, t0: float, t1: float) -> float:
    """Bytes each rank sends (and receives) in (t0, t1]: each all_reduce's bytes apportioned by
    how much of it falls in the window."""
    total = 0.0
    per_op = RING_FACTOR * size
    for s, e in ops:
        lo, hi = max(s, t0), min(e, t1)
        if hi > lo and e > s:
            total += per_op * (hi - lo) / (e - s)
    return total


def windows(reads: list[tuple[float, dict[int, dict]]], logs: list[dict], gpus: tuple[int, int]) -> list[dict]:
    out = []
    size = logs[0]["size_bytes"]
    ops = {gpus[lg["rank"]]: [tuple(o) for o in lg["ops"]] for lg in logs}
    phases = logs[0]["phases"]
    for (ta, a), (tb, b) in zip(reads, reads[1:]):
        dt = tb - ta
        phase = next((p["name"] for p in phases if p["t0"] <= (ta + tb) / 2 <= p["t1"]), None)
        w: dict = {"t0": ta, "t1": tb, "phase": phase, "gpus": {}}
        for g in gpus:
            exp = expected_bytes(ops.get(g, []), size, ta, tb) / dt
            row: dict = {"expected_bps": exp, "candidates": {}}
            for name, vb in b[g].items():
                va = a[g].get(name, {})
                if "error" in vb:
                    row["candidates"][name] = {"error": vb["error"]}
                elif vb.get("rate"):
                    row["candidates"][name] = {"tx_bps": vb["tx_bps"], "rx_bps": vb["rx_bps"],
                                               **{k: v for k, v in vb.items() if k.startswith("per_link")}}
                elif vb.get("counter") and va.get("counter"):
                    dtx, drx = vb["tx"] - va["tx"], vb["rx"] - va["rx"]
                    unit = vb["unit_bytes"]
                    c = {"tx_raw_per_s": dtx / dt, "rx_raw_per_s": drx / dt, "went_back": dtx < 0 or drx < 0}
                    if unit is not None:
                        c.update(tx_bps=dtx * unit / dt, rx_bps=drx * unit / dt)
                    if vb.get("per_link_tx") and va.get("per_link_tx"):
                        c["per_link_tx_raw_per_s"] = [(x - y) / dt for x, y in zip(vb["per_link_tx"], va["per_link_tx"])]
                        c["per_link_rx_raw_per_s"] = [(x - y) / dt for x, y in zip(vb["per_link_rx"], va["per_link_rx"])]
                    row["candidates"][name] = c
            w["gpus"][str(g)] = row
        out.append(w)
    return out


def summarize(wins: list[dict], gpus: tuple[int, int]) -> dict:
    """Per GPU and candidate: measured / expected over the loaded windows (median, spread), and
    whether it read zero (or an error) while the all_reduce ran."""
    out: dict = {}
    for g in gpus:
        per: dict = {}
        loaded = [w for w in wins if w["phase"] in ("slow", "fast", "max") and w["gpus"][str(g)]["expected_bps"] > 0]
        idle = [w for w in wins if w["phase"] == "idle"]
        names = sorted({n for w in wins for n in w["gpus"][str(g)]["candidates"]})
        for name in names:
            ratios_tx, ratios_rx, errors, raw = [], [], set(), []
            for w in loaded:
                row = w["gpus"][str(g)]
                c = row["candidates"].get(name, {})
                if "error" in c:
                    errors.add(c["error"])
                    continue
                if "tx_bps" in c:
                    ratios_tx.append(c["tx_bps"] / row["expected_bps"])
                    ratios_rx.append(c["rx_bps"] / row["expected_bps"])
                elif "tx_raw_per_s" in c:
                    raw.append((c["tx_raw_per_s"], c["rx_raw_per_s"], row["expected_bps"]))
            idle_vals = [w["gpus"][str(g)]["candidates"].get(name, {}).get("tx_bps") for w in idle]
            s: dict = {"loaded_windows": len(loaded)}
            if errors:
                s["errors"] = sorted(errors)
            if ratios_tx:
                s.update(tx_ratio_median=statistics.median(ratios_tx), rx_ratio_median=statistics.median(ratios_rx),
                         tx_ratio_range=[min(ratios_tx), max(ratios_tx)], rx_ratio_range=[min(ratios_rx), max(ratios_rx)],
                         reads_zero_under_load=max(ratios_tx + ratios_rx) == 0.0)
            if raw:
                s.update(raw_units_per_expected_byte_median=statistics.median(
                    [(a + b) / (2 * e) for a, b, e in raw]), reads_zero_under_load=all(a == 0 and b == 0 for a, b, _ in raw))
            vals = [v for v in idle_vals if v is not None]
            if vals:
                s["idle_bps_median"] = statistics.median(vals)
            per[name] = s
        out[str(g)] = per
    return out


def probe_main(args: argparse.Namespace) -> int:
    try:
        import pynvml as nv
    except ImportError:
        print("needs nvidia-ml-py (pip install nvidia-ml-py)", file=sys.stderr)
        return 2
    try:
        nv.nvmlInit()
    except Exception as exc:
        print(f"NVML cannot start: {exc}", file=sys.stderr)
        return 2
    try:
        gpus = tuple(int(x) for x in args.gpus.split(",")) if args.gpus else nvlink_pair(nv)
        if gpus is None or len(gpus) != 2:
            print("no two GPUs joined by NVLink here (give --gpus A,B to choose)", file=sys.stderr)
            return 2
        readers = {g: Reader(nv, g) for g in gpus}
        meta = describe(nv, gpus, readers, args)
        tmp = Path(tempfile.mkdtemp(prefix="probe_nvlink."))  # the ranks' logs of their all_reduces
        env = dict(os.environ, **NVLS_OFF, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   WORLD_SIZE=str(WORLD), CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=f"{gpus[0]},{gpus[1]}")
        procs = []
        for r in range(WORLD):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--rank", "--size-mib", str(args.size_mib),
                   "--phase-s", str(args.phase_s), "--log", str(tmp / f"rank{r}.json")]
            procs.append(subprocess.Popen(cmd, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        reads: list[tuple[float, dict[int, dict]]] = []
        deadline = time.time() + args.timeout_s
        next_t = time.time()
        while any(p.poll() is None for p in procs) and time.time() < deadline:
            t = time.time()
            reads.append((t, {g: rd.read() for g, rd in readers.items()}))
            next_t += 1.0
            time.sleep(max(0.0, next_t - time.time()))
        reads.append((time.time(), {g: rd.read() for g, rd in readers.items()}))
        for p in procs:
            if p.poll() is None:
                p.kill()
        outs = [p.communicate()[0] for p in procs]
        for rd in readers.values():
            rd.close()
    finally:
        nv.nvmlShutdown()
    if any(p.returncode != 0 for p in procs):
        for r, (p, o) in enumerate(zip(procs, outs)):
            print(f"rank {r} exit {p.returncode}:\n{o[-3000:]}", file=sys.stderr)
        return 1
    logs = [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(WORLD)]
    wins = windows(reads, logs, gpus)
    result = {
        "meta": meta,
        "phases": logs[0]["phases"],
        "expected": f"per rank and direction: all_reduces x {RING_FACTOR:g} x {logs[0]['size_bytes']} bytes "
                    "(ring all_reduce, n = 2), apportioned over the windows; NCCL's own protocol "
                    "(Simple for buffers this large) adds a few percent that a data counter includes",
        "notes": [
            "fv_data_scope0 is link 0 alone: it reads the whole traffic only where one link carries it",
            "util_counter0/1 are read as the driver left them: this probe sets no control "
            "(nvmlDeviceSetNvLinkUtilizationControl is deprecated and changes device state); zero or an "
            "error there is that, not absence of traffic",
            "fv_count_bytes_* (fields 202/204) are assumed to count bytes",
        ],
        "summary": summarize(wins, gpus),
        "windows": wins,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print_table(result, gpus)
    print(f"wrote {args.out}")
    return 0


def describe(nv, gpus, readers, args) -> dict:
    def safe(fn, *a):
        try:
            v = fn(*a)
            return v.decode() if isinstance(v, bytes) else v
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    out = {"host": socket.gethostname(), "python": platform.python_version(),
           "pynvml": safe(importlib.metadata.version, "nvidia-ml-py"),
           "driver": safe(nv.nvmlSystemGetDriverVersion), "nvml": safe(nv.nvmlSystemGetNVMLVersion),
           "size_mib": args.size_mib, "phase_s": args.phase_s, "nvls_off": NVLS_OFF, "gpus": {}}
    for g in gpus:
        rd = readers[g]
        remote = {}
        for link in rd.links:
            pci = safe(nv.nvmlDeviceGetNvLinkRemotePciInfo, rd.h, link)
            remote[link] = getattr(pci, "busId", pci) if not isinstance(pci, str) else pci
            if isinstance(remote[link], bytes):
                remote[link] = remote[link].decode()
        out["gpus"][str(g)] = {"name": safe(nv.nvmlDeviceGetName, rd.h),
                               "pci": safe(lambda: nv.nvmlDeviceGetPciInfo(rd.h).busId),
                               "links_up": rd.links, "link_remote_pci": remote,
                               "nvlink_version": safe(nv.nvmlDeviceGetNvLinkVersion, rd.h, rd.links[0]) if rd.links else None,
                               "gpm": rd.gpm is not None, "gpm_error": rd.gpm_error}
    return out


def print_table(result: dict, gpus) -> None:
    print(f"{'GPU':>3}  {'candidate':<22} {'tx/expected':>12} {'rx/expected':>12}  note")
    for g in gpus:
        for name, s in result["summary"][str(g)].items():
            tx = f"{s['tx_ratio_median']:.3f}" if "tx_ratio_median" in s else "-"
            rx = f"{s['rx_ratio_median']:.3f}" if "rx_ratio_median" in s else "-"
            note = "; ".join(s.get("errors", []))
            if "raw_units_per_expected_byte_median" in s:
                note = f"raw units per expected byte {s['raw_units_per_expected_byte_median']:.3g}" + (f"; {note}" if note else "")
            if s.get("reads_zero_under_load"):
                note = "reads 0 under load" + (f"; {note}" if note else "")
            print(f"{g:>3}  {name:<22} {tx:>12} {rx:>12}  {note}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", help="two NVML indices joined by NVLink (default: the first such pair)")
    ap.add_argument("--size-mib", type=int, default=256, help="the all_reduce buffer (default 256 MiB)")
    ap.add_argument("--phase-s", type=float, default=8.0, help="seconds per phase (idle, slow, fast, max)")
    ap.add_argument("--timeout-s", type=float, default=180.0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "probe_nvlink.json"))
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)  # one rank of the job
    ap.add_argument("--log", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank:
        rank_main(args)
        return 0
    return probe_main(args)


if __name__ == "__main__":
    sys.exit(main())
