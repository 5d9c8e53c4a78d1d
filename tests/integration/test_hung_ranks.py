"""Hung ranks (--kill-mode signal): a rank that stops answering without dying (a schedule's `hang`,
SIGSTOP at a phase; a `kill -STOP` from outside) is declared hung by the ranks of its host after
--failure-timeout, its process is ended, and the run repairs as after a death: every step commits,
mpirun exits 0 and --replay AGREES. A long step that keeps its process running is not a hang.

8 ranks of `tiny` (TP 4 x DP 2). Skipped where the build's MPI has no ULFM (NTPBENCH_REQUIRE_ULFM=1:
fails instead)."""
import os
import signal

import h5py
import numpy as np
import pytest

from conftest import MPIRUN, NTPBENCH, needs_ulfm, ntpbench, replay, replicas, run_and_kill, schedule, signal_when, steps

pytestmark = needs_ulfm

TINY = ["--preset", "tiny", "--micro-batch", 4, "--quiet", "--kill-mode", "signal", "--tp", 4]
TIMEOUT = 1.5  # --failure-timeout of these runs


def hang_events(path):
    return [(s, r, d, det) for s, k, r, d, det in full_events(path) if k == "hang"]


def full_events(path):
    with h5py.File(path, "r") as f:
        e = f["events"][()]
    return [(int(x["step"]), x["kind"].decode(), int(x["rank"]), float(x["duration"]), x["detail"].decode()) for x in e]


def first_pid(path, rank):
    with h5py.File(path, "r") as f:
        inc = f["ranks"]["incarnations"][()]
    return int(inc[inc["rank"] == rank]["pid"][0])


def step_seconds(path):
    s = steps(path)
    return float(np.median(s["t_end"] - s["t_start"]))


def check_latency(path, latency):
    # Declared no sooner than the timeout after its last heartbeat, and no later than the timeout
    # plus one beat period (a eighth of it), one step, and slack for 8 ranks sharing 2 cores.
    assert TIMEOUT <= latency <= TIMEOUT * 1.125 + step_seconds(path) + 0.5, latency


@pytest.mark.parametrize("policy", ["ntp", "dp-drop"])
@pytest.mark.parametrize("at", ["forward", "sync"])
def test_a_scheduled_hang_is_found_fenced_and_repaired(tmp_path, policy, at):
    out = tmp_path / f"{policy}-{at}.h5"
    text = f"events:\n  - {{step: 4, hang: [5], at: {at}}}\n  - {{step: 8, revive: [5]}}\n"
    ntpbench(8, *TINY, "--steps", 10, "--policy", policy, "--failure-timeout", TIMEOUT,
             "--schedule", schedule(tmp_path, text), "--out", out)  # mpirun exits 0
    s = steps(out)
    assert len(s) == 10 and (s["tokens_committed"] == s["tokens"]).all()
    [(step, rank, latency, detail)] = hang_events(out)
    assert (step, rank) == (4, 5)
    check_latency(out, latency)
    assert "declared hung" in detail and "SIGKILL" in detail
    kills = [(st, r, det) for st, k, r, _, det in full_events(out) if k == "kill"]
    assert kills == [(4, 5, f"scheduled: SIGSTOP at {at} (a hang), fenced")]
    assert not os.path.exists(f"/proc/{first_pid(out, 5)}"), "the frozen process is still there"
    replay(out)


def test_a_kill_stop_from_outside_is_an_unscheduled_hang(tmp_path):
    out = tmp_path / "stopped.h5"
    rc, output = run_and_kill(out, 8, [*TINY, "--steps", 40, "--policy", "dp-drop", "--failure-timeout", TIMEOUT],
                              victim=6, sig=signal.SIGSTOP)
    assert rc == 0, output
    assert "rank 6 stopped answering (last heartbeat" in output, output
    [(_, rank, latency, _)] = hang_events(out)
    assert rank == 6
    check_latency(out, latency)
    kills = [det for _, k, r, _, det in full_events(out) if k == "kill"]
    assert kills == ["unscheduled: the process stopped answering (hung), fenced"]
    assert not os.path.exists(f"/proc/{first_pid(out, 6)}")
    s = steps(out)
    assert len(s) == 40 and (s["tokens_committed"] == s["tokens"]).all()
    replay(out)


def test_a_long_step_is_not_a_hang(tmp_path):
    # Paced at 0.02 GFLOP/s, a step of `tiny` sleeps about 2 s between its collectives, and each is
    # followed by a checkpoint write: longer than the 0.5 s timeout, but every process's heartbeat
    # thread runs on.
    out = tmp_path / "slow.h5"
    ntpbench(8, *TINY, "--steps", 3, "--timing", "paced", "--device-gflops", 0.02, "--failure-timeout", 0.5,
             "--checkpoint-every", 1, "--out", out)
    assert step_seconds(out) > 1.0, "the steps were not long enough to show anything"
    assert not [k for _, k, _, _, _ in full_events(out) if k in ("kill", "hang")]
    assert len(steps(out)) == 3


def test_under_fence_a_hang_is_an_emulated_kill(tmp_path):
    out = tmp_path / "fence.h5"
    text = "events:\n  - {step: 2, hang: [1]}\n  - {step: 4, revive: [1]}\n"
    ntpbench(4, "--preset", "tiny", "--micro-batch", 4, "--quiet", "--tp", 2, "--kill-mode", "fence", "--steps", 5,
             "--schedule", schedule(tmp_path, text), "--out", out)
    ev = [(s, k, r) for s, k, r, _, _ in full_events(out) if k in ("kill", "revive", "hang")]
    assert ev == [(2, "kill", 1), (4, "revive", 1)], ev  # an emulated kill: no heartbeat watch involved
    # Rank 1's replica trains at TP 1 for steps 2 and 3 and is whole again from step 4; every step trains.
    assert replicas(out).tolist() == [[2, 2], [1, 2], [1, 2], [2, 2], [2, 2]]
    assert (steps(out)["tokens_committed"] > 0).all()
    replay(out)


def test_a_hung_rank_continued_before_it_is_declared_leaves_the_job(tmp_path):
    # Rank 5 freezes at step 3 under a 60 s timeout; the test continues it (kill -CONT) at once. It
    # must not train on as if nothing happened: it dies as a killed rank would, and the run
    # repairs and finishes.
    out = tmp_path / "cont.h5"
    text = "events:\n  - {step: 3, hang: [5], at: forward}\n"
    cmd = [*MPIRUN, "-np", "8", str(NTPBENCH), *map(str, TINY), "--steps", "8", "--policy", "ntp",
           "--failure-timeout", "60", "--schedule", str(schedule(tmp_path, text)), "--out", str(out)]

    def stopped_rank5(f):
        inc = f["ranks"]["incarnations"][()]
        candidate = int(inc[inc["rank"] == 5]["pid"][0])
        with open(f"/proc/{candidate}/stat") as st:
            return candidate if st.read().rsplit(")", 1)[1].split()[0] == "T" else None

    rc, output, pid = signal_when(cmd, out, stopped_rank5, signal.SIGCONT, poll=0.2)
    assert rc == 0, output
    assert not os.path.exists(f"/proc/{pid}")
    assert hang_events(out) == []  # nobody declared it: it left by itself
    kills = [det for _, k, r, _, det in full_events(out) if k == "kill"]
    assert kills == ["scheduled: SIGSTOP at forward (a hang; no peer of its host ended it)"], kills
    s = steps(out)
    assert len(s) == 8 and (s["tokens_committed"] == s["tokens"]).all()
    replay(out)
