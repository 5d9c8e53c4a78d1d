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

The MPI library's share (--library-cost COST.json, written by build/bench/ulfm_respawn_cost). Under
--kill-mode signal every replacement is a new process, and Open MPI 5.0.x keeps state on every
survivor for every process it has spawned (about 180 kB at 8 ranks) and one connection per peer it
reaches in another job; no MPI call gives either back. ulfm_respawn_cost measures both with nothing
of ntpbench in the process: the same kill, shrink, spawn and merge, every handle freed. Given that
file, a signal-mode run is judged on its growth *beyond* that share. For each sample of an
incarnation, R = the processes revived since the incarnation's first sample; the library's share
at that sample,

    RSS:  R x rss_bytes_per_replacement
    fds:  min(R, ranks - 1) x fds_per_peer

is taken off the sample, and the growth of what is left (the same first-and-last-10% rule) must stay
under GROWTH_LIMIT. Taking the share off each sample, not off the windows' means, matters when a
revival falls inside a window: a replacement that arrives in the middle of the last window raises
half of its samples, and only those carry its share. A leak of ntpbench's own (per step, or per
revival beyond the library's cost: the groups TrainingRun::adopt keeps, say) still counts in full. The raw growth is
always printed beside it; fence-mode runs, which spawn nothing, are judged on the raw growth.
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
    beyond: float = float("nan")  # worst growth beyond the MPI library's share (nan: no share given)
    beyond_rank: int = -1


@dataclass
class LibraryCost:
    """What the MPI keeps per replaced process (ulfm_respawn_cost --json)."""
    ranks: int
    rss_bytes_per_replacement: float
    fds_per_peer: float
    library: str

    @classmethod
    def load(cls, path: str) -> "LibraryCost":
        with open(path) as f:
            j = json.load(f)
        ranks = int(j["ranks"])
        return cls(ranks=ranks, rss_bytes_per_replacement=max(0.0, float(j["rss_bytes_per_replacement"])),
                   fds_per_peer=max(0, int(j["open_fds_max"]) - int(j["open_fds_first"])) / (ranks - 1),
                   library=str(j.get("library", "?")))


def incarnation_spans(column: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) rows of the maximal runs of valid (> 0) samples in one rank's column."""
    spans, start = [], None
    for i, ok in enumerate(column > 0):
        if ok and start is None:
            start = i
        elif not ok and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(column)))
    return spans


def incarnations(column: np.ndarray) -> list[np.ndarray]:
    """Maximal runs of valid (> 0) samples in one rank's column."""
    return [column[a:b] for a, b in incarnation_spans(column)]


