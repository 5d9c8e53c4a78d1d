"""`python3 -m analysis reshard`: the paper's Figure 8 from bench_resilience's paced benchmarks
(`make bench-reshard`; bench/README.md, "Paced NTP sync and Figure 8").

Input: Google Benchmark JSON with `reshard_slowdown/<model>/<n1>-><n2>/tokens<N>` rows (counters
`reshard_over_compute`, `slowdown`, `link_overruns`, `time_scale`) and `ntp_sync_paced/...` rows
(`exposed_ntp/uniform` and its parts).

reshard_over_compute is (the bytes one GPU of the healthy replica sends in the regroup) / (scale-up
link rate), over (that GPU's backward compute) / (device rate): dimensionless. `slowdown` is the
healthy replica's backward to the end of its reshard over the same backward in a uniform run. The
paper reports it linear in that ratio and at most ~4% where its prototype sits. Printed: the rows,
the least-squares line slowdown = a + b x, and the paper's prototype shapes placed on it:

  2 DGX A100 (TP 8 per node; NVLink 3 at 300 GB/s each way, 312 TFLOP/s bf16 dense), hidden 6144
  and 12288, sequences of 4K, 8K and 16K tokens, one sequence per replica's backward, TP 8 -> 7.
  Under NTP's layout the healthy replica's extra rank sends its whole shard of each layer's
  weights' gradients (12 h^2 / 8 values a layer; fp32, as ntpbench reduces them), and the backward
  of a layer is 2 (24 h^2 T + 4 T^2 h) FLOPs over 8 GPUs (Megatron's count, T tokens).
"""
from __future__ import annotations

import json
import re
import sys

import numpy as np

A100_FLOPS = 312e12       # bf16 dense peak
NVLINK_BYTES_S = 300e9    # NVLink 3, each way
GRAD_BYTES = 4            # fp32 gradients
PROTOTYPE = [(h, t) for h in (6144, 12288) for t in (4096, 8192, 16384)]


def prototype_ratio(hidden: int, seq: int, n1: int = 8) -> float:
    """reshard_over_compute of the prototype's shape (module docstring)."""
    reshard_s = 12 * hidden ** 2 / n1 * GRAD_BYTES / NVLINK_BYTES_S
    compute_s = 2 * (24 * hidden ** 2 * seq + 4 * seq ** 2 * hidden) / n1 / A100_FLOPS
    return reshard_s / compute_s


def load(path: str) -> tuple[list[dict], list[dict]]:
    """(reshard_slowdown rows, ntp_sync_paced rows) of a benchmark JSON; skipped ones left out."""
    with open(path) as f:
        doc = json.load(f)
    slow, sync = [], []
    for b in doc.get("benchmarks", []):
        if b.get("error_occurred") or b.get("skipped"):
            continue
        name = b["name"].split("/iterations")[0]
        if name.startswith("reshard_slowdown/"):
            slow.append({"name": name, **{k: b[k] for k in ("reshard_over_compute", "slowdown", "link_overruns",
                                                              "time_scale", "reshard_MB")}})
        elif name.startswith("ntp_sync_paced/"):
            sync.append({"name": name, **{k: b[k] for k in ("exposed_ntp/uniform", "exposed_ntp_us", "exposed_uniform_us",
                                                              "backward_ntp_us", "backward_uniform_us", "r0_reshard_us",
                                                              "r0_allreduce_us", "link_overruns", "time_scale")}})
    return slow, sync


def fit(rows: list[dict]) -> tuple[float, float, float]:
    """slowdown = a + b x by least squares over the rows: (a, b, R^2)."""
    x = np.array([r["reshard_over_compute"] for r in rows])
    y = np.array([r["slowdown"] for r in rows])
    b, a = np.polyfit(x, y, 1)
    resid = y - (a + b * x)
    ss = float(np.sum((y - y.mean()) ** 2))
    return float(a), float(b), 1.0 - float(np.sum(resid ** 2)) / ss if ss > 0 else 1.0


def model_of(row: dict) -> str:
    return row["name"].split("/")[1]


def fits_by_model(rows: list[dict]) -> dict[str, tuple[float, float, float]]:
    """One line per model with at least two distinct ratios: a model whose sync is latency-bound
    (small gradients, many messages) and one that is bandwidth-bound lie on different lines."""
    out = {}
    for model in sorted({model_of(r) for r in rows}):
        mine = [r for r in rows if model_of(r) == model]
        if len({r["reshard_over_compute"] for r in mine}) >= 2:
            out[model] = fit(mine)
    return out


