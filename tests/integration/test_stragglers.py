"""Stragglers: a schedule's `slow` event makes a rank's emulated device slower; with
--straggler-threshold every rank names it a straggler within --straggler-window steps, from the
same numbers, and names the end of its episode. Under --straggler-policy tolerate the job runs at
its pace; evict takes it out of the training groups (its process alive, under both kill modes)
until its probe names the end, then it rejoins; rebalance gives its replica shares by speed. Every
run computes what one rank computes (--replay AGREES). A healthy paced run names nobody.

8 ranks of `tiny` (TP 4 x DP 2), paced at 0.2 GFLOP/s, where the emulated device's time is well
above the real compute of 8 ranks sharing 2 cores (an honest emulation: no overruns to blur it)."""
import h5py
import numpy as np

import pytest

from conftest import ntpbench, replay, replicas, schedule, steps

PACED = ["--preset", "tiny", "--tp", 4, "--micro-batch", 4, "--quiet", "--timing", "paced", "--device-gflops", 0.2,
         "--straggler-threshold", 1.2, "--straggler-window", 3]


def event_rows(path, kinds):
    with h5py.File(path, "r") as f:
        e = f["events"][()]
    return [(int(x["step"]), x["kind"].decode(), int(x["rank"]), x["detail"].decode()) for x in e
            if x["kind"].decode() in kinds]


def test_a_slowed_rank_is_named_within_the_window_and_released(tmp_path):
    out = tmp_path / "slow.h5"
    text = "events:\n  - {step: 5, slow: [2], factor: 2.0}\n  - {step: 15, slow: [2], factor: 1}\n"
    ntpbench(8, *PACED, "--steps", 22, "--schedule", schedule(tmp_path, text), "--out", out)
    ev = event_rows(out, ("slow", "straggler", "straggler_end"))
    assert [(s, k, r) for s, k, r, _ in ev] == [(5, "slow", 2), (7, "straggler", 2), (15, "slow", 2),
                                                (17, "straggler_end", 2)], ev
    ratio = float(ev[1][3].split("x")[0].split()[-1])
    assert 1.8 <= ratio <= 2.2, ev[1]  # the factor, measured
    s = steps(out)
    dt = s["t_end"] - s["t_start"]
    slow, healthy = np.median(dt[6:14]), np.median(np.r_[dt[1:4], dt[16:]])
    # Tolerated: the job waits for the slowed rank at every TP collective and the DP sync; its
    # compute is most of a paced step here, so the step takes longer, but at most twice as long.
    assert 1.2 * healthy < slow < 2.05 * healthy, (slow, healthy)
    replay(out)


def test_a_healthy_paced_run_names_nobody(tmp_path):
    out = tmp_path / "healthy.h5"
    ntpbench(8, *PACED, "--steps", 20, "--out", out)
    assert event_rows(out, ("straggler", "straggler_end")) == []


SLOW_2 = "events:\n  - {step: 5, slow: [2], factor: 2.0}\n  - {step: 15, slow: [2], factor: 1}\n"
SLOW_END, WINDOW = 15, 3  # SLOW_2's episode ends at step 15 (factor 1); PACED's --straggler-window


def compute_share(path):
    with h5py.File(path, "r") as f:
        return f["ranks/compute_share"][()]


