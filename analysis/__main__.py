"""Command line: python3 -m analysis {report,plot,simulate,watch,soak,revivals,scale,stragglers,reshard,paced} ..."""
from __future__ import annotations

import argparse
import sys

from . import simulate as sim


def _add_report(sub) -> None:
    r = sub.add_parser("report", help="table of runs; checks /summary against the raw rows",
                       description="Print one row per run: policy, TP x DP, failures, throughput, goodput, "
                                   "goodput ratio, ETTR, MFU, recovery times and heal bytes, all recomputed "
                                   "from /steps, /replicas and /events. Exits 1 (with the details on stderr) "
                                   "when a file's /summary disagrees with the recomputation or a file cannot "
                                   "be read. A run cut short (no /summary) is reported from its completed steps "
                                   "and marked INCOMPLETE.")
    r.add_argument("runs", nargs="+", metavar="RUN.h5", help="results files written by ntpbench --out")
    r.add_argument("--wide", action="store_true",
                   help="print every column: the run's figures (throughput, ETTR, MFU, heal bytes, overrun steps "
                        "besides the default's) and the recovery's seconds part by part; the default prints the "
                        "columns that decide between runs (policy, kills, layout, slots, trained, failures, "
                        "goodput, good/healthy, recovery seconds, status)")
    r.add_argument("--csv", metavar="FILE", help="also write the table (every recomputed figure) as CSV to FILE")
    r.add_argument("--json", metavar="FILE", help="also write the table (every recomputed figure) as JSON to FILE")
    r.add_argument("--diff", action="store_true",
                   help="compare two runs A and B (e.g. two policies or two versions of one configuration): "
                        "every recomputed figure of both, the difference B - A and the ratio B / A, and the "
                        "configuration keys in which they differ other than the policy (--csv/--json then "
                        "write that table)")


def _add_plot(sub) -> None:
    pl = sub.add_parser("plot", help="PNG figures of runs",
                        description="Write PNGs per run (throughput per step with kill/revive marks and the time "
                                    "each killed rank was down shaded, TP degree of each replica, per-phase time "
                                    "per step) and across the runs (loss against optimizer step and committed "
                                    "tokens, goodput by run, total time per phase). Prints the paths written, and "
                                    "on stderr a warning when the runs differ in model, timing mode or rank count.")
    pl.add_argument("runs", nargs="+", metavar="RUN.h5", help="results files written by ntpbench --out")
    pl.add_argument("--out", required=True, metavar="DIR", help="directory for the PNGs (created if missing)")


def _add_watch(sub) -> None:
    w = sub.add_parser("watch", help="live view of a run while it is written",
                       description="Follow a results file while ntpbench writes it: steps done out of the "
                                   "total, ETA, the TP degree of each replica, the last loss and the goodput so "
                                   "far, refreshed every --interval seconds (redrawn in place on a terminal, a "
                                   "plain line per change otherwise). Exits 0 when the run writes /summary, 1 "
                                   "after --timeout seconds without it.")
    w.add_argument("run", metavar="RUN.h5", help="the --out file of a running (or finished) ntpbench job")
    w.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between looks (default 1)")
    w.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="give up after S seconds without /summary (default: wait until the run ends)")


def _add_soak(sub) -> None:
    sk = sub.add_parser("soak", help="check that memory and open files stay flat over a long run",
                        description="For each results file: steps, failures, revivals, and the worst growth of "
                                    "resident memory (/ranks/rss_bytes) and open file descriptors "
                                    "(/ranks/open_fds) of any logical rank, between the first and the last 10% "
                                    "of each process incarnation's samples (incarnations under 20 samples are "
                                    "not judged). Exits 1 when a growth reaches 5%, when a file has no "
                                    "incarnation long enough to judge, or when the run did not finish (no "
                                    "/summary). The rule is in analysis/soak.py.")
    sk.add_argument("runs", nargs="+", metavar="RUN.h5", help="results files written by ntpbench --out")
    sk.add_argument("--library-cost", metavar="COST.json",
                    help="what the MPI library keeps per replaced process (build/bench/ulfm_respawn_cost --json, "
                         "run at the same rank count): --kill-mode signal runs are then judged on their growth "
                         "beyond that share, printed beside the raw growth")


