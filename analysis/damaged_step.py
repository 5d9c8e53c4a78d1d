"""A damaged replica's step against its compute alone: what nonuniform TP's extra work costs.

Under `ntp` and `ntp-pw` a replica that lost k of its d ranks trains on at degree d - k. If the
step were compute alone it would take d / (d - k) of a healthy step for the same batch (its batch
share b / b_full times that; under `ntp-pw` divided by the boost, never below a healthy step's
compute), and the job's step, synchronous across replicas, is its slowest replica's. What a run
measures beyond that is the `excess`: the gradients regrouped between replicas of different
degrees (the paper's core/extra sync), the reshard and the TP collectives of the smaller group.
Its share falls as tokens per step grow (the regrouping is parameter-sized, the compute token-
sized: bench/README.md, Figure 8), so a ranking of `ntp` against `dp-drop` measured at one batch
may flip at another. The simulator's damaged speed (simulate --damaged-from) and `report`'s note
both come from here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .runfile import HEALTHY


@dataclass(frozen=True)
class DamagedStep:
    degrees: tuple          # every replica's TP degree in these rows
    rows: int
    measured: float         # median step time of these rows over the median healthy step
    compute: float          # what compute alone would give (the slowest replica's)

    @property
    def excess(self) -> float:
        """The measured step over compute alone, minus one."""
        return self.measured / self.compute - 1.0


def damaged_steps(run) -> list[DamagedStep]:
    """One entry per configuration of TP degrees with a damaged replica that trained, for a run under
    `ntp` or `ntp-pw` with a healthy step to compare against; [] otherwise."""
    if run.policy not in ("ntp", "ntp-pw"):
        return []
    boost = 1.0
    if run.policy == "ntp-pw":
        boost = float((run.config.get("pacing") or {}).get("boost", 1.0) or 1.0)
    dt = run.step_seconds()
    state, deg, batch = run.replicas["state"], run.replicas["tp_degree"], run.replicas["batch"]
    trained = run.steps["samples"].to_numpy() > 0
    healthy = trained & (state == HEALTHY).all(axis=1)
    if not healthy.any():
        return []
    t_healthy = float(np.median(dt[healthy]))
    full_batch = float(np.median(batch[healthy]))
    d = run.tp
    out = []
    damaged = trained & ~healthy & (deg < d).any(axis=1) & (deg > 0).any(axis=1)
    for key in sorted({tuple(int(x) for x in r) for r in deg[damaged].tolist()}):
        sel = damaged & (deg == np.array(key)).all(axis=1)
        # The slowest replica's compute relative to a healthy one's, over the rows' median batches.
        compute = 1.0
        for r, live in enumerate(key):
            b = float(np.median(batch[sel, r]))
            if live <= 0 or b <= 0:
                continue
            compute = max(compute, (b / full_batch) / min(1.0, live * boost / d))
        out.append(DamagedStep(degrees=key, rows=int(sel.sum()), measured=float(np.median(dt[sel])) / t_healthy,
                               compute=compute))
    return out


def median_excess(steps: list[DamagedStep]) -> float:
    """The excess over compute alone, the rows' median over every damaged configuration (nan: none)."""
    if not steps:
        return math.nan
    return float(np.median(np.repeat([s.excess for s in steps], [s.rows for s in steps])))


def tokens_per_replica_step(run) -> float:
    """Tokens one healthy replica trains per step (the batch Figure 8's share depends on)."""
    cfg = run.config
    seq = int(run.attrs.get("tokens_per_sample", cfg.get("seq", 1)))
    return float(int(cfg.get("micro_batch", 1)) * int(cfg.get("micro_batches", 1)) * seq)
