"""Real failures (--kill-mode signal, ULFM): a killed rank's process really dies, the survivors
learn it from MPI and carry on, a revived rank is a new process healed from its peers, and every
run still computes exactly what one rank computes on the committed steps (--replay AGREES).

4 ranks (TP 2 x DP 2) of `tiny` unless a case needs more. Skipped as a whole where the build's
MPI has no ULFM (`make MPI=system`): there kills are fenced and test_policies.py covers them. With
NTPBENCH_REQUIRE_ULFM=1 (CI's `make test`) each test fails there instead.
"""
import json
import os
import subprocess

import h5py
import numpy as np
import pytest

from conftest import MPIRUN, ROOT, ULFM, events, needs_ulfm, ntpbench, replay, replicas, run_and_kill, schedule, steps

pytestmark = needs_ulfm

TINY = ["--preset", "tiny", "--micro-batch", 4, "--quiet", "--kill-mode", "signal"]
PHASES = ["start", "forward", "backward", "sync", "optimizer"]


def incarnations(path):
    with h5py.File(path, "r") as f:
        return f["ranks"]["incarnations"][()]


def kill_details(path):
    with h5py.File(path, "r") as f:
        e = f["events"][()]
    return [(int(r["step"]), int(r["rank"]), r["detail"].decode()) for r in e if r["kind"].decode() == "kill"]


def check_new_process(path, rank):
    """The revived rank ran as a second process, and the first one is gone."""
    inc = incarnations(path)
    mine = inc[inc["rank"] == rank]
    assert len(mine) == 2, inc
    assert mine["pid"][0] != mine["pid"][1]
    assert np.isfinite(mine["t_end"][0]) and np.isnan(mine["t_end"][1])
    assert not os.path.exists(f"/proc/{int(mine['pid'][0])}")


@pytest.mark.parametrize("at", PHASES)
def test_kill_at_every_phase_is_survived_and_exact(tmp_path, at):
    out = tmp_path / f"{at}.h5"
    text = f"events:\n  - {{step: 3, kill: [3], at: {at}}}\n  - {{step: 6, revive: [3]}}\n"
    ntpbench(4, *TINY, "--tp", 2, "--steps", 8, "--policy", "ntp", "--schedule", schedule(tmp_path, text), "--out", out)
    s = steps(out)
    # Every step slot commits once: the interrupted step 3 is redone at TP [2, 1] with B 2.
    assert s["samples"].tolist() == [8, 8, 6, 6, 6, 8, 8, 8]
    assert (s["tokens_committed"] == s["tokens"]).all()
    assert replicas(out).tolist()[2] == [2, 1]
    assert kill_details(out) == [(3, 3, f"scheduled: SIGKILL at {at}")]
    kinds = [k for _, k, _ in events(out)]
    for k in ("lost", "notice", "repair", "heal", "spawn", "revive"):
        assert k in kinds, kinds
    check_new_process(out, 3)
    replay(out)


# Samples per step for a kill of rank 3 at backward in step 3 and its revival at 6, 8 steps.
EXPECTED = {
    "dp-drop": [8, 8, 4, 4, 4, 8, 8, 8],
    "ntp-pw": [8] * 8,
    "restart": [8, 8, 0, 0, 0, 8, 8, 8],
}


@pytest.mark.parametrize("policy", sorted(EXPECTED))
def test_every_policy_with_a_real_kill(tmp_path, policy):
    out = tmp_path / f"{policy}.h5"
    text = "events:\n  - {step: 3, kill: [3], at: backward}\n  - {step: 6, revive: [3]}\n"
    ntpbench(4, *TINY, "--tp", 2, "--steps", 8, "--policy", policy, "--schedule", schedule(tmp_path, text),
             "--out", out)
    assert steps(out)["samples"].tolist() == EXPECTED[policy]
    check_new_process(out, 3)
    replay(out)
    # The report's recovery columns add up: recov s is its parts plus a few ms no part names.
    rep = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "analysis", "report", str(out), "--json",
                          str(tmp_path / "report.json")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    row = json.loads((tmp_path / "report.json").read_text())[0]
    parts = ["repair", "detect", "reconfigure", "spawn", "spare", "heal"]
    assert row["recovery_spawn_seconds"] > 0 and row["recovery_repair_seconds"] > 0, row
    named = sum(row[f"recovery_{p}_seconds"] for p in parts)
    assert abs(row["recovery_seconds"] - named) <= 0.05 + 0.05 * row["recovery_seconds"], (row["recovery_seconds"], named)
    assert row["recovery_unnamed_seconds"] == pytest.approx(row["recovery_seconds"] - named)


