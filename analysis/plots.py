"""`python3 -m analysis plot`: PNG figures of one or more runs (matplotlib, Agg backend).

Per run (file stem S):
  S_throughput.png  tokens/(t_end - t_start) of every executed step against run time, with
                    vertical marks at kill (red) and revive (green) events from /events
                    (labels inside the frame); the time from a rank's kill to its revival
                    (or a spare's takeover) is shaded
  S_tp_degree.png   live TP degree of each replica per executed step (/replicas/tp_degree)
  S_phases.png      per-phase time per step, mean over ranks, stacked (/ranks/phase_times)
Across the runs given (bars and lines labelled by file stem and policy):
  loss.png               loss against optimizer step and against committed tokens, one line per run
  goodput_by_policy.png  goodput and throughput (tokens/s) of each run
  phase_totals.png       total time per phase of each run (sum over steps, mean over ranks)
Runs that differ in model, timing mode or rank count do not share an absolute axis: the cross-run
figures then carry a warning under their title, and `plot` prints it on stderr.

Loss against progress. A restart rolls back the steps after its last checkpoint and redoes them, so
its rows in time order go back in optimizer step: drawn in that order, the line would run back and
forth and count undone work as progress. loss.png therefore draws each run's line through its
committed rows (tokens_committed > 0) in order of `optimizer_step`, against that step and against
the committed tokens up to it: the progress that stayed. Rows that were not committed (rolled back,
or an update skipped) are drawn apart, as unconnected crosses at the optimizer step they had reached
and the committed tokens before it plus their own, so the wasted work stays visible without being
drawn as progress. Files written before `optimizer_step` existed number their committed rows in row
order (a rollback only undoes uncommitted rows, so this is their optimizer order) and leave the
others out.
"""
from __future__ import annotations

import os
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from . import metrics  # noqa: E402
from .compare import comparability_problems  # noqa: E402
from .report import rank_ranges  # noqa: E402
from .runfile import Run, SchemaError, load_run, paced_machine, paced_status  # noqa: E402

PHASE_COLORS = {"forward": "#4C72B0", "backward": "#55A868", "tp_comm": "#C44E52", "dp_comm": "#8172B2",
                "pp_comm": "#937860", "reshard": "#CCB974", "optimizer": "#64B5CD", "recovery": "#E17C05", "revival": "#B07AA1", "idle": "#BBBBBB",
                "other": "#777777"}


def _stem(path: str, used: set) -> str:
    stem = os.path.splitext(os.path.basename(path))[0]
    base, n = stem, 2
    while stem in used:
        stem, n = f"{base}-{n}", n + 1
    used.add(stem)
    return stem


def _title(run: Run) -> str:
    status = paced_status(run)
    over = " [OVERRAN: real time past emulated time]" if status == "overran" else ""
    return f"{run.name}: policy {run.policy}, TP {run.tp} x DP {run.dp}, {clock_label(run)}{over}"


def clock_label(run: Run) -> str:
    """Whose seconds the figure shows: the emulated machine's (paced timing, schema 2), or this host's."""
    if (run.summary or {}).get("clock") != "emulated":
        return f"{run.attrs.get('timing', '?')} timing"
    try:
        m = paced_machine(run)
    except (TypeError, ValueError):
        m = {}
    return f"emulated {m.get('machine', '?')} (its clock; run {m.get('time_scale', 0):g}x slowed here)"


# Events that bring a killed rank back: a revival, or a spare taking its place.
BACK_KINDS = ("revive", "spare", "takeover")
MARKS = (("kill", "tab:red", "--"), ("revive", "tab:green", ":"), ("takeover", "tab:purple", "-."),
         ("spare", "tab:purple", "-."))


def outage_spans(run: Run) -> list[dict]:
    """One span per kill: {rank, start, end}, from the kill's time to the first later event that
    brings that rank back (revive, spare or takeover); end is None when the rank never came back."""
    ev = run.events
    if not len(ev):
        return []
    ev = ev.assign(kind=ev["kind"].astype(str)).sort_values("time", kind="stable")
    spans, open_ = [], {}
    for kind, t, rank in zip(ev["kind"], ev["time"].astype(float), ev["rank"].astype(int)):
        if kind == "kill":
            open_.setdefault(rank, []).append({"rank": rank, "start": t, "end": None})
            spans.append(open_[rank][-1])
        elif kind in BACK_KINDS and open_.get(rank):
            for span in open_.pop(rank):
                span["end"] = t
    return spans


