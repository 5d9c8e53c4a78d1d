"""`python3 -m analysis simulate`: main(args) runs the experiments `--what` names, prints their tables and
writes the CSVs and plots."""
from __future__ import annotations

import os
import sys
import textwrap
from dataclasses import replace

import numpy as np

from .availability import plot_trace, time_trace, trace_table
from .calibration import calibrate
from .check import check_pp_main
from .costs import (Costs, add_fig6_costs, calibrated_heal_seconds, checkpoint_interval, heal_bytes_per_gpu,
                    mean_repair_seconds)
from .from_run import from_run_main
from .machines import ProfileError, load_profile
from .fig6 import fig6_costs_table, fig6_surprise, fig6_table, plot_fig6, sweep_failed_fraction
from .fig7 import fig7_table, plot_fig7, spares_needed, spares_sweep
from .model import DAY, MB_CUTS, Cluster, FailureModel, Params
from .pipelines import pipelines_sweep, pipelines_table
from .stragglers import stragglers_sweep, stragglers_table


def main(args) -> int:
    if args.from_run:
        return from_run_main(args.from_run, args.tolerance, args.machines_dir)
    try:
        cl = Cluster(args.gpus, args.domain_size, args.gpus_per_replica)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if 0 < args.experts < cl.domain_size:
        print(f"error: --experts {args.experts} must be at least --domain-size {cl.domain_size}: expert parallelism "
              "places whole experts, at least one on each GPU of a domain", file=sys.stderr)
        return 2
    if args.check_pp:
        return check_pp_main(args.check_pp)
    excess = damaged_excess(args, cl.replicas)
    if excess is None:
        return 2
    try:
        params = Params(boost=args.boost, min_tp_fraction=args.min_tp_fraction, placement=args.placement,
                        micro_batches=args.micro_batches, mb_cut=args.mb_cut, damaged_excess=excess,
                        experts=args.experts)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not 1.0 <= args.boost <= 1.3 + 1e-12:
        print("error: --boost must be in [1, 1.3] (the paper's 30% TDP headroom)", file=sys.stderr)
        return 2
    fm = FailureModel(hw_fraction=args.hw_fraction, hw_repair_days=args.hw_repair_days,
                      sw_repair_hours=args.sw_repair_hours, repair_dist=args.repair_dist,
                      interruptions=args.interruptions, days=args.ref_days, ref_gpus=args.ref_gpus)
    try:
        base = Costs.from_profile(args.machine, args.model_params, cl.gpus_per_replica, cl.gpus, args.bytes_per_param,
                                  args.checkpoint_interval, args.machines_dir, args.heal_link_gbps,
                                  args.repair_mechanism)
        link_gbps = (args.heal_link_gbps if args.heal_link_gbps is not None
                     else load_profile(args.machine, args.machines_dir).scale_out_gbps)
    except ProfileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    given = {k: getattr(args, f"{k}_seconds") for k in ("recovery", "heal", "restart", "checkpoint")}
    costs = replace(base, **{k: v for k, v in given.items() if v is not None})
    recovery_s, heal_s, tok_gpu = costs.recovery, costs.heal, None
    if args.calibrate:
        cal = calibrate(args.calibrate)
        tok_gpu = cal["tokens_per_s_per_rank"]
        print("calibration from", len(args.calibrate), "run(s):")
        for k, v in cal.items():
            print(f"  {k}: {v if v is None else (f'{v:.6g}' if isinstance(v, float) else v)}")
        if cal["recovery_steps_per_failure"] is not None:
            recovery_s = cal["recovery_steps_per_failure"] * args.step_seconds
        shard = heal_bytes_per_gpu(cl, args.model_params, args.bytes_per_param)
        by_bytes = calibrated_heal_seconds(cal, shard, link_gbps)
        if by_bytes is not None:
            heal_s = by_bytes
            print(f"  -> heal: {shard / 1e9:.3g} GB per GPU ({args.model_params:.3g} parameters x "
                  f"{args.bytes_per_param:g} B / {cl.gpus_per_replica} GPUs per replica) at {cal['heal_of_memcpy']:.3g} "
                  f"(the measured heals' share of their host's memory copy, at {cal['heal_bytes'] / 1e6:.3g} MB each) x "
                  f"{link_gbps:g} GB/s per GPU = {heal_s:.3g} s per repair")
        elif cal["heal_steps_per_revival"] is not None:
            heal_s = cal["heal_steps_per_revival"] * args.step_seconds
        print(f"  -> cluster costs at --step-seconds {args.step_seconds:g}: recovery {recovery_s:.3g} s per failure, "
              f"heal {heal_s:.3g} s per repair\n")
    costs = replace(costs, recovery=recovery_s, heal=heal_s)
    for name in ("restart_seconds", "checkpoint_seconds", "checkpoint_interval"):
        if (getattr(args, name) or 0) < 0:
            print(f"error: --{name.replace('_', '-')} must be 0 or more", file=sys.stderr)
            return 2
    print(describe_costs(costs, base, given, args))
    print(f"cluster: {cl.gpus} GPUs, {cl.domains} domains of {cl.domain_size}, {cl.domains_per_replica} domains "
          f"per replica, {cl.replicas} replicas; placement {params.placement}; boost {params.boost:g}; "
          f"domains with live < {args.min_tp_fraction:g} x {cl.domain_size} dropped")
    print(f"pipelines: {cl.domains_per_replica} stages per replica, "
          + (f"{params.micro_batches} micro-batches per replica per step (1F1B)" if params.micro_batches
             else "many micro-batches (the additive limit)") + f", {params.mb_cut} micro-batch cut")
    print(f"failures: {fm.rate_per_gpu_day:.3e} per GPU-day (x rate multiplier), {fm.hw_fraction:.0%} hardware, "
          f"software repaired in {fm.sw_repair_hours:g} h")
    if "restart" in args.policies:
        rate = fm.rate_per_gpu_day * cl.gpus / DAY
        tau = checkpoint_interval(costs, rate)
        print(f"restart: {costs.restart:g} s per failure and the work since the last checkpoint redone; a checkpoint "
              f"costs {costs.checkpoint:g} s, written every {tau / 60:.3g} min ("
              + ("--checkpoint-interval" if costs.checkpoint_interval else
                 f"Young's optimum at {rate * DAY:.3g} failures per day of the job") + ")")
    print()
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
        pols = [p for p in args.policies if p not in ("dp-drop", "restart")] or ["ntp"]
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
                             args.time_trials, args.seed + 2, recovery_s, heal_s, restart_costs=costs)
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


