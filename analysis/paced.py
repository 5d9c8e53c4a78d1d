"""Paced timing's machine independence (make bench-paced, bench/README.md): the same paced
configuration run as it is, beside a process that keeps a core busy, and with free links (infinite
bandwidth, no latency) at the same time scale. With honest pacing the busy core changes nothing
(the step's times are the emulated machine's), and free links shorten the step by the emulated
link time on its critical path, which the run's own phase times bound: the TP and DP communication
phases (mean over ranks, median over steps) are at most what the links can take off.
"""
from __future__ import annotations


import numpy as np

from .runfile import load_or_say, paced_machine, paced_status

COMM_PHASES = ("tp_comm", "dp_comm", "pp_comm")


def figures(run) -> dict:
    s = run.steps
    # This host's seconds: what pacing makes of them is the question, and the phases are on this clock.
    dt = (s["host_t_end"] - s["host_t_start"]).to_numpy(dtype=float)
    machine = paced_machine(run)
    phases = run.phase_times  # [steps, ranks, phases]
    names = list(run.phases)
    comm = sum(phases[:, :, names.index(p)] for p in COMM_PHASES if p in names)
    summary = run.summary or {}
    return {"median_step_s": float(np.median(dt)), "time_scale": float(machine.get("time_scale", float("nan"))),
            "median_comm_s": float(np.median(np.mean(comm, axis=1))),
            "compute_overrun_share": float(summary.get("paced_overrun_share", float("nan"))),
            "link_overrun_share": float(summary.get("paced_link_overrun_share", float("nan"))),
            "status": paced_status(run), "steps": int(len(dt))}


def main(args) -> int:
    runs = {}
    for label, path in (("default", args.default), ("busy", args.busy), ("free", args.free)):
        run = load_or_say(path)
        if run is None:
            return 1
        runs[label] = figures(run)
    base = runs["default"]
    print(f"{'run':<8} {'steps':>5} {'scale':>7} {'median step s':>13} {'vs default':>10} {'comm s':>8} "
          f"{'compute over':>12} {'link over':>9}  status")
    for label, f in runs.items():
        print(f"{label:<8} {f['steps']:>5} {f['time_scale']:>7g} {f['median_step_s']:>13.4f} "
              f"{f['median_step_s'] / base['median_step_s']:>10.4f} {f['median_comm_s']:>8.4f} "
              f"{100 * f['compute_overrun_share']:>11.2f}% {100 * f['link_overrun_share']:>8.2f}%  {f['status']}")
    busy = runs["busy"]["median_step_s"] / base["median_step_s"] - 1
    saved = base["median_step_s"] - runs["free"]["median_step_s"]
    print(f"busy core: the median step moved {100 * busy:+.2f}% (limit +-{100 * args.busy_limit:g}%)")
    print(f"free links: the median step is {saved:.4f} s shorter; the default run's communication phases take "
          f"{base['median_comm_s']:.4f} s a step (mean over ranks), an upper bound of the link time on the "
          f"critical path")
    ok = abs(busy) <= args.busy_limit and 0 < saved <= base["median_comm_s"] * 1.02 + 1e-3
    print("verdict:", "ok" if ok else "NOT MACHINE-INDEPENDENT")
    return 0 if ok else 1