def windows(n: int) -> int:
    """Samples in each of the first and last windows of an incarnation of n samples."""
    return max(2, n // 10)


def segment_growth(samples: np.ndarray) -> float:
    """mean of the last 10% over mean of the first 10%, minus 1 (at least 2 samples each)."""
    w = windows(len(samples))
    first, last = samples[:w].astype(float).mean(), samples[-w:].astype(float).mean()
    return last / first - 1.0


def worst_growth(table: np.ndarray, allowance=None) -> Growth:
    """The worst judged growth over every rank ([steps, ranks]) and incarnation. `allowance(a, rows)`,
    when given, is what the MPI library may have added from row a to each of `rows` (an array); the
    growth of the samples less it is tracked as well."""
    g = Growth()
    for rank in range(table.shape[1]):
        for start, stop in incarnation_spans(table[:, rank]):
            seg = table[start:stop, rank]
            g.total += 1
            if len(seg) < MIN_SAMPLES:
                continue
            g.judged += 1
            v = segment_growth(seg)
            if np.isnan(g.value) or v > g.value:
                g.value, g.rank = v, rank
            if allowance is not None:
                b = segment_growth(seg.astype(float) - allowance(start, np.arange(start, stop)))
                if np.isnan(g.beyond) or b > g.beyond:
                    g.beyond, g.beyond_rank = b, rank
    return g


def check_file(path: str, cost: LibraryCost | None = None) -> tuple[dict, list[str]]:
    """One table row and the reasons the file fails (empty: it passes). With `cost`, a signal-mode
    run is judged on its growth beyond the MPI library's share (module docstring)."""
    with h5py.File(path, "r") as f:
        missing = [d for d in ("ranks/rss_bytes", "ranks/open_fds") if d not in f]
        if missing:
            return {"file": path}, [f"no {', '.join('/' + m for m in missing)} (written by ntpbench since the soak)"]
        rss, fds = np.asarray(f["ranks/rss_bytes"][()]), np.asarray(f["ranks/open_fds"][()])
        policy = f.attrs.get("policy", b"?")
        config = f.attrs.get("config", b"{}")
        summary = dict(f["summary"].attrs) if "summary" in f else None
        events = f["events"][()] if "events" in f else None
    kinds = [k.decode().rstrip("\x00") for k in events["kind"]] if events is not None else []
    policy = policy.decode() if isinstance(policy, bytes) else str(policy)
    config = json.loads(config.decode() if isinstance(config, bytes) else str(config))
    planned = config.get("steps")
    n = min(len(rss), len(fds))
    rss, fds = rss[:n], fds[:n]
    problems = []
    rss_allow = fds_allow = None
    if cost is not None and config.get("kill_mode") == "signal":
        if cost.ranks != rss.shape[1]:
            problems.append(f"the library cost was measured at {cost.ranks} ranks, this run has {rss.shape[1]}: "
                            f"run ulfm_respawn_cost with -np {rss.shape[1]}")
        else:
            # Row i holds the samples taken after step i + 1; a revival at step s (at its start)
            # first shows in row s - 1.
            first_row = np.array([int(e["step"]) - 1 for e, k in zip(events, kinds) if k == "revive"])

            def replaced(a: int, rows: np.ndarray) -> np.ndarray:
                """Processes revived after row a, up to and including each of `rows`."""
                return ((first_row[None, :] > a) & (first_row[None, :] <= rows[:, None])).sum(axis=1)

            def rss_allow(a, rows):
                return replaced(a, rows) * cost.rss_bytes_per_replacement

            def fds_allow(a, rows):
                return np.minimum(replaced(a, rows), cost.ranks - 1) * cost.fds_per_peer
    row = {"file": path, "policy": policy, "steps": n,
           "failures": kinds.count("kill"), "revivals": kinds.count("revive"),
           "rss": worst_growth(rss, rss_allow), "fds": worst_growth(fds, fds_allow)}
    if summary is None:
        problems.append("no /summary: the run did not finish")
    elif planned is not None and n != int(planned):
        problems.append(f"{n} rows of samples for a run of {planned} steps: the run did not finish")
    for name, g in (("RSS", row["rss"]), ("open fds", row["fds"])):
        if g.judged == 0:
            problems.append(f"too few samples: no {name} incarnation of {MIN_SAMPLES}+ steps")
        elif np.isnan(g.beyond) and g.value >= GROWTH_LIMIT:
            problems.append(f"{name} grew {100 * g.value:.1f}% on logical rank {g.rank} (limit "
                            f"{100 * GROWTH_LIMIT:.0f}%)")
        elif g.beyond >= GROWTH_LIMIT:
            problems.append(f"{name} grew {100 * g.beyond:.1f}% beyond the MPI library's share on logical rank "
                            f"{g.beyond_rank} (limit {100 * GROWTH_LIMIT:.0f}%)")
    return row, problems


def _pct(g: Growth, beyond: bool = False) -> str:
    v, r = (g.beyond, g.beyond_rank) if beyond else (g.value, g.rank)
    return "-" if np.isnan(v) else f"{100 * v:+.2f}% (r{r})"


def format_table(rows: list[dict], shares: bool = False) -> str:
    """With `shares`, two more columns: the worst growth beyond the MPI library's share."""
    head = ["file", "policy", "steps", "failures", "revivals", "judged/incarn.", "RSS growth max",
            "fd growth max"] + (["RSS beyond MPI", "fd beyond MPI"] if shares else []) + ["verdict"]
    lines = [head]
    for r in rows:
        if "rss" not in r:
            lines.append([r["file"]] + ["-"] * (len(head) - 2) + [r["verdict"]])
            continue
        lines.append([r["file"], r["policy"], str(r["steps"]), str(r["failures"]), str(r["revivals"]),
                      f"{r['rss'].judged}/{r['rss'].total}", _pct(r["rss"]), _pct(r["fds"])]
                     + ([_pct(r["rss"], True), _pct(r["fds"], True)] if shares else []) + [r["verdict"]])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


def main(args) -> int:
    cost = None
    if getattr(args, "library_cost", None):
        try:
            cost = LibraryCost.load(args.library_cost)
        except (OSError, KeyError, ValueError, ZeroDivisionError) as e:
            print(f"soak: cannot read the library cost {args.library_cost}: {e}", file=sys.stderr)
            return 2
        print(f"MPI library's share ({cost.library}, {cost.ranks} ranks, from {args.library_cost}): "
              f"{cost.rss_bytes_per_replacement / 1e3:.0f} kB resident per replaced process, "
              f"{cost.fds_per_peer:.2f} descriptors per replaced peer")
    rows, failed = [], False
    for path in args.runs:
        try:
            row, problems = check_file(path, cost)
        except (OSError, KeyError) as e:
            row, problems = {"file": path}, [f"cannot read: {e}"]
        row["verdict"] = "FAIL" if problems else "ok"
        failed = failed or bool(problems)
        for p in problems:
            print(f"{path}: {p}", file=sys.stderr)
        rows.append(row)
    print(format_table(rows, shares=cost is not None))
    return 1 if failed else 0