def damaged_excess(args, replicas: int) -> float | None:
    """--damaged-excess, or what --damaged-from's runs measured, carried to the simulated job, or 0;
    None after an error message.

    A run's excess (analysis/damaged_step.py) is seconds parameter-sized (a GPU's share of the
    gradients regrouped over the scale-up link), the job's step compute: carried_excess divides the
    excess's seconds by the run's pure compute at the job's tokens per replica step
    (--tokens-per-replica) and scales by the machines' FLOP/s over scale-up bandwidth (run: its paced
    machine; job: --machine's bf16)."""
    if args.damaged_from is None:
        return 0.0 if args.damaged_excess is None else args.damaged_excess
    if args.damaged_excess is not None:
        print("error: give --damaged-excess or --damaged-from, not both", file=sys.stderr)
        return None
    from ..damaged_step import carried_excess, damaged_steps, tokens_per_replica_step
    from ..runfile import SchemaError, load_run
    try:
        job = load_profile(args.machine, args.machines_dir)
    except ProfileError as e:
        print(f"error: {e}", file=sys.stderr)
        return None
    carried, rows = [], []
    tokens = args.tokens_per_replica or 16 * 2**20 / replicas
    job_ratio = job.bf16_tflops * 1e3 / job.scale_up_gbps
    print(f"damaged steps (analysis/damaged_step.py), carried to {tokens:.6g} tokens per replica step on {job.name}:")
    for path in args.damaged_from:
        try:
            run = load_run(path)
            mine = tokens_per_replica_step(run)
            steps = damaged_steps(run)
            shares = [carried_excess(run, d, tokens, job_ratio) for d in steps]
        except (OSError, SchemaError, ValueError, KeyError) as e:
            print(f"error: {path}: {e}", file=sys.stderr)
            return None
        for d, share in zip(steps, shares):
            print(f"  {path}: TP {list(d.degrees)}, {d.rows} rows, {mine:g} tokens per replica step: step {d.measured:.3f} "
                  f"of a healthy one, {d.compute:.3f} by compute alone, excess {d.excess:+.3f} "
                  f"({d.excess_seconds * 1e3:.3g} ms) -> {share:+.4f}")
            carried.append(share)
            rows.append(d.rows)
    if not carried:
        print("error: --damaged-from: no run under ntp or ntp-pw with damaged and healthy rows", file=sys.stderr)
        return None
    excess = float(np.median(np.repeat(carried, rows)))
    print(f"  -> --damaged-excess {excess:.4f} (the median over {sum(rows)} rows)")
    return excess


def describe_costs(costs: Costs, base: Costs, given: dict, args) -> str:
    """Where each cost comes from: the flag that gave it, else the profile's rule (Costs.from_profile)."""
    p = load_profile(args.machine, args.machines_dir)
    rec = p.recovery
    shard = args.model_params * args.bytes_per_param / args.gpus_per_replica
    repair = "repair" if args.repair_mechanism == "shrink" else "reinit"
    rule = {"recovery": f"detect {rec['detect']:g} + {repair} {rec[repair]:g} + reconfigure {rec['reconfigure']:g}",
            "heal": f"{shard / 1e9:.3g} GB per GPU over {args.heal_link_gbps or p.scale_out_gbps:g} GB/s",
            "restart": f"restart {rec['restart']:g} + that shard loaded at {rec['checkpoint_gbps']:g} GB/s",
            "checkpoint": f"each of {args.gpus} GPUs' share at {rec['checkpoint_gbps']:g} GB/s"}
    parts = []
    for k in ("recovery", "heal", "restart", "checkpoint"):
        v = getattr(costs, k)
        why = f"--{k}-seconds" if given[k] is not None else (rule[k] if v == getattr(base, k) else "--calibrate")
        parts.append(f"{k} {v:.3g} s ({why})")
    return f"costs on {p.name} ({p.path}): " + "; ".join(parts)