def test_two_ranks_in_different_replicas_in_one_step(tmp_path):
    # Ranks 1 and 2 (replicas 0 and 1) die in one step and come back as two new processes.
    out = tmp_path / "two.h5"
    text = "events:\n  - {step: 2, kill: [1, 2], at: forward}\n  - {step: 4, revive: [1, 2]}\n"
    ntpbench(4, *TINY, "--tp", 2, "--steps", 6, "--policy", "ntp", "--schedule", schedule(tmp_path, text),
             "--out", out)
    assert steps(out)["samples"].tolist() == [8, 4, 4, 8, 8, 8]
    check_new_process(out, 1)
    check_new_process(out, 2)
    replay(out)


def test_the_replacement_itself_killed(tmp_path):
    # Rank 2's replacement dies too (at sync) and a third process takes rank 2. Open MPI 5.0.11's
    # runtime sometimes takes one more process down with a dying replacement: the run must still
    # finish and stay exact, whatever else it loses, and rank 2 must have had three processes.
    # mpirun must exit 0 (ntpbench() asserts it): the killed replacement's job is recoverable
    # (state_base_recoverable, jobs/prte-mca-params.conf); without it the launcher exits 137.
    out = tmp_path / "again.h5"
    text = ("events:\n  - {step: 2, kill: [2], at: forward}\n  - {step: 4, revive: [2]}\n"
            "  - {step: 6, kill: [2], at: sync}\n  - {step: 8, revive: [2]}\n")
    ntpbench(4, *TINY, "--tp", 2, "--steps", 10, "--policy", "ntp", "--schedule", schedule(tmp_path, text),
             "--out", out)
    inc = incarnations(out)
    pids = inc[inc["rank"] == 2]["pid"]
    assert len(pids) == 3 and len(set(pids)) == 3, inc
    assert (6, 2, "scheduled: SIGKILL at sync") in kill_details(out)
    assert len(steps(out)) == 10
    replay(out)


def test_a_death_during_the_repair_is_recorded_with_the_first(tmp_path):
    """Rank 3 dies in step 3's backward and rank 2 in the repair of that death, right after the
    survivors' shrink (at: repair): the repair starts again over ranks 0 and 1. Both deaths are the
    step's kills, both processes have ended, and the run, which lost replica 1, is exact. (The second
    pass once recorded only its own death: rank 3 had vanished from the results.)"""
    out = tmp_path / "cascade.h5"
    text = ("events:\n  - {step: 3, kill: [3], at: backward}\n  - {step: 3, kill: [2], at: repair}\n"
            "  - {step: 6, revive: [2, 3]}\n")
    ntpbench(4, *TINY, "--tp", 2, "--steps", 8, "--policy", "ntp", "--schedule", schedule(tmp_path, text),
             "--out", out)
    assert sorted(kill_details(out)) == [(3, 2, "scheduled: SIGKILL at repair"), (3, 3, "scheduled: SIGKILL at backward")]
    assert steps(out)["samples"].tolist() == [8, 8, 4, 4, 4, 8, 8, 8]
    check_new_process(out, 2)
    check_new_process(out, 3)
    replay(out)