@pytest.mark.parametrize("kill_mode", ["fence", "signal"])
def test_evict_takes_the_straggler_out_until_its_probe_says_it_is_well(tmp_path, request, kill_mode):
    if kill_mode == "signal":
        request.getfixturevalue("ulfm")  # real kills' repair path: needs ULFM
    out = tmp_path / "evict.h5"
    p = ntpbench(8, *PACED, "--steps", 22, "--schedule", schedule(tmp_path, SLOW_2), "--straggler-policy", "evict",
                 "--policy", "ntp", "--kill-mode", kill_mode, "--out", out)
    ev = [(s, k, r) for s, k, r, _ in event_rows(out, ("straggler", "straggler_end", "evict", "rejoin"))]
    # Named after 3 slow steps (5-7), out from step 8. While out, it times a probe each step
    # (/ranks/probe_ratio); the end is named at the first step that closes 3 probes in a row at or
    # below the threshold (1.2), and it rejoins the step after. The probe reads 2x until step 14 and
    # 1x from 15, so the end comes at 17 at the earliest (SLOW_END + WINDOW - 1); on 2 busy cores a
    # probe can still read slow after that, and the recorded ratios say exactly when it must come.
    # At the latest 20 (SLOW_END + 2 x WINDOW - 1, rejoin at 21 of 22): one probe spoiled by a busy
    # core, at worst the window's last, starts the window again (none seen: over 8 runs, 4 in each
    # kill mode, every probe read 1.00 +- 0.01 from step 15 and every end came at 17). A later end,
    # or none, is a probe still measuring a slowdown that ended.
    with h5py.File(out, "r") as f:
        probe = f["ranks/probe_ratio"][()][:, 2]
    steps_out = np.flatnonzero(~np.isnan(probe)) + 1  # 1-based steps with a probe
    print(f"rank 2's probes, steps {steps_out[0]}-{steps_out[-1]}:", [round(float(x), 2) for x in probe[steps_out - 1]])
    assert steps_out[0] == 8, probe
    assert (probe[7:14] > 1.2).all(), probe  # slowed 2x: steps 8-14
    well = [s for s in steps_out if s >= 10 and (probe[s - 3:s] <= 1.2).all()]
    assert well, f"no {WINDOW} probes in a row at or below 1.2 after the slowdown ended at step {SLOW_END}: {probe}"
    end = well[0]
    earliest, latest = SLOW_END + WINDOW - 1, SLOW_END + 2 * WINDOW - 1
    assert earliest <= end <= latest, (end, probe)
    assert steps_out[-1] == end, (end, probe)  # probed until the end was named, no longer
    assert ev == [(7, "straggler", 2), (8, "evict", 2), (end, "straggler_end", 2), (end + 1, "rejoin", 2)], ev
    tp, batch, share = replicas(out), replicas(out, "batch"), compute_share(out)
    assert (tp[7:end] == [3, 4]).all() and (batch[7:end] == [3, 4]).all(), (tp, batch)  # steps 8-end
    assert (tp[:7] == [4, 4]).all() and (tp[end:] == [4, 4]).all(), tp
    assert (share[7:end, 2] == 0).all() and np.allclose(share[7:end, [0, 1, 3]].sum(axis=1), 1, atol=1e-5), share
    assert "rank 2: evict" in p.stdout, p.stdout[-2000:]
    replay(out)


def test_rebalance_shares_the_replica_by_speed(tmp_path):
    out = tmp_path / "rebalance.h5"
    ntpbench(8, *PACED, "--steps", 22, "--schedule", schedule(tmp_path, SLOW_2), "--straggler-policy", "rebalance",
             "--out", out)
    ev = [(s, k, r) for s, k, r, _ in event_rows(out, ("straggler", "straggler_end", "rebalance", "rebalance_end"))]
    # Per FLOP the rank stays 2x slower with its smaller share: no false end while it is slow.
    assert ev == [(7, "straggler", 2), (8, "rebalance", 2), (17, "straggler_end", 2), (18, "rebalance_end", 2)], ev
    tp, batch, share = replicas(out), replicas(out, "batch"), compute_share(out)
    assert (tp == [4, 4]).all(), tp
    assert (batch[7:17] == [3, 4]).all() and (batch[17:] == [4, 4]).all(), batch  # floor(4 x 1.02 x 7/8)
    slow, fast = share[7:17, 2], share[7:17, [0, 1, 3]]
    assert (slow < 0.2).all() and (fast > 0.25).all(), share[7:17]
    assert np.allclose(share[:7, :4], 0.25, atol=1e-3) and np.allclose(share[17:, :4], 0.25, atol=1e-3), share
    replay(out)


