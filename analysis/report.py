"""`python3 -m analysis report`: one table row per run, recomputed from the raw rows.

Every figure is recomputed by metrics.recompute and checked against the file's /summary; a
disagreement is printed on stderr and makes the command exit with status 1. A run without
/summary (cut short) is reported from its rows and marked "INCOMPLETE".
"""
from __future__ import annotations

import json
import math
import sys

import numpy as np
import pandas as pd

from . import metrics
from .damaged_step import damaged_steps, median_excess, tokens_per_replica_step
from .runfile import SchemaError, load_run, paced_status

# (column, header, format). Two tables, so that each fits a terminal: the run's figures, then
# the recovery's seconds part by part. Text columns are left-aligned, numbers right-aligned.
COLUMNS = [
    ("file", "file", "{}"),
    ("policy", "policy", "{}"),
    ("kill_mode", "kills", "{}"),
    ("layout", "TPxPPxDP", "{}"),
    ("clock", "clock", "{}"),
    ("steps", "slots", "{:d}"),
    ("training_steps", "trained", "{:d}"),
    ("failures", "fail", "{:d}"),
    ("throughput_tokens_per_s", "thru tok/s", "{:.1f}"),
    ("goodput_tokens_per_s", "good tok/s", "{:.1f}"),
    ("goodput_ratio", "good/healthy", "{:.3f}"),
    ("ettr", "ETTR", "{:.3f}"),
    ("mfu", "MFU", "{:.4f}"),
    ("recovery_seconds", "recov s", "{:.3f}"),
    ("heal_bytes", "heal bytes", "{:.3g}"),
    ("paced_overrun_steps", "overrun", "{:d}"),
    ("host_wall_seconds", "host s", "{:.1f}"),
    ("status", "status", "{}"),
]
# The default: what decides between runs, one terminal line each (--wide: both tables above).
COMPACT_COLUMNS = [c for c in COLUMNS if c[0] in (
    "file", "policy", "kill_mode", "layout", "clock", "steps", "training_steps", "failures", "goodput_tokens_per_s",
    "goodput_ratio", "recovery_seconds", "status")]
RECOVERY_COLUMNS = [
    ("file", "file", "{}"),
    ("recovery_seconds", "recov s", "{:.3f}"),
    ("recovery_repair_seconds", "repair s", "{:.3f}"),
    ("recovery_detect_seconds", "detect s", "{:.3f}"),
    ("recovery_reconfigure_seconds", "reconf s", "{:.3f}"),
    ("recovery_spawn_seconds", "spawn s", "{:.3f}"),
    ("recovery_spare_seconds", "spare s", "{:.3f}"),
    ("recovery_heal_seconds", "heal s", "{:.3f}"),
    ("recovery_unnamed_seconds", "other s", "{:.3f}"),
    ("recovery_lost_seconds", "lost s", "{:.3f}"),
    ("recovery_recompute_seconds", "recomp s", "{:.3f}"),
    ("hangs", "hangs", "{:d}"),
    ("hang_detect_seconds", "hang det s", "{:.3f}"),
]


# What recovery_seconds (recov s: the time steps spent recovering before they trained, on the
# recording rank's clock) is made of. Each part is the slowest rank's (/events), so `other s`, what
# no part names, is a few ms either way: below 0 when a slower rank's part outlasted the recording
# rank's (under paced timing recov s is the parts' sum on the emulated clock, with `notice`). `lost s` and `recomp s` are not part of it: they are work thrown away (an interrupted
# attempt; the steps a restart rolls back and redoes).
RECOVERY_PARTS = ["recovery_repair_seconds", "recovery_detect_seconds", "recovery_reconfigure_seconds",
                  "recovery_spawn_seconds", "recovery_spare_seconds", "recovery_heal_seconds"]

RECOVERY_FOOTNOTE = (
    "recov s = repair s + detect s + reconf s + spawn s + spare s + heal s + other s\n"
    "  each part is its slowest rank's and recov s the recording rank's; other s is what no part names (below 0\n"
    "  when a slower rank's part outlasted the recording rank's; on the emulated clock, the survivors' wait for\n"
    "  the last one's notice); lost s and recomp s, work thrown away (an interrupted attempt; steps a restart\n"
    "  redoes), are not in recov s")


