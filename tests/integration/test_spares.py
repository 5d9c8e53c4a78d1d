"""Spare processes (--spares-per-host, --spare-use): a job of 12 processes on this host, 8 trainers
(TP 4 x DP 2 of `tiny`) and 4 spares. A dead rank comes back as a spare that was there from the
start, never as a new process while a spare is left: every pid in /ranks/incarnations is one of the
job's first 12. Every run still computes what one rank computes on its committed steps (--replay
AGREES)."""
import json
import os
import signal
import subprocess

import h5py
import pytest

from conftest import MPIRUN, NTPBENCH, ROOT, events, needs_ulfm, ntpbench, replay, replicas, run_and_kill, schedule, \
    signal_when, steps

pytestmark = needs_ulfm

def job(spares_per_host=4):
    return ["--preset", "tiny", "--tp", 4, "--micro-batch", 4, "--quiet", "--kill-mode", "signal",
            "--spares-per-host", spares_per_host]


JOB = job()
PHASES = ["start", "forward", "backward", "sync", "optimizer"]


def processes(path):
    """(pids of the spares at job start, {logical rank: [pid of each incarnation]})."""
    with h5py.File(path, "r") as f:
        spares = [s["pid"] for s in json.loads(f.attrs["spares"])]
        inc = f["ranks"]["incarnations"][()]
    held = {}
    for row in inc:
        held.setdefault(int(row["rank"]), []).append(int(row["pid"]))
    return spares, held


def summary(path):
    with h5py.File(path, "r") as f:
        return dict(f["summary"].attrs)


def check_taken_by_spare(path, rank):
    """`rank`'s second process is one of the job's spares and its first is gone; no other rank changed
    process."""
    spares, held = processes(path)
    assert len(held[rank]) == 2 and held[rank][1] in spares, (held, spares)
    assert not os.path.exists(f"/proc/{held[rank][0]}")
    assert all(len(pids) == 1 for r, pids in held.items() if r != rank), held
    assert "spawn" not in [k for _, k, _ in events(path)]


@pytest.mark.parametrize("at", PHASES)
def test_takeover_at_every_phase(tmp_path, at):
    out = tmp_path / f"{at}.h5"
    text = f"events:\n  - {{step: 3, kill: [5], at: {at}}}\n"
    ntpbench(12, *JOB, "--spare-use", "takeover", "--steps", 6, "--schedule", schedule(tmp_path, text), "--out", out)
    s = steps(out)
    assert (s["tokens_committed"] == s["tokens"]).all() and (s["samples"] == 8).all(), s
    # The replica is back at full degree within the repair of step 3: no step ran degraded.
    assert replicas(out).tolist() == [[4, 4]] * 6
    assert [e for e in events(out) if e[1] == "takeover"] == [(3, "takeover", 5)]
    # One reconfiguration, the handover's: the survivors do not first shrink to TP 3.
    assert [e for e in events(out) if e[1] in ("reconfigure", "heal")] == [(3, "reconfigure", -1), (3, "heal", -1)]
    check_taken_by_spare(out, 5)
    assert summary(out)["spares_used"] == 1 and summary(out)["spares_left"] == 3
    replay(out)


def test_a_takeover_of_a_rank_of_each_replica_heals_each_from_the_other_in_one_reconfiguration(tmp_path):
    """Ranks 1 (replica 0, TP index 1) and 6 (replica 1, TP index 2) die in one step: their spares are
    healed in by one reconfiguration, each shard from the replica that still holds it, no restore."""
    out = tmp_path / "two.h5"
    text = "events:\n  - {step: 3, kill: [1, 6], at: backward}\n"
    ntpbench(12, *JOB, "--spare-use", "takeover", "--steps", 6, "--schedule", schedule(tmp_path, text), "--out", out)
    ev = events(out)
    assert sorted(e for e in ev if e[1] == "takeover") == [(3, "takeover", 1), (3, "takeover", 6)], ev
    assert [e for e in ev if e[1] in ("reconfigure", "heal", "restore")] == [(3, "reconfigure", -1), (3, "heal", -1)], ev
    assert replicas(out).tolist() == [[4, 4]] * 6
    s = steps(out)
    assert (s["samples"] == 8).all(), s
    replay(out)