def test_an_eviction_that_would_lose_shards_is_refused(tmp_path):
    # One replica: no other rank holds the straggler's shards, so it stays (tolerated) and says why.
    out = tmp_path / "alone.h5"
    ntpbench(4, *PACED, "--steps", 12, "--schedule", schedule(tmp_path, SLOW_2.split("  - {step: 15")[0]),
             "--straggler-policy", "evict", "--out", out)
    ev = event_rows(out, ("evict", "evict_refused"))
    assert [(s, k, r) for s, k, r, _ in ev] == [(8, "evict_refused", 2)], ev
    assert "no live rank holds its shards" in ev[0][3], ev
    assert (replicas(out) == 4).all()


@pytest.mark.parametrize("kill_mode", ["fence", "signal"])
def test_a_rejoin_that_brings_back_the_only_replica_reloads_the_checkpoint(tmp_path, request, kill_mode):
    """dp-drop: rank 2 is evicted (replica 0 out), then rank 5 dies (replica 1 down): no replica
    trains and the state is dropped. When rank 2 rejoins, replica 0 trains again from the last
    checkpoint: the rejoin records the restore and the steps rolled back, as a repair would, and
    the run computes what one rank computes. (The rejoin once said "healed" and recorded neither,
    and --replay disagreed about the data cursor: found by make chaos, seed 17.)"""
    if kill_mode == "signal":
        request.getfixturevalue("ulfm")
    out = tmp_path / "rejoin.h5"
    text = ("events:\n  - {step: 3, slow: [2], factor: 2.0}\n  - {step: 8, kill: [5]}\n"
            "  - {step: 9, slow: [2], factor: 1}\n  - {step: 18, revive: [5]}\n")
    ntpbench(8, *PACED, "--steps", 20, "--policy", "dp-drop", "--straggler-policy", "evict", "--kill-mode", kill_mode,
             "--checkpoint-every", 3, "--schedule", schedule(tmp_path, text), "--out", out)
    ev = event_rows(out, ("evict", "rejoin", "restore", "rollback"))
    kinds = [k for _, k, _, _ in ev]
    assert kinds == ["evict", "rejoin", "restore", "rollback"], ev
    rejoin_step = ev[1][0]
    assert ev[2][0] == ev[3][0] == rejoin_step, ev
    # Optimizer steps 1-7 trained (eviction leaves replica 1), the checkpoint at 6 is reloaded.
    assert "step_000006.h5" in ev[2][3] and "1 steps rolled back (optimizer step 7 -> 6)" in ev[3][3], ev
    replay(out)


def test_a_policy_without_detection_is_refused(tmp_path):
    p = ntpbench(8, "--preset", "tiny", "--tp", 4, "--steps", 2, "--straggler-policy", "evict", "--out",
                 tmp_path / "x.h5", check=False)
    # A usage error: exit 2, and one message (rank 0's), naming the flag to set.
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.count("--straggler-policy evict acts on detected stragglers: set --straggler-threshold") == 1, \
        p.stderr
    assert not (tmp_path / "x.h5").exists()


@pytest.mark.parametrize("policy", ["evict", "rebalance"])
def test_a_replacement_joins_a_job_that_acts_on_a_straggler(tmp_path, ulfm, policy):
    # Rank 5 really dies at step 10 and a new process takes it at step 12, while rank 2 is evicted
    # or its replica rebalanced: the new process learns the eviction, the speeds and the detector's
    # state from the survivors, so every rank keeps reaching the same verdicts (the end at 17).
    out = tmp_path / f"{policy}.h5"
    text = SLOW_2 + "  - {step: 10, kill: [5]}\n  - {step: 12, revive: [5]}\n"
    ntpbench(8, *PACED, "--steps", 22, "--schedule", schedule(tmp_path, text), "--straggler-policy", policy,
             "--kill-mode", "signal", "--out", out)
    kinds = ("straggler", "straggler_end", "evict", "rejoin", "rebalance", "rebalance_end", "kill", "revive")
    ev = [(s, k, r) for s, k, r, _ in event_rows(out, kinds)]
    act, undo = ("evict", "rejoin") if policy == "evict" else ("rebalance", "rebalance_end")
    assert ev == [(7, "straggler", 2), (8, act, 2), (10, "kill", 5), (12, "revive", 5), (17, "straggler_end", 2),
                  (18, undo, 2)], ev
    assert len(steps(out)) == 22
    replay(out)