def _event_marks(ax, run: Run) -> None:
    ev = run.events
    if not len(ev):
        return
    kinds = ev["kind"].astype(str)
    run_end = float(run.steps["t_end"].max()) if len(run.steps) else 0.0
    for i, span in enumerate(outage_spans(run)):
        ax.axvspan(span["start"], run_end if span["end"] is None else span["end"], color="tab:red", alpha=0.07,
                   linewidth=0, label="rank down (kill to revival)" if i == 0 else None)
    for kind, color, style in MARKS:
        sel = ev[kinds == kind]
        # One mark per instant: a node's kill or a pool's takeover names several ranks at once.
        for i, (t, group) in enumerate(sel.groupby(sel["time"].astype(float), sort=True)):
            ax.axvline(t, color=color, linestyle=style, linewidth=1.2, label=kind if i == 0 else None)
            ranks = sorted({int(r) for r in group["rank"] if int(r) >= 0})
            # Inside the frame, a few points below its top edge, so the label never meets the axis.
            ax.annotate(f"{kind} r{rank_ranges(ranks)}" if ranks else kind, (t, 1.0),
                        xycoords=("data", "axes fraction"), xytext=(-2, -4), textcoords="offset points",
                        rotation=90, va="top", ha="right", fontsize=7, color=color,
                        bbox=dict(boxstyle="square,pad=0.1", facecolor="white", edgecolor="none", alpha=0.7))


