"""`python3 -m analysis scale DIR`: ntpbench's own costs against its number of ranks.

DIR holds what jobs/local/scale.sh writes per rank count N: N.h5 (the run), N.json (launch to exit,
the host's memory in use, exit statuses). Per N, from the results file:
- start-up: launch to exit (N.json) minus the run's own wall time (/summary wall_seconds): MPI's
  start of N processes, ntpbench's set-up before step 1, and the teardown;
- memory per rank: the median over ranks of VmRSS after the last step (/ranks/rss_bytes); the
  median over the processes of each one's largest anonymous memory (RssAnon, sampled every 0.5 s
  by scale.sh: no mapped files, so what the rank itself allocated and MPI's private buffers); and
  the host's peak memory in use over its level before the launch, per rank (N.json);
- the recorder: its seconds per step (/summary recorder_seconds over steps) and the bytes one step
  adds to the results file (one row of every per-step dataset);
- the control plane of a healthy step (the last): the calls on the run's group and their payload
  bytes, per live rank (/steps control_calls, control_bytes: counted by comm_counting.hpp; the
  report gather, the commit vote, the step's checks);
- the repair after the death at step 2: revoke + agree + shrink (`repair`), the notice spread
  (`notice`), reconfigure and heal seconds; the revival at step 4: spawn, reconfigure, heal;
- the healthy step (median of steps 1 and 6).
Then, per figure, its fitted growth: of a + b f(N) for f in log2 N, N, N^2, the one of least
relative error (each point weighs alike; constant where a constant fits within 10%), with the exponent of a power law fitted in log-log beside it.
"""
from __future__ import annotations

import json
import math
import pathlib

import h5py
import numpy as np

from .runfile import load_or_say

GROWTHS = {"constant": lambda n: np.ones_like(n), "log n": np.log2, "n": lambda n: n, "n^2": lambda n: n * n}

# (key, header, format, a time: wall seconds on this host)
COLUMNS = [
    ("startup_s", "start-up s", "{:.1f}", True),
    ("rss_mb", "RSS/rank MB", "{:.1f}", False),
    ("anon_mb", "anon MB/rank", "{:.1f}", False),
    ("host_mb", "host MB/rank", "{:.1f}", False),
    ("recorder_ms", "recorder ms/step", "{:.2f}", True),
    ("file_kb", "rows KB/step", "{:.1f}", False),
    ("control_calls", "ctl calls/rank/step", "{:.1f}", False),
    ("control_bytes", "ctl B/rank/step", "{:.0f}", False),
    ("notice_s", "notice s", "{:.3f}", True),
    ("repair_s", "repair s", "{:.3f}", True),
    ("reconfigure_s", "reconfig s", "{:.3f}", True),
    ("heal_s", "heal s", "{:.3f}", True),
    ("spawn_s", "spawn s", "{:.2f}", True),
    ("revive_reconfigure_s", "revive reconfig s", "{:.3f}", True),
    ("step_s", "step s", "{:.3f}", True),
]


def bytes_per_step(f) -> float:
    """What one more step adds to the results file: the bytes of one row of every dataset with a row
    per step (/steps, /ranks/*, /replicas/*). The file's own size over a short run is mostly the
    chunks allocated ahead (64 steps each), not growth."""
    steps = f["steps"].shape[0]
    total = 0.0
    def visit(name, obj):
        nonlocal total
        if isinstance(obj, h5py.Dataset) and obj.shape and obj.shape[0] == steps and name.split("/")[0] in (
                "steps", "ranks", "replicas"):
            total += obj.dtype.itemsize * float(np.prod(obj.shape[1:]))
    f.visititems(visit)
    return total


def _event(ev, kind: str, step: int) -> float:
    rows = ev[(ev["kind"].astype(str) == kind) & (ev["step"] == step)]
    return float(rows["duration"].iloc[0]) if len(rows) else math.nan


def measure(directory: pathlib.Path, n: int) -> dict | None:
    """One rank count's figures, or None (said on stderr by load_or_say) when its run cannot be read."""
    side = json.loads((directory / f"{n}.json").read_text())
    run = load_or_say(directory / f"{n}.h5")
    if run is None:
        return None
    with h5py.File(directory / f"{n}.h5", "r") as f:
        rss = np.asarray(f["ranks/rss_bytes"][-1], dtype=float)
        row_bytes = bytes_per_step(f)
        last = f["steps"][-1]
    live = max(1, int(last["live_ranks"]))
    counted = "control_calls" in last.dtype.names and last["control_calls"] >= 0
    rss = rss[rss > 0]
    steps = max(1, int(run.summary.get("steps", 1)))
    ev = run.events
    step_s = run.step_seconds()
    healthy = [float(step_s[i]) for i in (0, len(step_s) - 1) if i < len(step_s)]
    return {
        "ranks": n,
        "cores": int(side.get("cores", 0)),
        "mpirun_exit": side["mpirun_exit"],
        "replay_exit": side["replay_exit"],
        "startup_s": side["launch_to_exit_seconds"] - float(run.summary.get("wall_seconds", math.nan)),
        "rss_mb": float(np.median(rss)) / 1e6 if len(rss) else math.nan,
        "anon_mb": side["anon_bytes_median"] / 1e6 if side.get("anon_bytes_median", 0) > 0 else math.nan,
        "host_mb": (side["host_used_bytes_peak"] - side["host_used_bytes_before"]) / n / 1e6,
        "recorder_ms": 1e3 * float(run.summary.get("recorder_seconds", math.nan)) / steps,
        "file_kb": row_bytes / 1e3,
        "control_calls": float(last["control_calls"]) / live if counted else math.nan,
        "control_bytes": float(last["control_bytes"]) / live if counted else math.nan,
        "notice_s": _event(ev, "notice", 2),
        "repair_s": _event(ev, "repair", 2),
        "reconfigure_s": _event(ev, "reconfigure", 2),
        "heal_s": _event(ev, "heal", 2),
        "spawn_s": _event(ev, "spawn", 4),
        "revive_reconfigure_s": _event(ev, "reconfigure", 4),
        "step_s": float(np.median(healthy)) if healthy else math.nan,
    }