@pytest.mark.parametrize("victim,spares", [(1, 0), (0, 0), (1, 2)], ids=["survivor", "recorder", "spare-handover"])
def test_a_death_during_a_revivals_handover_is_repaired_with_the_new_process(tmp_path, victim, spares):
    """Rank 3 comes back at step 6 (a new process, or a spare); rank `victim` dies in that handover,
    after the new process joined the group and before its heal (at: handover). The repair that
    follows is the merged group's: the new process is a member and is healed in it, the victim's
    death is the step's kill, and rank 3's revival is recorded (its handover's own heal never came).
    Once this ended the job with an error on every rank."""
    out = tmp_path / "handover.h5"
    text = (f"events:\n  - {{step: 3, kill: [3], at: backward}}\n  - {{step: 6, revive: [3]}}\n"
            f"  - {{step: 6, kill: [{victim}], at: handover}}\n  - {{step: 8, revive: [{victim}]}}\n")
    extra = ["--spares-per-host", spares, "--spare-use", "revive"] if spares else []
    ntpbench(4 + spares, *TINY, "--tp", 2, "--steps", 10, "--policy", "ntp", *extra,
             "--schedule", schedule(tmp_path, text), "--out", out)
    assert sorted(kill_details(out)) == sorted([(3, 3, "scheduled: SIGKILL at backward"),
                                                (6, victim, "scheduled: SIGKILL at handover")])
    # Replica 1 is short of rank 3 for steps 3-5; replica 0 of the victim for steps 6-7.
    assert steps(out)["samples"].tolist() == [8, 8, 6, 6, 6, 6, 6, 8, 8, 8]
    assert replicas(out).tolist()[5] == [1, 2]
    revived = [(s, r) for s, k, r in events(out) if k == "revive"]
    assert revived == [(6, 3), (8, victim)], revived
    check_new_process(out, 3)
    check_new_process(out, victim)
    replay(out)


def test_a_whole_replica_killed(tmp_path):
    out = tmp_path / "replica.h5"
    text = "events:\n  - {step: 2, kill: [2, 3], at: backward}\n  - {step: 5, revive: [2, 3]}\n"
    ntpbench(4, *TINY, "--tp", 2, "--steps", 7, "--policy", "ntp", "--schedule", schedule(tmp_path, text),
             "--out", out)
    assert steps(out)["samples"].tolist() == [8, 4, 4, 4, 8, 8, 8]
    replay(out)


def test_unscheduled_kill_from_outside(tmp_path):
    # rank 3's pid comes from /ranks/incarnations while the run writes the file.
    out = tmp_path / "outside.h5"
    code, output = run_and_kill(out, 4, [*TINY, "--tp", 2, "--steps", 40], victim=3, min_steps=5)
    assert code == 0 and "done: 40 steps" in output, output
    details = kill_details(out)
    assert len(details) == 1 and details[0][1] == 3 and details[0][2].startswith("unscheduled"), details
    assert "unscheduled death of rank(s) [3]" in output and "kill [3]" not in output, output
    assert replicas(out).tolist()[-1] == [2, 1]
    replay(out)


def test_an_unscheduled_death_comes_back_after_the_generators_repair_time(tmp_path):
    """With a `random` generator in the schedule, a process that dies with no kill event for it
    (here kill -9 from outside; in long runs also one Open MPI takes down with another's failure)
    is revived repair_steps later, as a generated failure would be."""
    out = tmp_path / "repaired.h5"
    quiet = schedule(tmp_path, "random: {mtbf_steps: 1.0e12, repair_steps: 4, seed: 1}\n")  # no failures of its own
    code, output = run_and_kill(out, 4, [*TINY, "--tp", 2, "--steps", 40, "--schedule", quiet], victim=3,
                                min_steps=5)
    assert code == 0 and "done: 40 steps" in output, output
    (died, rank, detail), = kill_details(out)
    assert rank == 3 and detail.startswith("unscheduled"), detail
    assert f"rank 3 died unscheduled: back at step {died + 4}" in output, output
    revived = [(step, r) for step, kind, r in events(out) if kind == "revive"]
    assert revived == [(died + 4, 3)], revived
    check_new_process(out, 3)
    assert replicas(out).tolist()[-1] == [2, 2]
    replay(out)


def test_logical_rank_zero_killed_the_recorder_moves(tmp_path):
    out = tmp_path / "r0.h5"
    text = "events:\n  - {step: 3, kill: [0], at: backward}\n  - {step: 6, revive: [0]}\n"
    p = ntpbench(4, "--preset", "tiny", "--micro-batch", 4, "--kill-mode", "signal", "--tp", 2, "--steps", 8,
                 "--schedule", schedule(tmp_path, text), "--out", out)
    assert "logical rank 1 takes over the results file" in p.stdout, p.stdout
    assert len(steps(out)) == 8 and steps(out)["step"].tolist() == list(range(1, 9))
    assert "recorder" in [k for _, k, _ in events(out)]
    check_new_process(out, 0)
    replay(out)


