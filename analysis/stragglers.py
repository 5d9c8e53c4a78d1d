"""`python3 -m analysis stragglers`: what one straggler cost under each --straggler-policy, against
what arithmetic expects (docs/stragglers.md, `make stragglers`).

Input: a healthy run (no `slow` event: the baseline) and runs of the same job whose rank is slowed
by factor f at step a and back to full speed at step b (jobs/schedules/one-straggler.yaml), with
--straggler-threshold and --straggler-window w. Two windows of steps:

  steady   a + w .. b - 1: the policy has acted (at the start of step a + w, after w slow steps
           named the straggler) and the rank is still slow;
  episode  a .. b + w: from the slowdown to the step at which the policy undoes its action, the
           slow steps before the verdict and both reconfigurations included.

Goodput over a window: tokens committed in its steps over the time from the end of the step before
it to the end of its last step (a reconfiguration between two rows counts), relative to the healthy
run's over the same steps.

Expected (steady window), from the healthy run's medians and the configuration, R replicas of TP t
taking B sequences each:
  tolerate   everyone waits for the slow rank: H / (H + (f - 1) C), H the healthy step time and C the
             slowest rank's compute (forward + backward + optimizer) in it;
  evict      the rank leaves as if failed: under ntp its replica trains at TP t - 1 with
             floor(B (t - 1) / t) sequences in the healthy step time, (R - 1 + floor(B (t-1)/t) / B) / R;
             under dp-drop the replica stops, (R - 1) / R;
  rebalance  its replica shares in proportion to speed, ideally t / (t - 1 + 1/f) of a healthy step
             per sequence, and keeps pace with floor(B (1 + 0.02) (t - 1 + 1/f) / t) sequences (the
             slack of src/parallel/rebalance.hpp), (R - 1 + that / B) / R.
The expectation leaves out the NTP sync's regrouping (a degraded or rebalanced replica's gradients
are resharded before the DP all-reduce) and the shares' rounding to whole units.
"""
from __future__ import annotations

import json
import math

import numpy as np

from .runfile import load_or_say

SLACK = 0.02  # kRebalanceSlack, src/parallel/rebalance.hpp
ACTIONS = ("evict", "rejoin", "evict_refused", "rebalance", "rebalance_end")


def _config(run) -> dict:
    c = run.attrs.get("config", "{}")
    return json.loads(c) if isinstance(c, str) else dict(c)


def episode(run) -> tuple[int, int, float, int] | None:
    """(first slow step a, step b back to full speed, factor f, slowed rank) of the run's slow events."""
    ev = run.events
    slow = ev[ev["kind"].astype(str) == "slow"]
    start = slow[~slow["detail"].astype(str).str.startswith("back")]
    end = slow[slow["detail"].astype(str).str.startswith("back")]
    if not len(start):
        return None
    a, rank = int(start.iloc[0]["step"]), int(start.iloc[0]["rank"])
    f = float(str(start.iloc[0]["detail"]).split("compute x")[1].split(",")[0])
    b = int(end.iloc[0]["step"]) if len(end) else int(run.steps["step"].max()) + 1
    return a, b, f, rank


def goodput(run, first: int, last: int) -> float:
    """Tokens committed in steps first..last per second, from the start of step first: the steady
    state, without the reconfiguration before it (its seconds are `reconfig s`, and under paced
    timing the machine's charge, 2 s on a DGX; NaN for an empty window or steps the run does not hold)."""
    s = run.steps.set_index("step")
    if last < first or first not in s.index or last not in s.index:
        return math.nan
    seconds = float(s.loc[last, "t_end"] - s.loc[first, "t_start"])
    return float(s.loc[first:last, "tokens_committed"].sum()) / seconds


def healthy_figures(healthy) -> tuple[float, float]:
    """Median step time H and the slowest rank's median compute C of the healthy run."""
    st = healthy.steps
    h = float(np.median(st["t_end"] - st["t_start"]))
    idx = [healthy.phases.index(p) for p in ("forward", "backward", "optimizer")]
    compute = healthy.phase_times[:, :, idx].sum(axis=2)  # [steps, ranks]
    return h, float(np.median(compute.max(axis=1)))


