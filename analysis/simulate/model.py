"""The model every experiment shares: the cluster, the failure model and the policy parameters, domain
and replica speeds, and one step of non-interleaved 1F1B over a replica's pipeline stages."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


# restart: checkpoint-restart at a fixed size, the baseline every job has. It trains only with every
# replica whole (a damaged domain is a stop, not a smaller job); its cost (a rollback and a restart
# per failure, and writing checkpoints) is costs.restart_stall's.
POLICIES = ("dp-drop", "ntp", "ntp-pw", "restart")
LIVE_POLICIES = POLICIES[:3]  # those that train on with what is left
DAY = 86400.0


@dataclass(frozen=True)
class Cluster:
    gpus: int = 32000
    domain_size: int = 32
    gpus_per_replica: int = 256

    def __post_init__(self):
        if self.domain_size <= 0 or self.gpus_per_replica % self.domain_size:
            raise ValueError("--gpus-per-replica must be a multiple of --domain-size")
        if self.gpus % self.domain_size:
            raise ValueError("--gpus must be a multiple of --domain-size")
        if self.replicas < 1:
            raise ValueError("fewer GPUs than one replica")

    @property
    def domains(self) -> int:
        return self.gpus // self.domain_size

    @property
    def domains_per_replica(self) -> int:
        return self.gpus_per_replica // self.domain_size

    @property
    def replicas(self) -> int:
        return self.domains // self.domains_per_replica


@dataclass(frozen=True)
class FailureModel:
    interruptions: float = 419.0
    days: float = 54.0
    ref_gpus: int = 16384
    hw_fraction: float = 0.78
    hw_repair_days: float = 3.0
    sw_repair_hours: float = 3.0
    rate_multiplier: float = 1.0
    repair_dist: str = "fixed"

    @property
    def rate_per_gpu_day(self) -> float:
        return self.interruptions / (self.days * self.ref_gpus) * self.rate_multiplier

    @property
    def mean_repair_days(self) -> float:
        return self.hw_fraction * self.hw_repair_days + (1 - self.hw_fraction) * self.sw_repair_hours / 24

    def expected_down_fraction(self) -> float:
        return self.rate_per_gpu_day * self.mean_repair_days


MB_CUTS = ("proportional", "keep-pace")
# The paper's job: 16M tokens per step in sequences of 16K = 1,024 sequences, over the default 125
# replicas 8.2 each: with one sequence per micro-batch, 8 micro-batches per replica per step.
DEFAULT_MICRO_BATCHES = 8


@dataclass(frozen=True)
class Params:
    boost: float = 1.3
    min_tp_fraction: float = 0.5
    placement: str = "packed"
    micro_batches: int = DEFAULT_MICRO_BATCHES    # M per replica per step; 0 = the limit M -> infinity
    mb_cut: str = "proportional"
    # ntp, ntp-pw: a job step with a damaged replica lasts (1 + damaged_excess) times what its compute
    # alone gives: the gradients regrouped between degrees, measured by runs (analysis/damaged_step.py,
    # simulate --damaged-from); 0, the paper's model: compute alone.
    damaged_excess: float = 0.0
    # A mixture of experts: E whole experts per domain (expert parallelism over the TP group, as in
    # ntpbench); 0, a dense model.
    experts: int = 0

    def __post_init__(self):
        if self.experts < 0:
            raise ValueError("--experts must be >= 0 (0: a dense model)")
        if not (self.damaged_excess >= 0 and math.isfinite(self.damaged_excess)):
            raise ValueError("--damaged-excess must be a finite number >= 0")
        if self.micro_batches < 0:
            raise ValueError("--micro-batches must be >= 0 (0: the limit of many micro-batches)")
        if self.mb_cut not in MB_CUTS:
            raise ValueError(f"unknown micro-batch cut {self.mb_cut!r} (choose from {', '.join(MB_CUTS)})")


def speed_table(domain_size: int, policy: str, p: Params) -> np.ndarray:
    """Speed of a domain with k = 0..d failed GPUs (non-increasing in k)."""
    k = np.arange(domain_size + 1)
    live = domain_size - k
    alive = (live >= max(1, math.ceil(p.min_tp_fraction * domain_size))).astype(float)
    if policy in ("dp-drop", "restart"):
        s = (k == 0).astype(float)
    elif policy in ("ntp", "ntp-pw"):
        s = live / domain_size
        if p.experts:
            # Whole experts: the busiest of L GPUs holds ceil(E / L) where a healthy one holds E / d.
            s = np.where(live > 0, p.experts / domain_size / np.ceil(p.experts / np.maximum(live, 1)), 0.0)
        if policy == "ntp-pw":
            s = np.minimum(1.0, s * p.boost)
    else:
        raise ValueError(f"unknown policy {policy!r} (choose from {', '.join(POLICIES)})")
    return s * alive


def replica_speeds(counts: np.ndarray, dpr: int, lut: np.ndarray, placement: str, job_domains: int | None = None,
                   sorted_counts: np.ndarray | None = None) -> np.ndarray:
    """Speed v of every replica [..., n] (its slowest domain's, lut[k]) for failed-GPU counts per domain [..., D].

    packed: all D domains regrouped R = dpr at a time in order of failures, so replicas come best first
    (which maximises any sum of a non-decreasing function of the replica speeds).
    fixed: the first job_domains domains keep their replicas; the remaining (spare) domains hot-swap
    the slowest job domains when faster.
    """
    if placement == "packed":
        k = np.sort(counts, axis=-1, kind="stable") if sorted_counts is None else sorted_counts
        m = k.shape[-1] // dpr
        # Sorted by failures ascending = by speed descending: each chunk's minimum is its last entry.
        return lut[k[..., dpr - 1: m * dpr: dpr]]
    if placement != "fixed":
        raise ValueError(f"unknown placement {placement!r}")
    J = counts.shape[-1] if job_domains is None else job_domains
    speeds = lut[counts]
    job, spare = speeds[..., :J].copy(), speeds[..., J:]
    S = spare.shape[-1]
    if S:
        order = np.argsort(job, axis=-1, kind="stable")[..., :S]
        worst = np.take_along_axis(job, order, axis=-1)
        best = -np.sort(-spare, axis=-1)[..., : order.shape[-1]]
        np.put_along_axis(job, order, np.maximum(worst, best), axis=-1)
    m = J // dpr
    return job[..., : m * dpr].reshape(job.shape[:-1] + (m, dpr)).min(axis=-1)


def capacity(counts: np.ndarray, dpr: int, lut: np.ndarray, placement: str, job_domains: int | None = None,
             sorted_counts: np.ndarray | None = None) -> np.ndarray:
    """The additive model: sum of replica speeds, in replicas (= job_throughput x replicas for M -> infinity
    under the keep-pace cut)."""
    return replica_speeds(counts, dpr, lut, placement, job_domains, sorted_counts).sum(axis=-1)


# ---------------------------------------------------------------------------------------------
# Pipelines: one step of non-interleaved 1F1B
# ---------------------------------------------------------------------------------------------

def replica_time(work, v, stages: int, micro_batches: int) -> np.ndarray:
    """Step time of a replica of speed v doing `work` x M micro-batches on P = `stages` stages, relative to a
    healthy replica's (M + P - 1) micro-batch times; 0 where it does no work. M = 0: the limit M -> infinity."""
    work, v = np.asarray(work, dtype=float), np.asarray(v, dtype=float)
    on = (work > 0) & (v > 0)
    vs = np.where(on, v, 1.0)
    if micro_batches == 0:
        t = work / vs
    else:
        M, P = micro_batches, stages
        t = (work * M + P - 1) / (vs * (M + P - 1))
    return np.where(on, t, 0.0)


def kept_micro_batches(v, policy: str, stages: int, p: Params) -> np.ndarray:
    """Micro-batches a replica of speed v runs per step, as a fraction of M (0 where v == 0).

    proportional (the paper's and ntpbench's rule): ntp max(1, floor(M v)); ntp-pw and dp-drop keep M.
    keep-pace: the most that fit in a healthy step, floor((M + P - 1) v - (P - 1)), at most M; a
    replica that cannot fit one sits the step out (0). M = 0 is the limit M -> infinity (v; ntp-pw
    keeps 1 under the proportional rule)."""
    v = np.asarray(v, dtype=float)
    on = v > 0
    keep = policy != "ntp" and p.mb_cut == "proportional"
    M, P = p.micro_batches, stages
    if M == 0:
        w = np.ones_like(v) if keep else np.minimum(v, 1.0)
    elif p.mb_cut == "keep-pace":
        w = np.clip(np.floor((M + P - 1) * v - (P - 1) + 1e-9), 0, M) / M
    elif keep:
        w = np.ones_like(v)
    else:
        w = np.clip(np.floor(M * v + 1e-9), 1, M) / M
    return np.where(on, w, 0.0)


def job_throughput(v: np.ndarray, policy: str, stages: int, p: Params, replicas: int,
                   damaged: np.ndarray | None = None) -> np.ndarray:
    """Throughput of a job whose replicas [..., n] have speeds v and all train in lock-step, relative to
    `replicas` healthy ones: committed micro-batches / max replica step time."""
    if policy == "restart":  # every replica whole, or a stop
        return np.where((np.asarray(v) >= 1).sum(axis=-1) >= replicas, 1.0, 0.0)
    w = kept_micro_batches(v, policy, stages, p)
    T = replica_time(w, v, stages, p.micro_batches).max(axis=-1) * damaged_stretch(v, damaged, policy, p)
    return np.where(T > 0, w.sum(axis=-1) / replicas / np.where(T > 0, T, 1.0), 0.0)


def damaged_stretch(v, damaged, policy: str, p: Params) -> np.ndarray:
    """1 + damaged_excess where a replica trains at a reduced degree (damaged and v > 0) under ntp or
    ntp-pw, else 1 (damaged: bool [..., n], from damaged_replicas; None: no replica is)."""
    v = np.asarray(v, dtype=float)
    if damaged is None or policy not in ("ntp", "ntp-pw") or p.damaged_excess == 0:
        return np.ones(v.shape[:-1])
    return np.where((np.asarray(damaged) & (v > 0)).any(axis=-1), 1.0 + p.damaged_excess, 1.0)


def damaged_replicas(counts: np.ndarray, dpr: int, domain_size: int, placement: str, job_domains: int | None = None,
                     sorted_counts: np.ndarray | None = None) -> np.ndarray:
    """Which replicas [..., n] hold a domain with a failed GPU, grouped as replica_speeds groups them (an
    indicator speed: 1 whole, 0 with a failure; under `fixed` a spare swaps in for a job domain with a
    failure, which ntp-pw's speeds, full at a small k, would not do)."""
    whole = (np.arange(domain_size + 1) == 0).astype(float)
    return replica_speeds(counts, dpr, whole, placement, job_domains, sorted_counts) == 0


def fixed_batch_throughput(v: np.ndarray, policy: str, stages: int, p: Params, replicas: int,
                           damaged: np.ndarray | None = None):
    """A fixed mini-batch of `replicas` x M micro-batches per step from a pool of replicas [..., n] ordered
    best first: they are filled in that order (the last one used may run fewer micro-batches than it
    could). Returns (short, throughput when short jobs slow down, throughput when they pause), each [...]:
    short = the pool cannot run the mini-batch in one step; "slow" then runs it with every replica, at the
    pool's rate (sum of work / max step time), "pause" stops (0)."""
    w = kept_micro_batches(v, policy, stages, p)
    cum = np.cumsum(w, axis=-1)
    used = np.clip(replicas - (cum - w), 0.0, w)
    total = cum[..., -1]
    short = total < replicas - 1e-9
    T = replica_time(used, v, stages, p.micro_batches).max(axis=-1) * damaged_stretch(v, damaged, policy, p)
    rate = np.where(T > 0, np.minimum(total, replicas) / replicas / np.where(T > 0, T, 1.0), 0.0)
    if policy == "restart":  # a job of fixed size does not slow down when short: it stops
        rate = np.where(short, 0.0, rate)
    return short, rate, np.where(short, 0.0, rate)