def test_a_replacement_that_becomes_the_recorder_reports_mfu(tmp_path):
    """Rank 0 dies and comes back as a new process; then rank 1, the recorder since, dies: the
    replacement of rank 0, now the lowest live rank, takes the file over and must know the run's
    peak (it never probed one) so that its rows and /summary carry an MFU."""
    out = tmp_path / "r0r1.h5"
    text = ("events:\n  - {step: 2, kill: [0], at: backward}\n  - {step: 4, revive: [0]}\n"
            "  - {step: 6, kill: [1], at: forward}\n  - {step: 8, revive: [1]}\n")
    p = ntpbench(4, "--preset", "tiny", "--micro-batch", 4, "--kill-mode", "signal", "--tp", 2, "--steps", 9,
                 "--schedule", schedule(tmp_path, text), "--out", out)
    assert "logical rank 0 takes over the results file" in p.stdout, p.stdout
    s = steps(out)
    assert len(s) == 9 and np.isfinite(s["mfu"]).all() and (s["mfu"] > 0).all(), s["mfu"]
    with h5py.File(out, "r") as f:
        assert f["summary"].attrs["mfu"] > 0
        e = f["events"][()]
    # One clock across processes: rows stamped by the original recorder and then by rank 0's
    # replacement follow each other in time, and no failure is noticed before its step began.
    assert (s["t_start"][1:] >= s["t_end"][:-1]).all(), (s["t_start"], s["t_end"])
    lost = e[e["kind"] == b"lost"]["duration"]
    assert len(lost) == 2 and (lost >= 0).all(), lost
    replay(out)


def test_no_way_forward_ends_the_run_with_the_dead_ranks_named(tmp_path):
    # One replica under dp-drop: a death stops it, and nothing will revive it.
    out = tmp_path / "stuck.h5"
    code, output = run_and_kill(out, 2, [*TINY, "--tp", 2, "--steps", 40, "--policy", "dp-drop"], victim=1)
    assert code != 0, output
    assert "no replica can train" in output and "[1]" in output, output
    s = steps(out)
    assert len(s) >= 3 and (s["tokens_committed"] == s["tokens"]).all()
    expect_stopped_with_the_death_recorded(out, 1)


def test_a_revival_that_cannot_help_is_no_way_forward(tmp_path):
    """Under restart, rank 3 killed from outside and nothing to revive it: the revival of rank 1 the
    schedule holds for later would not let a replica train again, so the run ends at once with exit 3,
    instead of idling every replica to its end with no final checkpoint (chaos seeds 150, 198)."""
    out = tmp_path / "restart-stuck.h5"
    text = "events:\n  - {step: 30, kill: [1]}\n  - {step: 35, revive: [1]}\n"
    code, output = run_and_kill(out, 4, [*TINY, "--tp", 2, "--steps", 40, "--policy", "restart", "--checkpoint-every",
                                         5, "--schedule", schedule(tmp_path, text)], victim=3)
    assert code == 3, output
    assert "no revival is scheduled that would let one train again" in output and "[3]" in output, output
    s = steps(out)
    assert 3 <= len(s) < 30, len(s)
    expect_stopped_with_the_death_recorded(out, 3)


def expect_stopped_with_the_death_recorded(out, rank):
    """A run ended by a death (exit 3) holds that death like any other: a kill event, the process's
    incarnation ended, and a /summary that says the run stopped (not `ok`)."""
    details = kill_details(out)
    assert [r for _, r, _ in details].count(rank) == 1, details
    inc = incarnations(out)
    assert np.isfinite(inc[inc["rank"] == rank]["t_end"]).all(), inc
    with h5py.File(out, "r") as f:
        summary = dict(f["summary"].attrs)
    assert summary["status"] == b"stopped" or summary["status"] == "stopped", summary
    assert "no replica can train" in str(summary["stop_reason"]), summary


