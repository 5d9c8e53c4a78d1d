"""`simulate --from-run RUN.h5 ...`: predict a paced run's emulated ETTR and goodput from a model of its
machine, layout, policy and failure schedule, and hold the prediction against the run's own /summary.

What the model takes from the run, and what it computes:

  taken   the machine's name, time scale and emulated shape (root attribute `paced_machine`), the layout
          (`tp`, `pp`, `replicas`, `ranks`), the model's dimensions, batch and `checkpoint_every` (`config`),
          the policy and kill mode, the failure schedule as it happened (/events `kill` and `revive` rows,
          their step; a kill's detail names the phase it struck at), and the step times: the healthy step
          (median emulated `t_end - t_start` of rows whose every replica has /replicas/state 0) and each
          damaged configuration's (median of the rows with that tuple of /replicas/tp_degree).
  model   everything else. The slots are replayed with ntpbench's rules, ported to Python (shards.py): the
          configuration the policy gives each membership, its tokens, which replicas heal and from whom,
          whether a restore is needed and which rows it rolls back, when checkpoints are written. Every
          recovery part is charged from the machine's profile, jobs/machines/<machine>.yaml (`custom`:
          dgx-a100's recovery, its links the run's), read with PyYAML (machines.py), as run_record.cpp does,
          except a figure the run's command line gave in its place (--repair-s and the like: its input):

    death (signal)   detect + repair + reconfigure + heal     (fence: detect + reconfigure + heal)
    revival          replace (spares: takeover) + reconfigure + heal     (fence: reconfigure + heal)
    takeover         --spare-use takeover (not restart): a death is detect + repair + takeover + one
                     reconfigure + the spare's heal (the survivors forget the lost shards; no shrink of their own)
    heal             latency_us 1e-6 + b_max x r / (scale_out_gbps 1e9)
                     b_max: the most bytes a rank sends or receives, its link the bottleneck (12 per
                     parameter of the units moved, shards.heal_traffic), r: the emulated shape's parameter bytes over the model's
                     (parameter_count(shape) / parameter_count(model); 1 without --emulate-shape); no bytes,
                     no heal; every replica down: no heal
    restore          b_rank x r / (checkpoint_gbps 1e9) (+ restart under --policy restart)
                     b_rank: the largest shard's state, 12 bytes per parameter of Model::param_count() (0
                     when no checkpoint was written: the initial state is rebuilt); the rows since the
                     checkpoint it loads are rolled back: no longer productive, their tokens uncommitted
    checkpoint       12 x parameter_count x r / ranks / (checkpoint_gbps 1e9), every `checkpoint_every`
                     optimizer steps (the final, end-of-run checkpoint, ntpbench's for --replay, is charged
                     nothing, as the run charges it)
    hang             a hung rank's kill (SIGSTOP) adds --failure-timeout (its detection), once per step
    lost             the interrupted attempt of a real kill: a fraction of the step it struck: 0 at start
                     and forward (survivors notice at its first collective), 1/3 at backward (the forward
                     is a third of a step's FLOPs), 1 at sync and optimizer; fence kills strike at the start
                     (0). The survivors' notice spread (a paced phase) is left out.
    idle slot        no replica can train: the slot lasts a healthy step (ntpbench waits the median healthy
                     step)

    wall    = sum over the run's slots of the predicted step time + every charge + lost
    ETTR    = (step time of committed slots) / wall,    goodput = committed tokens / wall

Not modelled (a note says so when a run has them): straggler actions, slowdowns, unscheduled deaths' phase
(taken as start), non-finite steps, spare takeovers in the repair (--spare-use takeover: charged as a death
followed by a takeover).
"""
from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass, field

import numpy as np

from . import shards
from .machines import CUSTOM_RECOVERY_MACHINE, ProfileError, load_profile

# A kill at a phase: the share of the step that was lost before the survivors noticed.
LOST_FRACTION = {"start": 0.0, "forward": 0.0, "backward": 1 / 3, "sync": 1.0, "optimizer": 1.0,
                 "repair": 0.0, "handover": 0.0}
