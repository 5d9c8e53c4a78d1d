"""Check against runs (`--check-pp`): the pipeline model's prediction for paced ntpbench runs' layouts beside
their measured damaged/healthy throughput."""
from __future__ import annotations

import math
import sys
from dataclasses import replace

import numpy as np
import pandas as pd

from .model import Params, job_throughput, kept_micro_batches
from .tables import _table


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
    from ..runfile import load_run
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
    from ..runfile import SchemaError
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