def expected(run, healthy, f: float) -> float:
    cfg = _config(run)
    policy, policy_on_failure = cfg.get("stragglers", {}).get("policy", "tolerate"), cfg.get("policy", "ntp")
    if policy == "evict" and (run.events["kind"].astype(str) == "evict_refused").any():
        policy = "tolerate"  # the eviction was not made (it would have stopped the job or lost shards)
    t, R = int(run.attrs["tp"]), int(run.attrs["replicas"])
    # A batch is cut in whole micro-batches when there are several, else in sequences.
    M = int(cfg.get("micro_batches", 1))
    B = M if M > 1 else int(cfg.get("micro_batch", 1))
    if policy == "tolerate":
        h, c = healthy_figures(healthy)
        return h / (h + (f - 1) * c)
    if policy == "evict":
        if policy_on_failure in ("ntp", "ntp-pw"):
            kept = B if policy_on_failure == "ntp-pw" else max(1, B * (t - 1) // t)
            return (R - 1 + kept / B) / R
        return (R - 1) / R  # dp-drop: the replica stops (restart would stop the job: refused, above)
    kept = min(B, math.floor(B * (1 + SLACK) * (t - 1 + 1 / f) / t + 1e-9))
    return (R - 1 + kept / B) / R


def label(run) -> str:
    cfg = _config(run)
    policy = cfg.get("stragglers", {}).get("policy", "tolerate")
    return f"{policy} ({cfg.get('policy')})" if policy == "evict" else policy


def compare(healthy, runs) -> list[dict]:
    rows = []
    for run in runs:
        ep = episode(run)
        if ep is None:
            rows.append({"run": run.name, "label": label(run), "problem": "no slow event"})
            continue
        a, b, f, rank = ep
        w = int(_config(run).get("stragglers", {}).get("window", 5))
        steady, whole = (a + w, b - 1), (a, min(b + w, int(run.steps["step"].max())))
        ev = run.events
        acted = ev[ev["kind"].astype(str).isin(ACTIONS)]
        rows.append({
            "run": run.name, "label": label(run), "rank": rank, "factor": f, "steady": steady, "whole": whole,
            "expected": expected(run, healthy, f),
            "measured": goodput(run, *steady) / goodput(healthy, *steady),
            "episode": goodput(run, *whole) / goodput(healthy, *whole),
            "actions": ", ".join(f"{k}@{s}" for k, s in zip(acted["kind"].astype(str), acted["step"])) or "-",
            "reconfig_seconds": float(acted["duration"].sum()),
        })
    return rows


def format_table(rows: list[dict]) -> str:
    head = ["run", "straggler policy", "steady steps", "expected", "measured", "diff", "episode",
            "reconfig s", "actions"]
    lines = [head]
    for r in rows:
        if "problem" in r:
            lines.append([r["run"], r["label"], r["problem"]] + ["-"] * (len(head) - 3))
            continue
        diff = 100 * (r["measured"] / r["expected"] - 1) if r["expected"] > 0 else math.nan
        lines.append([r["run"], r["label"], f"{r['steady'][0]}-{r['steady'][1]}", f"{r['expected']:.3f}",
                      f"{r['measured']:.3f}", f"{diff:+.1f}%", f"{r['episode']:.3f}", f"{r['reconfig_seconds']:.2f}",
                      r["actions"]])
    widths = [max(len(x[i]) for x in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(wd) for c, wd in zip(x, widths)).rstrip() for x in lines)


def plot(runs, out: str) -> str:
    """Per-rank compute time (forward + backward + optimizer) and compute share over the steps, one
    column per run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, len(runs), figsize=(4.2 * len(runs), 6), sharex=True, squeeze=False)
    for k, run in enumerate(runs):
        idx = [run.phases.index(p) for p in ("forward", "backward", "optimizer")]
        compute = run.phase_times[:, :, idx].sum(axis=2)
        steps = run.steps["step"].to_numpy()
        for r in range(compute.shape[1]):
            axes[0][k].plot(steps, compute[:, r], lw=1, label=f"rank {r}")
            if run.compute_share is not None:
                axes[1][k].plot(steps, run.compute_share[:, r], lw=1)
        axes[0][k].set_title(f"{label(run)}\n{run.name}", fontsize=9)
        axes[0][k].set_ylabel("compute per step (s)")
        axes[1][k].set_ylabel("share of its replica's compute")
        axes[1][k].set_xlabel("step")
    axes[0][0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(args) -> int:
    healthy = load_or_say(args.healthy)
    runs = [r for r in (load_or_say(p) for p in args.runs) if r is not None]
    if healthy is None or len(runs) != len(args.runs):
        return 2
    if episode(healthy) is not None:
        print(f"stragglers: {args.healthy} has a slow event: the baseline must be a healthy run")
        return 2
    rows = compare(healthy, runs)
    print(f"goodput relative to the healthy run {healthy.name} over the same steps (analysis/stragglers.py):")
    print(format_table(rows))
    if args.plot:
        print(f"wrote {plot(runs, args.plot)}")
    failed = any("problem" in r for r in rows)
    if args.tolerance is not None:
        for r in rows:
            if "problem" in r:
                continue
            if not (r["expected"] > 0 and abs(r["measured"] / r["expected"] - 1) <= args.tolerance):
                print(f"stragglers: {r['run']} ({r['label']}): measured {r['measured']:.3f} is more than "
                      f"{100 * args.tolerance:.0f}% from the expected {r['expected']:.3f}")
                failed = True
    return 1 if failed else 0