def plot(rows: list[dict], line: tuple[float, float, float], png: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    a, b, r2 = line
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = np.array([0.0, max(max(r["reshard_over_compute"] for r in rows), max(prototype_ratio(h, t) for h, t in PROTOTYPE))])
    per = fits_by_model(rows)
    for model in sorted({model_of(r) for r in rows}):
        mine = [r for r in rows if model_of(r) == model]
        dots = ax.scatter([r["reshard_over_compute"] for r in mine], [r["slowdown"] for r in mine], label=model)
        if model in per:
            ma, mb, mr2 = per[model]
            ax.plot(xs, ma + mb * xs, ":", color=dots.get_facecolor()[0],
                    label=f"{model}: {ma:.3f} + {mb:.3f} x (R² {mr2:.2f})")
    ax.plot(xs, a + b * xs, "k--", label=f"all: {a:.3f} + {b:.3f} x (R² {r2:.2f})")
    for h, t in PROTOTYPE:
        ax.axvline(prototype_ratio(h, t), color="grey", alpha=0.3)
    ax.set_xlabel("reshard bytes / NVLink rate over backward compute (one GPU)")
    ax.set_ylabel("backward slowdown (reshard included)")
    ax.set_title("NTP reshard cost (grey: the paper's prototype shapes)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main(args) -> int:
    slow, sync = [], []
    for path in args.bench:
        try:
            s, y = load(path)
        except (OSError, ValueError, KeyError) as e:
            print(f"{path}: not a bench_resilience JSON with the paced benchmarks ({e})", file=sys.stderr)
            return 1
        slow += s
        sync += y
    if not slow and not sync:
        print("no reshard_slowdown or ntp_sync_paced rows (run `make bench-reshard`)", file=sys.stderr)
        return 1
    if sync:
        print("paced NTP sync (DGX A100 links), exposed after the backward, DGX microseconds:")
        print(f"  {'benchmark':<28} {'ntp/uniform':>11} {'ntp':>8} {'uniform':>8} {'r0 reshard':>10} "
              f"{'r0 allreduce':>12} {'overruns':>8}")
        for r in sync:
            print(f"  {r['name']:<28} {r['exposed_ntp/uniform']:>11.3f} {r['exposed_ntp_us']:>8.1f} "
                  f"{r['exposed_uniform_us']:>8.1f} {r['r0_reshard_us']:>10.1f} {r['r0_allreduce_us']:>12.1f} "
                  f"{int(r['link_overruns']):>8}")
    if slow:
        print("reshard slowdown (Figure 8):")
        print(f"  {'benchmark':<34} {'reshard/compute':>15} {'slowdown':>8} {'reshard MB':>10} {'overruns':>8}")
        for r in sorted(slow, key=lambda r: r["reshard_over_compute"]):
            print(f"  {r['name']:<34} {r['reshard_over_compute']:>15.4f} {r['slowdown']:>8.4f} "
                  f"{r['reshard_MB']:>10.2f} {int(r['link_overruns']):>8}")
    if len(slow) >= 2:
        line = fit(slow)
        a, b, r2 = line
        print(f"fit: slowdown = {a:.4f} + {b:.4f} x reshard/compute (R^2 {r2:.3f})")
        per = fits_by_model(slow)
        for model, (ma, mb, mr2) in per.items():
            print(f"fit {model}: slowdown = {ma:.4f} + {mb:.4f} x reshard/compute (R^2 {mr2:.3f})")
        print("the paper's prototype (TP 8 -> 7 on a DGX A100, fp32 gradients, one sequence per backward), "
              "slowdown on each line:")
        print(f"  {'hidden':>6} {'seq':>6} {'reshard/compute':>15} {'all':>7}" + "".join(f" {m:>7}" for m in per))
        for h, t in PROTOTYPE:
            x = prototype_ratio(h, t)
            print(f"  {h:>6} {t:>6} {x:>15.4f} {a + b * x:>7.4f}" + "".join(f" {ma + mb * x:>7.4f}" for ma, mb, _ in per.values()))
        if args.plot:
            plot(slow, line, args.plot)
            print(f"wrote {args.plot}")
    return 0