DEFAULT_TOLERANCE = 0.02


class FromRunError(ValueError):
    """A file the prediction cannot be made for (not paced, unreadable, an unknown machine)."""


@dataclass
class Facts:
    """What the model reads from a run (never its recovery events)."""
    name: str
    policy: str
    kill_mode: str
    tp: int
    pp: int
    replicas: int
    ranks: int
    model: shards.Model
    batch: int            # sequences per replica per step (B)
    micro_batches: int
    seq: int
    slots: int
    checkpoint_every: int
    failure_timeout: float
    spares: bool
    spare_use: str
    machine: str
    time_scale: float
    emulate_shape: str
    ratio: float          # the emulated shape's parameter bytes per byte here (model)
    recorded_ratio: float  # the same as the run recorded it
    run_scale_out_gbps: float   # --machine custom: the scale-out link the command line gave (GB/s)
    run_latency_us: float
    recorded_recovery: dict   # part -> the figure the run was charged (paced_machine's recovery)
    recorded_sources: dict    # part -> its source there ("given: --repair-s" where the command line gave it)
    kills: dict = field(default_factory=dict)     # step -> [(rank, phase, hang)]
    revives: dict = field(default_factory=dict)   # step -> [rank]
    notes: list = field(default_factory=list)


def _num(x, default=0.0):
    try:
        return float(x)
    except (TypeError, ValueError):
        return default


def read_facts(run) -> Facts:
    attrs = run.attrs
    if str(attrs.get("timing", "")) != "paced":
        raise FromRunError(f"{run.name}: timing {attrs.get('timing', '?')!r}, not paced: its times are this "
                           f"host's, there is no emulated machine to predict")
    try:
        machine = json.loads(attrs.get("paced_machine", "") or "{}")
    except (TypeError, ValueError) as e:
        raise FromRunError(f"{run.name}: root attribute paced_machine is not JSON ({e})") from e
    if not machine:
        raise FromRunError(f"{run.name}: no root attribute paced_machine")
    cfg = run.config
    model = shards.Model.from_config(cfg)
    shape = str(machine.get("emulate_shape", "") or cfg.get("pacing", {}).get("emulate_shape", "") or "")
    ratio = 1.0
    if shape:
        ratio = shards.parameter_count(shards.Model.preset(shape)) / shards.parameter_count(model)
    charge = machine.get("charge", {}) or {}
    scale = _num(machine.get("time_scale"), 1.0) or 1.0
    spares = cfg.get("spares", {}) or {}
    f = Facts(name=run.name, policy=run.policy, kill_mode=str(attrs.get("kill_mode", cfg.get("kill_mode", "fence"))),
              tp=run.tp, pp=run.pp, replicas=run.dp, ranks=run.ranks, model=model,
              batch=int(cfg.get("micro_batch", 1)) * int(cfg.get("micro_batches", 1)),
              micro_batches=int(cfg.get("micro_batches", 1)),
              seq=int(attrs.get("tokens_per_sample", cfg.get("seq", 1))), slots=len(run.steps),
              checkpoint_every=int(cfg.get("checkpoint_every", 0) or 0),
              failure_timeout=_num(cfg.get("failure_timeout"), 0.0),
              spares=int(spares.get("per_host", 0) or 0) > 0 or int(spares.get("hosts", 0) or 0) > 0,
              spare_use=str(spares.get("use", "revive")), machine=str(machine.get("machine", "custom")),
              time_scale=scale, emulate_shape=shape, ratio=ratio,
              recorded_ratio=_num(charge.get("parameter_bytes"), 1.0) if shape else 1.0,
              # --machine custom: the link the command line gave (--dp-gbps, --link-latency-us).
              run_scale_out_gbps=_num((cfg.get("pacing") or {}).get("dp_gbps"),
                                      _num(machine.get("scale_out_gbps")) * scale),
              run_latency_us=_num((cfg.get("pacing") or {}).get("latency_us"), _num(machine.get("latency_us")) / scale),
              recorded_recovery={k: _num(v.get("value")) for k, v in (machine.get("recovery") or {}).items()
                                 if isinstance(v, dict)},
              recorded_sources={k: str(v.get("source", "")) for k, v in (machine.get("recovery") or {}).items()
                                if isinstance(v, dict)})
    if f.recorded_ratio and not math.isclose(f.ratio, f.recorded_ratio, rel_tol=1e-9):
        f.notes.append(f"emulated shape's parameter bytes: model x{f.ratio:.6g}, the run recorded "
                       f"x{f.recorded_ratio:.6g}")
    if f.slots != int(cfg.get("steps", f.slots)):
        f.notes.append(f"{f.slots} rows for --steps {cfg.get('steps')}: the run stopped early; its rows are predicted")
    ev = run.events
    kinds = ev["kind"].astype(str).to_numpy() if len(ev) else np.array([], dtype=object)
    for i in np.flatnonzero(kinds == "kill"):
        detail = str(ev["detail"].iloc[i])
        m = re.search(r"\bat (\w+)", detail)
        phase = m.group(1) if m else "start"
        hang = "SIGSTOP" in detail or "hung" in detail
        if detail.startswith("unscheduled"):
            f.notes.append(f"step {int(ev['step'].iloc[i])}: rank {int(ev['rank'].iloc[i])} died unscheduled "
                           f"(taken as a kill at the start)")
        f.kills.setdefault(int(ev["step"].iloc[i]), []).append((int(ev["rank"].iloc[i]), phase, hang))
    for i in np.flatnonzero(kinds == "revive"):
        f.revives.setdefault(int(ev["step"].iloc[i]), []).append(int(ev["rank"].iloc[i]))
    others = sorted(set(kinds) & {"evict", "rejoin", "rebalance", "rebalance_end", "slow", "nonfinite", "recorder"})
    if others:
        f.notes.append(f"not modelled: {', '.join(others)} events")
    return f