UNITS = {"checkpoint_gbps": "GB/s per GPU"}


def format_charges(rows: list[dict]) -> list[str]:
    """For the paced runs: what each recovery part was charged on their machine, with its source (the
    `recovery` of the `paced_machine` attribute, from jobs/machines/*.yaml, or `given: --flag` where the
    run's command line gave a figure of its own), once per set of charges."""
    out, seen = [], set()
    for r in rows:
        rec = r.get("recovery_costs")
        key = json.dumps(rec, sort_keys=True)
        if not rec or r["clock"] == "host" or key in seen:
            continue
        seen.add(key)
        given = any(isinstance(f, dict) and str(f.get("source", "")).startswith("given:") for f in rec.values())
        out.append(f"{rec['machine']}'s recovery charges (jobs/machines/{rec['machine']}.yaml"
                   f"{', some given by ' + r['file'] if given else ''}); heals: their bytes over the scale-out link")
        for part, f in rec.items():
            if isinstance(f, dict):
                aside = " (not charged: the alternative to repair)" if part == "reinit" else ""
                out.append(f"  {part} {f['value']:g} {UNITS.get(part, 's')}{aside}: {f['source']}")
    return out


def failure_events(run) -> list[dict]:
    """One entry per failure: the `kill` events of one step. Ranks lost = GPUs lost (one rank per
    GPU); their hosts (the root attribute `hosts`, each rank's host at job start), the hosts that
    lost every rank they held (a node failure), and the replicas that lost every rank."""
    ev = run.events
    kills = ev[ev["kind"].astype(str) == "kill"] if len(ev) else ev
    try:
        hosts = json.loads(run.attrs.get("hosts", "[]"))
    except (TypeError, ValueError):
        hosts = []
    out = []
    for step, group in kills.groupby("step", sort=True):
        ranks = sorted(int(r) for r in group["rank"])
        on = {}
        for r in ranks:
            h = hosts[r] if r < len(hosts) else "?"
            on.setdefault(h, []).append(r)
        whole_nodes = [h for h, rs in on.items() if h != "?" and len(rs) == hosts.count(h)]
        size = max(run.tp, 1) * max(run.pp, 1)  # ranks per replica: its stages' TP groups
        whole_replicas = sorted({r // size for r in ranks
                                 if all(q in ranks for q in range(r // size * size, r // size * size + size))})
        out.append({"step": int(step), "ranks": ranks, "gpus_lost": len(ranks),
                    "hosts": {h: len(rs) for h, rs in on.items()}, "whole_nodes": whole_nodes,
                    "whole_replicas": whole_replicas})
    return out


def rank_ranges(ranks: list[int]) -> str:
    """[3, 4, 5, 6, 7, 9] -> '3-7,9'."""
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ",".join(parts)


def format_failures(path: str, events: list[dict]) -> str:
    lines = [f"failures in {path} (one rank = one GPU):",
             f"  {'step':>5}  {'GPUs lost':>9}  {'ranks':<12}  {'hosts (ranks lost)':<24}  {'whole nodes':<12}  replicas out"]
    for e in events:
        ranks = rank_ranges(e["ranks"])
        hosts = ", ".join(f"{h} ({n})" for h, n in e["hosts"].items())
        lines.append(f"  {e['step']:>5}  {e['gpus_lost']:>9}  {ranks:<12}  {hosts:<24}  "
                     f"{','.join(e['whole_nodes']) or '-':<12}  {','.join(map(str, e['whole_replicas'])) or '-'}")
    return "\n".join(lines)


def routing(run) -> dict | None:
    """A mixture of experts' routing over the run: assignments kept and dropped (/steps), each
    expert's share of the kept ones (/moe/tokens_per_expert, the rows that were gathered), and the
    busiest expert of any one layer's pass against an even share (moe_load_max). None for a dense
    model or a file without the per-expert rows."""
    per_expert = run.tokens_per_expert
    if per_expert is None or per_expert.shape[1] == 0:
        return None
    totals = per_expert[(per_expert >= 0).all(axis=1)].sum(axis=0)
    kept, dropped = int(run.steps["moe_kept"].sum()), int(run.steps["moe_dropped"].sum())
    share = totals / totals.sum() if totals.sum() > 0 else np.full(len(totals), math.nan)
    return {"experts": len(totals), "kept": kept, "dropped": dropped, "share": share.tolist(),
            "load_max": float(np.nanmax(run.steps["moe_load_max"])) if len(run.steps) else math.nan}


def format_routing(path: str, r: dict) -> str:
    share = np.asarray(r["share"])
    least, most = int(np.argmin(share)), int(np.argmax(share))
    offered = r["kept"] + r["dropped"]
    return (f"routing in {path} ({r['experts']} experts): {r['kept']} assignments kept, {r['dropped']} dropped "
            f"({100 * r['dropped'] / offered if offered else 0:.1f}%); each expert's share of the kept: least "
            f"{100 * share[least]:.1f}% (expert {least}), most {100 * share[most]:.1f}% (expert {most}), even "
            f"{100 / r['experts']:.1f}%; the busiest expert of one layer's pass: {r['load_max']:.2f}x an even share")


def run_row(path: str) -> tuple[dict, list[str]]:
    """The report row of one file and the problems found (empty when /summary agrees)."""
    run = load_run(path)
    rec = metrics.recompute(run)
    problems = [str(m) for m in metrics.compare(run, rec)]
    if not run.complete:
        status = "INCOMPLETE (no /summary; wall=last step end)"
    elif problems:
        status = f"SUMMARY MISMATCH ({len(problems)})"
    else:
        status = paced_status(run)  # ok, or overran: this machine, not the emulated one, set its times
    # Real kills (signal) or emulated ones (fence); "-" for a run with no schedule.
    kill_mode = run.attrs.get("kill_mode", run.config.get("kill_mode", "-")) if run.policy != "none" else "-"
    row = {"file": path, "policy": run.policy, "kill_mode": kill_mode, "layout": f"{run.tp}x{run.pp}x{run.dp}",
           "tp": run.tp, "pp": run.pp, "dp": run.dp, "ranks": run.ranks, "timing": run.attrs.get("timing", "?"),
           "complete": run.complete}
    row.update(rec)
    unnamed = rec["recovery_seconds"] - sum(rec[c] for c in RECOVERY_PARTS)
    row["recovery_unnamed_seconds"] = unnamed if abs(unnamed) > 1e-9 else 0.0  # not "-0.000" for rounding
    # Hung ranks (docs/hangs.md): how many, and the time from their last heartbeat until a peer
    # declared them hung, summed. That wait is inside `lost s`/`repair s` of their step.
    ev = run.events
    hangs = ev[ev["kind"].astype(str) == "hang"] if len(ev) else ev
    row["hangs"] = int(len(hangs))
    row["hang_detect_seconds"] = float(hangs["duration"].sum()) if len(hangs) else 0.0
    row["failure_events"] = failure_events(run)
    row["routing"] = routing(run)
    row["status"] = status
    try:  # paced timing: the machine whose clock the figures are on, and this host's factor
        machine = json.loads(run.attrs.get("paced_machine", "{}") or "{}")
    except (TypeError, ValueError):
        machine = {}
    row["time_scale"] = machine.get("time_scale")
    row["machine"] = machine.get("machine")
    row["recovery_costs"] = machine.get("recovery")
    steps = damaged_steps(run)
    row["damaged_step_excess"] = median_excess(steps)
    row["damaged_step_measured"] = float(np.median([d.measured for d in steps])) if steps else math.nan
    row["tokens_per_replica_step"] = tokens_per_replica_step(run)
    clock = (run.summary or {}).get("clock", "host")
    row["clock"] = (f"{row['machine']}/x{row['time_scale']:g}" if clock == "emulated" and row["time_scale"]
                    else "host")
    return row, problems


def _fmt(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def format_table(rows: list[dict], columns=None) -> str:
    columns = COLUMNS if columns is None else columns
    cells = [[h for _, h, _ in columns]]
    for r in rows:
        cells.append([_fmt(r.get(c), f) for c, _, f in columns])
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = []
    for n, row in enumerate(cells):
        parts = [(c.ljust(w) if columns[i][2] == "{}" else c.rjust(w)) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


# A damaged step's excess over its compute alone (analysis/damaged_step.py) at or above which a
# ranking of ntp against the other policies is said to depend on tokens per step.
EXCESS_NOTED = 0.02


def ranking_notes(rows: list[dict]) -> list[str]:
    """When runs of several policies are compared and an ntp or ntp-pw run's damaged steps cost more than
    their compute alone: which share, and that the ranking holds for these tokens per step only."""
    if len({r["policy"] for r in rows}) < 2:
        return []
    out = []
    for r in rows:
        e = r.get("damaged_step_excess", math.nan)
        if not (e >= EXCESS_NOTED):
            continue
        out.append(f"note: {r['file']} ({r['policy']}): a damaged step took {r['damaged_step_measured']:.3g}x a "
                   f"healthy one, {e:+.0%} over its compute alone (gradients regrouped between TP degrees, a "
                   f"parameter-sized cost over a token-sized one); at {r['tokens_per_replica_step']:g} tokens per "
                   f"replica step, this ranking of the policies may not hold at another batch (bench/README.md, "
                   f"Figure 8; `simulate --damaged-from` carries it to a cluster's)")
    return out


def main(args) -> int:
    rows, failed = [], False
    for path in args.runs:
        try:
            row, problems = run_row(path)
        except (SchemaError, OSError, KeyError) as e:
            print(f"error: {e}", file=sys.stderr)
            failed = True
            continue
        rows.append(row)
        for p in problems:
            print(f"{path}: /summary disagrees with the rows: {p}", file=sys.stderr)
        failed |= bool(problems)
    if rows:
        if getattr(args, "wide", False):
            print(format_table(rows))
            print(format_table(rows, RECOVERY_COLUMNS))
            print(RECOVERY_FOOTNOTE)
            for line in format_charges(rows):
                print(line)
        else:
            print(format_table(rows, COMPACT_COLUMNS))
            print("(--wide: throughput, ETTR, MFU, heal bytes, overrun steps, and recov s part by part; "
                  "--csv/--json: every figure)")
        for r in rows:
            if r["failure_events"]:
                print()
                print(format_failures(r["file"], r["failure_events"]))
        for r in rows:
            if r["routing"]:
                print()
                print(format_routing(r["file"], r["routing"]))
        if any(r["clock"] != "host" for r in rows):
            print("clock `MACHINE/xF`: every figure is the emulated MACHINE's, on its clock (its steps ran F times "
                  "slowed here; each recovery part is charged jobs/machines/MACHINE.yaml's seconds), whatever F; "
                  "`host`: this host's run clock (--wide: host s, this host's seconds)")
        old = sorted({r["time_scale"] for r in rows if r.get("time_scale") and r["clock"] == "host"})
        if len(old) > 1:
            print(f"note: these paced runs from before the emulated clock ran at different time scales "
                  f"({', '.join(f'{s:g}' for s in old)}): their seconds, tokens/s and MFU do not compare")
        for line in ranking_notes(rows):
            print(line)
        incomplete = [r["file"] for r in rows if not r["complete"]]
        for f in incomplete:
            print(f"note: {f} has no /summary (run cut short): figures come from its completed steps; "
                  f"wall time is taken as the end of the last step, so goodput and ETTR are upper bounds")
        df = pd.DataFrame(rows)
        if args.csv:
            df.to_csv(args.csv, index=False)
            print(f"wrote {args.csv}")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump([{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
                           for r in rows], fh, indent=2)
            print(f"wrote {args.json}")
    return 1 if failed else 0
