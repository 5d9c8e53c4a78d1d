"""`python3 -m analysis simulate`: cluster-scale goodput under GPU failures (the NTP paper's Fig. 6/7).

Model
-----
Cluster. `--gpus` G GPUs in scale-up domains of `--domain-size` d GPUs (a domain is one TP group),
D = G/d domains. A DP replica is `--gpus-per-replica` g GPUs, i.e. R = g/d domains (pipeline
stages); the job has N = D/R replicas. Throughput is in units of the failure-free job (1.0 = every
replica at full speed); "availability" below is that fraction, "loss" is 1 - availability.

Domain speed. A domain with k failed GPUs has L = d - k live ones. With `--min-tp-fraction` m a
domain with L < ceil(m d) (default: fewer than half its GPUs) is dropped (speed 0) under every
policy. Otherwise, per policy, its speed v (micro-batches per unit time, healthy = 1) is:
  dp-drop  1 if k == 0 else 0 (uniform TP: a damaged TP group cannot train)
  ntp      L/d — the domain runs at TP L, each GPU doing d/L of its share. Head-granularity
           imbalance is ignored: MLP columns can absorb it.
  ntp-pw   min(1, L b / d) with the power boost b = `--boost` (<= 1.3): the surviving GPUs run up
           to b times faster, so a domain keeps full speed while d/L <= b (TP32 tolerates 7 failed
           GPUs). The perf/W cost of boosting (2.8% at 1.1x, 6.5% at 1.2x) costs energy, not
           throughput, and is not modelled.
A replica's R domains are its P = R pipeline stages, and every stage of a damaged replica runs at
its least-staffed stage's degree (as in ntpbench), so a replica's speed v is its slowest domain's.
Pipelines. A replica runs non-interleaved 1F1B over its P stages with M = `--micro-batches`
micro-batches per step: a step takes (M + P - 1) micro-batch times (the pipeline's fill and drain do
not shrink with M). A replica of speed v running M' micro-batches takes (M' + P - 1) / v. Replicas
train in lock-step (the DP gradient all-reduce closes every step), so the job's step takes the
longest replica's time, and
    throughput = (sum of M' over replicas / (N M)) x (M + P - 1) / max over replicas of (M' + P - 1) / v.
M' (`--mb-cut`):
  proportional  (the paper's and ntpbench's rule; default) ntp: M' = max(1, floor(M v)); ntp-pw and
           dp-drop keep M. With P > 1 the cut replica's step, (M' + P - 1) / v, still exceeds the
           healthy M + P - 1 whenever floor(M v) is close to M v, and it gates the whole job; a coarse
           floor (small M) over-cuts instead, so the loss is not monotone in M. Likewise ntp-pw gates
           the job wherever the boost falls short (v < 1).
  keep-pace  M' = min(M, floor((M + P - 1) v - (P - 1))): as many as fit in a healthy step, for every
           policy (ntp-pw is cut too where its boost falls short), so no replica gates the job; a
           replica that cannot fit one micro-batch sits the step out.
`--micro-batches 0` is the limit M -> infinity: the bubble vanishes and (keep-pace, or ntp and
dp-drop under proportional) throughput = sum of replica speeds / N, the additive model this simulator
used before it modelled pipelines; with P = 1 and large M, proportional agrees with it too. The
default M = 8 is the paper's job: 16M tokens per step in sequences of 16K is 1,024 sequences, 8.2 per
replica over the default 125 replicas, one sequence per micro-batch (bubble 7/15 at P = 8).
Placement (`--placement`):
  packed   (default; the paper: "failed domains are packed into the lowest ranks so as few replicas
           as possible are damaged") — at each reconfiguration domains are regrouped into replicas:
           sorted by speed and chunked R at a time, which maximises the sum of any non-decreasing
           function of the replica speeds (M' is one); the slowest replica, which sets the step, holds
           the slowest domain however domains are grouped. Under dp-drop only floor(healthy domains /
           R) replicas survive, i.e. any failed GPU removes its replica, but the healthy domains of
           damaged replicas regroup. A job could also drop a replica that gates it (not modelled;
           keep-pace does better: it keeps such a replica with fewer micro-batches).
  fixed    replica r is always domains [rR, rR+R); a failed GPU anywhere in it removes (dp-drop)
           or slows (ntp) the whole replica. Spare domains, if any, hot-swap the worst domains.

Failure placements (Fig. 6). For a failed fraction f, n = round(f G) distinct GPUs fail, chosen
uniformly at random (so the chance a given g-GPU replica is untouched is the hypergeometric
C(G-g, n)/C(G, n), which differs from (1-f)^g by a factor ~exp(-n g^2 / 2G^2): 0.2% at G=32000,
g=256, f=2e-3). `--trials` independent placements per f; means and standard errors over trials.

Failures in time (Fig. 7 and the trace). Each GPU fails as a Poisson process of rate
   lambda = 419 / (54 days x 16,384 GPUs) x `--rate-multiplier`   (Llama 3 405B, unexpected only)
= 4.74e-4 per GPU-day. A failure is hardware with probability 0.78 (`--hw-fraction`), repaired
after `--hw-repair-days` (default 3 for the trace; Fig. 7 uses `--fig7-hw-repair-days`, default 5
as in the paper), else software, repaired after `--sw-repair-hours` (3). Repair times are fixed
(`--repair-dist exp` makes them exponential with those means). The process starts one repair time
before t = 0 so the window [0, `--days`) is stationary; the state is sampled every
`--sample-hours`. A GPU that fails again while down counts once.
  Fig. 7: the job's fixed mini-batch is N M micro-batches per step; S spare domains (which fail
  too) join the pool. Replicas are formed from all D+S domains as above and filled best first, M'
  micro-batches each, until the mini-batch is covered (the last one used may run fewer); the rest
  idle. The step takes the longest used replica's time, as above. When the pool's M' sum to less
  than N M the job is short: under "pause" semantics it stops until repairs (throughput 0), under
  "slow" semantics it keeps the mini-batch by giving the remaining replicas more micro-batches
  (throughput = the pool's rate, sum of M' / (N M) over its step time). Per-GPU throughput =
  time-mean throughput x D/(D+S), relative to a failure-free job without spares.
  Trace: fraction of time more than 0.1% of GPUs are down, mean availability per policy, and
  goodput = availability x (1 - stall fraction) (Recovery costs, below).

Stragglers (`--what stragglers`). Each GPU starts slow episodes as a Poisson process of
`--slow-per-gpu-day` (an assumption: the paper gives no rate), each `--slow-hours` long at
1/`--slow-factor` speed; no failures. A domain with k slow GPUs runs, per --straggler-policy:
tolerate at 1/f when k > 0 (the TP group waits for its slowest GPU; no micro-batch cut); evict as
if its slow GPUs had failed, under ntp or dp-drop (speeds above); rebalance at (d - k + k/f) / d
(shares in proportion to speed) with ntp's proportional cut (ntpbench's 2% slack and the shares'
rounding to whole heads left out). Replicas, packing and the lock-step throughput are as for
failures; the table gives the time-mean throughput per policy.

Recovery costs. Every failure stalls the whole job for `--recovery-seconds` (detect + reconfigure)
and every repair for `--heal-seconds` (re-admit and heal the returning GPUs from a peer). The trace
gives goodput = availability x (1 - stall fraction) from its own failures and repairs; Fig. 7 counts
those among the pool's J + S domains in each history (a failure on an idle spare domain is counted
too: an upper bound); Fig. 6, which has no time, holds its failed fraction f in steady state: with
the failure model's mean repair R (`--hw-repair-days`, `--sw-repair-hours`, `--hw-fraction`), f G / R
failures and as many repairs per second (Little's law). Each table shows its figures with and
without the stall; the stall is the same for every policy (one event, one repair of the job).

Calibration. `--calibrate RUN.h5 ...` reads measured runs (schema 1): the healthy step time, tokens
per step per rank, recovery seconds per failure (every detect and reconfigure event, the
re-admitting reconfiguration included, over the kills) and every heal that moved bytes (its bytes /
seconds, over the memory copy the run measured at its start, root attribute `memcpy_gbps`).
Recovery is transferred to the cluster as a multiple of the healthy step time (recovery_seconds =
measured recovery / measured step time x `--step-seconds`), since a CPU run's absolute seconds say
nothing about a 32K-GPU step. The heal is scaled by bytes: one GPU's share of the simulated model
(`--model-params` x `--bytes-per-param` / GPUs per replica; 480e9 x 16 B / 256 = 30 GB by default)
over `--heal-link-gbps` (50 GB/s per GPU) at the share of the memory copy the measured heals
reached. A small calibration model's heals are partly latency, so that share, and the heal time, is
conservative (an upper bound). The per-GPU tokens/s of the run is printed beside the Fig. 7
fractions.

Check against runs. `--check-pp RUN.h5 ...` reads paced ntpbench runs and prints, per distinct set
of replica TP degrees in their damaged steps, the measured damaged/healthy tokens per second (medians,
step 1 left out) beside this model's prediction for the run's layout (TP x PP x DP, M, policy,
boost; proportional cut, as ntpbench cuts) and the additive model's. With M = 1 ntpbench cuts a
damaged replica's sequences instead; the check then uses the P = 1 model with the micro-batch's
sequences as the units. `--what pipelines` tabulates ntp and ntp-pw by M (`--pp-micro-batches`) under
both cuts.
"""
from __future__ import annotations

