"""Fig. 7: per-GPU throughput of a fixed mini-batch against spare domains, the spares to never be short,
its table and its plot."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .costs import Costs, restart_stall
from .failures import failure_trace
from .model import DAY, POLICIES, Cluster, FailureModel, Params, damaged_replicas, fixed_batch_throughput, replica_speeds, speed_table
from .tables import _table


def spares_sweep(cl: Cluster, spares, fm: FailureModel, policies=POLICIES, params: Params = Params(),
                 days: float = 30, sample_hours: float = 1.0, trials: int = 4, seed: int = 2,
                 costs: Costs = Costs()) -> pd.DataFrame:
    """Fig. 7: per-GPU throughput against spare domains with a fixed mini-batch; with costs, every
    failure and every repair among the pool's J + S domains also stalls the job (`costs`)."""
    rng = np.random.default_rng(seed)
    spares = sorted(set(int(s) for s in spares))
    J, R, N = cl.domains, cl.domains_per_replica, cl.replicas
    Smax = max(spares)
    acc = {}
    for _ in range(trials):
        tr = failure_trace(cl.gpus + Smax * cl.domain_size, cl.domain_size, fm, days, sample_hours, rng)
        for S in spares:
            c = tr.counts[:, : J + S]
            pool = (J + S) * cl.domain_size
            failures = int((tr.failed_gpus < pool).sum())
            stall = min(1.0, (failures * costs.recovery
                              + int((tr.repaired_gpus < pool).sum()) * costs.heal) / (days * DAY))
            # Checkpoint-restart stops for the failures of the domains in use (J of the pool's J + S).
            stall_restart = restart_stall(costs, failures * J / (J + S) / (days * DAY))
            srt = np.sort(c, axis=-1, kind="stable") if params.placement == "packed" else None
            for pol in policies:
                lut = speed_table(cl.domain_size, pol, params)
                v = replica_speeds(c, R, lut, params.placement, job_domains=J, sorted_counts=srt)
                dmg = damaged_replicas(c, R, cl.domain_size, params.placement, job_domains=J, sorted_counts=srt)
                short, slow, pause = fixed_batch_throughput(v, pol, R, params, N, dmg)
                a = acc.setdefault((S, pol), {"slow": [], "pause": [], "short": [], "stall": []})
                a["slow"].append(slow.mean())
                a["pause"].append(pause.mean())
                a["short"].append(short.mean())
                a["stall"].append(stall_restart if pol == "restart" else stall)
    rows = []
    for (S, pol), a in sorted(acc.items(), key=lambda kv: (POLICIES.index(kv[0][1]) if kv[0][1] in POLICIES else 9, kv[0][0])):
        share = J / (J + S)
        slow, pause, short = float(np.mean(a["slow"])), float(np.mean(a["pause"])), float(np.mean(a["short"]))
        # Per trial, so that a history's stall meets its own throughput.
        slow_c = float(np.mean([x * (1 - st) for x, st in zip(a["slow"], a["stall"])]))
        pause_c = float(np.mean([x * (1 - st) for x, st in zip(a["pause"], a["stall"])]))
        rows.append(dict(policy=pol, spare_domains=S, spare_gpus=S * cl.domain_size,
                         short_time_fraction=short,
                         per_gpu_pause=pause * share, per_gpu_slow=slow * share,
                         stall_fraction=float(np.mean(a["stall"])),
                         per_gpu_pause_costs=pause_c * share, per_gpu_slow_costs=slow_c * share,
                         placement=params.placement, hw_repair_days=fm.hw_repair_days))
    return pd.DataFrame(rows)


def spares_needed(df: pd.DataFrame) -> dict:
    """Smallest spare count in the sweep whose job was never short (None if none)."""
    out = {}
    for pol, g in df.groupby("policy", sort=False):
        ok = g[g["short_time_fraction"] == 0]["spare_domains"]
        out[pol] = int(ok.min()) if len(ok) else None
    return out


def fig7_table(df: pd.DataFrame, tokens_per_gpu: float | None = None) -> str:
    cols = [("policy", "policy", "{}"), ("spare_domains", "spare domains", "{:d}"),
            ("short_time_fraction", "time short", "{:.2%}"), ("per_gpu_pause", "per-GPU (pause)", "{:.4f}"),
            ("per_gpu_slow", "per-GPU (slow)", "{:.4f}")]
    if "stall_fraction" in df:
        cols += [("stall_fraction", "stall", "{:.2%}"), ("per_gpu_pause_costs", "with costs (pause)", "{:.4f}"),
                 ("per_gpu_slow_costs", "with costs (slow)", "{:.4f}")]
    df = df.copy()
    if tokens_per_gpu:
        df["tok"] = df["per_gpu_slow"] * tokens_per_gpu
        cols.append(("tok", "tok/s/GPU (slow)", "{:.1f}"))
    return _table(df, cols)


def plot_fig7(df: pd.DataFrame, cl: Cluster, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (pol, g) in enumerate(df.groupby("policy", sort=False)):
        color = f"C{i}"
        ax.plot(g["spare_domains"], g["per_gpu_pause"], "-o", markersize=3, color=color, label=f"{pol} (pause when short)")
        ax.plot(g["spare_domains"], g["per_gpu_slow"], "--", color=color, alpha=0.7, label=f"{pol} (slow when short)")
    ax.set_xlabel(f"spare scale-up domains ({cl.domain_size} GPUs each)")
    lo = max(0, min(0.8, df["per_gpu_slow"].min() - 0.02))
    # The axis starts where the curves do, and says so.
    ax.set_ylabel("per-GPU throughput (failure-free job = 1)" + (f"; axis from {lo:.2f}" if lo > 0 else ""))
    ax.set_title(f"Fixed mini-batch with spares: {cl.gpus} GPUs, TP{cl.domain_size}, "
                 f"{df['hw_repair_days'].iloc[0]:g}-day hardware repair", fontsize=9)
    ax.set_ylim(lo, 1.005)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
