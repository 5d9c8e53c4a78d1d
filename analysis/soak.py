"""`python3 -m analysis soak`: do memory and file descriptors stay flat over a long run?

Every rank samples its process after every step (/ranks/rss_bytes: VmRSS in bytes, /ranks/open_fds:
entries of /proc/self/fd; -1, or 0 where a crash left a row unwritten, means no sample). The rule:

- A logical rank's column is cut into *incarnations*: maximal runs of consecutive samples. A killed
  rank has no sample in the row of the step it died in (the row is written after the repair,
  without it), and a revival comes at least one step later, so a new process always starts a new
  run. (A row written by a new recorder after its predecessor died lacks every report, which cuts
  one process into two runs: stricter, never looser.)
- An incarnation of n >= MIN_SAMPLES samples is judged: growth = mean(last w) / mean(first w) - 1
  with w = max(2, n // 10), the first and last 10% of that process's life in the run. Shorter ones
  are counted but not judged (a process that lived 19 steps says little about a leak).
- A file passes when it has a /summary and a row for every step of its config (the run finished), at least one judged incarnation, and no
  judged incarnation grew by GROWTH_LIMIT (5%) or more, for RSS and for descriptors alike.

The table: file, policy, steps, failures and revivals (kill and revive rows of /events), incarnations judged / all, the worst RSS and
descriptor growth (with the logical rank), verdict. Exit status 1 when any file fails.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import h5py
import numpy as np

GROWTH_LIMIT = 0.05
MIN_SAMPLES = 20


@dataclass
class Growth:
    value: float = float("nan")  # worst growth over the judged incarnations (nan: none judged)
    rank: int = -1               # the logical rank it belongs to
    judged: int = 0              # incarnations long enough to judge
    total: int = 0               # incarnations seen


def incarnations(column: np.ndarray) -> list[np.ndarray]:
    """Maximal runs of valid (> 0) samples in one rank's column."""
    valid = column > 0
    runs, start = [], None
    for i, ok in enumerate(valid):
        if ok and start is None:
            start = i
        elif not ok and start is not None:
            runs.append(column[start:i])
            start = None
    if start is not None:
        runs.append(column[start:])
    return runs


def segment_growth(samples: np.ndarray) -> float:
    """mean of the last 10% over mean of the first 10%, minus 1 (at least 2 samples each)."""
    w = max(2, len(samples) // 10)
    first, last = samples[:w].astype(float).mean(), samples[-w:].astype(float).mean()
    return last / first - 1.0


def worst_growth(table: np.ndarray) -> Growth:
    """The worst judged growth over every rank ([steps, ranks]) and incarnation."""
    g = Growth()
    for rank in range(table.shape[1]):
        for seg in incarnations(table[:, rank]):
            g.total += 1
            if len(seg) < MIN_SAMPLES:
                continue
            g.judged += 1
            v = segment_growth(seg)
            if np.isnan(g.value) or v > g.value:
                g.value, g.rank = v, rank
    return g


def check_file(path: str) -> tuple[dict, list[str]]:
    """One table row and the reasons the file fails (empty: it passes)."""
    with h5py.File(path, "r") as f:
        missing = [d for d in ("ranks/rss_bytes", "ranks/open_fds") if d not in f]
        if missing:
            return {"file": path}, [f"no {', '.join('/' + m for m in missing)} (written by ntpbench since the soak)"]
        rss, fds = np.asarray(f["ranks/rss_bytes"][()]), np.asarray(f["ranks/open_fds"][()])
        policy = f.attrs.get("policy", b"?")
        config = f.attrs.get("config", b"{}")
        summary = dict(f["summary"].attrs) if "summary" in f else None
        kinds = [k.decode().rstrip("\x00") for k in f["events"]["kind"][()]] if "events" in f else []
    policy = policy.decode() if isinstance(policy, bytes) else str(policy)
    planned = json.loads(config.decode() if isinstance(config, bytes) else str(config)).get("steps")
    n = min(len(rss), len(fds))
    rss, fds = rss[:n], fds[:n]
    row = {"file": path, "policy": policy, "steps": n,
           "failures": kinds.count("kill"), "revivals": kinds.count("revive"),
           "rss": worst_growth(rss), "fds": worst_growth(fds)}
    problems = []
    if summary is None:
        problems.append("no /summary: the run did not finish")
    elif planned is not None and n != int(planned):
        problems.append(f"{n} rows of samples for a run of {planned} steps: the run did not finish")
    for name, g in (("RSS", row["rss"]), ("open fds", row["fds"])):
        if g.judged == 0:
            problems.append(f"too few samples: no {name} incarnation of {MIN_SAMPLES}+ steps")
        elif g.value >= GROWTH_LIMIT:
            problems.append(f"{name} grew {100 * g.value:.1f}% on logical rank {g.rank} (limit "
                            f"{100 * GROWTH_LIMIT:.0f}%)")
    return row, problems


def _pct(g: Growth) -> str:
    return "-" if np.isnan(g.value) else f"{100 * g.value:+.2f}% (r{g.rank})"


def format_table(rows: list[dict]) -> str:
    head = ["file", "policy", "steps", "failures", "revivals", "judged/incarn.", "RSS growth max",
            "fd growth max", "verdict"]
    lines = [head]
    for r in rows:
        if "rss" not in r:
            lines.append([r["file"]] + ["-"] * 7 + [r["verdict"]])
            continue
        lines.append([r["file"], r["policy"], str(r["steps"]), str(r["failures"]), str(r["revivals"]),
                      f"{r['rss'].judged}/{r['rss'].total}", _pct(r["rss"]), _pct(r["fds"]), r["verdict"]])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


def main(args) -> int:
    rows, failed = [], False
    for path in args.runs:
        try:
            row, problems = check_file(path)
        except (OSError, KeyError) as e:
            row, problems = {"file": path}, [f"cannot read: {e}"]
        row["verdict"] = "FAIL" if problems else "ok"
        failed = failed or bool(problems)
        for p in problems:
            print(f"{path}: {p}", file=sys.stderr)
        rows.append(row)
    print(format_table(rows))
    return 1 if failed else 0