import math
import os
import sys
import textwrap
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

POLICIES = ("dp-drop", "ntp", "ntp-pw")
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

    def __post_init__(self):
        if self.micro_batches < 0:
            raise ValueError("--micro-batches must be >= 0 (0: the limit of many micro-batches)")
        if self.mb_cut not in MB_CUTS:
            raise ValueError(f"unknown micro-batch cut {self.mb_cut!r} (choose from {', '.join(MB_CUTS)})")


def speed_table(domain_size: int, policy: str, p: Params) -> np.ndarray:
    """Speed of a domain with k = 0..d failed GPUs (non-increasing in k)."""
    k = np.arange(domain_size + 1)
    live = domain_size - k
    alive = (live >= max(1, math.ceil(p.min_tp_fraction * domain_size))).astype(float)
    if policy == "dp-drop":
        s = (k == 0).astype(float)
    elif policy == "ntp":
        s = live / domain_size
    elif policy == "ntp-pw":
        s = np.minimum(1.0, live * p.boost / domain_size)
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


def job_throughput(v: np.ndarray, policy: str, stages: int, p: Params, replicas: int) -> np.ndarray:
    """Throughput of a job whose replicas [..., n] have speeds v and all train in lock-step, relative to
    `replicas` healthy ones: committed micro-batches / max replica step time."""
    w = kept_micro_batches(v, policy, stages, p)
    T = replica_time(w, v, stages, p.micro_batches).max(axis=-1)
    return np.where(T > 0, w.sum(axis=-1) / replicas / np.where(T > 0, T, 1.0), 0.0)