def run_step_times(run) -> tuple[float, dict]:
    """The healthy step (median over rows with every replica healthy) and each damaged configuration's (median
    over the rows with its tuple of TP degrees), from the run's rows."""
    dt = run.step_seconds()
    state, deg = run.replicas["state"], run.replicas["tp_degree"]
    trained = run.steps["samples"].to_numpy() > 0
    healthy = trained & (state == 0).all(axis=1)
    h = float(np.median(dt[healthy])) if healthy.any() else math.nan
    by = {}
    for key in {tuple(int(x) for x in r) for r in deg[trained & ~healthy].tolist()}:
        sel = trained & ~healthy & (deg == np.array(key)).all(axis=1)
        by[key] = float(np.median(dt[sel]))
    return h, by


@dataclass
class Prediction:
    wall: float = 0.0
    productive: float = 0.0
    tokens_committed: int = 0
    parts: dict = field(default_factory=dict)       # charge name -> seconds
    heal_bytes: float = 0.0                          # summed over ranks (as the run's heal events)
    restore_bytes: float = 0.0
    notes: list = field(default_factory=list)

    @property
    def moved_bytes(self) -> float:
        """Heals' and restores' bytes summed over ranks: /summary heal_bytes."""
        return self.heal_bytes + self.restore_bytes

    @property
    def ettr(self) -> float:
        return self.productive / self.wall if self.wall > 0 else math.nan

    @property
    def goodput(self) -> float:
        return self.tokens_committed / self.wall if self.wall > 0 else math.nan

    def charge(self, part: str, seconds: float) -> None:
        self.parts[part] = self.parts.get(part, 0.0) + seconds


