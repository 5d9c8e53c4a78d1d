"""Stragglers (`--what stragglers`): slow episodes in time and the job throughput under each
--straggler-policy, and their table."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from .model import Cluster, Params, job_throughput, replica_speeds, speed_table


# ---------------------------------------------------------------------------------------------
# Stragglers: slow episodes in time, under each --straggler-policy
# ---------------------------------------------------------------------------------------------

STRAGGLER_POLICIES = ("tolerate", "evict-ntp", "evict-dp-drop", "rebalance")


def straggler_speed_table(domain_size: int, policy: str, factor: float, p: Params) -> tuple[np.ndarray, str]:
    """Speed of a domain with k = 0..d GPUs running 1/`factor` slow, and the micro-batch rule it takes
    (a policy name of kept_micro_batches): tolerate, the TP group waits for its slowest GPU (1/f with
    any slow one; no cut); evict, slow GPUs are treated as failed under ntp or dp-drop; rebalance,
    shares in proportion to speed, (d - k + k/f) / d with ntp's cut (src/parallel/rebalance.hpp; its
    2% slack and the shares' rounding are left out)."""
    k = np.arange(domain_size + 1)
    if policy == "tolerate":
        return np.where(k > 0, 1.0 / factor, 1.0), "dp-drop"
    if policy in ("evict-ntp", "evict-dp-drop"):
        pol = policy.removeprefix("evict-")
        return speed_table(domain_size, pol, p), pol
    if policy == "rebalance":
        return (domain_size - k + k / factor) / domain_size, "ntp"
    raise ValueError(f"unknown straggler policy {policy!r} (choose from {', '.join(STRAGGLER_POLICIES)})")


def slow_trace(gpus: int, domain_size: int, per_gpu_day: float, hours: float, days: float, sample_hours: float,
               rng: np.random.Generator) -> np.ndarray:
    """Slow GPUs per domain [Ts, D] at sample times over [0, days): each GPU starts slow episodes as a
    Poisson process of rate `per_gpu_day`, each lasting `hours` (from one episode length before 0, so
    the window is stationary); a GPU slow twice at once counts once."""
    span, warm = days + hours / 24, hours / 24
    E = rng.poisson(per_gpu_day * gpus * span)
    start = rng.uniform(-warm, days, E)
    gpu = rng.integers(0, gpus, E)
    Ts = max(1, int(round(days * 24 / sample_hours)))
    t = (np.arange(Ts) + 0.5) * days / Ts
    D = gpus // domain_size
    ti, ei = np.nonzero((start[None, :] <= t[:, None]) & (t[:, None] < start[None, :] + warm))
    key = np.unique(ti.astype(np.int64) * gpus + gpu[ei])
    ti, g = key // gpus, key % gpus
    return np.bincount(ti * D + g // domain_size, minlength=Ts * D).reshape(Ts, D)


def straggler_throughput(counts: np.ndarray, cl: Cluster, policy: str, factor: float, p: Params) -> np.ndarray:
    """Job throughput (healthy = 1) for slow-GPU counts per domain [..., D] under a straggler policy."""
    lut, cut = straggler_speed_table(cl.domain_size, policy, factor, p)
    v = replica_speeds(counts, cl.domains_per_replica, lut, p.placement)
    if policy == "rebalance":  # the same degree, shards resized: no regrouping between degrees
        p = replace(p, damaged_excess=0.0)
    return job_throughput(v, cut, cl.domains_per_replica, p, cl.replicas)


def stragglers_sweep(cl: Cluster, rates, hours: float, factor: float, params: Params = Params(), days: float = 15,
                     sample_hours: float = 1.0, trials: int = 4, seed: int = 5) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for rate in rates:
        per_pol = {p: [] for p in STRAGGLER_POLICIES}
        slow_any = []
        for _ in range(trials):
            counts = slow_trace(cl.gpus, cl.domain_size, rate, hours, days, sample_hours, rng)
            slow_any.append((counts.sum(axis=-1) > 0).mean())
            for pol in STRAGGLER_POLICIES:
                per_pol[pol].append(straggler_throughput(counts, cl, pol, factor, params).mean())
        for pol in STRAGGLER_POLICIES:
            rows.append(dict(slow_per_gpu_day=rate, slow_hours=hours, factor=factor, policy=pol,
                             time_with_a_straggler=float(np.mean(slow_any)),
                             mean_slow_gpus=rate * hours / 24 * cl.gpus, throughput=float(np.mean(per_pol[pol]))))
    return pd.DataFrame(rows)


def stragglers_table(df: pd.DataFrame) -> str:
    head = ["slow/GPU-day", "mean slow GPUs", "time with one"] + list(STRAGGLER_POLICIES)
    lines = [head]
    for rate, g in df.groupby("slow_per_gpu_day", sort=True):
        thr = dict(zip(g["policy"], g["throughput"]))
        first = g.iloc[0]
        lines.append([f"{rate:.3g}", f"{first['mean_slow_gpus']:.2f}", f"{first['time_with_a_straggler']:.1%}"]
                     + [f"{thr[p]:.4f}" for p in STRAGGLER_POLICIES])
    widths = [max(len(x[i]) for x in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(x, widths)) for x in lines)