def fixed_batch_throughput(v: np.ndarray, policy: str, stages: int, p: Params, replicas: int):
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
    T = replica_time(used, v, stages, p.micro_batches).max(axis=-1)
    rate = np.where(T > 0, np.minimum(total, replicas) / replicas / np.where(T > 0, T, 1.0), 0.0)
    return short, rate, np.where(short, 0.0, rate)


# ---------------------------------------------------------------------------------------------
# Recovery costs: whole-job stalls per failure and per repair
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Costs:
    """Whole-job stalls: `recovery` seconds per failure (detect + reconfigure), `heal` per repair (the
    returning GPUs' shards healed from a peer)."""
    recovery: float = 60.0
    heal: float = 5.0


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
    df = df.copy()
    df["stall_fraction"] = [stall_at_failed_fraction(f, cl, fm, costs) for f in df["failed_fraction"]]
    df["loss_with_costs"] = 1 - df["availability"] * (1 - df["stall_fraction"])
    return df


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
            avail = job_throughput(v, pol, R, params, N)
            rows.append(dict(failed_fraction=f, failed_gpus=n, policy=pol, placement=params.placement,
                             availability=avail.mean(), availability_se=avail.std(ddof=1) / math.sqrt(trials) if trials > 1 else math.nan,
                             loss=1 - avail.mean(), replicas_hit=hit.mean(),
                             replicas_hit_se=hit.std(ddof=1) / math.sqrt(trials) if trials > 1 else math.nan,
                             replicas_hit_formula=1 - (1 - n / cl.gpus) ** cl.gpus_per_replica,
                             domains_hit=dom_hit.mean()))
    return pd.DataFrame(rows)


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
            stall = min(1.0, (int((tr.failed_gpus < pool).sum()) * costs.recovery
                              + int((tr.repaired_gpus < pool).sum()) * costs.heal) / (days * DAY))
            srt = np.sort(c, axis=-1, kind="stable") if params.placement == "packed" else None
            for pol in policies:
                lut = speed_table(cl.domain_size, pol, params)
                v = replica_speeds(c, R, lut, params.placement, job_domains=J, sorted_counts=srt)
                short, slow, pause = fixed_batch_throughput(v, pol, R, params, N)
                a = acc.setdefault((S, pol), {"slow": [], "pause": [], "short": [], "stall": []})
                a["slow"].append(slow.mean())
                a["pause"].append(pause.mean())
                a["short"].append(short.mean())
                a["stall"].append(stall)
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


def time_trace(cl: Cluster, fm: FailureModel, multipliers, policies=POLICIES, params: Params = Params(),
               days: float = 15, sample_hours: float = 1.0, trials: int = 4, seed: int = 3,
               recovery_seconds: float = 60.0, heal_seconds: float = 5.0, keep_first: bool = False):
    rng = np.random.default_rng(seed)
    R, N = cl.domains_per_replica, cl.replicas
    rows, example = [], None
    for mult in multipliers:
        fmm = replace(fm, rate_multiplier=mult)
        res = {"down": [], "over": [], "fails": [], "stall": []}
        per_pol = {p: [] for p in policies}
        for t in range(trials):
            tr = failure_trace(cl.gpus, cl.domain_size, fmm, days, sample_hours, rng)
            down = tr.counts.sum(axis=-1) / cl.gpus
            res["down"].append(down.mean())
            res["over"].append((down > 1e-3).mean())
            res["fails"].append(tr.failures / days)
            res["stall"].append(min(1.0, (tr.failures * recovery_seconds + tr.repairs * heal_seconds) / (days * DAY)))
            srt = np.sort(tr.counts, axis=-1, kind="stable") if params.placement == "packed" else None
            series = {}
            for pol in policies:
                v = replica_speeds(tr.counts, R, speed_table(cl.domain_size, pol, params), params.placement,
                                   sorted_counts=srt)
                thr = job_throughput(v, pol, R, params, N)
                per_pol[pol].append(thr.mean())
                series[pol] = thr
            if example is None and t == 0:
                example = dict(multiplier=mult, t=tr.times_days, down=down, **series)
        stall = float(np.mean(res["stall"]))
        for pol in policies:
            av = float(np.mean(per_pol[pol]))
            rows.append(dict(rate_multiplier=mult, policy=pol, failures_per_day=float(np.mean(res["fails"])),
                             mean_down_fraction=float(np.mean(res["down"])),
                             time_down_over_0p1pct=float(np.mean(res["over"])),
                             availability=av, stall_fraction=stall, goodput=av * (1 - stall)))
    return pd.DataFrame(rows), example


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