class _Replay:
    """The run's slots replayed under the model."""

    def __init__(self, f: Facts, profile, healthy: float, times: dict, recovery: dict):
        self.f, self.p, self.healthy, self.times = f, profile, healthy, times
        self.rec = recovery
        # The heal's link: the profile's (custom: the command line's, --dp-gbps and --link-latency-us).
        self.link_gbps = f.run_scale_out_gbps if f.machine == "custom" else profile.scale_out_gbps
        self.latency_us = f.run_latency_us if f.machine == "custom" else profile.latency_us
        self.alive = [True] * f.ranks
        self.cfg = self.plan()
        self.valid = [True] * f.replicas
        self.opt = 0            # optimizer steps taken
        self.ckpt = 0           # the restore point (optimizer step); 0: the initial state
        self.ckpt_written = False
        self.rows: list = []    # [optimizer step or None, seconds, tokens, committed]
        self.out = Prediction()

    def plan(self) -> shards.Configuration:
        f = self.f
        return shards.plan_configuration(f.policy, f.model, f.tp, f.pp, f.replicas, f.batch, self.alive,
                                         f.micro_batches)

    def step_time(self, cfg: shards.Configuration) -> float:
        if cfg.active_replicas == 0 or all(s == shards.HEALTHY for s in cfg.states()):
            return self.healthy
        key = cfg.degrees()
        if key in self.times:
            return self.times[key]
        # A configuration the run never trained in: as slow as its slowest replica's work per rank.
        worst = max(rp.batch / self.f.batch * self.f.tp / rp.degree for rp in cfg.replicas if rp.active)
        self.out.notes.append(f"TP {list(key)} is not among the run's rows: its step modelled as the healthy "
                              f"step x {worst:.3g}")
        self.times[key] = self.healthy * worst
        return self.times[key]

    def reconfigure(self, death: bool) -> None:
        """ntpbench's reconfiguration after a membership change: detect (deaths), reconfigure, then a heal, a
        restore, or nothing (every replica down)."""
        old, valid = self.cfg, self.valid
        new = self.plan()
        if death:
            self.out.charge("detect", self.rec["detect"])
        self.out.charge("reconfigure", self.rec["reconfigure"])
        if new.active_replicas == 0:
            self.valid = [False] * self.f.replicas
        elif shards.state_survives(self.f.model, old, valid, new.alive):
            sent, recv = shards.heal_traffic(self.f.model, old, valid, new)
            self.out.heal_bytes += sum(sent)
            busiest = max(max(s, r) for s, r in zip(sent, recv))
            if busiest > 0:
                self.out.charge("heal", self.latency_us * 1e-6 + busiest * self.f.ratio / (self.link_gbps * 1e9))
            self.valid = [rp.active for rp in new.replicas]
        else:
            b = shards.restore_rank_bytes(self.f.model, new) if self.ckpt_written else [0]
            self.out.restore_bytes += sum(b)
            self.out.charge("restore", max(b) * self.f.ratio / (self.rec["checkpoint_gbps"] * 1e9))
            if self.f.policy == "restart":
                self.out.charge("restart", self.rec["restart"])
            for row in self.rows:            # the rows since the checkpoint are undone
                if row[0] is not None and row[0] > self.ckpt:
                    row[3] = False
            self.opt = self.ckpt
            self.valid = [rp.active for rp in new.replicas]
        self.cfg = new

    def slot(self, s: int) -> None:
        f = self.f
        kills, back = f.kills.get(s, []), [r for r in f.revives.get(s, []) if not self.alive[r]]
        if f.kill_mode == "signal":
            if back:        # a revival comes first, before the step's attempt
                self.out.charge("takeover" if f.spares else "replace",
                                self.rec["takeover" if f.spares else "replace"])
                for r in back:
                    self.alive[r] = True
                self.reconfigure(death=False)
            if kills:       # the attempt is cut short at the kill's phase, then repaired
                lost = max(LOST_FRACTION.get(phase, 0.0) for _, phase, _ in kills)
                if self.cfg.active_replicas:
                    self.out.charge("lost", lost * self.step_time(self.cfg))
                if any(hang for _, _, hang in kills):
                    self.out.charge("hang", f.failure_timeout)
                self.out.charge("repair", self.rec["repair"])
                for r, _, _ in kills:
                    self.alive[r] = False
                if f.spares and f.spare_use == "takeover" and f.policy != "restart":
                    # Spares take the dead ranks over at once (src/recovery/recovery.cpp, spares_take_all_at_once):
                    # the survivors forget the lost shards without a reconfiguration of their own, and the
                    # handover's one reconfiguration heals the spares in.
                    self.out.charge("detect", self.rec["detect"])
                    self.cfg = self.plan()
                    self.out.charge("takeover", self.rec["takeover"])
                    for r, _, _ in kills:
                        self.alive[r] = True
                    self.reconfigure(death=False)
                else:
                    self.reconfigure(death=True)
                    if f.spares and f.spare_use == "takeover":
                        self.out.charge("takeover", self.rec["takeover"])
                        for r, _, _ in kills:
                            self.alive[r] = True
                        self.reconfigure(death=False)
        elif kills or back:  # fence: one reconfiguration for the step's deaths and revivals
            for r, _, _ in kills:
                self.alive[r] = False
            for r in back:
                self.alive[r] = True
            self.reconfigure(death=bool(kills))
        t = self.step_time(self.cfg)
        if self.cfg.active_replicas == 0:
            self.rows.append([None, t, 0, False])
            return
        self.opt += 1
        self.rows.append([self.opt, t, sum(self.cfg.batches()) * f.seq, True])
        if f.checkpoint_every > 0 and self.opt % f.checkpoint_every == 0:
            state = shards.STATE_BYTES_PER_PARAM * shards.parameter_count(f.model) * f.ratio / f.ranks
            self.out.charge("checkpoint", state / (self.rec["checkpoint_gbps"] * 1e9))
            self.ckpt, self.ckpt_written = self.opt, True

    def run(self) -> Prediction:
        for s in range(1, self.f.slots + 1):
            self.slot(s)
        out = self.out
        out.parts["steps"] = sum(r[1] for r in self.rows)
        out.wall = sum(out.parts.values())
        out.productive = sum(r[1] for r in self.rows if r[3])
        out.tokens_committed = sum(r[2] for r in self.rows if r[3])
        return out


