"""A damaged replica's step against its compute alone: what nonuniform TP's extra work costs.

Under `ntp` and `ntp-pw` a replica that lost k of its d ranks trains on at degree d - k. If the
step were compute alone it would take d / (d - k) of a healthy step for the same batch (its batch
share b / b_full times that; under `ntp-pw` divided by the boost, never below a healthy step's
compute), and the job's step, synchronous across replicas, is its slowest replica's. What a run
measures beyond that is the `excess`: the gradients regrouped between replicas of different
degrees (the paper's core/extra sync), the reshard and the TP collectives of the smaller group.
Its seconds are parameter-sized (the same 6.1 and 5.6 ms at 512 and 4,096 tokens per replica step
in two demo-like runs), while the step grows with the tokens, so its share falls as tokens per step
grow (bench/README.md, Figure 8) and a ranking of `ntp` against `dp-drop` measured at one batch may
flip at another. The simulator's damaged speed (simulate --damaged-from) and `report`'s note both
come from here: the simulator carries the excess's seconds, not its share (carried_excess).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .runfile import HEALTHY, paced_machine


@dataclass(frozen=True)
class DamagedStep:
    degrees: tuple          # every replica's TP degree in these rows
    rows: int
    measured: float         # median step time of these rows over the median healthy step
    compute: float          # what compute alone would give (the slowest replica's)

    healthy_seconds: float  # the median healthy step (the run's clock)

    @property
    def excess(self) -> float:
        """The measured step over compute alone, minus one."""
        return self.measured / self.compute - 1.0

    @property
    def excess_seconds(self) -> float:
        """What the damaged step took beyond compute alone, in the run's (emulated) seconds."""
        return (self.measured - self.compute) * self.healthy_seconds


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
                               compute=compute, healthy_seconds=t_healthy))
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


def compute_seconds(run, tokens: float) -> float:
    """One GPU's pure compute for `tokens` per replica step on the run's (emulated) device: 6 FLOPs per
    parameter per token of its share of the emulated shape's parameters (the model's own without
    --emulate-shape), at the device's rate (paced_machine: device_gflops x time_scale)."""
    from .simulate import shards
    m = paced_machine(run)
    shape = str(m.get("emulate_shape") or "none")
    model = shards.Model.preset(shape) if shape != "none" else shards.Model.from_config(run.config)
    per_gpu = shards.parameter_count(model) / (run.tp * run.pp)
    rate = float(m.get("device_gflops", 0)) * float(m.get("time_scale", 1)) * 1e9
    return 6.0 * per_gpu * tokens / rate if rate > 0 else math.nan


def carried_excess(run, step: DamagedStep, tokens: float, flops_over_link: float) -> float:
    """The excess of `step` carried to a job of `tokens` per replica step on a machine whose GPU's
    FLOP/s over its scale-up bandwidth is `flops_over_link`: the excess's seconds are parameter-sized
    (a GPU's share of the gradients over the scale-up link), the job's step compute (6 FLOPs per
    parameter per token), so with P parameters over G GPUs per replica both sides scale as P / G and
    the share is excess_seconds / compute_seconds(run, tokens) x (the job's FLOP/s over link) / (the
    run's)."""
    m = paced_machine(run)
    mine = float(m["device_gflops"]) / float(m["scale_up_gbps"])
    return max(0.0, step.excess_seconds) / compute_seconds(run, tokens) * flops_over_link / mine
