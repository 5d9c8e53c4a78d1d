"""Fig. 6: throughput loss against a failed fraction placed uniformly at random at one instant, its
tables (with and without recovery costs), the note when ntp loses more than dp-drop, and its plot."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd

from .model import (POLICIES, Cluster, Params, damaged_replicas, job_throughput, kept_micro_batches, replica_speeds, replica_time,
                    speed_table)
from .tables import _table


# ---------------------------------------------------------------------------------------------
# Fig. 6: failures placed uniformly at random at one instant
# ---------------------------------------------------------------------------------------------

def place_failures(cl: Cluster, n: int, trials: int, rng: np.random.Generator) -> np.ndarray:
    """[trials, D] counts of failed GPUs per domain, n distinct GPUs failed per trial."""
    out = np.zeros((trials, cl.domains), dtype=np.int16)
    for t in range(trials):
        idx = rng.choice(cl.gpus, size=n, replace=False)
        out[t] = np.bincount(idx // cl.domain_size, minlength=cl.domains)
    return out


def sweep_failed_fraction(cl: Cluster, fractions, policies=POLICIES, params: Params = Params(),
                          trials: int = 100, seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    R, N = cl.domains_per_replica, cl.replicas
    rows = []
    for f in fractions:
        n = int(round(f * cl.gpus))
        counts = place_failures(cl, n, trials, rng)
        # Fixed-membership quantities: replicas / domains touched by at least one failure.
        used = counts[:, : N * R].reshape(trials, N, R)
        hit = (used.sum(axis=-1) > 0).mean(axis=-1)
        dom_hit = (counts > 0).mean(axis=-1)
        srt = np.sort(counts, axis=-1, kind="stable")
        for pol in policies:
            lut = speed_table(cl.domain_size, pol, params)
            v = replica_speeds(counts, R, lut, params.placement, sorted_counts=srt if params.placement == "packed" else None)
            dmg = damaged_replicas(counts, R, cl.domain_size, params.placement,
                                   sorted_counts=srt if params.placement == "packed" else None)
            avail = job_throughput(v, pol, R, params, N, dmg)
            rows.append(dict(failed_fraction=f, failed_gpus=n, policy=pol, placement=params.placement,
                             availability=avail.mean(), availability_se=avail.std(ddof=1) / math.sqrt(trials) if trials > 1 else math.nan,
                             loss=1 - avail.mean(), replicas_hit=hit.mean(),
                             replicas_hit_se=hit.std(ddof=1) / math.sqrt(trials) if trials > 1 else math.nan,
                             replicas_hit_formula=1 - (1 - n / cl.gpus) ** cl.gpus_per_replica,
                             domains_hit=dom_hit.mean()))
    return pd.DataFrame(rows)


def fig6_table(df: pd.DataFrame) -> str:
    piv = df.pivot_table(index=["failed_fraction", "failed_gpus"], columns="policy", values="loss", sort=False)
    se = df.pivot_table(index=["failed_fraction", "failed_gpus"], columns="policy", values="availability_se", sort=False)
    hit = df.groupby(["failed_fraction", "failed_gpus"], sort=False)[["replicas_hit", "replicas_hit_formula", "domains_hit"]].first()
    out = pd.concat([piv.add_prefix("loss "), se.max(axis=1).rename("max se"), hit], axis=1).reset_index()
    cols = [("failed_fraction", "failed frac", "{:.4f}"), ("failed_gpus", "GPUs", "{:d}")]
    cols += [(f"loss {p}", f"loss {p}", "{:.2%}") for p in piv.columns]
    cols += [("max se", "max s.e.", "{:.2%}"), ("replicas_hit", "repl hit (fixed)", "{:.3f}"),
             ("replicas_hit_formula", "1-(1-f)^g", "{:.3f}"), ("domains_hit", "domains hit", "{:.3f}")]
    return _table(out, cols)


def fig6_costs_table(df: pd.DataFrame) -> str:
    """Fig. 6 with recovery costs (add_fig6_costs): the stall and each policy's loss with and without it."""
    piv = df.pivot_table(index=["failed_fraction", "failed_gpus"], columns="policy", values="loss", sort=False)
    with_c = df.pivot_table(index=["failed_fraction", "failed_gpus"], columns="policy", values="loss_with_costs",
                            sort=False)
    live = df[df["policy"] != "restart"] if (df["policy"] != "restart").any() else df
    stall = live.groupby(["failed_fraction", "failed_gpus"], sort=False)["stall_fraction"].first()
    out = pd.concat([stall, piv.add_prefix("loss "), with_c.add_prefix("costs ")], axis=1).reset_index()
    cols = [("failed_fraction", "failed frac", "{:.4f}"), ("stall_fraction", "stall", "{:.2%}")]
    cols += [(f"loss {p}", f"loss {p}", "{:.2%}") for p in piv.columns]
    cols += [(f"costs {p}", f"with costs {p}", "{:.2%}") for p in with_c.columns]
    return _table(out, cols)


