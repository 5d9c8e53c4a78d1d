#!/usr/bin/env python3
"""Prints the tables people compare from ntpbench's Google Benchmark JSON (results/bench/*.json).

    python3 bench/report.py results/bench            # every *.json there
    python3 bench/report.py results/bench/comm.json  # one file

Standard library only. Exits non-zero if any collective reported wrong elements.
"""
import json
import math
import pathlib
import sys

UNIT = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def load(path):
    with open(path) as f:
        return json.load(f)


def clean_name(run):
    """Benchmark name without Google Benchmark's suffixes (min_time:, iterations:, real_time...)."""
    parts = run.get("run_name", run["name"]).split("/")
    keep = [p for p in parts if not (p.startswith(("min_time:", "iterations:", "repeats:"))
                                     or p in ("real_time", "manual_time"))]
    return "/".join(keep)


def runs(doc):
    """name -> run, taking the median aggregate when repetitions were made."""
    out, medians = {}, {}
    for r in doc.get("benchmarks", []):
        name = clean_name(r)
        if r.get("run_type") == "aggregate":
            if r.get("aggregate_name") == "median":
                medians[name] = r
        else:
            out.setdefault(name, r)
    out.update(medians)
    return out


def seconds(r):
    return r["real_time"] * UNIT[r.get("time_unit", "ns")]


def table(title, header, rows):
    print(f"\n## {title}\n")
    cols = list(zip(*([header] + rows))) if rows else [[h] for h in header]
    widths = [max(len(str(c)) for c in col) for col in cols]
    line = lambda cells: "| " + " | ".join(str(c).rjust(w) for c, w in zip(cells, widths)) + " |"
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))


def fmt(x, nd=2):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{nd}f}"


def context(doc, keys=("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "openblas_corename", "omp_max_threads",
                       "mpi_ranks", "host")):
    ctx = doc.get("context", {})
    load = ctx.get("load_avg")
    load = f", load_avg={'/'.join(f'{x:.1f}' for x in load)}" if load else ""
    return ", ".join(f"{k}={ctx.get(k, '?')}" for k in keys) + load


def report_kernels(doc, title):
    rs = runs(doc)
    rows = []
    for name, r in rs.items():
        impl, shape, kernel = name.split("/", 2)
        if impl != "fast":
            continue
        metric = "GFLOP/s" if "GFLOP/s" in r else "GB/s"
        sg = rs.get(f"sgemm/{shape}/{kernel}")
        ref = rs.get(f"ref/{shape}/{kernel}")
        rows.append([shape, kernel, fmt(seconds(r) * 1e6, 1), metric, fmt(r[metric]),
                     fmt(sg[metric]) if sg else "-",
                     fmt(100 * r[metric] / sg[metric], 0) + "%" if sg else "-",
                     fmt(ref[metric]) if ref else "-",
                     fmt(seconds(ref) / seconds(r), 1) + "x" if ref else "-"])
    table(f"{title}: CPU kernels ({context(doc)})",
          ["shape", "kernel", "fast us", "unit", "fast", "sgemm", "fast/sgemm", "ref", "speed-up vs ref"], rows)


def report_comm(doc, title):
    rs = runs(doc)
    rows, wrong = [], 0
    for name, r in rs.items():
        coll, path, size = name.split("/")
        if path == "raw" and f"{coll}/seam/{size}" in rs:
            continue  # printed beside its seam row
        raw = rs.get(f"{coll}/raw/{size}") if path == "seam" else None
        wrong += int(r.get("wrong", 0)) + (int(raw.get("wrong", 0)) if raw else 0)
        rows.append([coll, size, int(r["bytes"]), path, fmt(seconds(r) * 1e6, 1), fmt(r["algbw_GB/s"], 3),
                     fmt(r["busbw_GB/s"], 3), fmt(raw["busbw_GB/s"], 3) if raw else "-",
                     fmt(seconds(r) / seconds(raw), 2) if raw else "-",
                     int(r.get("wrong", 0)) + (int(raw.get("wrong", 0)) if raw else 0)])
    table(f"{title}: collectives, nccl-tests columns ({context(doc)})",
          ["collective", "size", "bytes", "path", "time us", "algbw GB/s", "busbw GB/s", "raw busbw GB/s",
           "seam/raw time", "#wrong"], rows)
    return wrong


def report_layer(doc, title):
    rs = runs(doc)
    rows, base = [], {}
    for name, r in sorted(rs.items(), key=lambda kv: kv[0]):
        _, shape, tp = name.split("/")
        tp = int(tp.split(":")[1])
        t = seconds(r)
        base.setdefault(shape, t if tp == 1 else None)
        b = base[shape]
        rows.append([shape, tp, fmt(t * 1e3, 1), fmt(r["GFLOP/s"], 1), fmt(b / t, 2) if b else "-",
                     fmt(100 * b / t / tp, 0) + "%" if b else "-", fmt(100 * r.get("tp_comm_frac", 0), 0) + "%"])
    table(f"{title}: one transformer layer fwd+bwd, strong scaling (median of 3; {context(doc)})",
          ["shape", "TP", "time ms", "GFLOP/s", "speed-up vs TP1", "efficiency", "TP comm (rank 0)"], rows)


