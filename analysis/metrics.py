"""Recompute every /summary figure from a run's raw rows, as results/README.md defines them.

Definitions (all from /steps, /replicas/state and /events; `wall_seconds` alone is taken from
/summary because only the recorder saw the end of the run — for a file cut short, which has no
/summary, the end of the last step stands in for it, so goodput and ETTR of such a file are upper bounds).
Under paced timing every time is on the emulated machine's clock (/summary `clock`); this host's
run clock is kept beside it (host_* columns, `host_wall_seconds`), and only the paced verdict's
shares, which judge this host, use it:

    steps                      rows in /steps (the run's slots)
    training_steps             rows with tokens_committed > 0 (committed optimizer steps)
    tokens, tokens_committed   sums of the /steps columns
    step_seconds               sum(t_end - t_start)
    productive_seconds         sum(t_end - t_start) over committed steps (tokens_committed > 0)
    recovery_seconds, idle_seconds   sums of the /steps columns
    throughput_tokens_per_s    tokens / step_seconds
    goodput_tokens_per_s       tokens_committed / wall_seconds
    ettr                       productive_seconds / wall_seconds
    healthy_throughput_tokens_per_s  median of tokens/(t_end-t_start) over steps whose every
                               replica has state 0 (NaN when there is none)
    goodput_ratio              goodput / healthy throughput
    mfu                        sum(flops) / (step_seconds * ranks * peak_gflops_per_rank * 1e9)
    failures, revivals         number of `kill` / `revive` events
    recovery_{detect,reconfigure,heal,recompute}_seconds   sum of `duration` of events of that kind
                               (heal: `heal` and `restore` events)
    recovery_lost_seconds      sum of `lost` durations: real failures (--kill-mode signal), the
                               interrupted attempt's time until the first survivor noticed
    recovery_repair_seconds    sum of `repair` durations: revoke + agree + shrink after a real failure
    recovery_spawn_seconds     sum of `spawn` durations: new processes for revivals, started and merged
    recovery_spare_seconds     sum of `spare` and `takeover` durations: spares handed dead ranks
    spares_used                number of `spare` and `takeover` events (one per rank a spare took)
    heal_bytes                 sum of `bytes` of `heal` and `restore` events
    paced_overrun_steps        steps with paced_overrun == 1
    final_loss                 loss of the last row

A figure that is undefined (a division by zero, e.g. no step with every replica healthy) is NaN
here; compare() accepts NaN or 0 for it in /summary.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .runfile import HEALTHY, LATER_SUMMARY_KEYS, SUMMARY_KEYS, Run

# Figures that are counts: compared exactly.
COUNT_KEYS = ("steps", "training_steps", "tokens", "tokens_committed", "failures", "revivals", "paced_overrun_steps", "spares_used")


def _div(a: float, b: float) -> float:
    return a / b if b else math.nan


def recompute(run: Run) -> dict:
    s = run.steps
    dt = run.step_seconds()
    tokens = s["tokens"].to_numpy(dtype=np.int64)
    committed = s["tokens_committed"].to_numpy(dtype=np.int64)
    out: dict = {}
    out["steps"] = int(len(s))
    out["training_steps"] = int((committed > 0).sum())
    out["tokens"] = int(tokens.sum())
    out["tokens_committed"] = int(committed.sum())
    if run.summary is not None and "wall_seconds" in run.summary:
        out["wall_seconds"] = float(run.summary["wall_seconds"])
    else:
        out["wall_seconds"] = float(s["t_end"].max()) if len(s) else 0.0
    if run.summary is not None and "host_wall_seconds" in run.summary:
        out["host_wall_seconds"] = float(run.summary["host_wall_seconds"])
    else:
        out["host_wall_seconds"] = float(s["host_t_end"].max()) if len(s) else 0.0
    out["step_seconds"] = float(dt.sum())
    out["productive_seconds"] = float(dt[committed > 0].sum())
    out["recovery_seconds"] = float(s["recovery_seconds"].to_numpy(dtype=float).sum())
    out["idle_seconds"] = float(s["idle_seconds"].to_numpy(dtype=float).sum())
    out["throughput_tokens_per_s"] = _div(out["tokens"], out["step_seconds"])
    out["goodput_tokens_per_s"] = _div(out["tokens_committed"], out["wall_seconds"])
    out["ettr"] = _div(out["productive_seconds"], out["wall_seconds"])
    state = run.replicas["state"]
    healthy = (state == HEALTHY).all(axis=1) if state.size else np.zeros(len(s), bool)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_step = tokens / dt
    out["healthy_throughput_tokens_per_s"] = float(np.median(per_step[healthy])) if healthy.any() else math.nan
    out["goodput_ratio"] = _div(out["goodput_tokens_per_s"], out["healthy_throughput_tokens_per_s"])
    peak = float(run.attrs.get("peak_gflops_per_rank", math.nan))
    out["mfu"] = _div(float(s["flops"].to_numpy(dtype=float).sum()),
                      out["step_seconds"] * run.ranks * peak * 1e9)
    ev = run.events
    kinds = ev["kind"].astype(str).to_numpy() if len(ev) else np.array([], dtype=object)
    out["failures"] = int((kinds == "kill").sum())
    out["revivals"] = int((kinds == "revive").sum())
    # A restore (reading back a checkpoint) is how a run heals when no peer holds a shard.
    parts = {"detect": ("detect",), "reconfigure": ("reconfigure",), "heal": ("heal", "restore"),
             "recompute": ("recompute",), "lost": ("lost",), "repair": ("repair",), "spawn": ("spawn",),
             "spare": ("spare", "takeover")}
    for part, names in parts.items():
        mask = np.isin(kinds, names)
        out[f"recovery_{part}_seconds"] = float(ev["duration"].to_numpy(dtype=float)[mask].sum()) if len(ev) else 0.0
    heal_mask = np.isin(kinds, ("heal", "restore"))
    out["heal_bytes"] = float(ev["bytes"].to_numpy(dtype=float)[heal_mask].sum()) if len(ev) else 0.0
    out["spares_used"] = int(np.isin(kinds, ("spare", "takeover")).sum())
    out["paced_overrun_steps"] = int((s["paced_overrun"].to_numpy() == 1).sum())
    out["final_loss"] = float(s["loss"].iloc[-1]) if len(s) else math.nan
    # Paced timing's verdict: the share of the ranks' step time real compute (every step) and real
    # transfers (steps where no peer was expected late) ran past emulated time.
    if "paced_overrun_seconds" in s:
        host_dt = (s["host_t_end"] - s["host_t_start"]).to_numpy(dtype=float)  # lateness is this host's
        rank_s = host_dt * s["live_ranks"].to_numpy(dtype=float)
        even = s["paced_peers_uneven"].to_numpy() == 0
        out["paced_overrun_share"] = _div(float(s["paced_overrun_seconds"].sum()), float(rank_s.sum()))
        out["paced_link_overrun_share"] = _div(float(s["paced_link_overrun_seconds"].to_numpy()[even].sum()),
                                               float(rank_s[even].sum()))
    else:
        out["paced_overrun_share"] = out["paced_link_overrun_share"] = math.nan
    assert set(out) == set(SUMMARY_KEYS)
    return out


@dataclass
class Mismatch:
    name: str
    summary: float | None   # None: absent from /summary
    recomputed: float
    rel_error: float

    def __str__(self) -> str:
        if self.summary is None:
            return f"{self.name}: missing from /summary (recomputed {self.recomputed:.6g})"
        return (f"{self.name}: /summary {self.summary:.9g} vs recomputed {self.recomputed:.9g} "
                f"(relative error {self.rel_error:.2e})")


def compare(run: Run, recomputed: dict | None = None, rtol: float = 1e-6, atol: float = 1e-12) -> list[Mismatch]:
    """Mismatches between /summary and the recomputation ([] when they agree, or no /summary)."""
    if run.summary is None:
        return []
    rec = recompute(run) if recomputed is None else recomputed
    bad = []
    for key in SUMMARY_KEYS:
        r = float(rec[key])
        if key not in run.summary and key in LATER_SUMMARY_KEYS:
            continue  # a file from before the figure existed
        if key not in run.summary:
            bad.append(Mismatch(key, None, r, math.inf))
            continue
        v = float(run.summary[key])
        if math.isnan(r) and (math.isnan(v) or v == 0.0):
            continue  # undefined here (e.g. no all-healthy step, zero peak): the recorder may write 0 or NaN
        if math.isnan(v) or math.isnan(r):
            bad.append(Mismatch(key, v, r, math.inf))
            continue
        err = abs(v - r)
        rel = err / max(abs(r), abs(v)) if max(abs(r), abs(v)) > 0 else 0.0
        tol = 0.0 if key in COUNT_KEYS else rtol * max(abs(r), abs(v)) + atol
        if err > tol:
            bad.append(Mismatch(key, v, r, rel))
    # Consistency the definitions imply: the run lasts at least as long as its steps.
    if rec["wall_seconds"] < rec["step_seconds"] * (1 - rtol) - atol:
        bad.append(Mismatch("wall_seconds>=step_seconds", rec["wall_seconds"], rec["step_seconds"],
                            _div(rec["step_seconds"] - rec["wall_seconds"], rec["step_seconds"])))
    return bad
