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
           imbalance is ignored: MLP columns can absorb it. A mixture of experts (`--experts E`,
           expert parallelism over the domain, whole experts per GPU as in ntpbench) cannot: the
           busiest of L GPUs holds ceil(E/L) experts where a healthy one holds E/d, so v is
           (E/d) / ceil(E/L) (Mixtral's 8 experts at EP 8: 0.5 after one failure, not 7/8); the
           experts' share of the step is taken as the whole of it.
  ntp-pw   min(1, v b), v as for ntp, with the power boost b = `--boost` (<= 1.3): the surviving
           GPUs run up to b times faster, so a dense domain keeps full speed while d/L <= b (TP32
           tolerates 7 failed GPUs). The perf/W cost of boosting (2.8% at 1.1x, 6.5% at 1.2x) costs energy, not
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
and every repair for `--heal-seconds` (re-admit and heal the returning GPUs from a peer). Unless given,
each cost comes from `--machine`'s profile (jobs/machines/NAME.yaml, default gb200-nvl72, read by
machines.py; no figure is written here) by the rules ntpbench's paced runs charge (Costs.from_profile):
recovery = detect + repair + reconfigure; heal = a replacement process + reconfigure + latency + one GPU's shard (`--model-params` x
`--bytes-per-param` / `--gpus-per-replica`) over the scale-out link (`--heal-link-gbps` overrides it);
restart = the profile's restart + that shard loaded at its checkpoint_gbps; checkpoint = each GPU's share
of the job's state (over `--gpus`) written at checkpoint_gbps. The trace
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

Predict a run. `--from-run RUN.h5 ...` predicts each paced ntpbench run's emulated ETTR and goodput from its
machine's profile, layout, policy and failure schedule as it happened, and prints them beside the run's own
(/summary) with the relative difference and a verdict (exit 1 beyond `--tolerance`, default 2%). The step times
are taken from the run (the healthy step, and each damaged TP-degree tuple's, medians); everything else is
modelled: the slots are replayed with ntpbench's rules ported to Python (shards.py: configurations, heals'
bytes per rank, restores, rollbacks, checkpoints) and every recovery part charged from
jobs/machines/<machine>.yaml (`--machines-dir` reads another copy). The equations are in from_run.py.
"""

# One module per part of the model (see each module's docstring); every name is re-exported here, so
# `from analysis.simulate import X` and `simulate.X` reach it.
from .availability import plot_trace, time_trace, trace_table  # noqa: F401
from .calibration import calibrate  # noqa: F401
from .check import (_compute_per_unit, check_pp, check_pp_main, check_pp_table, predict_run,  # noqa: F401
                    run_replica_speeds)
from .cli import main  # noqa: F401
from .from_run import FromRunError, from_run_main, predict  # noqa: F401
from .machines import Profile, ProfileError, load_profile, profile_names  # noqa: F401
from .costs import (Costs, add_fig6_costs, calibrated_heal_seconds, checkpoint_interval, heal_bytes_per_gpu,
                    restart_stall,  # noqa: F401
                    mean_repair_seconds, stall_at_failed_fraction)
from .failures import Trace, failure_trace  # noqa: F401
from .fig6 import (fig6_costs_table, fig6_surprise, fig6_table, gating_example, place_failures,  # noqa: F401
                   plot_fig6, sweep_failed_fraction)
from .fig7 import fig7_table, plot_fig7, spares_needed, spares_sweep  # noqa: F401
from .model import (DAY, DEFAULT_MICRO_BATCHES, LIVE_POLICIES, MB_CUTS, POLICIES, Cluster, FailureModel, Params,  # noqa: F401
                    capacity, fixed_batch_throughput, job_throughput, kept_micro_batches, replica_speeds,
                    replica_time, speed_table)
from .pipelines import pipelines_sweep, pipelines_table  # noqa: F401
from .stragglers import (STRAGGLER_POLICIES, slow_trace, straggler_speed_table, straggler_throughput,  # noqa: F401
                         stragglers_sweep, stragglers_table)
from .tables import _table  # noqa: F401