def plot_throughput(run: Run, path: str) -> None:
    s = run.steps
    dt = run.step_seconds()
    with np.errstate(divide="ignore", invalid="ignore"):
        tput = s["tokens"].to_numpy(dtype=float) / dt
    committed = s["tokens_committed"].to_numpy() > 0
    idle = s["samples"].to_numpy() == 0  # a slot in which no replica trained: nothing to roll back
    undone = ~committed & ~idle
    fig, ax = plt.subplots(figsize=(9, 4.5))
    t = s["t_end"].to_numpy(dtype=float)
    ax.plot(t, tput, "-", color="tab:blue", linewidth=1, alpha=0.6)
    ax.plot(t[committed], tput[committed], "o", color="tab:blue", markersize=3, label="step (committed)")
    if undone.any():
        ax.plot(t[undone], tput[undone], "x", color="tab:orange", markersize=6, label="step (rolled back)")
    if idle.any():
        ax.plot(t[idle], tput[idle], "s", color="tab:gray", markersize=3, label="idle slot (no replica trained)")
    rec = metrics.recompute(run)
    if np.isfinite(rec["healthy_throughput_tokens_per_s"]):
        ax.axhline(rec["healthy_throughput_tokens_per_s"], color="gray", linewidth=0.8,
                   label="healthy median")
    _event_marks(ax, run)
    ax.set_xlabel("run time at step end (s)")
    ax.set_ylabel("throughput (tokens/s)")
    finite = tput[np.isfinite(tput)]
    # Headroom above the highest step for the event labels, which hang from the top of the frame.
    ax.set_ylim(0, 1.4 * finite.max() if finite.size and finite.max() > 0 else 1.0)
    ax.set_title(_title(run), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(fig, path)


def plot_tp_degree(run: Run, path: str) -> None:
    tp = run.replicas["tp_degree"]
    x = np.arange(1, tp.shape[0] + 1)
    fig, ax = plt.subplots(figsize=(9, 4))
    nrep = tp.shape[1] if tp.ndim == 2 else 0
    for r in range(nrep):
        # Offset the lines a little so replicas with the same degree stay visible.
        off = (r - (nrep - 1) / 2) * 0.06
        ax.step(x, tp[:, r] + off, where="mid", label=f"replica {r}", linewidth=1.5)
    ax.set_xlabel("executed step (row of /steps)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("live TP degree (ranks; 0 = down)")
    ax.set_ylim(-0.3, max(run.tp, int(tp.max()) if tp.size else 1) + 0.5)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_title(_title(run), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=min(nrep, 4) or 1, loc="lower left")
    _save(fig, path)


def plot_phases(run: Run, path: str) -> None:
    pt = run.phase_times  # [steps, ranks, phases]
    mean = pt.mean(axis=1) if pt.size else np.zeros((0, len(run.phases)))
    x = np.arange(1, mean.shape[0] + 1)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    bottom = np.zeros(mean.shape[0])
    for j, name in enumerate(run.phases):
        if not mean[:, j].any():
            continue
        ax.bar(x, mean[:, j] * 1e3, bottom=bottom * 1e3, width=0.85, label=name,
               color=PHASE_COLORS.get(name))
        bottom += mean[:, j]
    ax.set_xlabel("executed step (row of /steps)")
    ax.set_ylabel("time per step, mean over ranks (ms)")
    ax.set_title(_title(run), fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="phase")
    _save(fig, path)


def _save(fig, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _titles(fig, ax, title: str, warnings: list[str], width: int = 110, loc: str = "center") -> None:
    """The figure's title, and under it, in red over `ax`, why its runs do not compare (when they do not)."""
    if not warnings and len(fig.axes) == 1:
        ax.set_title(title, fontsize=10)
        return
    fig.suptitle(title, fontsize=10)
    if warnings:
        text = "NOT COMPARABLE: " + "; ".join(warnings)
        ax.set_title(textwrap.fill(text, width), fontsize=8, color="tab:red", loc=loc)


def bar_label(stem: str, run: Run) -> str:
    """A run's label on the cross-run figures: its file stem, and its policy unless that is the stem."""
    return stem if stem == run.policy else f"{stem}\n({run.policy})"


def loss_series(run: Run) -> pd.DataFrame:
    """The points loss.png draws for one run (the rule is in the module docstring): one row per row of
    /steps with a finite loss and tokens, with `row` (its index in /steps), `optimizer_step`, `tokens`
    (committed tokens up to and including it), `loss` and `committed`; committed rows first, in
    optimizer order, then the others in row order."""
    s = run.steps
    loss = s["loss"].to_numpy(dtype=float)
    tokens = s["tokens"].to_numpy(dtype=np.int64)
    committed = s["tokens_committed"].to_numpy(dtype=np.int64) > 0
    has_opt = "optimizer_step" in s.columns
    keep = np.isfinite(loss) & (tokens > 0) & (committed | has_opt)
    opt = (s["optimizer_step"].to_numpy(dtype=np.int64) if has_opt
           else np.cumsum(committed).astype(np.int64))
    df = pd.DataFrame({"row": np.arange(len(s)), "optimizer_step": opt, "tokens": tokens, "loss": loss,
                       "committed": committed})[keep]
    done = df[df["committed"]].sort_values("optimizer_step", kind="stable").copy()
    done["tokens"] = np.cumsum(done["tokens"].to_numpy())
    undone = df[~df["committed"]].copy()
    # Committed tokens before the update the row attempted, plus the row's own.
    before = np.searchsorted(done["optimizer_step"].to_numpy(), undone["optimizer_step"].to_numpy(), side="left")
    cum = np.concatenate([[0], done["tokens"].to_numpy()])
    undone["tokens"] = cum[before] + undone["tokens"].to_numpy()
    return pd.concat([done, undone], ignore_index=True)


def plot_loss(runs: list[Run], labels: list[str], path: str, warnings: list[str] = ()) -> None:
    fig, (a_step, a_tok) = plt.subplots(1, 2, figsize=(14, 4.5), sharey=True)
    undone_drawn = False
    for run, label in zip(runs, labels):
        df = loss_series(run)
        done, undone = df[df["committed"]], df[~df["committed"]]
        line, = a_step.plot(done["optimizer_step"], done["loss"], "-", linewidth=1.2, label=label.replace("\n", " "))
        a_tok.plot(done["tokens"], done["loss"], "-", linewidth=1.2, color=line.get_color())
        if len(undone):
            for ax, x in ((a_step, undone["optimizer_step"]), (a_tok, undone["tokens"])):
                ax.plot(x, undone["loss"], "x", color=line.get_color(), markersize=5, alpha=0.7,
                        label=None if undone_drawn or ax is a_tok else "not committed (rolled back)")
            undone_drawn = True
    a_step.set_xlabel("optimizer step (committed updates, in order)")
    a_tok.set_xlabel("committed tokens (cumulative)")
    a_step.set_ylabel("loss (nats/token)")
    for ax in (a_step, a_tok):
        ax.grid(alpha=0.3)
    # Beside the right panel, off the lines.
    a_tok.legend(*a_step.get_legend_handles_labels(), fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    # Over both panels: the warning starts at the left panel's edge and runs on over the right one.
    _titles(fig, a_step, "Loss against progress: committed steps in optimizer order; crosses = work rolled back",
            list(warnings), width=170, loc="left")
    _save(fig, path)


def plot_goodput_by_policy(runs: list[Run], labels: list[str], path: str, warnings: list[str] = ()) -> None:
    recs = [metrics.recompute(r) for r in runs]
    x = np.arange(len(runs))
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(runs) + 2) + 3, 4.5))  # + the legend beside
    w = 0.38
    ax.bar(x - w / 2, [r["throughput_tokens_per_s"] for r in recs], w, label="throughput (tokens / step time)",
           color="tab:blue")
    bars = ax.bar(x + w / 2, [r["goodput_tokens_per_s"] for r in recs], w,
                  label="goodput (committed tokens / wall time)", color="tab:green")
    for b, r in zip(bars, recs):
        if np.isfinite(r["goodput_ratio"]):
            ax.annotate(f"{r['goodput_ratio']:.2f}", (b.get_x() + b.get_width() / 2, b.get_height()),
                        ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("tokens/s")
    _titles(fig, ax, "Throughput and goodput per run (numbers: goodput / healthy throughput)", list(warnings))
    ax.grid(alpha=0.3, axis="y")
    # Beside the axes, where it covers neither a bar nor a ratio.
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(fig, path)


def plot_phase_totals(runs: list[Run], labels: list[str], path: str, warnings: list[str] = ()) -> None:
    names = []
    for r in runs:
        names += [p for p in r.phases if p not in names]
    x = np.arange(len(runs))
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(runs) + 2) + 3, 4.5))  # + the legend beside
    bottom = np.zeros(len(runs))
    for name in names:
        vals = np.array([r.phase_times[:, :, r.phases.index(name)].mean(axis=1).sum()
                         if name in r.phases and r.phase_times.size else 0.0 for r in runs])
        if not vals.any():
            continue
        ax.bar(x, vals, bottom=bottom, label=name, color=PHASE_COLORS.get(name))
        bottom += vals
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("seconds")
    _titles(fig, ax, "Where each run's time went: seconds per phase over all its steps (mean over ranks)",
            list(warnings))
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="phase")
    _save(fig, path)


