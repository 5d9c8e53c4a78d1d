"""Recovery costs: whole-job stalls per failure and per repair, and Fig. 6's stall at a failed fraction."""
from __future__ import annotations

from dataclasses import dataclass

import math

import pandas as pd

from .machines import load_profile
from .model import DAY, Cluster, FailureModel


# ---------------------------------------------------------------------------------------------
# Recovery costs: whole-job stalls per failure and per repair
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Costs:
    """Whole-job stalls: `recovery` seconds per failure (detect + reconfigure), `heal` per repair (the
    returning GPUs' shards healed from a peer). Checkpoint-restart instead: `restart` seconds per
    failure (relaunch and load), `checkpoint` seconds to write one, every `checkpoint_interval` seconds
    (0: Young's optimum for the job's failure rate).

    The constructor's defaults are round figures for tests and hand-made cases; the command line takes
    every figure from a machine's profile (`Costs.from_profile`), the flags overriding it."""
    recovery: float = 60.0
    heal: float = 5.0
    restart: float = 600.0
    checkpoint: float = 60.0
    checkpoint_interval: float = 0.0

    @classmethod
    def from_profile(cls, machine: str, model_params: float, gpus_per_replica: int, gpus: int | None = None,
                     bytes_per_param: float = 16.0, checkpoint_interval: float = 0.0,
                     machines_dir: str | None = None, link_gbps: float | None = None,
                     repair_mechanism: str = "shrink") -> "Costs":
        """The stalls a failure, a repair, a restart and a checkpoint cost on `machine` (jobs/machines/
        <machine>.yaml), by the rules ntpbench's paced runs charge (src/run/run_record.cpp):

            recovery   = detect + repair + reconfigure     (repair_mechanism "reinit": reinit for repair)
            heal       = replace + reconfigure + latency_us 1e-6 + shard / (scale_out_gbps 1e9)
                         (a returning GPU: a new process, the layout back, its shard; link_gbps overrides the link)
            restart    = restart + shard / (checkpoint_gbps 1e9)             (the job restarted, its state loaded)
            checkpoint = model_params x bytes_per_param / gpus / (checkpoint_gbps 1e9)   (each GPU its share)

        with shard = model_params x bytes_per_param / gpus_per_replica, one GPU's share of a replica's state
        (heal_bytes_per_gpu); `gpus`: the job's GPUs (default: one replica's)."""
        p = load_profile(machine, machines_dir)
        shard = model_params * bytes_per_param / gpus_per_replica
        share = model_params * bytes_per_param / (gpus or gpus_per_replica)
        rec = p.recovery
        link = p.scale_out_gbps if link_gbps is None else link_gbps
        if repair_mechanism not in ("shrink", "reinit"):
            raise ValueError(f"repair mechanism {repair_mechanism!r}: shrink or reinit")
        repair = rec["repair" if repair_mechanism == "shrink" else "reinit"]
        return cls(recovery=rec["detect"] + repair + rec["reconfigure"],
                   heal=rec["replace"] + rec["reconfigure"] + p.latency_us * 1e-6 + shard / (link * 1e9),
                   restart=rec["restart"] + p.storage_seconds(shard),
                   checkpoint=p.storage_seconds(share), checkpoint_interval=checkpoint_interval)


def checkpoint_interval(costs: Costs, failures_per_second: float) -> float:
    """The interval restart writes checkpoints at: the given one, or Young's optimum sqrt(2 C M) for a
    write of C seconds and M seconds between failures (Daly's refinement differs by under C); inf
    without failures."""
    if costs.checkpoint_interval > 0:
        return costs.checkpoint_interval
    if failures_per_second <= 0:
        return math.inf
    return math.sqrt(2 * costs.checkpoint / failures_per_second)


def restart_stall(costs: Costs, failures_per_second: float) -> float:
    """The share of time checkpoint-restart loses at a failure rate (Young/Daly's first-order model):
    writing checkpoints (C / tau) and, per failure, the restart and the work since the last checkpoint
    (half an interval on average)."""
    tau = checkpoint_interval(costs, failures_per_second)
    if math.isinf(tau):
        return 0.0
    return min(1.0, costs.checkpoint / tau + failures_per_second * (costs.restart + tau / 2))


def heal_bytes_per_gpu(cl: Cluster, model_params: float, bytes_per_param: float) -> float:
    """One GPU's share of a replica's training state: what a returning (or spare) GPU receives."""
    return model_params * bytes_per_param / cl.gpus_per_replica


def calibrated_heal_seconds(cal: dict, shard_bytes: float, link_gbps: float) -> float | None:
    """The simulated shard over the simulated link at the efficiency the measured heals reached (their
    rate over the memory copy of their host); None without a measured heal. Small shards' heals are
    partly latency, so a small calibration model gives an upper bound on the heal's time."""
    eff = cal.get("heal_of_memcpy")
    return None if not eff else shard_bytes / (eff * link_gbps * 1e9)


def mean_repair_seconds(fm: FailureModel) -> float:
    return (fm.hw_fraction * fm.hw_repair_days * DAY + (1 - fm.hw_fraction) * fm.sw_repair_hours * 3600)


def stall_at_failed_fraction(f: float, cl: Cluster, fm: FailureModel, costs: Costs) -> float:
    """Fig. 6 with costs: a failed fraction f held in steady state with the failure model's mean repair
    time R is f G / R failures (and as many repairs) per second (Little's law); each stalls the job."""
    return min(1.0, f * cl.gpus / mean_repair_seconds(fm) * (costs.recovery + costs.heal))


def add_fig6_costs(df: pd.DataFrame, cl: Cluster, fm: FailureModel, costs: Costs) -> pd.DataFrame:
    """The stall per row: the failures' and repairs' under the live policies; under restart, checkpoint-
    restart's at the same failure rate (f G / R per second)."""
    df = df.copy()
    df["stall_fraction"] = [
        restart_stall(costs, f * cl.gpus / mean_repair_seconds(fm)) if pol == "restart"
        else stall_at_failed_fraction(f, cl, fm, costs) for f, pol in zip(df["failed_fraction"], df["policy"])]
    df["loss_with_costs"] = 1 - df["availability"] * (1 - df["stall_fraction"])
    return df