def _add_revivals(sub) -> None:
    rv = sub.add_parser("revivals", help="what each revival cost: spawned processes against spares",
                        description="Per revival (spawned processes, or spares at a revival or in a takeover): "
                                    "the handover's milliseconds, then its heal's milliseconds, bytes and "
                                    "bandwidth against the memory-copy bandwidth measured at the start of the "
                                    "same run; medians per kind. The rule is in analysis/revivals.py.")
    rv.add_argument("runs", nargs="+", metavar="RUN.h5", help="results files written by ntpbench --out")


def _add_scale(sub) -> None:
    sc = sub.add_parser("scale", help="ntpbench's own costs against its number of ranks (make bench-scale)",
                        description="Per rank count in DIR (jobs/local/scale.sh's N.h5 and N.json): start-up, "
                                    "memory per rank, the recorder's seconds and file bytes per step, the repair "
                                    "after one death (notice, revoke + agree + shrink, reconfigure, heal), the "
                                    "revival (spawn, reconfigure) and the healthy step; then each figure's fitted "
                                    "growth (constant, log n, n, n^2). Exits 1 when a run or its replay failed. "
                                    "The rules are in analysis/scale.py.")
    sc.add_argument("dir", metavar="DIR", help="the folder jobs/local/scale.sh wrote")


def _add_stragglers(sub) -> None:
    sg = sub.add_parser("stragglers", help="goodput under each --straggler-policy against its expectation",
                        description="One straggler's cost under each --straggler-policy: goodput over the steps "
                                    "the policy is in force (and over the whole episode) relative to a healthy run "
                                    "of the same job, beside the arithmetic expectation. The rule and the "
                                    "expectations are in analysis/stragglers.py.")
    sg.add_argument("healthy", metavar="HEALTHY.h5", help="the same job without the slowdown (the baseline)")
    sg.add_argument("runs", nargs="+", metavar="RUN.h5", help="runs with one slowed rank (a schedule's slow events)")
    sg.add_argument("--plot", metavar="PNG", help="write per-rank compute time and compute share over the steps here")
    sg.add_argument("--tolerance", type=float, metavar="FRACTION",
                    help="exit 1 when a run's measured goodput is further than this from its expectation "
                         "(e.g. 0.1; default: only print)")


def _add_reshard(sub) -> None:
    rs = sub.add_parser("reshard", help="the NTP reshard's cost against compute (the paper's Figure 8)",
                        description="From bench_resilience's paced benchmarks (make bench-reshard): the paced NTP "
                                    "sync against the uniform all-reduce, and the backward's slowdown against "
                                    "(reshard bytes / link rate) / (backward compute), with a fitted line and the "
                                    "paper's prototype shapes placed on it. The rule is in analysis/reshard.py.")
    rs.add_argument("bench", nargs="+", metavar="BENCH.json", help="Google Benchmark JSON of bench_resilience")
    rs.add_argument("--plot", metavar="PNG", help="write the figure (slowdown against the ratio, fitted line) here")


def _add_paced(sub) -> None:
    pc = sub.add_parser("paced", help="paced timing's machine independence (make bench-paced)",
                        description="Three runs of one paced configuration: as it is, beside a busy core, and "
                                    "with free links at the same time scale. Prints each run's median step, "
                                    "overrun shares and status; exits 1 unless the busy core moved the median "
                                    "step by at most --busy-limit and free links shortened it by no more than "
                                    "the default run's communication phases. The rule is in analysis/paced.py.")
    pc.add_argument("default", metavar="DEFAULT.h5")
    pc.add_argument("busy", metavar="BUSY.h5")
    pc.add_argument("free", metavar="FREE_LINKS.h5")
    pc.add_argument("--busy-limit", type=float, default=0.02, metavar="F",
                    help="largest relative change of the median step a busy core may cause (default 0.02)")