def test_a_death_while_every_replica_idles_is_recorded(tmp_path):
    """Under restart every replica idles once rank 1 is dead (its revival is at step 30); rank 2 then
    killed from outside leaves no replica that revival could bring back: exit 3, and the death is
    in the file (it once ended the run unrecorded, with its process alive in /ranks/incarnations and
    a /summary that said ok)."""
    out = tmp_path / "idle-death.h5"
    text = "events:\n  - {step: 3, kill: [1], at: backward}\n  - {step: 30, revive: [1]}\n"
    code, output = run_and_kill(out, 4, [*TINY, "--tp", 2, "--steps", 40, "--policy", "restart", "--checkpoint-every",
                                         2, "--schedule", schedule(tmp_path, text)], victim=2, min_steps=6)
    assert code == 3, output
    assert "[1, 2]" in output, output
    s = steps(out)
    assert (s["samples"][5:] == 0).all(), s["samples"]  # it died while every replica idled
    expect_stopped_with_the_death_recorded(out, 2)


def test_a_replacement_that_became_the_recorder_carries_the_verdict(tmp_path):
    """The run's verdict is the exit status of the recorder alone (finish_mpi). Here the recorder
    at the end is the replacement of rank 0, in a job of its own (MPI_Comm_spawn): its exit 4
    (the last step not finite) must still be mpirun's."""
    out = tmp_path / "verdict.h5"
    text = ("events:\n  - {step: 2, kill: [0]}\n  - {step: 3, revive: [0]}\n  - {step: 4, kill: [1]}\n")
    p = ntpbench(4, "--preset", "tiny", "--tp", 2, "--steps", 6, "--lr", 1e30, "--clip", 0, "--on-nonfinite", "skip",
                 "--schedule", schedule(tmp_path, text), "--out", out, check=False)
    assert "logical rank 0 takes over the results file" in p.stdout, p.stdout
    assert p.returncode == 4 and "the training diverged" in p.stderr, (p.returncode, p.stdout + p.stderr)


def test_fence_mode_keeps_the_process(tmp_path):
    out = tmp_path / "fence.h5"
    text = "events:\n  - {step: 2, kill: [3]}\n  - {step: 4, revive: [3]}\n"
    ntpbench(4, "--preset", "tiny", "--quiet", "--kill-mode", "fence", "--tp", 2, "--steps", 5, "--schedule",
             schedule(tmp_path, text), "--out", out)
    inc = incarnations(out)
    assert len(inc) == 4  # nobody died: the same four processes throughout
    replay(out)


@pytest.mark.skipif(not ULFM, reason="this build's MPI has no ULFM: every kill is fenced")
def test_the_kill_mode_is_shown_and_kills_without_fault_tolerance_are_refused(tmp_path):
    """Under `mpirun --with-ft ulfm` the kills are real and the banner, the closing line and the
    file say so; the same command without fault tolerance is refused (exit 2) naming both ways, and
    runs with emulated kills when --kill-mode fence says so, recorded as fence."""
    text = "events:\n  - {step: 2, kill: [1]}\n  - {step: 3, revive: [1]}\n"
    plain = [m for m in MPIRUN if m not in ("--with-ft", "ulfm")]
    args = ("--preset", "tiny", "--tp", 1, "--steps", 4, "--policy", "ntp", "--schedule", schedule(tmp_path, text),
            "--no-final-checkpoint")
    real = tmp_path / "real.h5"
    p = ntpbench(2, *args, "--out", real, mpirun=MPIRUN)
    assert "kill mode: signal (kills are real SIGKILLs" in p.stdout and "| kill mode signal" in p.stdout, p.stdout
    with h5py.File(real) as f:
        assert f.attrs["kill_mode"] == "signal"
    refused = ntpbench(2, *args, "--out", tmp_path / "refused.h5", mpirun=plain, check=False)
    err = refused.stdout + refused.stderr
    assert refused.returncode == 2 and "launched without fault tolerance" in err, err
    assert "mpirun --with-ft ulfm" in err and "--kill-mode fence" in err, err
    assert not (tmp_path / "refused.h5").exists()
    fenced = tmp_path / "fenced.h5"
    p = ntpbench(2, *args, "--kill-mode", "fence", "--out", fenced, mpirun=plain)
    assert "| kill mode fence" in p.stdout and "will be fenced" not in p.stdout, p.stdout
    with h5py.File(fenced) as f:
        assert f.attrs["kill_mode"] == "fence"
