"""Failures in time: each GPU's Poisson failures and repairs, sampled as failed GPUs per domain (the
histories behind Fig. 7 and the trace)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .model import FailureModel


# ---------------------------------------------------------------------------------------------
# Failures in time
# ---------------------------------------------------------------------------------------------

@dataclass
class Trace:
    times_days: np.ndarray     # [Ts] sample times
    counts: np.ndarray         # [Ts, D] failed GPUs per domain (int16)
    failures: int              # failures starting in [0, days)
    repairs: int               # repairs completing in [0, days)
    failed_gpus: np.ndarray    # the GPU of each of those failures
    repaired_gpus: np.ndarray  # the GPU of each of those repairs


def failure_trace(gpus: int, domain_size: int, fm: FailureModel, days: float, sample_hours: float,
                  rng: np.random.Generator) -> Trace:
    warm = max(fm.hw_repair_days, fm.sw_repair_hours / 24) * (5 if fm.repair_dist == "exp" else 1)
    span = days + warm
    E = rng.poisson(fm.rate_per_gpu_day * gpus * span)
    start = rng.uniform(-warm, days, E)
    gpu = rng.integers(0, gpus, E)
    hw = rng.random(E) < fm.hw_fraction
    mean = np.where(hw, fm.hw_repair_days, fm.sw_repair_hours / 24)
    dur = rng.exponential(mean) if fm.repair_dist == "exp" else mean
    end = start + dur
    Ts = max(1, int(round(days * 24 / sample_hours)))
    t = (np.arange(Ts) + 0.5) * days / Ts
    D = gpus // domain_size
    active = (start[None, :] <= t[:, None]) & (t[:, None] < end[None, :])
    ti, ei = np.nonzero(active)
    key = np.unique(ti.astype(np.int64) * gpus + gpu[ei])          # a GPU down twice counts once
    ti, g = key // gpus, key % gpus
    counts = np.bincount(ti * D + g // domain_size, minlength=Ts * D).reshape(Ts, D).astype(np.int16)
    began, ended = (start >= 0) & (start < days), (end >= 0) & (end < days)
    return Trace(t, counts, int(began.sum()), int(ended.sum()), gpu[began], gpu[ended])