# ---------------------------------------------------------------------------------------------
# Pipelines: the same experiments by micro-batches and cut
# ---------------------------------------------------------------------------------------------

def pipelines_sweep(cl: Cluster, fm: FailureModel, fm7: FailureModel, micro_batches, params: Params = Params(),
                    cuts=MB_CUTS, policies=("ntp", "ntp-pw"), failed_fraction: float = 4e-3, trials: int = 100,
                    spares=(0, 8, 16), multipliers=(1.0, 3.0), days: float = 30, sample_hours: float = 1.0,
                    time_trials: int = 4, seed: int = 1) -> pd.DataFrame:
    """Fig. 6 loss at one failed fraction, Fig. 7 spares to never be short and trace availability, for
    every (M, cut): the same seeds as the default experiments, so every row sees the same failures."""
    rows = []
    for M in micro_batches:
        for cut in cuts:
            p = replace(params, micro_batches=int(M), mb_cut=cut)
            d6 = sweep_failed_fraction(cl, [failed_fraction], policies, p, trials, seed).set_index("policy")
            d7 = spares_sweep(cl, spares, fm7, policies, p, days, sample_hours, time_trials, seed + 1)
            need = spares_needed(d7)
            dt, _ = time_trace(cl, fm, multipliers, policies, p, days, sample_hours, time_trials, seed + 2)
            P = cl.domains_per_replica
            row = dict(micro_batches=int(M), mb_cut=cut, bubble=(P - 1) / (M + P - 1) if M else 0.0)
            for pol in policies:
                row[f"loss {pol}"] = float(d6.loc[pol, "loss"])
                row[f"spares {pol}"] = need[pol]
                for mult in multipliers:
                    a = dt[(dt["policy"] == pol) & (dt["rate_multiplier"] == mult)]["availability"]
                    row[f"avail {pol} x{mult:g}"] = float(a.iloc[0])
            rows.append(row)
    return pd.DataFrame(rows)


def pipelines_table(df: pd.DataFrame, spares_max: int) -> str:
    cols = [("micro_batches", "M", "{}"), ("mb_cut", "cut", "{}"), ("bubble", "bubble", "{:.0%}")]
    for c in df.columns[3:]:
        if c.startswith("spares "):
            cols.append((c, c, "{}"))
        else:
            cols.append((c, c, "{:.2%}"))
    df = df.copy()
    df["micro_batches"] = [str(m) if m else "inf" for m in df["micro_batches"]]
    for c in df.columns:
        if c.startswith("spares "):
            df[c] = [f">{spares_max}" if v is None or (isinstance(v, float) and math.isnan(v)) else str(int(v)) for v in df[c]]
    return _table(df, cols)


# ---------------------------------------------------------------------------------------------
# Calibration from measured runs
# ---------------------------------------------------------------------------------------------

def calibrate(paths) -> dict:
    from . import metrics
    from .runfile import load_run
    steps, tput_rank, rec_ratio, heal_ratio = [], [], [], []
    heal_gbps, heal_of_memcpy, heal_bytes = [], [], []
    for p in paths:
        run = load_run(p)
        m = metrics.recompute(run)
        h = m["healthy_throughput_tokens_per_s"]
        if not np.isfinite(h):
            continue
        # Every heal that moved bytes: its rate, and that rate over the memory copy measured at the
        # run's start (the physical limit of moving a shard on that host).
        ev = run.events
        if len(ev):
            heals = ev[(ev["kind"].astype(str) == "heal") & (ev["bytes"] > 0) & (ev["duration"] > 0)]
            memcpy = float(run.attrs.get("memcpy_gbps", math.nan))
            for b, d in zip(heals["bytes"].to_numpy(dtype=float), heals["duration"].to_numpy(dtype=float)):
                heal_gbps.append(b / d / 1e9)
                heal_bytes.append(b)
                if memcpy > 0:
                    heal_of_memcpy.append(b / d / 1e9 / memcpy)
        tok = run.steps["tokens"].to_numpy(dtype=float)
        healthy = (run.replicas["state"] == 0).all(axis=1)
        step_s = float(np.median(run.step_seconds()[healthy]))
        steps.append(step_s)
        tput_rank.append(h / max(1, run.ranks))
        if m["failures"]:
            rec_ratio.append((m["recovery_detect_seconds"] + m["recovery_reconfigure_seconds"]) / m["failures"] / step_s)
        if m["revivals"]:
            heal_ratio.append(m["recovery_heal_seconds"] / m["revivals"] / step_s)
        del tok
    if not steps:
        raise ValueError("no calibration run has a step with every replica healthy")
    return dict(runs=len(steps), healthy_step_seconds=float(np.median(steps)),
                tokens_per_s_per_rank=float(np.median(tput_rank)),
                recovery_steps_per_failure=float(np.median(rec_ratio)) if rec_ratio else None,
                heal_steps_per_revival=float(np.median(heal_ratio)) if heal_ratio else None,
                heals=len(heal_gbps), heal_bytes=float(np.median(heal_bytes)) if heal_bytes else None,
                heal_gbps=float(np.median(heal_gbps)) if heal_gbps else None,
                heal_of_memcpy=float(np.median(heal_of_memcpy)) if heal_of_memcpy else None)


