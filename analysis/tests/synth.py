"""Synthetic ntpbench results files in exactly the schema of results/README.md (version 1).

write_run(path, policy=..., kill_step=..., revive_step=...) builds a plausible run: TP x DP ranks,
per-step rows with times, tokens and losses, /replicas (tp_degree, batch, state), per-rank phase
times that add up to the step time, /events with fixed-length strings, and a /summary computed
from the rows by the README's definitions (independently of analysis.metrics, so a test that
compares the two checks both). As in ntpbench's files, `step` is the slot and `optimizer_step`
the update a row applied, which a restart's redone rows repeat. Options: the restart policy with
rolled-back steps, a file cut short (no /summary), and a deliberately corrupted summary figure.
"""
from __future__ import annotations

import json

import h5py
import numpy as np
import numpy.lib.recfunctions as rfn

PHASES = ["forward", "backward", "tp_comm", "dp_comm", "reshard", "optimizer", "recovery", "idle", "other"]
STEP_DTYPE = np.dtype([
    ("step", "<i8"), ("optimizer_step", "<i8"), ("t_start", "<f8"), ("t_end", "<f8"), ("sample_begin", "<i8"), ("samples", "<i8"),
    ("tokens", "<i8"), ("tokens_committed", "<i8"), ("loss", "<f8"), ("grad_norm", "<f8"), ("lr", "<f8"),
    ("flops", "<f8"), ("mfu", "<f8"), ("live_ranks", "<i4"), ("active_replicas", "<i4"),
    ("recovery_seconds", "<f8"), ("idle_seconds", "<f8"), ("paced_overrun", "i1"), ("paced_link_overruns", "<i4"),
    ("paced_overrun_seconds", "<f8"), ("paced_link_overrun_seconds", "<f8"), ("paced_peers_uneven", "i1"),
])
OVERRUN_S = 0.002       # compute seconds past emulated time in an overrun step (over the ranks)
LINK_OVERRUN_S = 0.001  # transfer seconds past emulated time in a damaged step (a late peer)
EVENT_DTYPE = np.dtype([
    ("time", "<f8"), ("step", "<i8"), ("kind", "S16"), ("rank", "<i4"), ("replica", "<i4"),
    ("bytes", "<f8"), ("duration", "<f8"), ("detail", "S96"),
])
T = 32            # tokens per sample
MICRO = 4         # sequences per replica per step
PEAK = 50.0       # GFLOP/s per rank
FLOPS_PER_TOKEN = 6 * 120_000.0


def _extendible(f, name, data):
    maxshape = (None,) + data.shape[1:]
    chunks = (64,) + data.shape[1:] if data.ndim > 1 else (64,)
    return f.create_dataset(name, data=data, maxshape=maxshape, chunks=chunks)


MEMCPY_GBPS = 5.0  # the host memory copy a run measures at its start (root attribute memcpy_gbps)