def predict(run, machines_dir: str | None = None) -> tuple[Facts, Prediction]:
    f = read_facts(run)
    try:
        profile = load_profile(f.machine, machines_dir)
    except ProfileError as e:
        raise FromRunError(f"{run.name}: {e}") from e
    healthy, times = run_step_times(run)
    if not math.isfinite(healthy):
        raise FromRunError(f"{run.name}: no row with every replica healthy: no healthy step time to take")
    # The profile's figures, except those the run's command line gave in their place (--repair-s and
    # the like, source "given: ..."): those are the run's inputs, as its layout is. A profile figure
    # that differs from what the run was charged otherwise is a disagreement, noted and charged.
    recovery = dict(profile.recovery)
    for part, v in f.recorded_recovery.items():
        if part not in recovery or math.isclose(v, recovery[part], rel_tol=1e-9):
            continue
        source = f.recorded_sources.get(part, "")
        if source.startswith("given:"):
            f.notes.append(f"recovery.{part}: {v:g}, {source} (the profile's {recovery[part]:g} not charged)")
            recovery[part] = v
        else:
            f.notes.append(f"{profile.path}: recovery.{part} is {recovery[part]:g}, the run was charged {v:g}")
    return f, _Replay(f, profile, healthy, times, recovery).run()


def _rel(model: float, run: float) -> float:
    return (model - run) / run if run else (0.0 if model == 0 else math.inf)