# ---------------------------------------------------------------------------------------------
# The pipeline model against paced ntpbench runs
# ---------------------------------------------------------------------------------------------

def run_replica_speeds(degrees, tp: int, policy: str, boost: float) -> np.ndarray | None:
    """Speed of each replica of a run from its recorded TP degrees (0: not training); None for policies
    the model does not cover (restart, none)."""
    deg = np.asarray(degrees, dtype=float)
    if policy == "ntp":
        v = deg / tp
    elif policy == "ntp-pw":
        v = np.where(deg < tp, np.minimum(1.0, boost * deg / tp), 1.0)
    elif policy == "dp-drop":
        v = (deg == tp).astype(float)
    else:
        return None
    return np.where(deg > 0, v, 0.0)


def predict_run(degrees, tp: int, pp: int, micro_batches: int, policy: str, boost: float = 1.3,
                micro_batch: int = 1, mb_cut: str = "proportional") -> dict | None:
    """Damaged/healthy throughput of ntpbench's layout (TP tp x PP pp x DP len(degrees), M micro-batches of
    micro_batch sequences) when its replicas run at the TP `degrees`: the 1F1B model and the additive one.

    With M = 1, ntpbench cuts a damaged replica's sequences instead of its micro-batches; every stage's
    time then shrinks with them, so the model is the P = 1 one with the micro-batch's sequences as units."""
    v = run_replica_speeds(degrees, tp, policy, boost)
    if v is None:
        return None
    M, P = (micro_batch, 1) if micro_batches == 1 else (micro_batches, pp)
    p = Params(boost=boost, micro_batches=M, mb_cut=mb_cut)
    n = len(v)
    return dict(model=float(job_throughput(v, policy, P, p, n)),
                additive=float(job_throughput(v, policy, P, replace(p, micro_batches=0, mb_cut="keep-pace"), n)),
                kept=(kept_micro_batches(v, policy, P, p) * M).round().astype(int).tolist(), units=M)


