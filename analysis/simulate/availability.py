"""The failure trace (`--what trace`): availability, stall and goodput per policy and rate multiplier over
failure histories in time, its table and its plot."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from .costs import Costs, restart_stall
from .failures import failure_trace
from .model import DAY, POLICIES, Cluster, FailureModel, Params, damaged_replicas, job_throughput, replica_speeds, speed_table
from .tables import _table


def time_trace(cl: Cluster, fm: FailureModel, multipliers, policies=POLICIES, params: Params = Params(),
               days: float = 15, sample_hours: float = 1.0, trials: int = 4, seed: int = 3,
               recovery_seconds: float = 60.0, heal_seconds: float = 5.0, keep_first: bool = False,
               restart_costs: Costs = Costs()):
    rng = np.random.default_rng(seed)
    R, N = cl.domains_per_replica, cl.replicas
    rows, example = [], None
    for mult in multipliers:
        fmm = replace(fm, rate_multiplier=mult)
        res = {"down": [], "over": [], "fails": [], "stall": [], "stall_restart": []}
        per_pol = {p: [] for p in policies}
        for t in range(trials):
            tr = failure_trace(cl.gpus, cl.domain_size, fmm, days, sample_hours, rng)
            down = tr.counts.sum(axis=-1) / cl.gpus
            res["down"].append(down.mean())
            res["over"].append((down > 1e-3).mean())
            res["fails"].append(tr.failures / days)
            res["stall"].append(min(1.0, (tr.failures * recovery_seconds + tr.repairs * heal_seconds) / (days * DAY)))
            res["stall_restart"].append(restart_stall(restart_costs, tr.failures / (days * DAY)))
            srt = np.sort(tr.counts, axis=-1, kind="stable") if params.placement == "packed" else None
            series = {}
            for pol in policies:
                v = replica_speeds(tr.counts, R, speed_table(cl.domain_size, pol, params), params.placement,
                                   sorted_counts=srt)
                dmg = damaged_replicas(tr.counts, R, cl.domain_size, params.placement, sorted_counts=srt)
                thr = job_throughput(v, pol, R, params, N, dmg)
                per_pol[pol].append(thr.mean())
                series[pol] = thr
            if example is None and t == 0:
                example = dict(multiplier=mult, t=tr.times_days, down=down, **series)
        for pol in policies:
            stall = float(np.mean(res["stall_restart" if pol == "restart" else "stall"]))
            av = float(np.mean(per_pol[pol]))
            rows.append(dict(rate_multiplier=mult, policy=pol, failures_per_day=float(np.mean(res["fails"])),
                             mean_down_fraction=float(np.mean(res["down"])),
                             time_down_over_0p1pct=float(np.mean(res["over"])),
                             availability=av, stall_fraction=stall, goodput=av * (1 - stall)))
    return pd.DataFrame(rows), example


def trace_table(df: pd.DataFrame) -> str:
    cols = [("rate_multiplier", "rate x", "{:g}"), ("policy", "policy", "{}"),
            ("failures_per_day", "fail/day", "{:.1f}"), ("mean_down_fraction", "mean down", "{:.3%}"),
            ("time_down_over_0p1pct", "time >0.1% down", "{:.1%}"), ("availability", "availability", "{:.2%}"),
            ("stall_fraction", "stall", "{:.2%}"), ("goodput", "goodput", "{:.2%}")]
    return _table(df, cols)


def plot_trace(ex: dict, cl: Cluster, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    a1.plot(ex["t"], ex["down"] * 100, color="tab:red")
    a1.axhline(0.1, color="gray", linestyle="--", linewidth=0.8, label="0.1% of GPUs")
    a1.set_ylabel("GPUs down (%)")
    a1.legend(fontsize=8)
    a1.grid(alpha=0.3)
    a1.set_title(f"Failure trace ({cl.gpus} GPUs, TP{cl.domain_size}, rate x{ex['multiplier']:g})", fontsize=9)
    for pol in POLICIES:
        if pol in ex:
            a2.plot(ex["t"], ex[pol] * 100, label=pol)
    a2.set_xlabel("time (days)")
    a2.set_ylabel("throughput (% of failure-free)")
    a2.legend(fontsize=8)
    a2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