def report_step(doc, title):
    rows = []
    for name, r in runs(doc).items():
        rows.append([name.split("/")[1], int(r["threads"]), fmt(r["step_ms"], 0), fmt(r["forward_ms"], 0),
                     fmt(r["backward_ms"], 0), fmt(r["optimizer_ms"], 0), fmt(r["sgemm_set_ms"], 0),
                     fmt(r["step_GFLOP/s"], 1), fmt(r["sgemm_GFLOP/s"], 1), fmt(100 * r["step_vs_sgemm"], 1) + "%"])
    table(f"{title}: whole step vs cblas_sgemm at the step's GEMM shapes (medians of interleaved rounds; "
          f"{context(doc)})",
          ["model", "threads", "step ms", "fwd ms", "bwd ms", "optim ms", "sgemm set ms", "step GFLOP/s",
           "sgemm GFLOP/s", "step/sgemm (target >= 70%)"], rows)


def report_resilience(doc, title):
    rows_sync, rows_heal = [], []
    for r in doc.get("benchmarks", []):
        name = clean_name(r)
        kind, model, what = name.split("/")
        if r.get("error_occurred"):
            msg = r.get("error_message", "skipped")
            (rows_sync if kind == "ntp_sync" else rows_heal).append(
                [model, what] + ["-"] * (10 if kind == "ntp_sync" else 7) + [msg])
            continue
        if kind == "ntp_sync":
            rows_sync.append([model, what, fmt(r["exposed_ntp_ms"], 1), fmt(r["exposed_uniform_ms"], 1),
                              fmt(r["exposed_ntp/uniform"], 2) + "x",
                              fmt(r["ntp_ms"], 1), fmt(r["uniform_ms"], 1), fmt(r["ntp/uniform"], 2) + "x",
                              fmt(r["healthy_ms"], 1) if "healthy_ms" in r else "-",
                              fmt(r["r0_reshard_ms"], 1), fmt(r["r0_allreduce_ms"], 1),
                              int(r["allreduce_bytes"]), int(r["ntp_bytes_sent"]), int(r.get("wrong", 0))])
        else:
            rows_heal.append([model, what, fmt(r["step_ms"], 0), fmt(r["kill_heal_ms"], 0), fmt(r["kill_heal_MB"], 1),
                              fmt(r["kill_heal/step"], 2), fmt(r["revive_heal_ms"], 0), fmt(r["revive_heal_MB"], 1),
                              fmt(r["revive_heal/step"], 2), ""])
    table(f"{title}: NTP gradient sync vs uniform all-reduce of the same bytes (medians; {context(doc)})",
          ["model", "TP pair", "overlapped: ntp ms", "uniform ms", "ntp/uniform (target <= 1.10x)",
           "serial: ntp ms", "uniform ms", "ntp/uniform", "healthy ms",
           "r0 reshard ms", "r0 allreduce ms", "allreduce bytes/rank", "ntp bytes sent (max)", "#wrong"], rows_sync)
    table(f"{title}: healing vs step time (medians; {context(doc)})",
          ["model", "layout", "step ms", "kill heal ms", "kill heal MB", "kill heal/step", "revive heal ms",
           "revive heal MB", "revive heal/step (target <= 1 at small)", "note"], rows_heal)
    return sum(int(r.get("wrong", 0)) for r in doc.get("benchmarks", []))


def report_pipeline(doc, title):
    bubble, layout = [], []
    for r in doc.get("benchmarks", []):
        parts = clean_name(r).split("/")
        if r.get("error_occurred"):
            continue
        if parts[0] == "pipeline_bubble":
            bubble.append([parts[1], parts[2], fmt(seconds(r) * 1e3, 0), fmt(100 * r["bubble"], 1) + "%",
                           fmt(100 * r["ideal"], 1) + "%", fmt(r["bubble/ideal"], 2)])
        else:
            layout.append([parts[1], fmt(seconds(r) * 1e3, 0), fmt(r["tokens_per_s"], 0),
                           fmt(100 * r["bubble"], 1) + "%"])
    table(f"{title}: 1F1B bubble under paced timing, TP 1 x PP P x DP 8/P (medians; {context(doc)})",
          ["stages", "micro-batches", "step ms", "measured bubble", "(P-1)/(M+P-1)", "measured/ideal"], bubble)
    table(f"{title}: throughput by layout at 8 ranks, 8 sequences per step (paced; {context(doc)})",
          ["layout", "step ms", "tokens/s", "bubble"], layout)
    return 0


def main(argv):
    paths = []
    for a in argv[1:] or ["results/bench"]:
        p = pathlib.Path(a)
        paths += sorted(p.glob("*.json")) if p.is_dir() else [p]
    wrong = 0
    for p in paths:
        doc = load(p)
        names = [b["name"] for b in doc.get("benchmarks", [])]
        title = p.stem
        if any(n.startswith(("fast/", "ref/", "sgemm/")) for n in names):
            report_kernels(doc, title)
        elif any(n.startswith("layer_fwd_bwd/") for n in names):
            report_layer(doc, title)
        elif any(n.startswith("step_vs_sgemm/") for n in names):
            report_step(doc, title)
        elif any(n.startswith(("pipeline_bubble/", "pipeline_layout/")) for n in names):
            report_pipeline(doc, title)
        elif any(n.startswith(("ntp_sync/", "heal/")) for n in names):
            wrong += report_resilience(doc, title)
        elif names:
            wrong += report_comm(doc, title)
    if wrong:
        print(f"\nFAILED: {wrong} wrong elements in collective checks")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
