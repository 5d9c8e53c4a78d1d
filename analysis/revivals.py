"""`python3 -m analysis revivals`: what each revival of a run cost, by how its processes came.

A revival's processes come from `spawn` (new processes started and merged: one event), or from
spares (`spare` at a revival, `takeover` in the repair of a death: one event per rank, the
handover's seconds on the first). Its heal is the `heal` event of the reconfiguration that follows
the handover in the same step (the first `heal` after it). Per revival: the handover's seconds,
the heal's seconds and bytes, and the heal's bandwidth (bytes / seconds) against the recorder's
memory-copy bandwidth at the start of the same run (root attribute `memcpy_gbps`): the physical
limit of moving a shard on one host. Medians per kind across the files given.
"""
from __future__ import annotations

import math
import statistics

from .runfile import load_or_say

KINDS = ("spawn", "spare", "takeover")


def revivals(run) -> list[dict]:
    """One entry per handover: kind, step, ranks, handover seconds, heal seconds and bytes."""
    ev = run.events
    out = []
    if not len(ev):
        return out
    kinds = ev["kind"].astype(str).tolist()
    rows = ev.to_dict("records")
    i = 0
    while i < len(rows):
        kind = kinds[i]
        if kind not in KINDS:
            i += 1
            continue
        step, seconds, ranks = int(rows[i]["step"]), float(rows[i]["duration"]), []
        j = i
        while j < len(rows) and kinds[j] == kind and int(rows[j]["step"]) == step and (kind != "spawn" or j == i):
            ranks.append(int(rows[j]["rank"]))
            j += 1
        heal = next((r for k, r in zip(kinds[j:], rows[j:]) if k == "heal" and int(r["step"]) == step), None)
        out.append({"kind": kind, "step": step, "ranks": ranks, "handover_seconds": seconds,
                    "heal_seconds": float(heal["duration"]) if heal else math.nan,
                    "heal_bytes": float(heal["bytes"]) if heal else math.nan})
        i = j
    return out


def _gbps(r: dict) -> float:
    return r["heal_bytes"] / r["heal_seconds"] / 1e9 if r["heal_seconds"] > 0 else math.nan


def _median(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def main(args) -> int:
    every, copies = [], []
    for path in args.runs:
        run = load_or_say(path)
        if run is None:
            return 1
        memcpy = float(run.attrs.get("memcpy_gbps", math.nan))
        copies.append(memcpy)
        print(f"{path}: memcpy {memcpy:.2f} GB/s at the start of the run")
        print(f"  {'step':>5}  {'kind':<9} {'ranks':<12} {'handover ms':>11} {'heal ms':>8} {'heal MB':>8} "
              f"{'heal GB/s':>9} {'of memcpy':>9}")
        for r in revivals(run):
            every.append(r)
            g = _gbps(r)
            print(f"  {r['step']:>5}  {r['kind']:<9} {','.join(map(str, r['ranks'])):<12} "
                  f"{r['handover_seconds'] * 1e3:>11.2f} {r['heal_seconds'] * 1e3:>8.2f} {r['heal_bytes'] / 1e6:>8.2f} "
                  f"{g:>9.3f} {g / memcpy:>9.3f}")
    if not every:
        print("no revival in these runs")
        return 1
    print("medians:")
    memcpy = _median(copies)
    for kind in KINDS:
        mine = [r for r in every if r["kind"] == kind]
        if mine:
            g = _median([_gbps(r) for r in mine])
            print(f"  {kind:<9} {len(mine):>3} revival(s): handover {_median([r['handover_seconds'] for r in mine]) * 1e3:.2f} ms, "
                  f"heal {_median([r['heal_seconds'] for r in mine]) * 1e3:.2f} ms at {g:.3f} GB/s "
                  f"({g / memcpy:.3f} of memcpy's {memcpy:.2f} GB/s)")
    return 0
