"""Calibration (`--calibrate`): step time, tokens per second and recovery and heal costs from measured runs."""
from __future__ import annotations

import math

import numpy as np


# ---------------------------------------------------------------------------------------------
# Calibration from measured runs
# ---------------------------------------------------------------------------------------------

def calibrate(paths) -> dict:
    from .. import metrics
    from ..runfile import load_run
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
            heals = ev[(ev["kind"].astype(str) == "heal") & (ev["bytes"] > 0) & (ev["host_duration"] > 0)]
            memcpy = float(run.attrs.get("memcpy_gbps", math.nan))
            for b, d in zip(heals["bytes"].to_numpy(dtype=float), heals["host_duration"].to_numpy(dtype=float)):
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
