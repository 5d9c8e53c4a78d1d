"""Pipelines (`--what pipelines`): Fig. 6, Fig. 7 and the trace again for every micro-batch count and cut,
and their table."""
from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd

from .availability import time_trace
from .fig6 import sweep_failed_fraction
from .fig7 import spares_needed, spares_sweep
from .model import MB_CUTS, Cluster, FailureModel, Params
from .tables import _table


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
