"""`python3 -m analysis plot`: PNG figures of one or more runs (matplotlib, Agg backend).

Per run (file stem S):
  S_throughput.png  tokens/(t_end - t_start) of every executed step against run time, with
                    vertical marks at kill (red) and revive (green) events from /events
  S_tp_degree.png   live TP degree of each replica per executed step (/replicas/tp_degree)
  S_phases.png      per-phase time per step, mean over ranks, stacked (/ranks/phase_times)
Across the runs given:
  goodput_by_policy.png  goodput and throughput (tokens/s) of each run, labelled by policy
  phase_totals.png       total time per phase of each run (sum over steps, mean over ranks)
"""
from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from . import metrics  # noqa: E402
from .runfile import Run, load_run  # noqa: E402

PHASE_COLORS = {"forward": "#4C72B0", "backward": "#55A868", "tp_comm": "#C44E52", "dp_comm": "#8172B2",
                "pp_comm": "#937860", "reshard": "#CCB974", "optimizer": "#64B5CD", "recovery": "#E17C05", "revival": "#B07AA1", "idle": "#BBBBBB",
                "other": "#777777"}


def _stem(path: str, used: set) -> str:
    stem = os.path.splitext(os.path.basename(path))[0]
    base, n = stem, 2
    while stem in used:
        stem, n = f"{base}-{n}", n + 1
    used.add(stem)
    return stem


def _title(run: Run) -> str:
    return f"{run.name}: policy {run.policy}, TP {run.tp} x DP {run.dp}, {run.attrs.get('timing', '?')} timing"


def _event_marks(ax, run: Run) -> None:
    ev = run.events
    if not len(ev):
        return
    kinds = ev["kind"].astype(str)
    for kind, color, style in (("kill", "tab:red", "--"), ("revive", "tab:green", ":"),
                               ("takeover", "tab:purple", "-."), ("spare", "tab:purple", "-.")):
        sel = ev[kinds == kind]
        for i, (t, rank) in enumerate(zip(sel["time"], sel["rank"])):
            ax.axvline(float(t), color=color, linestyle=style, linewidth=1.2,
                       label=f"{kind}" if i == 0 else None)
            ax.annotate(f"{kind} r{int(rank)}", (float(t), 1.0), xycoords=("data", "axes fraction"),
                        rotation=90, va="top", ha="right", fontsize=7, color=color)