def from_run_main(paths, tolerance: float = DEFAULT_TOLERANCE, machines_dir: str | None = None) -> int:
    from ..runfile import load_or_say
    rows, bad, failed = [], [], False
    for path in paths:
        run = load_or_say(path)
        if run is None:
            failed = True
            continue
        try:
            f, p = predict(run, machines_dir)
        except (FromRunError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            failed = True
            continue
        if run.summary is None:
            print(f"error: {run.name}: no /summary (the run was cut short): nothing to hold the prediction against",
                  file=sys.stderr)
            failed = True
            continue
        ettr, good = float(run.summary["ettr"]), float(run.summary["goodput_tokens_per_s"])
        d_ettr, d_good = _rel(p.ettr, ettr), _rel(p.goodput, good)
        ev = run.events
        kinds = ev["kind"].astype(str).to_numpy() if len(ev) else np.array([])
        moved = np.isin(kinds, ("heal", "restore"))
        run_heal = float(ev["bytes"].to_numpy(dtype=float)[moved].sum()) if len(ev) else 0.0
        ok = abs(d_ettr) <= tolerance and abs(d_good) <= tolerance
        if not ok:
            bad.append(run.name)
        rows.append(dict(f=f, p=p, wall=float(run.summary.get("wall_seconds", math.nan)), ettr=ettr, good=good,
                         d_ettr=d_ettr, d_good=d_good, heal=run_heal, ok=ok))
    if rows:
        _print_table(rows)
    if bad:
        print(f"verdict: MISMATCH: {', '.join(bad)} differ(s) from the model by more than {tolerance:.0%} "
              f"(--tolerance {tolerance:g})")
    elif rows and not failed:
        print(f"verdict: ok: {len(rows)} run(s) within {tolerance:.0%} of the model (--tolerance {tolerance:g})")
    else:
        print("verdict: FAILED: some file(s) could not be predicted (above)")
    return 1 if bad or failed else 0


def _print_table(rows) -> None:
    print("Paced runs' emulated ETTR and goodput (committed tokens / emulated wall s) against the model's "
          "prediction; step times taken from the run, every recovery part, heal, restore and checkpoint charged "
          "from jobs/machines/<machine>.yaml (analysis/simulate/from_run.py); diff = model / run - 1; wall in "
          "emulated seconds:")
    head = (f"{'file':<16} {'policy':<8} {'kills':<6} {'machine':<8} {'slots':>5} {'wall run':>10} "
            f"{'wall model':>10} {'ETTR run':>9} {'ETTR model':>10} {'diff':>7} {'good run':>9} "
            f"{'good model':>10} {'diff':>7} {'moved bytes run/model':>21}  verdict")
    print(head)
    print("-" * len(head))
    for r in rows:
        f, p = r["f"], r["p"]
        heal = f"{r['heal']:.4g}/{p.moved_bytes:.4g}"
        if not math.isclose(r["heal"], p.moved_bytes, rel_tol=1e-9, abs_tol=0.5):
            heal += " (!)"
        print(f"{f.name:<16} {f.policy:<8} {f.kill_mode:<6} {f.machine:<8} {f.slots:>5} {r['wall']:>10.4g} "
              f"{p.wall:>10.4g} {r['ettr']:>9.4g} {p.ettr:>10.4g} {r['d_ettr']:>+7.2%} {r['good']:>9.4g} "
              f"{p.goodput:>10.4g} {r['d_good']:>+7.2%} {heal:>21}  {'ok' if r['ok'] else 'MISMATCH'}")
    for r in rows:
        f, p = r["f"], r["p"]
        parts = " + ".join(f"{k} {v:.4g}" for k, v in sorted(p.parts.items(), key=lambda kv: -kv[1]) if v)
        recovery = f" ({CUSTOM_RECOVERY_MACHINE}'s recovery)" if f.machine == "custom" else ""
        print(f"  {f.name}: model wall {p.wall:.6g} s = {parts}{recovery}")
        for n in f.notes + p.notes:
            print(f"  note: {f.name}: {n}")
        if not math.isclose(r["heal"], p.moved_bytes, rel_tol=1e-9, abs_tol=0.5):
            print(f"  note: {f.name}: the run's heals and restores moved {r['heal']:.6g} bytes (summed over ranks), "
                  f"the model {p.moved_bytes:.6g}: its configurations or holders differ from ntpbench's")
