"""Two runs side by side (`python3 -m analysis report A.h5 B.h5 --diff`), and whether runs compare.

`--diff` prints every figure metrics.recompute derives (the report's columns and the rest of
/summary's figures), for A and B, with the difference B - A and the ratio B / A ("-" where A is 0
or a value is undefined). Under it, a note lists every key of the resolved configuration (the root
attribute `config`, nested objects flattened to `model/hidden`, ...) and the rank count that differ
between the two runs, other than `policy` and `out` (the results file's own name): a comparison
between policies or versions is fair only when that list is empty. The binaries' `ntpbench_version`
and `git_revision` are printed when they differ.

`comparability_problems(runs)` says why runs cannot share one absolute axis: a different model
(`preset` and the `model/*` keys), timing mode (`wall` or `paced`) or rank count.
"""
from __future__ import annotations

import json
import math
import sys

import pandas as pd

from . import metrics
from .runfile import SUMMARY_KEYS, Run, load_or_say, paced_machine

# Keys that differ between any two runs of one comparison and say nothing about its fairness.
IGNORED_KEYS = ("policy", "out")
ABSENT = "(absent)"


def flat_config(run: Run) -> dict:
    """The run's `config` JSON, nested objects flattened to 'a/b' keys, with the rank count, which
    the launcher sets and the configuration does not hold, as 'ranks'."""
    out: dict = {}

    def walk(prefix: str, obj) -> None:
        for k, v in obj.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict):
                walk(key + "/", v)
            else:
                out[key] = v
    walk("", run.config)
    out["ranks"] = run.ranks
    return out


def config_differences(a: Run, b: Run, ignore=IGNORED_KEYS) -> list[tuple[str, object, object]]:
    """(key, A's value, B's value) for every configuration key whose values differ, sorted by key."""
    ca, cb = flat_config(a), flat_config(b)
    keys = sorted((set(ca) | set(cb)) - set(ignore))
    return [(k, ca.get(k, ABSENT), cb.get(k, ABSENT)) for k in keys if ca.get(k, ABSENT) != cb.get(k, ABSENT)]


def _models(runs: list[Run]) -> list[str]:
    """Each run's model: its preset, with the `model/*` dimensions in which the runs differ."""
    cfgs = [flat_config(r) for r in runs]
    keys = sorted({k for c in cfgs for k in c if k.startswith("model/")})
    differ = [k for k in keys if len({json.dumps(c.get(k)) for c in cfgs}) > 1]
    out = []
    for c in cfgs:
        dims = ", ".join(f"{k.split('/', 1)[1]} {c.get(k, ABSENT)}" for k in differ)
        out.append(f"{c.get('preset', '?')}" + (f" ({dims})" if dims else ""))
    return out


def _machine(run: Run) -> str:
    """The emulated machine of a paced run (its clock: the time scale does not matter), else '-'."""
    try:
        return str(paced_machine(run).get("machine", "-"))
    except (TypeError, ValueError):
        return "-"


def comparability_problems(runs: list[Run]) -> list[str]:
    """One line per property the runs do not share (model/preset, timing mode, rank count); [] when
    their absolute tokens/s can share an axis."""
    out = []
    for what, values in (("model", _models(runs)), ("timing", [str(r.attrs.get("timing", "?")) for r in runs]),
                         ("emulated machine", [_machine(r) for r in runs]), ("ranks", [str(r.ranks) for r in runs])):
        groups: dict = {}
        for v, r in zip(values, runs):
            groups.setdefault(v, []).append(r.name)
        if len(groups) > 1:
            out.append(f"{what} differs: " + "; ".join(f"{v} ({', '.join(names)})" for v, names in groups.items()))
    return out


def diff_rows(a: dict, b: dict) -> list[dict]:
    """metric, a, b, diff (b - a), ratio (b / a) for every recomputed figure; NaN where undefined."""
    rows = []
    for key in SUMMARY_KEYS:
        va, vb = float(a[key]), float(b[key])
        ok = math.isfinite(va) and math.isfinite(vb)
        diff = vb - va if ok else math.nan
        if ok and abs(diff) <= 1e-12 * max(abs(va), abs(vb)):
            diff = 0.0  # the same figure summed in another order: no difference worth printing
        rows.append({"metric": key, "a": va, "b": vb, "diff": diff,
                     "ratio": vb / va if ok and va != 0 else math.nan})
    return rows


def _num(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.6g}"


def format_diff(rows: list[dict], name_a: str, name_b: str) -> str:
    cells = [["metric", f"A {name_a}", f"B {name_b}", "B - A", "B / A"]]
    for r in rows:
        ratio = "-" if math.isnan(r["ratio"]) else f"{r['ratio']:.4f}"
        cells.append([r["metric"], _num(r["a"]), _num(r["b"]), _num(r["diff"]), ratio])
    widths = [max(len(c[i]) for c in cells) for i in range(5)]
    lines = []
    for n, c in enumerate(cells):
        lines.append("  ".join([c[0].ljust(widths[0])] + [x.rjust(w) for x, w in zip(c[1:], widths[1:])]).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_config_note(diffs: list[tuple[str, object, object]]) -> str:
    if not diffs:
        return "configurations: the same apart from the policy"
    parts = [f"  {k}: A {json.dumps(va) if va != ABSENT else va}, B {json.dumps(vb) if vb != ABSENT else vb}"
             for k, va, vb in diffs]
    return (f"note: the configurations differ in more than the policy ({len(diffs)} key(s)); "
            f"the figures may not compare:\n" + "\n".join(parts))


def _versions(a: Run, b: Run) -> str | None:
    va = (a.attrs.get("ntpbench_version", "?"), a.attrs.get("git_revision", "?"))
    vb = (b.attrs.get("ntpbench_version", "?"), b.attrs.get("git_revision", "?"))
    if va == vb:
        return None
    return f"versions: A {va[0]} ({va[1]}), B {vb[0]} ({vb[1]})"


def main(args) -> int:
    """`report --diff`: 0, 1 when a file cannot be read or its /summary disagrees, 2 unless two files."""
    if len(args.runs) != 2:
        print(f"error: --diff compares two runs, A and B; {len(args.runs)} given", file=sys.stderr)
        return 2
    runs, recs, failed = [], [], False
    for path in args.runs:
        run = load_or_say(path)
        if run is None:
            return 1
        rec = metrics.recompute(run)
        for p in metrics.compare(run, rec):
            print(f"{path}: /summary disagrees with the rows: {p}", file=sys.stderr)
            failed = True
        runs.append(run)
        recs.append(rec)
    a, b = runs
    print(f"A = {a.path} (policy {a.policy}{'' if a.complete else ', INCOMPLETE'}), "
          f"B = {b.path} (policy {b.policy}{'' if b.complete else ', INCOMPLETE'})")
    rows = diff_rows(*recs)
    print(format_diff(rows, a.name, b.name))
    print()
    print(format_config_note(config_differences(a, b)))
    versions = _versions(a, b)
    if versions:
        print(versions)
    df = pd.DataFrame(rows)
    if args.csv:
        df.to_csv(args.csv, index=False)
        print(f"wrote {args.csv}")
    if args.json:
        df.astype(object).where(df.notna(), None).to_json(args.json, orient="records", indent=2)
        print(f"wrote {args.json}")
    return 1 if failed else 0