def gating_example(cl: Cluster, policy: str, params: Params) -> dict | None:
    """The fewest failed GPUs k in one domain whose replica, under `policy`, takes longer than a healthy
    step (and so slows the whole job): k, the speed v, the micro-batches kept, the step ratio and what
    keep-pace would keep. None when no k does (keep-pace, P = 1, or a boost that covers every k)."""
    lut, P, M = speed_table(cl.domain_size, policy, params), cl.domains_per_replica, params.micro_batches
    for k in range(1, cl.domain_size + 1):
        v = float(lut[k])
        if v <= 0:
            return None
        w = float(kept_micro_batches(v, policy, P, params))
        t = float(replica_time(w, v, P, M))
        if t > 1 + 1e-9:
            pace = float(kept_micro_batches(v, policy, P, replace(params, mb_cut="keep-pace")))
            return dict(k=k, v=v, kept=w * M, step=t, keep_pace=pace * M)
    return None


def fig6_surprise(df: pd.DataFrame, cl: Cluster, params: Params) -> str | None:
    """An explanation when ntp (or ntp-pw) loses more than dp-drop at some point of the Fig. 6 sweep,
    which the paper's figure never shows: replicas train in lock-step, and a damaged replica's cut
    step (its pipeline's fill and drain do not shrink) can be slower than a healthy one, so it slows
    every replica, while dp-drop gives up the damaged replica alone. Names `--mb-cut keep-pace`."""
    loss = df.pivot_table(index="failed_fraction", columns="policy", values="loss", sort=True)
    if "dp-drop" not in loss.columns:
        return None
    notes = []
    for pol in [p for p in ("ntp", "ntp-pw") if p in loss.columns]:
        worse = loss[loss[pol] > loss["dp-drop"] + 1e-12]
        if worse.empty:
            continue
        f = worse.index[0]
        head = (f"note: {pol} loses more than dp-drop at {len(worse)} of {len(loss)} failed fractions (at "
                f"{f:g}: {worse.loc[f, pol]:.2%} against {worse.loc[f, 'dp-drop']:.2%}).")
        ex = gating_example(cl, pol, params)
        if ex is None:
            notes.append(head)
            continue
        m = f"{params.micro_batches}" if params.micro_batches else "many"
        notes.append(
            f"{head} The cause is the lock-step and the micro-batch cut: replicas train in lock-step, so the "
            f"slowest one sets every step. A domain of {cl.domain_size} with {ex['k']} failed GPU(s) runs at speed "
            f"{ex['v']:.3g}; the {params.mb_cut} cut keeps {ex['kept']:g} of its {m} micro-batches, but the "
            f"pipeline's fill and drain ({cl.domains_per_replica - 1} micro-batch times) do not shrink, so its step "
            f"takes {ex['step']:.3f} healthy steps and slows the whole job by {ex['step'] - 1:.1%}, while dp-drop "
            f"gives up that replica alone, 1 of {cl.replicas} ({1 / cl.replicas:.2%}). With --mb-cut keep-pace a "
            f"damaged replica runs only the micro-batches that fit in a healthy step ({ex['keep_pace']:g} here), "
            f"so none slows the job.")
    return "\n".join(notes) or None


def plot_fig6(df: pd.DataFrame, cl: Cluster, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for pol, g in df[df["policy"] != "restart"].groupby("policy", sort=False):
        ax.errorbar(g["failed_fraction"] * 1e3, g["loss"] * 100, yerr=2 * g["availability_se"] * 100,
                    marker="o", markersize=3, capsize=2, label=pol)
    # restart loses everything at any failed fraction (no spares here): a line at 100% would flatten the
    # others, so the legend says it instead.
    if (df["policy"] == "restart").any():
        ax.plot([], [], " ", label="restart: 100% at every point (stops on any failure)")
    ax.set_xlabel("failed GPUs (per mille of the cluster)")
    ax.set_ylabel("throughput loss (%)")
    ax.set_title(f"Throughput loss vs failed fraction: {cl.gpus} GPUs, TP{cl.domain_size} domains, "
                 f"{cl.domains_per_replica} domains/replica ({df['placement'].iloc[0]})", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