def _add_simulate(sub) -> None:
    s = sub.add_parser("simulate", help="cluster-scale goodput simulator (the NTP paper's Fig. 6/7)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                       description="Monte Carlo over failure placements and time for dp-drop, ntp and ntp-pw "
                                   "(with spare domains for Fig. 7). The model is documented in "
                                   "analysis/simulate/__init__.py.")
    g = s.add_argument_group("cluster")
    g.add_argument("--gpus", type=int, default=32000, help="GPUs in the job (without spares)")
    g.add_argument("--domain-size", type=int, default=32, help="GPUs per scale-up domain = TP degree")
    g.add_argument("--gpus-per-replica", type=int, default=256,
                   help="GPUs per DP replica (a multiple of --domain-size: domains per replica = PP stages)")
    g = s.add_argument_group("policies")
    g.add_argument("--policies", nargs="+", default=list(sim.POLICIES), choices=sim.POLICIES,
                   help="policies to simulate")
    g.add_argument("--placement", choices=("packed", "fixed"), default="packed",
                   help="packed: domains regrouped so damaged ones share replicas (the paper); "
                        "fixed: replica membership never changes, spares hot-swap")
    g.add_argument("--boost", type=float, default=1.3, help="ntp-pw power boost (compute speed-up), at most 1.3")
    g.add_argument("--min-tp-fraction", type=float, default=0.5,
                   help="a domain with fewer than this fraction of its GPUs alive is dropped")
    g.add_argument("--experts", type=int, default=0, metavar="E",
                   help="a mixture of experts: E whole experts per domain (expert parallelism over the TP group); "
                        "a damaged domain under ntp or ntp-pw runs at its busiest GPU's share of experts (default 0: "
                        "a dense model)")
    g.add_argument("--damaged-excess", type=float, default=None, metavar="X",
                   help="ntp, ntp-pw: a job step with a damaged replica takes 1 + X times what its compute alone "
                        "gives (the gradients regrouped between degrees; analysis/damaged_step.py); default 0, "
                        "the paper's model, or what --damaged-from measures")
    g.add_argument("--damaged-from", nargs="+", metavar="RUN.h5",
                   help="take --damaged-excess from paced ntpbench runs under ntp or ntp-pw: each damaged "
                        "configuration's seconds beyond compute alone (parameter-sized), over one GPU's pure compute "
                        "of the run's emulated shape at --tokens-per-replica, times this machine's FLOP/s over "
                        "scale-up bandwidth over the run's (analysis/damaged_step.py); the median over the rows")
    g.add_argument("--tokens-per-replica", type=float, default=None, metavar="N",
                   help="tokens each replica trains per step, for --damaged-from (default: the paper's 16M-token "
                        "batch over the cluster's replicas)")
    g = s.add_argument_group("pipelines (1F1B over the domains of a replica; replicas in lock-step)")
    g.add_argument("--micro-batches", type=int, default=sim.DEFAULT_MICRO_BATCHES, metavar="M",
                   help="micro-batches per replica per step (the paper's 16M-token batch of 16K sequences over "
                        "125 replicas: 8); 0 = the limit of many micro-batches (the additive model)")
    g.add_argument("--mb-cut", choices=sim.MB_CUTS, default="proportional",
                   help="micro-batches of a damaged replica: proportional = max(1, floor(M t'/t)) under ntp, full M "
                        "under ntp-pw (the paper, ntpbench); keep-pace = as many as fit in a healthy step, "
                        "floor((M+P-1) v - (P-1)) at speed v, so no replica slows the job")
    g.add_argument("--check-pp", nargs="+", metavar="RUN.h5",
                   help="only compare paced ntpbench runs' damaged/healthy throughput with this model's "
                        "prediction for their layout, and exit")
    g = s.add_argument_group("failure model (defaults: Llama 3 405B, unexpected interruptions)")
    g.add_argument("--interruptions", type=float, default=419, help="interruptions in the reference period")
    g.add_argument("--ref-days", type=float, default=54, help="length of the reference period (days)")
    g.add_argument("--ref-gpus", type=int, default=16384, help="GPUs of the reference cluster")
    g.add_argument("--rate-multiplier", type=float, nargs="+", default=[1.0, 3.0],
                   help="failure-rate multipliers for the trace (Fig. 7 uses the first)")
    g.add_argument("--hw-fraction", type=float, default=0.78, help="share of failures that are hardware")
    g.add_argument("--hw-repair-days", type=float, default=3.0, help="hardware repair time for the trace (days)")
    g.add_argument("--fig7-hw-repair-days", type=float, default=5.0, help="hardware repair time for Fig. 7 (days)")
    g.add_argument("--sw-repair-hours", type=float, default=3.0, help="software repair time (hours)")
    g.add_argument("--repair-dist", choices=("fixed", "exp"), default="fixed",
                   help="repair times fixed at their value, or exponential with that mean")
    g = s.add_argument_group("stragglers (--what stragglers; an assumed rate: the paper gives none)")
    g.add_argument("--slow-per-gpu-day", type=float, nargs="+", default=[0.01, 0.03, 0.1],
                   help="slow episodes each GPU starts per day (Poisson)")
    g.add_argument("--slow-hours", type=float, default=2.0, help="length of a slow episode (hours)")
    g.add_argument("--slow-factor", type=float, default=2.0, help="a slow GPU computes this many times slower")
    g = s.add_argument_group("costs (each from --machine's profile unless given)")
    g.add_argument("--machine", default="gb200-nvl72", metavar="NAME",
                   help="the machine whose profile, jobs/machines/NAME.yaml (recovery seconds, links, checkpoint "
                        "storage), gives every cost below that is not given, by the rules ntpbench's paced runs "
                        "charge (analysis/simulate/costs.py, Costs.from_profile)")
    g.add_argument("--machines-dir", metavar="DIR",
                   help="read the machines' profiles from DIR (default %(default)s: jobs/machines; also for --from-run)")
    g.add_argument("--repair-mechanism", choices=("shrink", "reinit"), default="shrink",
                   help="how the communicators are repaired after a failure: shrink (the profile's repair: revoke, "
                        "agree, shrink) or reinit (the profile's reinit: abort every communicator, initialise new "
                        "ones); default %(default)s")
    g.add_argument("--recovery-seconds", type=float, default=None,
                   help="whole-job stall per failure, trace goodput (default %(default)s: the profile's detect + "
                        "repair (or reinit, --repair-mechanism) + reconfigure)")
    g.add_argument("--heal-seconds", type=float, default=None,
                   help="whole-job stall per repair (default %(default)s: one GPU's shard, --model-params x --bytes-per-param "
                        "/ --gpus-per-replica, over the profile's scale-out link; TorchFT: 12 GB in 4-5 s); with "
                        "--calibrate, replaced by the simulated model's shard bytes over the calibrated heal rate")
    g.add_argument("--restart-seconds", type=float, default=None,
                   help="restart: whole-job stall per failure, besides the work since the last checkpoint, which "
                        "is redone (default %(default)s: the profile's restart, 'minutes' in the paper, + one GPU's shard "
                        "loaded at its checkpoint_gbps)")
    g.add_argument("--checkpoint-seconds", type=float, default=None,
                   help="restart: the job's stall to write one checkpoint (default %(default)s: each GPU's share of the "
                        "model's state, --model-params x --bytes-per-param / --gpus, at the profile's "
                        "checkpoint_gbps)")
    g.add_argument("--checkpoint-interval", type=float, default=0.0, metavar="S",
                   help="restart: seconds between checkpoints; 0 (the default): Young's optimum sqrt(2 C M) for a "
                        "write of C = --checkpoint-seconds and M seconds between the job's failures")
    g.add_argument("--model-params", type=float, default=480e9,
                   help="parameters of the simulated model (the paper's 480B), for the heal's bytes")
    g.add_argument("--bytes-per-param", type=float, default=16.0,
                   help="training state per parameter a heal moves: bf16 weights and gradients, fp32 master "
                        "weights and two AdamW moments")
    g.add_argument("--heal-link-gbps", type=float, default=None,
                   help="scale-out bandwidth per GPU a heal crosses, GB/s (default %(default)s: the profile's scale_out_gbps; "
                        "gb200-nvl72: one 400 Gb/s NIC per GPU, 50)")
    g.add_argument("--step-seconds", type=float, default=10.0,
                   help="cluster step time; with --calibrate, measured costs in step times are scaled by it")
    g.add_argument("--calibrate", nargs="+", metavar="RUN.h5",
                   help="derive healthy step time, tokens/s per rank and recovery/heal costs from runs")
    g = s.add_argument_group("check against runs")
    g.add_argument("--from-run", nargs="+", metavar="RUN.h5",
                   help="only predict each paced ntpbench run's emulated ETTR and goodput from its machine's "
                        "profile, layout, policy and failure schedule (step times taken from the run; the model is "
                        "in analysis/simulate/from_run.py), print them beside the run's own, and exit: 1 if any "
                        "differs by more than --tolerance")
    g.add_argument("--tolerance", type=float, default=0.02, metavar="F",
                   help="--from-run: the largest relative difference of ETTR or goodput accepted")
    g = s.add_argument_group("experiments")
    g.add_argument("--what", nargs="+", choices=("fig6", "fig7", "trace", "pipelines", "stragglers"),
                   default=["fig6", "fig7", "trace"],
                   help="which outputs to produce (pipelines: ntp and ntp-pw by --pp-micro-batches and cut; "
                        "stragglers: slow episodes under each --straggler-policy)")
    g.add_argument("--pp-micro-batches", type=int, nargs="+", default=[8, 16, 32, 64, 128, 0], metavar="M",
                   help="pipelines: micro-batch counts to compare (0: the additive limit)")
    g.add_argument("--max-failed-fraction", type=float, default=4e-3, help="Fig. 6: top of the failed-fraction sweep")
    g.add_argument("--points", type=int, default=8, help="Fig. 6: points in the sweep")
    g.add_argument("--trials", type=int, default=100, help="Fig. 6: random placements per point")
    g.add_argument("--spares", type=int, nargs="+", default=[0, 4, 8, 12, 16, 24, 32, 48, 64, 72, 80, 88, 96, 104, 112, 128],
                   help="Fig. 7: spare domain counts")
    g.add_argument("--days", type=float, default=30.0, help="Fig. 7 / trace: simulated days per trial")
    g.add_argument("--sample-hours", type=float, default=1.0, help="Fig. 7 / trace: sampling interval (hours)")
    g.add_argument("--time-trials", type=int, default=4, help="Fig. 7 / trace: independent failure histories")
    g.add_argument("--seed", type=int, default=1, help="random seed")
    g = s.add_argument_group("output")
    g.add_argument("--csv", metavar="DIR", help="write fig6.csv, fig7.csv, trace.csv (pipelines.csv) into DIR")
    g.add_argument("--out", metavar="DIR", help="write fig6_throughput_loss.png, fig7_spares.png, trace.png into DIR")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m analysis",
        description="Reports, plots and the cluster-scale goodput simulator for ntpbench results "
                    "(HDF5 schema 1, see results/README.md).")
    sub = p.add_subparsers(dest="command", required=True, metavar="{report,plot,simulate,watch,soak,revivals,scale,stragglers,reshard}")
    _add_report(sub)
    _add_plot(sub)
    _add_watch(sub)
    _add_soak(sub)
    _add_revivals(sub)
    _add_scale(sub)
    _add_stragglers(sub)
    _add_reshard(sub)
    _add_paced(sub)
    _add_simulate(sub)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "report":
        if args.diff:
            from . import compare
            return compare.main(args)
        from . import report
        return report.main(args)
    if args.command == "scale":
        from . import scale
        return scale.main(args)
    if args.command == "revivals":
        from . import revivals
        return revivals.main(args)
    if args.command == "watch":
        from . import watch
        return watch.main(args)
    if args.command == "soak":
        from . import soak
        return soak.main(args)
    if args.command == "stragglers":
        from . import stragglers
        return stragglers.main(args)
    if args.command == "reshard":
        from . import reshard
        return reshard.main(args)
    if args.command == "paced":
        from . import paced
        return paced.main(args)
    if args.command == "plot":
        from . import plots
        return plots.main(args)
    return sim.main(args)


if __name__ == "__main__":
    sys.exit(main())