def make_plots(paths: list[str], out_dir: str) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    runs = [load_run(p) for p in paths]
    warnings = comparability_problems(runs)
    for w in warnings:
        print(f"warning: runs not comparable on one absolute axis: {w}", file=sys.stderr)
    overran = [f"{run.name} overran (paced: real time past emulated time)" for run in runs
               if paced_status(run) == "overran"]
    for w in overran:
        print(f"warning: {w}", file=sys.stderr)
    warnings += overran
    written, used = [], set()
    labels = []
    for run in runs:
        stem = _stem(run.path, used)
        labels.append(bar_label(stem, run))
        for kind, fn in (("throughput", plot_throughput), ("tp_degree", plot_tp_degree), ("phases", plot_phases)):
            p = os.path.join(out_dir, f"{stem}_{kind}.png")
            fn(run, p)
            written.append(p)
    for name, fn in (("loss", plot_loss), ("goodput_by_policy", plot_goodput_by_policy),
                     ("phase_totals", plot_phase_totals)):
        p = os.path.join(out_dir, f"{name}.png")
        fn(runs, labels, p, warnings)
        written.append(p)
    return written


def main(args) -> int:
    try:
        written = make_plots(args.runs, args.out)
    except SchemaError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for p in written:
        print(p)
    return 0