def _compute_per_unit(run, units: np.ndarray) -> np.ndarray:
    """[steps, replicas, stages]: the slowest live rank's forward + backward time per unit of work (micro-
    batch, or sequence when M = 1) in each stage of each replica; NaN where the replica did no work."""
    ph = list(run.phases)
    fb = run.phase_times[..., ph.index("forward")] + run.phase_times[..., ph.index("backward")]
    tp, pp, n_rep = max(1, run.tp), max(1, run.pp), units.shape[1]
    if fb.shape[1] != n_rep * tp * pp:          # not the documented rank layout: no diagnostics
        return np.full(units.shape + (pp,), np.nan)
    # Ranks are numbered (replica x pp + stage) x tp + TP index (results/README.md, /ranks/stage).
    per = fb.reshape(fb.shape[0], n_rep, pp, tp).max(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(units[:, :, None] > 0, per / units[:, :, None], np.nan)


def check_pp(paths, warmup_steps: int = 1) -> pd.DataFrame:
    """Measured damaged/healthy throughput of runs next to the model's prediction for their layout.

    Per run: tokens / (t_end - t_start) per step; healthy = steps with every replica healthy, damaged =
    steps with some replica degraded or down (one row per distinct set of replica TP degrees), both
    after the first `warmup_steps` steps; the ratio of their medians against predict_run().

    Diagnostics beside it, from /ranks/phase_times (forward + backward of each stage's slowest live rank
    per micro-batch, medians over the steps): each replica's compute speed as the run shows it (healthy
    slowest stage over its slowest stage: does TP t' cost t/t' as the model assumes?), and 1F1B with the
    run's own per-stage times c_s and micro-batch counts m, a step of sum_s c_s + (m - 1) max_s c_s (the
    model assumes equal stages). What is left between that and the measurement is time outside the
    forward and backward (communication, optimizer) and noise."""
    from .runfile import load_run
    rows = []
    for path in paths:
        run = load_run(path)
        cfg = run.config
        M = int(run.attrs.get("micro_batches", cfg.get("micro_batches", 1)))
        b = int(cfg.get("micro_batch", 1))
        boost = float(cfg.get("pacing", {}).get("boost", 1.3))
        st = run.steps
        tput = st["tokens"].to_numpy(dtype=float) / run.step_seconds()
        state, deg, batch = run.replicas["state"], run.replicas["tp_degree"], run.replicas["batch"]
        late = st["step"].to_numpy() > warmup_steps
        healthy = late & (state == 0).all(axis=1)
        damaged = late & ~(state == 0).all(axis=1) & (deg > 0).any(axis=1)
        base = dict(file=run.name, policy=run.policy, layout=f"{run.tp}x{run.pp}x{run.dp}", M=M,
                    timing=str(run.attrs.get("timing", "?")), healthy_steps=int(healthy.sum()))
        if not healthy.any() or not damaged.any():
            rows.append(dict(base, degrees="-", damaged_steps=int(damaged.sum()), measured=math.nan, model=math.nan,
                             additive=math.nan, kept_run="-", kept_model="-", speeds_run="-", stages_run="-",
                             model_run=math.nan))
            continue
        h = float(np.median(tput[healthy]))
        dt = run.step_seconds()
        base["healthy_spread"] = float(dt[healthy].max() / dt[healthy].min() - 1)
        units_per_seq = 1 if M == 1 else 1 / b                  # work units: sequences when M == 1
        U = b if M == 1 else M
        units = batch * units_per_seq
        per_unit = _compute_per_unit(run, units)                 # [steps, replicas, stages]
        ref = np.nanmedian(per_unit[healthy].max(axis=-1))       # a healthy replica's slowest stage
        for key in sorted({tuple(r) for r in deg[damaged].tolist()}):
            sel = damaged & (deg == np.array(key)).all(axis=1)
            kept_run = np.median(units[sel], axis=0)
            pr = predict_run(key, run.tp, run.pp, M, run.policy, boost, b)
            # The run's compute: per replica and stage, per unit of work (NaN where it did no work).
            c = np.full(per_unit.shape[1:], np.nan)
            working = kept_run > 0
            if working.any():
                c[working] = np.nanmedian(per_unit[sel][:, working], axis=0)
            v_run = np.where(working, ref / np.nanmax(np.where(working[:, None], c, 1.0), axis=-1), 0.0)
            ch = np.nanmedian(per_unit[healthy], axis=0).max(axis=0)            # healthy, per stage
            if M == 1:
                T_h, T_q = U * ch.sum(), kept_run * np.nansum(c, axis=-1)
            else:
                T_h = ch.sum() + (U - 1) * ch.max()
                T_q = np.where(working, np.nansum(c, axis=-1) + (kept_run - 1) * np.nanmax(np.where(working[:, None], c, 0.0), axis=-1), 0.0)
            model_run = float(kept_run.sum() / (U * len(kept_run)) * T_h / T_q.max()) if T_q.max() > 0 else math.nan
            rows.append(dict(base, degrees=str(list(key)), damaged_steps=int(sel.sum()),
                             damaged_spread=float(dt[sel].max() / dt[sel].min() - 1),
                             measured=float(np.median(tput[sel])) / h,
                             model=pr["model"] if pr else math.nan, additive=pr["additive"] if pr else math.nan,
                             kept_run=f"{[int(round(x)) for x in kept_run]}/{U}",
                             kept_model=f"{pr['kept']}/{U}" if pr else "-",
                             speeds_run="[" + ", ".join(f"{x:.3f}" for x in v_run) + "]",
                             stages_run="/".join(f"{x / ch.max():.3f}" for x in ch), model_run=model_run))
    df = pd.DataFrame(rows)
    df["error"] = df["measured"] / df["model"] - 1
    df["error_run"] = df["measured"] / df["model_run"] - 1
    return df


def check_pp_table(df: pd.DataFrame) -> str:
    cols = [("file", "file", "{}"), ("policy", "policy", "{}"), ("layout", "TPxPPxDP", "{}"), ("M", "M", "{:d}"),
            ("degrees", "TP degrees", "{}"), ("kept_run", "kept (run)", "{}"), ("kept_model", "kept (model)", "{}"),
            ("damaged_steps", "steps h/d", "{}"), ("spread", "spread h/d", "{}"),
            ("measured", "measured", "{:.4f}"), ("model", "1F1B model", "{:.4f}"), ("error", "meas/model-1", "{:+.1%}"),
            ("additive", "additive", "{:.4f}"), ("speeds_run", "speeds (run)", "{}"),
            ("stages_run", "stage times", "{}"), ("model_run", "1F1B at run's times", "{:.4f}"),
            ("error_run", "meas/that-1", "{:+.1%}")]
    df = df.copy()
    df["damaged_steps"] = [f"{h}/{d}" for h, d in zip(df["healthy_steps"], df["damaged_steps"])]
    df["spread"] = [f"{h:.0%}/{d:.0%}" if np.isfinite(h) and np.isfinite(d) else "-"
                    for h, d in zip(df.get("healthy_spread", np.nan), df.get("damaged_spread", np.nan))]
    df = df.astype(object).where(df.notna(), None)           # no figure: "-"
    return _table(df, cols)


def check_pp_main(paths) -> int:
    from .runfile import SchemaError
    try:
        df = check_pp(paths)
    except SchemaError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("Damaged/healthy tokens per second (medians over the healthy/damaged steps h/d; step 1 left out as "
          "warm-up) against the 1F1B model (replicas in lock-step; kept = micro-batches per replica, of M; "
          "sequences, of the micro-batch, when M = 1) and the additive model. From the run's forward + backward "
          "times: each replica's compute speed, the healthy stages' times relative to the slowest, and 1F1B "
          "with those stage times (sum_s c_s + (m - 1) max_s c_s per step). Spread: slowest over fastest "
          "step, healthy/damaged:")
    print(check_pp_table(df))
    for r in df.to_dict("records"):
        if r["timing"] != "paced":
            print(f"note: {r['file']} ran with {r['timing']} timing; the model assumes compute-bound paced steps")
    return 0


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------

def _table(df: pd.DataFrame, cols: list[tuple[str, str, str]]) -> str:
    cells = [[h for _, h, _ in cols]] + [[(f.format(r[c]) if r[c] is not None else "-") for c, _, f in cols]
                                         for r in df.to_dict("records")]
    w = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    lines = ["  ".join(c.rjust(w[i]) for i, c in enumerate(row)) for row in cells]
    lines.insert(1, "  ".join("-" * x for x in w))
    return "\n".join(lines)


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
    stall = df.groupby(["failed_fraction", "failed_gpus"], sort=False)["stall_fraction"].first()
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


def trace_table(df: pd.DataFrame) -> str:
    cols = [("rate_multiplier", "rate x", "{:g}"), ("policy", "policy", "{}"),
            ("failures_per_day", "fail/day", "{:.1f}"), ("mean_down_fraction", "mean down", "{:.3%}"),
            ("time_down_over_0p1pct", "time >0.1% down", "{:.1%}"), ("availability", "availability", "{:.2%}"),
            ("stall_fraction", "stall", "{:.2%}"), ("goodput", "goodput", "{:.2%}")]
    return _table(df, cols)


def plot_fig6(df: pd.DataFrame, cl: Cluster, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for pol, g in df.groupby("policy", sort=False):
        ax.errorbar(g["failed_fraction"] * 1e3, g["loss"] * 100, yerr=2 * g["availability_se"] * 100,
                    marker="o", markersize=3, capsize=2, label=pol)
    ax.set_xlabel("failed GPUs (per mille of the cluster)")
    ax.set_ylabel("throughput loss (%)")
    ax.set_title(f"Throughput loss vs failed fraction: {cl.gpus} GPUs, TP{cl.domain_size} domains, "
                 f"{cl.domains_per_replica} domains/replica ({df['placement'].iloc[0]})", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
    ax.set_ylabel("per-GPU throughput (failure-free job = 1)")
    ax.set_title(f"Fixed mini-batch with spares: {cl.gpus} GPUs, TP{cl.domain_size}, "
                 f"{df['hw_repair_days'].iloc[0]:g}-day hardware repair", fontsize=9)
    ax.set_ylim(max(0, min(0.8, df["per_gpu_slow"].min() - 0.02)), 1.005)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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


def main(args) -> int:
    try:
        cl = Cluster(args.gpus, args.domain_size, args.gpus_per_replica)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.check_pp:
        return check_pp_main(args.check_pp)
    try:
        params = Params(boost=args.boost, min_tp_fraction=args.min_tp_fraction, placement=args.placement,
                        micro_batches=args.micro_batches, mb_cut=args.mb_cut)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not 1.0 <= args.boost <= 1.3 + 1e-12:
        print("error: --boost must be in [1, 1.3] (the paper's 30% TDP headroom)", file=sys.stderr)
        return 2
    fm = FailureModel(hw_fraction=args.hw_fraction, hw_repair_days=args.hw_repair_days,
                      sw_repair_hours=args.sw_repair_hours, repair_dist=args.repair_dist,
                      interruptions=args.interruptions, days=args.ref_days, ref_gpus=args.ref_gpus)
    recovery_s, heal_s, tok_gpu = args.recovery_seconds, args.heal_seconds, None
    if args.calibrate:
        cal = calibrate(args.calibrate)
        tok_gpu = cal["tokens_per_s_per_rank"]
        print("calibration from", len(args.calibrate), "run(s):")
        for k, v in cal.items():
            print(f"  {k}: {v if v is None else (f'{v:.6g}' if isinstance(v, float) else v)}")
        if cal["recovery_steps_per_failure"] is not None:
            recovery_s = cal["recovery_steps_per_failure"] * args.step_seconds
        shard = heal_bytes_per_gpu(cl, args.model_params, args.bytes_per_param)
        by_bytes = calibrated_heal_seconds(cal, shard, args.heal_link_gbps)
        if by_bytes is not None:
            heal_s = by_bytes
            print(f"  -> heal: {shard / 1e9:.3g} GB per GPU ({args.model_params:.3g} parameters x "
                  f"{args.bytes_per_param:g} B / {cl.gpus_per_replica} GPUs per replica) at {cal['heal_of_memcpy']:.3g} "
                  f"(the measured heals' share of their host's memory copy, at {cal['heal_bytes'] / 1e6:.3g} MB each) x "
                  f"{args.heal_link_gbps:g} GB/s per GPU = {heal_s:.3g} s per repair")
        elif cal["heal_steps_per_revival"] is not None:
            heal_s = cal["heal_steps_per_revival"] * args.step_seconds
        print(f"  -> cluster costs at --step-seconds {args.step_seconds:g}: recovery {recovery_s:.3g} s per failure, "
              f"heal {heal_s:.3g} s per repair\n")
    costs = Costs(recovery_s, heal_s)
    print(f"cluster: {cl.gpus} GPUs, {cl.domains} domains of {cl.domain_size}, {cl.domains_per_replica} domains "
          f"per replica, {cl.replicas} replicas; placement {params.placement}; boost {params.boost:g}; "
          f"domains with live < {args.min_tp_fraction:g} x {cl.domain_size} dropped")
    print(f"pipelines: {cl.domains_per_replica} stages per replica, "
          + (f"{params.micro_batches} micro-batches per replica per step (1F1B)" if params.micro_batches
             else "many micro-batches (the additive limit)") + f", {params.mb_cut} micro-batch cut")
    print(f"failures: {fm.rate_per_gpu_day:.3e} per GPU-day (x rate multiplier), {fm.hw_fraction:.0%} hardware, "
          f"software repaired in {fm.sw_repair_hours:g} h\n")
    frames = {}
    what = set(args.what)
    if "fig6" in what:
        fr = np.linspace(0, args.max_failed_fraction, args.points + 1)[1:]
        df6 = sweep_failed_fraction(cl, fr, args.policies, params, args.trials, args.seed)
        print(f"Fig. 6 — throughput loss vs failed fraction ({args.trials} placements each):")
        print(fig6_table(df6), "\n")
        df6 = add_fig6_costs(df6, cl, fm, costs)
        frames["fig6"] = df6
        print(f"Fig. 6 with recovery costs: {costs.recovery:.3g} s per failure + {costs.heal:.3g} s per repair stall "
              f"the job; a failed fraction f held with a mean repair of {mean_repair_seconds(fm) / 3600:.3g} h "
              f"(--hw-repair-days {fm.hw_repair_days:g}) is f x {cl.gpus} / that failures per second:")
        print(fig6_costs_table(df6), "\n")
        surprise = fig6_surprise(df6, cl, params)
        if surprise:
            print("\n".join(textwrap.fill(n, 110, break_on_hyphens=False) for n in surprise.split("\n")), "\n")
    if "fig7" in what:
        fm7 = replace(fm, hw_repair_days=args.fig7_hw_repair_days, rate_multiplier=args.rate_multiplier[0])
        df7 = spares_sweep(cl, args.spares, fm7, args.policies, params, args.days, args.sample_hours,
                           args.time_trials, args.seed + 1, costs)
        frames["fig7"] = df7
        print(f"Fig. 7 — fixed mini-batch with spare domains, {fm7.hw_repair_days:g}-day hardware repair, "
              f"{args.days:g} days x {args.time_trials} trials; with costs: {costs.recovery:.3g} s per failure + "
              f"{costs.heal:.3g} s per repair in the pool stall the job:")
        print(fig7_table(df7, tok_gpu))
        need = spares_needed(df7)
        print("spares to never be short:", ", ".join(f"{p} {('>' + str(max(args.spares))) if v is None else v}"
                                                        for p, v in need.items()), "\n")
    if "pipelines" in what:
        fm7 = replace(fm, hw_repair_days=args.fig7_hw_repair_days, rate_multiplier=args.rate_multiplier[0])
        pols = [p for p in args.policies if p != "dp-drop"] or list(args.policies)
        dfp = pipelines_sweep(cl, fm, fm7, args.pp_micro_batches, params, MB_CUTS, pols, args.max_failed_fraction,
                              args.trials, args.spares, args.rate_multiplier, args.days, args.sample_hours,
                              args.time_trials, args.seed)
        frames["pipelines"] = dfp
        print(f"Pipelines — {cl.domains_per_replica} stages per replica, by micro-batches M (inf: the additive "
              f"limit) and cut; bubble = (P-1)/(M+P-1); loss: Fig. 6 at f = {args.max_failed_fraction:g} "
              f"({args.trials} placements); spares: Fig. 7, to never be short ({fm7.hw_repair_days:g}-day "
              f"repair); avail: trace availability ({fm.hw_repair_days:g}-day repair) by rate multiplier. "
              f"dp-drop does not depend on M:")
        print(pipelines_table(dfp, max(args.spares)), "\n")
    if "stragglers" in what:
        dfs = stragglers_sweep(cl, args.slow_per_gpu_day, args.slow_hours, args.slow_factor, params, args.days,
                               args.sample_hours, args.time_trials, args.seed + 3)
        frames["stragglers"] = dfs
        print(f"Stragglers — episodes of {args.slow_hours:g} h at 1/{args.slow_factor:g} speed, {args.days:g} days x "
              f"{args.time_trials} trials; job throughput (healthy = 1) under each --straggler-policy:")
        print(stragglers_table(dfs), "\n")
    ex = None
    if "trace" in what:
        dft, ex = time_trace(cl, fm, args.rate_multiplier, args.policies, params, args.days, args.sample_hours,
                             args.time_trials, args.seed + 2, recovery_s, heal_s)
        frames["trace"] = dft
        print(f"Trace — {fm.hw_repair_days:g}-day hardware repair, {args.days:g} days x {args.time_trials} trials, "
              f"stall {recovery_s:g} s per failure + {heal_s:g} s per repair:")
        print(trace_table(dft), "\n")
    if args.csv:
        os.makedirs(args.csv, exist_ok=True)
        for k, df in frames.items():
            p = os.path.join(args.csv, f"{k}.csv")
            df.to_csv(p, index=False)
            print("wrote", p)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        if "fig6" in frames:
            p = os.path.join(args.out, "fig6_throughput_loss.png")
            plot_fig6(frames["fig6"], cl, p)
            print("wrote", p)
        if "fig7" in frames:
            p = os.path.join(args.out, "fig7_spares.png")
            plot_fig7(frames["fig7"], cl, p)
            print("wrote", p)
        if ex is not None:
            p = os.path.join(args.out, "trace.png")
            plot_trace(ex, cl, p)
            print("wrote", p)
    return 0