def test_takeover_lets_a_schedule_leave_no_replica_without_a_revival(tmp_path):
    """dp-drop, one rank of each replica killed and none revived: without spares the schedule is
    refused before training (every replica down from step 4); with takeover spares it is the
    pool's to serve at run time, and the spares bring both replicas back at once."""
    text = "events:\n  - {step: 3, kill: [1]}\n  - {step: 4, kill: [6]}\n"
    sched = schedule(tmp_path, text)
    p = ntpbench(8, *JOB[:-2], "--policy", "dp-drop", "--steps", 6, "--schedule", sched,
                 "--out", tmp_path / "refused.h5", check=False)
    assert p.returncode == 2 and "every replica is down" in p.stderr, p.stderr
    out = tmp_path / "takeover.h5"
    ntpbench(12, *JOB, "--spare-use", "takeover", "--policy", "dp-drop", "--steps", 6, "--schedule", sched,
             "--out", out)
    assert [e for e in events(out) if e[1] == "takeover"] == [(3, "takeover", 1), (4, "takeover", 6)]
    assert replicas(out).tolist() == [[4, 4]] * 6
    replay(out)


def test_revive_is_served_by_a_spare(tmp_path):
    out = tmp_path / "revive.h5"
    text = "events:\n  - {step: 3, kill: [5], at: backward}\n  - {step: 6, revive: [5]}\n"
    ntpbench(12, *JOB, "--spare-use", "revive", "--steps", 8, "--schedule", schedule(tmp_path, text), "--out", out)
    assert replicas(out).tolist() == [[4, 4]] * 2 + [[4, 3]] * 3 + [[4, 4]] * 3
    assert [e for e in events(out) if e[1] == "spare"] == [(6, "spare", 5)]
    check_taken_by_spare(out, 5)
    replay(out)
    # The report recomputes every /summary figure (the spares' included) and shows the handover.
    p = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "analysis", "report", str(out), "--wide"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "spare s" in p.stdout, p.stdout + p.stderr


def test_an_outside_kill_is_taken_over(tmp_path):
    out = tmp_path / "outside.h5"
    code, output = run_and_kill(out, 12, [*JOB, "--spare-use", "takeover", "--steps", 30], victim=6, min_steps=4,
                                trainers=8)
    assert code == 0 and "done: 30 steps" in output, output
    assert "takeover" in [k for _, k, _ in events(out)]
    check_taken_by_spare(out, 6)
    assert replicas(out).tolist()[-1] == [4, 4]
    replay(out)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_a_dead_spare_leaves_the_pool(tmp_path, sig):
    """Spare 0 is killed (or frozen: a frozen spare once held the repair's agreement until the watchdog
    ended the job) from outside while it waits; at the next repair (rank 5's death) the pool records
    it lost, and the rank goes to spare 1."""
    out = tmp_path / "spare-lost.h5"
    text = "events:\n  - {step: 12, kill: [5], at: forward}\n"
    cmd = [*MPIRUN, "-np", "12", str(NTPBENCH), *map(str, JOB), "--spare-use", "takeover", "--steps", 16,
           "--timing", "paced", "--device-gflops", "0.2", "--failure-timeout", "1.5", "--hang-timeout", "120",
           "--schedule", str(schedule(tmp_path, text)), "--out", str(out)]

    def spare0(f):
        return json.loads(f.attrs["spares"])[0]["pid"] if len(f["steps"]) >= 3 and "spares" in f.attrs else None

    rc, output, _ = signal_when(cmd, out, spare0, sig, poll=0.3, run_timeout=240)
    assert rc == 0 and "done: 16 steps" in output, output
    kinds = [(s, k) for s, k, _ in events(out)]
    assert (12, "spare_lost") in kinds and (12, "takeover") in kinds, kinds
    with h5py.File(out, "r") as f:
        lost = [e["detail"].decode() for e in f["events"][()] if e["kind"].decode() == "spare_lost"]
    assert lost == ["spare 0 (%s) %s" % (os.uname().nodename,
                                         "froze; a process of its host ended it" if sig == signal.SIGSTOP else "died")]
    spares, held = processes(out)
    assert held[5][1] == spares[1], (held, spares)
    assert summary(out)["spares_left"] == 2
    replay(out)


def test_the_recorder_taken_over(tmp_path):
    """Logical rank 0 dies: rank 1 takes the results file over, and a spare takes rank 0."""
    out = tmp_path / "r0.h5"
    text = "events:\n  - {step: 2, kill: [0], at: forward}\n"
    p = ntpbench(12, *JOB, "--spare-use", "takeover", "--steps", 5, "--schedule", schedule(tmp_path, text),
                 "--out", out)
    assert "logical rank 1 takes over the results file" in p.stdout, p.stdout
    assert steps(out)["step"].tolist() == [1, 2, 3, 4, 5]
    check_taken_by_spare(out, 0)
    replay(out)