def write_run(path, *, policy="ntp", tp=2, dp=2, steps=12, kill_step=None, kill_rank=1, revive_step=None,
              checkpoint_every=3, summary=True, corrupt=None, seed=0, timing="paced", overrun_steps=()):
    """Write a synthetic run; returns the summary dict written (or that would have been)."""
    rng = np.random.default_rng(seed)
    ranks = tp * dp
    base_dt = 0.1
    rows, tp_rows, batch_rows, state_rows, phase_rows, events = [], [], [], [], [], []
    t = 0.0
    cursor = 0
    dead = False
    kill_replica = kill_rank // tp

    def ev(time, step, kind, rank=-1, replica=-1, nbytes=0.0, duration=0.0, detail=""):
        events.append((time, step, kind.encode(), rank, replica, nbytes, duration, detail.encode()))

    if policy == "restart":
        # Steps 1..kill_step-1 run; at kill_step's start a rank dies, the job idles until the
        # repair, restores the last checkpoint and redoes the steps after it (their first runs
        # are rolled back: tokens_committed 0).
        assert kill_step is not None and revive_step is None
        plan, ckpt = [], 0
        for s in range(1, kill_step):
            plan.append(s)
        last_ckpt = ((kill_step - 1) // checkpoint_every) * checkpoint_every
        rolled = set(range(last_ckpt + 1, kill_step))
        plan += list(range(last_ckpt + 1, steps + 1))
        first_seen = set()
        pending_recovery = pending_idle = 0.0
        for i, s in enumerate(plan):
            if i == kill_step - 1:  # first row after the failure
                ev(t, kill_step, "kill", kill_rank, kill_replica, detail=f"rank {kill_rank} killed")
                ev(t, kill_step, "detect", -1, -1, duration=0.02, detail="heartbeat timeout")
                idle = 0.5
                ev(t + 0.02, kill_step, "idle", -1, -1, duration=idle, detail="waiting for repair")
                ev(t + 0.52, kill_step, "revive", kill_rank, kill_replica, detail=f"rank {kill_rank} back")
                ev(t + 0.52, kill_step, "restore", -1, -1, nbytes=4.0e6, duration=0.05, detail=f"checkpoint step {last_ckpt}")
                ev(t + 0.57, kill_step, "rollback", -1, -1, detail=f"steps {sorted(rolled)} undone")
                redo = sum(base_dt for _ in rolled)
                ev(t + 0.57, kill_step, "recompute", -1, -1, duration=redo, detail=f"redo {len(rolled)} steps")
                pending_recovery, pending_idle = 0.02 + 0.05, idle
                cursor = last_ckpt * dp * MICRO
            t += pending_recovery + pending_idle
            dt = base_dt * (1 + 0.05 * rng.standard_normal())
            samples = dp * MICRO
            committed = samples * T if not (s in rolled and s not in first_seen) else 0
            first_seen.add(s)
            rows.append((i + 1, s, t, t + dt, cursor, samples, samples * T, committed, 5.5 - 0.01 * s, 1.5, 3e-4,
                         FLOPS_PER_TOKEN * samples * T, 0.0, ranks, dp, pending_recovery, pending_idle,
                         1 if s in overrun_steps else 0, 0, OVERRUN_S if s in overrun_steps else 0.0, 0.0, 0))
            tp_rows.append([tp] * dp)
            batch_rows.append([MICRO] * dp)
            state_rows.append([0] * dp)
            phase_rows.append(_phases(rng, dt, ranks, pending_recovery))
            if s % checkpoint_every == 0 and committed:
                ev(t + dt, s, "checkpoint", -1, -1, nbytes=4.0e6, duration=0.0, detail=f"step {s}")
            cursor += samples
            t += dt
            pending_recovery = pending_idle = 0.0
    else:
        for s in range(1, steps + 1):
            recovery = 0.0
            if kill_step is not None and s == kill_step:
                dead = True
                ev(t, s, "kill", kill_rank, kill_replica, detail=f"rank {kill_rank} killed")
                ev(t, s, "detect", -1, kill_replica, duration=0.01, detail="comm error")
                ev(t + 0.01, s, "reconfigure", -1, -1, duration=0.02,
                   detail=f"TP {[tp] * dp} -> {[tp - 1 if r == kill_replica else tp for r in range(dp)]}")
                recovery = 0.03
            if revive_step is not None and s == revive_step:
                dead = False
                ev(t, s, "revive", kill_rank, kill_replica, detail=f"rank {kill_rank} back")
                ev(t, s, "reconfigure", -1, -1, duration=0.015, detail="re-admit")
                ev(t + 0.015, s, "heal", kill_rank, kill_replica, nbytes=2.5e6, duration=0.04, detail="from replica 0")
                recovery = 0.055
            t += recovery
            tps, batches, states = [], [], []
            for r in range(dp):
                if dead and r == kill_replica:
                    if policy == "dp-drop":
                        tps.append(0), batches.append(0), states.append(2)
                    elif policy == "ntp":
                        tps.append(tp - 1), batches.append(max(1, MICRO * (tp - 1) // tp)), states.append(1)
                    else:  # ntp-pw keeps its batch
                        tps.append(tp - 1), batches.append(MICRO), states.append(1)
                else:
                    tps.append(tp), batches.append(MICRO), states.append(0)
            slow = 1.0
            if dead and policy == "ntp-pw":
                slow = max(1.0, tp / (tp - 1) / 1.3)
            dt = base_dt * slow * (1 + 0.05 * rng.standard_normal())
            samples = int(sum(batches))
            live = ranks - (1 if dead else 0)
            rows.append((s, s, t, t + dt, cursor, samples, samples * T, samples * T, 5.5 - 0.01 * s, 1.5, 3e-4,
                         FLOPS_PER_TOKEN * samples * T, 0.0, live, sum(1 for x in batches if x), recovery, 0.0,
                         1 if s in overrun_steps else 0, 1 if dead else 0, OVERRUN_S if s in overrun_steps else 0.0,
                         LINK_OVERRUN_S if dead else 0.0, 1 if dead and policy != "dp-drop" else 0))
            tp_rows.append(tps)
            batch_rows.append(batches)
            state_rows.append(states)
            phase_rows.append(_phases(rng, dt, ranks, recovery))
            cursor += samples
            t += dt

    steps_arr = np.array(rows, dtype=STEP_DTYPE)
    dts = steps_arr["t_end"] - steps_arr["t_start"]
    steps_arr["mfu"] = steps_arr["flops"] / (dts * ranks * PEAK * 1e9)
    wall = float(steps_arr["t_end"][-1]) + 0.02
    ev_arr = np.array(events, dtype=EVENT_DTYPE)
    # Schema 2's host clock: a wall-timed run's is its own.
    steps_arr = rfn.append_fields(steps_arr, ["host_t_start", "host_t_end"], [steps_arr["t_start"], steps_arr["t_end"]],
                                  usemask=False)
    ev_arr = rfn.append_fields(ev_arr, ["host_time", "host_duration"], [ev_arr["time"], ev_arr["duration"]], usemask=False)

    summ = _summary(steps_arr, np.array(state_rows), ev_arr, wall, ranks)
    if corrupt:
        summ = dict(summ)
        summ[corrupt] = summ[corrupt] * 1.01 + 1.0

    with h5py.File(path, "w") as f:
        cfg = {"preset": "synthetic", "tp": tp, "steps": steps, "policy": policy, "micro_batch": MICRO}
        for k, v in {
            "schema_version": "2", "ntpbench_version": "synthetic", "git_revision": "0000000",
            "start_time": "2025-01-01T00:00:00Z", "hosts": json.dumps(["synth"] * ranks),
            "mpi_library_version": "none", "policy": policy, "timing": timing, "config": json.dumps(cfg),
            "data": "synthetic test data", "peak_gflops_source": "synthetic", "blas_core": "none",
            "blas_config": "none", "OPENBLAS_CORETYPE": "", "OPENBLAS_L2_SIZE": "",
        }.items():
            f.attrs[k] = np.bytes_(v)
        for k, v in {"ranks": ranks, "tp": tp, "replicas": dp, "tokens_per_sample": T, "threads_per_rank": 1}.items():
            f.attrs[k] = np.int64(v)
        f.attrs["peak_gflops_per_rank"] = np.float64(PEAK)
        f.attrs["memcpy_gbps"] = np.float64(MEMCPY_GBPS)
        _write_tables(f, steps_arr, tp_rows, batch_rows, state_rows, phase_rows, ev_arr)
        if summary:
            sg = f.create_group("summary")
            for k, v in summ.items():
                sg.attrs[k] = np.float64(v)
    return summ


def _write_tables(f, steps_arr, tp_rows, batch_rows, state_rows, phase_rows, ev_arr):
    """/steps, /replicas, /ranks/phase_times and /events, as the recorder lays them out."""
    _extendible(f, "steps", steps_arr)
    g = f.create_group("replicas")
    _extendible(g, "tp_degree", np.array(tp_rows, dtype="<i4"))
    _extendible(g, "batch", np.array(batch_rows, dtype="<i4"))
    _extendible(g, "state", np.array(state_rows, dtype="i1"))
    d = _extendible(f.create_group("ranks"), "phase_times", np.array(phase_rows, dtype="<f8"))
    d.attrs["phases"] = np.bytes_(",".join(PHASES))
    _extendible(f, "events", ev_arr)


def _phases(rng, dt, ranks, recovery):
    share = np.array([0.3, 0.45, 0.08, 0.06, 0.0, 0.06, 0.0, 0.03, 0.02])
    out = np.tile(share * dt, (ranks, 1)) * (1 + 0.02 * rng.standard_normal((ranks, len(PHASES))))
    out[:, PHASES.index("recovery")] = 0.0
    out[:, PHASES.index("other")] += dt - out.sum(axis=1)  # phases add up to the step time
    return out


def _summary(st, state, ev, wall, ranks):
    """The README's /summary definitions, written out independently of analysis.metrics."""
    dt = st["t_end"] - st["t_start"]
    kinds = np.array([k.decode() for k in ev["kind"]]) if len(ev) else np.array([])
    healthy = (state == 0).all(axis=1)
    healthy_tput = float(np.median((st["tokens"] / dt)[healthy])) if healthy.any() else float("nan")
    good = st["tokens_committed"].sum() / wall

    def dur(kind):
        return float(ev["duration"][kinds == kind].sum()) if len(ev) else 0.0

    return {
        "steps": len(st), "training_steps": int((st["tokens_committed"] > 0).sum()), "tokens": int(st["tokens"].sum()), "tokens_committed": int(st["tokens_committed"].sum()),
        "wall_seconds": wall, "host_wall_seconds": wall, "step_seconds": float(dt.sum()),
        "productive_seconds": float(dt[st["tokens_committed"] > 0].sum()),
        "recovery_seconds": float(st["recovery_seconds"].sum()), "idle_seconds": float(st["idle_seconds"].sum()),
        "throughput_tokens_per_s": float(st["tokens"].sum() / dt.sum()), "goodput_tokens_per_s": float(good),
        "ettr": float(dt[st["tokens_committed"] > 0].sum() / wall),
        "healthy_throughput_tokens_per_s": healthy_tput, "goodput_ratio": float(good / healthy_tput),
        "mfu": float(st["flops"].sum() / (dt.sum() * ranks * PEAK * 1e9)),
        "failures": int((kinds == "kill").sum()), "revivals": int((kinds == "revive").sum()),
        "recovery_detect_seconds": dur("detect"), "recovery_reconfigure_seconds": dur("reconfigure"),
        "recovery_heal_seconds": dur("heal") + dur("restore"), "recovery_recompute_seconds": dur("recompute"),
        "recovery_lost_seconds": dur("lost"), "recovery_repair_seconds": dur("repair"),
        "heal_bytes": float(ev["bytes"][(kinds == "heal") | (kinds == "restore")].sum()) if len(ev) else 0.0,
        "paced_overrun_steps": int((st["paced_overrun"] == 1).sum()), "final_loss": float(st["loss"][-1]),
        "recovery_spawn_seconds": dur("spawn"), "recovery_spare_seconds": dur("spare") + dur("takeover"),
        "spares_used": int(((kinds == "spare") | (kinds == "takeover")).sum()) if len(ev) else 0,
        # Paced timing's verdict: overrun seconds over the ranks' step time (transfers: steps
        # without expected late peers only).
        "paced_overrun_share": float(st["paced_overrun_seconds"].sum() / (dt * st["live_ranks"]).sum()),
        "paced_link_overrun_share": _share(st["paced_link_overrun_seconds"], dt * st["live_ranks"],
                                           st["paced_peers_uneven"] == 0),
    }


def _share(seconds, rank_seconds, judged):
    return float(seconds[judged].sum() / rank_seconds[judged].sum()) if judged.any() else float("nan")


# ---------------------------------------------------------------------------------------------
# A paced run with real kills, as ntpbench writes one (schema 2, the emulated clock)
# ---------------------------------------------------------------------------------------------

# `tiny` (TP 2 x DP 2, B = 4, T = 32) charged as gpt2-medium on an emulated DGX A100 at time scale 64:
# the figures below are what real runs of ntpbench recorded (tests/integration/test_simulate_from_run.py
# makes them), written out here as numbers, independently of analysis.simulate.
PACED_RATIO = 354_823_168 / 118_528          # gpt2-medium's parameters over tiny's
A100 = {"detect": 5.0, "repair": 2.0, "reconfigure": 2.0, "replace": 20.0, "takeover": 2.0, "restart": 300.0,
        "checkpoint_gbps": 2.0}
PACED_HEALTHY_S, PACED_DAMAGED_S = 0.00645, 0.01194   # emulated step: TP [2, 2], and ntp's TP [2, 1]
PACED_LOST_S, PACED_NOTICE_S = 0.00032, 0.00203        # a kill at the start: until the first notice, the spread
# The heal's bytes (summed over ranks) and its charge: the most loaded rank's bytes as gpt2-medium's over 25 GB/s.
PACED_HEALS = {("ntp", "kill"): (693_504.0, 5e-6 + 693_504 * PACED_RATIO / 25e9),
               ("ntp", "revive"): (728_832.0, 5e-6 + 693_504 * PACED_RATIO / 25e9),
               ("dp-drop", "kill"): (0.0, 0.0),
               ("dp-drop", "revive"): (1_457_664.0, 5e-6 + 764_160 * PACED_RATIO / 25e9)}
PACED_RESTORE = (4 * 728_832.0, 728_832 * PACED_RATIO / 2e9 + 300.0)      # bytes, seconds
PACED_CHECKPOINT_S = 12 * 118_528 * PACED_RATIO / 4 / 2e9


def write_paced_run(path, *, policy="ntp", kill_step=3, revive_step=6, steps=10, checkpoint_every=0,
                    machine="dgx-a100", doctor=None):
    """A paced signal-mode run of `tiny` as ntpbench writes it: rank 3 killed at the start of `kill_step` and
    revived by a new process at `revive_step`, every recovery part charged the dgx-a100 profile's seconds
    (`A100`), heals and checkpoints by their bytes. doctor: {summary key: factor} applied to /summary."""
    tp, dp, ranks = 2, 2, 4
    rows, tp_rows, batch_rows, state_rows, phase_rows, events = [], [], [], [], [], []
    rng = np.random.default_rng(1)

    def ev(time, step, kind, rank=-1, replica=-1, nbytes=0.0, duration=0.0, detail=""):
        events.append((time, step, kind.encode(), rank, replica, nbytes, duration, detail.encode()))

    t, opt, ckpt, dead, cursor = 0.0, 0, 0, False, 0
    for s in range(1, steps + 1):
        recovery = 0.0
        if s == revive_step:
            dead = False
            ev(t, s, "spawn", duration=A100["replace"], detail="1 new process(es) for rank(s) [3]")
            ev(t, s, "revive", 3, 1)
            ev(t, s, "detect")
            ev(t, s, "reconfigure", duration=A100["reconfigure"])
            recovery += A100["replace"] + A100["reconfigure"]
            if policy == "restart":
                ev(t, s, "restore", nbytes=PACED_RESTORE[0], duration=PACED_RESTORE[1], detail=f"optimizer step {ckpt}")
                ev(t, s, "rollback")
                for r in rows:
                    if r[1] > ckpt and r[7] > 0:
                        r[7] = 0
                opt = ckpt
                recovery += PACED_RESTORE[1]
            else:
                nbytes, secs = PACED_HEALS[(policy, "revive")]
                ev(t, s, "heal", nbytes=nbytes, duration=secs)
                recovery += secs
        if s == kill_step:
            dead = True
            ev(t, s, "lost", duration=PACED_LOST_S)
            t += PACED_LOST_S
            ev(t, s, "notice", duration=PACED_NOTICE_S)
            ev(t, s, "repair", duration=A100["repair"], detail="revoke + agree + shrink")
            ev(t, s, "kill", 3, 1, detail="scheduled: SIGKILL at start")
            ev(t, s, "detect", duration=A100["detect"])
            ev(t, s, "reconfigure", duration=A100["reconfigure"])
            recovery += PACED_NOTICE_S + A100["repair"] + A100["detect"] + A100["reconfigure"]
            if policy != "restart":
                nbytes, secs = PACED_HEALS[(policy, "kill")]
                ev(t, s, "heal", nbytes=nbytes, duration=secs)
                recovery += secs
        t += recovery
        idle = dead and policy == "restart"
        if idle:
            tps, batches, states, dt = [0, 0], [0, 0], [2, 2], PACED_HEALTHY_S
        elif dead and policy == "ntp":
            tps, batches, states, dt = [2, 1], [MICRO, MICRO // 2], [0, 1], PACED_DAMAGED_S
        elif dead:  # dp-drop
            tps, batches, states, dt = [2, 0], [MICRO, 0], [0, 2], PACED_HEALTHY_S
        else:
            tps, batches, states, dt = [2, 2], [MICRO, MICRO], [0, 0], PACED_HEALTHY_S
        dt *= 1 + 0.001 * rng.standard_normal()
        samples = sum(batches)
        if samples:
            opt += 1
        rows.append([s, opt, t, t + dt, cursor, samples, samples * T, samples * T, 5.5 - 0.01 * s if samples else np.nan,
                     1.5, 3e-4, FLOPS_PER_TOKEN * samples * T, 0.0, ranks - dead, sum(1 for b in batches if b),
                     recovery, dt if idle else 0.0, 0, 0, 0.0, 0.0, int(dead and policy == "ntp")])
        tp_rows.append(tps), batch_rows.append(batches), state_rows.append(states)
        phase_rows.append(_phases(rng, dt, ranks, 0.0))
        cursor += samples
        t += dt
        if samples and checkpoint_every and opt % checkpoint_every == 0:
            ev(t, s, "checkpoint", nbytes=12.0 * 118_528, duration=PACED_CHECKPOINT_S, detail=f"step_{opt:06d}.h5")
            t += PACED_CHECKPOINT_S
            ckpt = opt
    steps_arr = np.array([tuple(r) for r in rows], dtype=STEP_DTYPE)
    steps_arr["mfu"] = 0.05
    wall = float(steps_arr["t_end"][-1]) + 7e-5
    ev_arr = np.array(events, dtype=EVENT_DTYPE)
    steps_arr = rfn.append_fields(steps_arr, ["host_t_start", "host_t_end"],
                                  [steps_arr["t_start"] * 64, steps_arr["t_end"] * 64], usemask=False)
    ev_arr = rfn.append_fields(ev_arr, ["host_time", "host_duration"], [ev_arr["time"], ev_arr["duration"]],
                               usemask=False)
    summ = _summary(steps_arr, np.array(state_rows), ev_arr, wall, ranks)
    summ["host_wall_seconds"] = wall * 64
    for k, factor in (doctor or {}).items():
        summ[k] *= factor
    model = {"vocab": 256, "context": 32, "layers": 2, "heads": 4, "hidden": 64, "family": "gpt2", "kv_heads": 0,
             "ffn": 0}
    cfg = {"preset": "tiny", "model": model, "tp": tp, "pp": 1, "steps": steps, "policy": policy, "micro_batch": MICRO,
           "micro_batches": 1, "seq": T, "checkpoint_every": checkpoint_every, "kill_mode": "signal",
           "timing": "paced", "spares": {"hosts": 0, "per_host": 0, "use": "revive"}, "failure_timeout": 10.0,
           "pacing": {"machine": machine, "emulate_shape": "gpt2-medium", "time_scale": "64"}}
    paced = {"machine": machine, "time_scale": 64.0, "emulate_shape": "gpt2-medium", "scale_out_gbps": 25 / 64,
             "device_gflops": 312e3 / 64, "scale_up_gbps": 300 / 64,
             "latency_us": 5 * 64, "charge": {"parameter_bytes": PACED_RATIO},
             "recovery": {k: {"value": v, "source": "synthetic"} for k, v in A100.items()} | {"machine": "dgx-a100"}}
    with h5py.File(path, "w") as f:
        for k, v in {"schema_version": "2", "ntpbench_version": "synthetic", "policy": policy, "timing": "paced",
                     "kill_mode": "signal", "config": json.dumps(cfg), "paced_machine": json.dumps(paced),
                     "hosts": json.dumps(["synth"] * ranks)}.items():
            f.attrs[k] = np.bytes_(v)
        for k, v in {"ranks": ranks, "tp": tp, "pp": 1, "replicas": dp, "tokens_per_sample": T}.items():
            f.attrs[k] = np.int64(v)
        f.attrs["peak_gflops_per_rank"] = np.float64(PEAK)
        _write_tables(f, steps_arr, tp_rows, batch_rows, state_rows, phase_rows, ev_arr)
        sg = f.create_group("summary")
        for k, v in summ.items():
            sg.attrs[k] = np.float64(v)
        sg.attrs["clock"] = np.bytes_("emulated")
    return summ