def fit_growth(n: np.ndarray, y: np.ndarray) -> tuple[str, float, float]:
    """(the growth of least relative error, its relative RMS error, the log-log exponent).

    A figure that a constant fits within 10% (relative RMS) is constant. Else each growth f of log n,
    n, n^2 is fitted as a + b f(n) (a fixed cost and the growing part, b >= 0), each point weighed by
    1/y, and the growth whose fit errs least wins."""
    ok = np.isfinite(y) & (y > 0)
    n, y = n[ok].astype(float), y[ok]
    if len(n) < 3:
        return "-", math.nan, math.nan
    slope = float(np.polyfit(np.log(n), np.log(y), 1)[0])
    flat = float(np.sum(1 / y) / np.sum(1 / y**2))
    flat_err = float(np.sqrt(np.mean(((flat - y) / y) ** 2)))
    if flat_err <= 0.1:
        return "constant", flat_err, slope
    best, best_err = "-", math.inf
    for name, f in GROWTHS.items():
        if name == "constant":
            continue
        g = f(n)
        design = np.stack([np.ones_like(g), g], axis=1) / y[:, None]
        (a, b), *_ = np.linalg.lstsq(design, np.ones_like(y), rcond=None)
        if b < 0:  # shrinking: the fixed cost alone
            a, b = flat, 0.0
        err = float(np.sqrt(np.mean(((a + b * g - y) / y) ** 2)))
        if err < best_err - 1e-12:
            best, best_err = name, err
    return best, best_err, slope


def main(args) -> int:
    directory = pathlib.Path(args.dir)
    counts = sorted(int(p.stem) for p in directory.glob("*.json") if p.stem.isdigit())
    if not counts:
        print(f"scale: no N.json in {directory} (jobs/local/scale.sh {directory} writes them)")
        return 1
    rows = [r for r in (measure(directory, n) for n in counts) if r is not None]
    header = ["ranks"] + [h for _, h, _, _ in COLUMNS]
    lines = [header]
    for r in rows:
        lines.append([str(r["ranks"])] + [fmt.format(r[k]) if math.isfinite(r[k]) else "-" for k, _, fmt, _ in COLUMNS])
    n = np.array([r["ranks"] for r in rows], dtype=float)
    growth, exponent, share = ["growth"], ["n^k, k ="], ["per rank, k - 1"]
    # On a host with fewer cores than ranks, every rank's wall time is the cores' time shared by all
    # n ranks: a cost each rank pays once grows as n here. k - 1 is then the per-rank growth.
    oversubscribed = all(0 < r["cores"] < r["ranks"] for r in rows)
    for k, _, _, is_time in COLUMNS:
        name, err, slope = fit_growth(n, np.array([r[k] for r in rows], dtype=float))
        growth.append(f"{name} ({100 * err:.0f}%)" if name != "-" else "-")
        exponent.append(f"{slope:.2f}" if math.isfinite(slope) else "-")
        share.append(f"{slope - 1:.2f}" if is_time and oversubscribed and math.isfinite(slope) else "-")
    lines += [growth, exponent, share]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for line in lines[1:]:
        print("| " + " | ".join(line) + " |")
    failed = [r["ranks"] for r in rows if r["mpirun_exit"] != 0 or r["replay_exit"] != 0]
    for r in rows:
        if r["mpirun_exit"] != 0 or r["replay_exit"] != 0:
            print(f"{r['ranks']} ranks: mpirun exit {r['mpirun_exit']}, replay exit {r['replay_exit']}")
    print("growth: of a + b*log2(n), a + b*n, a + b*n^2, the fit of least relative RMS error (in brackets), "
          "constant where a constant fits within 10%; k: the exponent of a power law fitted in log-log")
    if oversubscribed:
        print(f"every count ran on {rows[0]['cores']} cores, more ranks than cores: a wall time is the cores' time "
              "shared by all ranks, so a cost each rank pays once shows as k = 1; k - 1 is the per-rank growth")
    return 1 if failed or len(rows) < len(counts) else 0