def plot_throughput(run: Run, path: str) -> None:
    s = run.steps
    dt = run.step_seconds()
    with np.errstate(divide="ignore", invalid="ignore"):
        tput = s["tokens"].to_numpy(dtype=float) / dt
    committed = s["tokens_committed"].to_numpy() > 0
    fig, ax = plt.subplots(figsize=(9, 4.5))
    t = s["t_end"].to_numpy(dtype=float)
    ax.plot(t, tput, "-", color="tab:blue", linewidth=1, alpha=0.6)
    ax.plot(t[committed], tput[committed], "o", color="tab:blue", markersize=3, label="step (committed)")
    if (~committed).any():
        ax.plot(t[~committed], tput[~committed], "x", color="tab:orange", markersize=6,
                label="step (rolled back)")
    rec = metrics.recompute(run)
    if np.isfinite(rec["healthy_throughput_tokens_per_s"]):
        ax.axhline(rec["healthy_throughput_tokens_per_s"], color="gray", linewidth=0.8,
                   label="healthy median")
    _event_marks(ax, run)
    ax.set_xlabel("run time at step end (s)")
    ax.set_ylabel("throughput (tokens/s)")
    ax.set_ylim(bottom=0)
    ax.set_title(_title(run), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_tp_degree(run: Run, path: str) -> None:
    tp = run.replicas["tp_degree"]
    x = np.arange(1, tp.shape[0] + 1)
    fig, ax = plt.subplots(figsize=(9, 4))
    nrep = tp.shape[1] if tp.ndim == 2 else 0
    for r in range(nrep):
        # Offset the lines a little so replicas with the same degree stay visible.
        off = (r - (nrep - 1) / 2) * 0.06
        ax.step(x, tp[:, r] + off, where="mid", label=f"replica {r}", linewidth=1.5)
    ax.set_xlabel("executed step (row of /steps)")
    ax.set_ylabel("live TP degree (ranks; 0 = down)")
    ax.set_ylim(-0.3, max(run.tp, int(tp.max()) if tp.size else 1) + 0.5)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_title(_title(run), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=min(nrep, 4) or 1, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_phases(run: Run, path: str) -> None:
    pt = run.phase_times  # [steps, ranks, phases]
    mean = pt.mean(axis=1) if pt.size else np.zeros((0, len(run.phases)))
    x = np.arange(1, mean.shape[0] + 1)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    bottom = np.zeros(mean.shape[0])
    for j, name in enumerate(run.phases):
        if not mean[:, j].any():
            continue
        ax.bar(x, mean[:, j] * 1e3, bottom=bottom * 1e3, width=0.85, label=name,
               color=PHASE_COLORS.get(name))
        bottom += mean[:, j]
    ax.set_xlabel("executed step (row of /steps)")
    ax.set_ylabel("time per step, mean over ranks (ms)")
    ax.set_title(_title(run), fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="phase")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_goodput_by_policy(runs: list[Run], labels: list[str], path: str) -> None:
    recs = [metrics.recompute(r) for r in runs]
    x = np.arange(len(runs))
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(runs) + 2), 4.5))
    w = 0.38
    ax.bar(x - w / 2, [r["throughput_tokens_per_s"] for r in recs], w, label="throughput (tokens / step time)",
           color="tab:blue")
    bars = ax.bar(x + w / 2, [r["goodput_tokens_per_s"] for r in recs], w,
                  label="goodput (committed tokens / wall time)", color="tab:green")
    for b, r in zip(bars, recs):
        if np.isfinite(r["goodput_ratio"]):
            ax.annotate(f"{r['goodput_ratio']:.2f}", (b.get_x() + b.get_width() / 2, b.get_height()),
                        ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("tokens/s")
    ax.set_title("Goodput by policy (labels: goodput / healthy throughput)", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_phase_totals(runs: list[Run], labels: list[str], path: str) -> None:
    names = []
    for r in runs:
        names += [p for p in r.phases if p not in names]
    x = np.arange(len(runs))
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(runs) + 2), 4.5))
    bottom = np.zeros(len(runs))
    for name in names:
        vals = np.array([r.phase_times[:, :, r.phases.index(name)].mean(axis=1).sum()
                         if name in r.phases and r.phase_times.size else 0.0 for r in runs])
        if not vals.any():
            continue
        ax.bar(x, vals, bottom=bottom, label=name, color=PHASE_COLORS.get(name))
        bottom += vals
    ax.set_xticks(x, labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("total time over steps, mean over ranks (s)")
    ax.set_title("Time per phase", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="phase")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def make_plots(paths: list[str], out_dir: str) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    runs = [load_run(p) for p in paths]
    written, used = [], set()
    labels = []
    for run in runs:
        stem = _stem(run.path, used)
        labels.append(f"{stem}\n({run.policy}, {run.tp}x{run.dp})")
        for kind, fn in (("throughput", plot_throughput), ("tp_degree", plot_tp_degree), ("phases", plot_phases)):
            p = os.path.join(out_dir, f"{stem}_{kind}.png")
            fn(run, p)
            written.append(p)
    for name, fn in (("goodput_by_policy", plot_goodput_by_policy), ("phase_totals", plot_phase_totals)):
        p = os.path.join(out_dir, f"{name}.png")
        fn(runs, labels, p)
        written.append(p)
    return written


def main(args) -> int:
    import sys

    from .runfile import SchemaError
    try:
        written = make_plots(args.runs, args.out)
    except SchemaError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for p in written:
        print(p)
    return 0