def test_with_no_spare_left_a_revival_spawns(tmp_path):
    """One spare, two revivals, one host: the first takes the spare, the second a new process."""
    out = tmp_path / "spent.h5"
    text = ("events:\n  - {step: 2, kill: [1], at: forward}\n  - {step: 3, revive: [1]}\n"
            "  - {step: 4, kill: [6], at: forward}\n  - {step: 5, revive: [6]}\n")
    ntpbench(9, *job(spares_per_host=1), "--steps", 6, "--schedule", schedule(tmp_path, text), "--out", out)
    kinds = [(s, k) for s, k, _ in events(out)]
    assert (3, "spare") in kinds and (5, "spawn") in kinds, kinds
    spares, held = processes(out)
    assert held[1][1] in spares and held[6][1] not in spares, (held, spares)
    assert summary(out)["spares_left"] == 0
    replay(out)
    # analysis revivals pairs each handover with the heal that follows it, against memcpy.
    p = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "analysis", "revivals", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [line.split() for line in p.stdout.splitlines() if line.split()[:1] in (["3"], ["5"])]
    assert [(r[0], r[1], r[2]) for r in rows] == [("3", "spare", "1"), ("5", "spawn", "-1")], p.stdout
    assert all(float(r[4]) > 0 and float(r[6]) > 0 for r in rows), p.stdout  # a heal and its bandwidth each
    assert "spare       1 revival(s)" in p.stdout and "spawn       1 revival(s)" in p.stdout, p.stdout
    # The report's recovery columns name both: the spawn's seconds and the spare's.
    p = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "analysis", "report", str(out), "--wide"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    lines = p.stdout.splitlines()
    at = [i for i, line in enumerate(lines) if line.startswith("file ")][1]  # the recovery's table
    head, row = lines[at], lines[at + 2]
    cells = dict(zip([h.strip() for h in head.split("  ") if h.strip()], row.split()))
    assert float(cells["spawn s"]) > 0.1 and 0 < float(cells["spare s"]) < float(cells["spawn s"]), p.stdout


@pytest.mark.parametrize("flags, message", [
    (["--spares-per-host", 4, "--kill-mode", "fence"], "need --kill-mode signal"),
    (["--spares-per-host", 12], "leaves no trainer on host"),
    (["--spare-hosts", 1], "leaves no host to train on"),
    (["--spares-per-host", 2], "does not divide the 10 trainer ranks"),
])
def test_spares_that_cannot_work_are_refused(tmp_path, flags, message):
    p = ntpbench(12, "--preset", "tiny", "--tp", 4, "--steps", 2, *flags, "--out", tmp_path / "x.h5", check=False)
    assert p.returncode == 2 and message in p.stderr, p.stderr
    assert p.stderr.count("ntpbench: error") == 1, p.stderr
    assert not (tmp_path / "x.h5").exists()


def test_a_death_in_the_repair_of_a_takeover_during_a_rebalance(tmp_path):
    """Every failure kind at once: rank 2 slowed and rebalanced around, then rank 5 dies before its
    update and rank 4 in the repair of that death. The spares' own repair of the pool met the
    second death and left the job (`MPI_Allgather: communicator revoked`), and the trainers waited
    for them until killed; now the spares repair in as many passes as the trainers do, take both
    ranks, and the run finishes, records both deaths and replays."""
    out = tmp_path / "chaos.h5"
    text = ("events:\n  - {step: 3, slow: [2], factor: 3.0}\n  - {step: 5, kill: [5], at: optimizer}\n"
            "  - {step: 5, kill: [4], at: repair}\n  - {step: 11, slow: [2], factor: 1.0}\n")
    ntpbench(12, "--preset", "tiny", "--heads", 8, "--hidden", 128, "--tp", 4, "--steps", 14, "--policy", "ntp",
             "--kill-mode", "signal", "--failure-timeout", 1.5, "--timing", "paced", "--straggler-threshold", 1.3,
             "--straggler-window", 2, "--straggler-policy", "rebalance", "--spares-per-host", 4, "--spare-use",
             "takeover", "--schedule", schedule(tmp_path, text), "--out", out, "--quiet", timeout=180)
    ev = events(out)
    assert sorted(r for _, k, r in ev if k == "kill") == [4, 5], ev
    assert sorted(r for _, k, r in ev if k == "takeover") == [4, 5], ev
    assert len(steps(out)) == 14
    replay(out)
