"""`python3 -m analysis watch RUN.h5`: a live view of a run while ntpbench writes its file.

Once a second (--interval) it reads the file and shows the steps done out of the run's total, an
ETA, the current TP degree of each replica, the last loss and the goodput so far; it ends when the
run writes /summary (exit 0) or after --timeout seconds (exit 1). On a terminal the line is
redrawn in place; otherwise (a pipe, a log file) a plain line is printed whenever it changes.

The file can be read mid-run because ntpbench's writer takes no HDF5 file lock (results/README.md,
"Reading a run while it runs"); a read that lands in the middle of a write is skipped and the next
tick tries again.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass

import h5py
import numpy as np


@dataclass
class Progress:
    step: int             # the schedule slot of the last row (0 before the first)
    total: int | None     # --steps of the run (None until the config attribute is there)
    rows: int             # rows in /steps (redone steps repeat a slot)
    eta_s: float | None
    tp: list
    loss: float
    goodput: float        # committed tokens / run time so far (tokens/s)
    run_seconds: float    # run time of the last row's end
    done: bool            # /summary is complete
    summary: dict

    def line(self, name: str) -> str:
        total = "?" if self.total is None else str(self.total)
        pct = f" ({100.0 * self.step / self.total:3.0f}%)" if self.total else ""
        if self.done:
            s = self.summary
            return (f"{name}: done | {int(s.get('steps', self.rows))} steps in {s.get('wall_seconds', 0.0):.1f} s | "
                    f"TP {self.tp} | final loss {_num(s.get('final_loss', self.loss))} | "
                    f"goodput {s.get('goodput_tokens_per_s', self.goodput):.1f} tok/s | "
                    f"ETTR {s.get('ettr', math.nan):.3f}")
        if self.rows == 0:
            return f"{name}: started, no step done yet (of {total})"
        eta = "-" if self.eta_s is None else _duration(self.eta_s)
        return (f"{name}: step {self.step}/{total}{pct} | ETA {eta} | TP {self.tp} | loss {_num(self.loss)} | "
                f"goodput {self.goodput:.1f} tok/s | run {self.run_seconds:.1f} s")


def _num(x) -> str:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "-"
    return "-" if math.isnan(x) else f"{x:.4f}"


def _duration(s: float) -> str:
    s = max(0, int(round(s)))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def read_progress(path: str) -> Progress:
    """One look at the file; raises OSError/KeyError/ValueError when it cannot be read right now."""
    with h5py.File(path, "r") as f:
        total = None
        if "config" in f.attrs:
            cfg = f.attrs["config"]
            total = int(json.loads(cfg.decode() if isinstance(cfg, bytes) else cfg).get("steps", 0)) or None
        rows = f["steps"][()]
        tp_rows = f["replicas/tp_degree"][()]
        done, summary = False, {}
        if "summary" in f:
            summary = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in f["summary"].attrs.items()}
            # The attributes are written one by one at the end: done once the last figures are there.
            done = "goodput_tokens_per_s" in summary and "steps" in summary
    n = min(len(rows), len(tp_rows))
    rows, tp_rows = rows[:n], tp_rows[:n]
    if n == 0:
        return Progress(0, total, 0, None, [], math.nan, 0.0, 0.0, done, summary)
    step = int(rows["step"][-1])
    run_s = float(rows["t_end"][-1])
    goodput = float(rows["tokens_committed"].sum()) / run_s if run_s > 0 else 0.0
    eta = None
    if total:
        # Time per slot over the last (up to) 10 rows, recovery and idle time included, on this
        # host's clock (the wait is here; paced rows are the emulated machine's, schema 2).
        host = rows["host_t_end"] if "host_t_end" in (rows.dtype.names or ()) else rows["t_end"]
        k = min(n, 10)
        first = float(host[n - k - 1]) if n > k else 0.0
        slots = step - (int(rows["step"][n - k - 1]) if n > k else 0)
        if slots > 0:
            eta = (float(host[-1]) - first) / slots * max(0, total - step)
    return Progress(step, total, n, eta, [int(t) for t in tp_rows[-1]], float(rows["loss"][-1]), goodput, run_s,
                    done, summary)


def watch(path: str, interval: float = 1.0, timeout: float | None = None, out=None) -> int:
    out = out or sys.stdout
    tty = out.isatty()
    name = os.path.basename(path)
    start = time.monotonic()
    last_line, said_waiting = None, False

    def show(line: str, final: bool = False) -> None:
        nonlocal last_line
        if tty:
            out.write("\r" + line + "\x1b[K" + ("\n" if final else ""))
        elif line != last_line:
            out.write(line + "\n")
        out.flush()
        last_line = line

    while True:
        try:
            p = read_progress(path)
        except (OSError, KeyError, ValueError, RuntimeError) as e:
            p = None
            if not os.path.exists(path) and not said_waiting:
                show(f"{name}: waiting for the file to appear")
                said_waiting = True
            elif os.path.exists(path) and last_line is None:
                show(f"{name}: not readable yet ({type(e).__name__})")
        if p is not None:
            if p.done:
                show(p.line(name), final=True)
                return 0
            show(p.line(name))
        if timeout is not None and time.monotonic() - start >= timeout:
            if tty:
                out.write("\n")
            out.write(f"{name}: watch: no /summary after {timeout:g} s (the run is still going, or ended "
                      f"without one); stopping\n")
            out.flush()
            return 1
        time.sleep(interval)


def main(args) -> int:
    try:
        return watch(args.run, interval=args.interval, timeout=args.timeout)
    except KeyboardInterrupt:
        print()
        return 130
