"""The chaos checker (tests/chaos/verdict.py, chaos.py --check-only) against one real run and
doctored copies of it: the run passes, and each copy with one thing wrong fails on the rule that
judges that thing. A rule no copy fails would be a check that cannot fail.

The run: 8 ranks (TP 4 x DP 2) of tiny under real kills, rank 5 killed at step 3 and revived at
step 6, rank 1 slowed 3x from step 3 to 8 under --straggler-policy evict.
"""
import os
import pathlib
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

from conftest import BUILD, ENV, ROOT, needs_ulfm

sys.path.insert(0, str(ROOT / "tests" / "chaos"))
import chaos  # noqa: E402
import verdict  # noqa: E402

pytestmark = needs_ulfm

SCHEDULE = """events:
  - {step: 3, kill: [5], at: backward}
  - {step: 3, slow: [1], factor: 3.0}
  - {step: 6, revive: [5]}
  - {step: 8, slow: [1], factor: 1.0}
"""
JOB = {"policy": "ntp", "spares": "none", "straggler": "evict", "layout": "tp4dp2", "model": "gpt2"}


@pytest.fixture(scope="module")
def good_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("chaos-checker")
    sched = d / "schedule.yaml"
    sched.write_text(SCHEDULE)
    out = d / "good.h5"
    shm_before = verdict.shm_entries()
    p = subprocess.run(chaos.command(BUILD, JOB, 12, sched, out), env={**ENV, "PRTE_MCA_prte_allowed_exit_without_sync": "1",
                       "PRTE_MCA_state_base_recoverable": "1"}, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    facts = verdict.RunFacts(out)
    # What the copies below doctor must be there to doctor.
    assert facts.of_kind("straggler") and facts.of_kind("evict"), facts.events
    return out, verdict.load_schedule(sched), shm_before


def doctored(good, tmp_path, change):
    """A copy of the good run's file with `change(f)` applied."""
    copy = tmp_path / "doctored.h5"
    shutil.copy(good, copy)
    with h5py.File(copy, "r+") as f:
        change(f)
    return copy


def edit_events(f, change):
    ev = f["events"][()]
    ev = change(ev)
    del f["events"]
    f.create_dataset("events", data=ev, maxshape=(None,), chunks=True)


def kinds(ev):
    return np.array([k.decode() for k in ev["kind"]])


def without(good, tmp_path, *dropped):
    """A copy of the good run's file with no event of the kinds `dropped`."""
    return doctored(good, tmp_path, lambda f: edit_events(f, lambda ev: ev[~np.isin(kinds(ev), dropped)]))


def expect_fails(path, events, rc, words, shm_before=None):
    problems = verdict.check_run(path, events, rc, shm_before)
    assert any(words in p for p in problems), problems
    return problems


def test_the_good_run_passes_every_rule_and_replays(good_run):
    out, events, shm_before = good_run
    assert verdict.check_run(out, events, 0, shm_before) == []
    assert chaos.check(BUILD, out, events, 0) == []  # the replay and the report too
    cli = subprocess.run([sys.executable, str(ROOT / "tests/chaos/chaos.py"), "--check-only", str(out),
                          str(out.parent / "schedule.yaml"), "--rc", "0", "--build", str(BUILD)],
                         capture_output=True, text=True, timeout=600)
    assert cli.returncode == 0 and cli.stdout.strip().endswith("ok"), cli.stdout + cli.stderr


def test_a_death_the_schedule_did_not_cause(good_run, tmp_path):
    out, events, _ = good_run

    def extra_kill(ev):
        row = ev[kinds(ev) == "kill"][:1].copy()
        row["rank"], row["detail"] = 2, b"unscheduled: the process died"
        return np.concatenate([ev, row])
    path = doctored(out, tmp_path, lambda f: edit_events(f, extra_kill))
    expect_fails(path, events, 0, "death(s) the schedule did not cause: step 3 rank 2")


def test_an_outside_kill_is_a_death_the_run_must_record(good_run, tmp_path):
    """A rank killed from outside after step 3's line: its unscheduled death at step 4 is explained;
    without the event, or at another rank, or too late, it is not (the negative controls)."""
    out, events, _ = good_run

    def outside_kill(rank, step):
        def change(ev):
            row = ev[kinds(ev) == "kill"][:1].copy()
            row["rank"], row["step"], row["detail"] = rank, step, b"unscheduled: the process died"
            return np.concatenate([ev, row])
        return change
    explained = doctored(out, tmp_path, lambda f: edit_events(f, outside_kill(2, 4)))
    problems = verdict.check_run(explained, events, 0, outside=[(3, 2)])
    assert not any("did not cause" in p or "outside kill" in p for p in problems), problems

    def expect_outside(path, words):
        problems = verdict.check_run(path, events, 0, outside=[(3, 2)])
        assert any(words in p for p in problems), problems
    expect_outside(out, "the outside kill of rank 2 after step 3 has no death event")
    expect_outside(doctored(out, tmp_path, lambda f: edit_events(f, outside_kill(6, 4))),
                   "death(s) the schedule did not cause: step 4 rank 6")
    expect_outside(doctored(out, tmp_path, lambda f: edit_events(f, outside_kill(2, 4 + verdict.OUTSIDE_SLACK + 1))),
                   "the outside kill of rank 2 after step 3 has no death event")


def test_restart_trains_only_with_every_rank_alive():
    """Under restart the whole job waits for a repair (DESIGN: every rank stops): a rank killed
    from outside and never revived leaves no way forward, so exit 3 is the right end there, while
    under dp-drop the other replica trains on (no exit 3)."""
    import types
    facts = types.SimpleNamespace(policy="restart", tp=4, pp=1, dp=2, trainers=8, stage_of=lambda r: 0)
    events = [{"step": 4, "kill": [0]}, {"step": 9, "revive": [0]}]
    assert not verdict.schedule_leaves_no_replica(events, facts)  # every death revived
    assert verdict.schedule_leaves_no_replica(events, facts, outside=[(5, 6)])  # rank 6 never back
    facts.policy = "dp-drop"
    assert not verdict.schedule_leaves_no_replica(events, facts, outside=[(5, 6)])  # replica 0 is whole at 9


def test_a_scheduled_death_with_no_event(good_run, tmp_path):
    out, events, _ = good_run
    expect_fails(without(out, tmp_path, "kill"), events, 0, "kill events for ranks [], scheduled deaths [5]")


def test_exit_3_where_a_replica_could_train(good_run, tmp_path):
    out, events, _ = good_run
    expect_fails(out, events, 3, "exit 3 (no replica can go on)")


def test_exit_3_is_allowed_where_the_schedule_leaves_no_replica(good_run):
    facts = verdict.RunFacts(good_run[0])
    both = [{"step": 3, "kill": [1]}, {"step": 4, "kill": [6]}]
    facts.policy = "dp-drop"
    assert verdict.schedule_leaves_no_replica(both, facts)
    assert not verdict.schedule_leaves_no_replica([*both, {"step": 8, "revive": [6]}], facts)
    facts.policy = "ntp"  # each replica keeps 3 of its 4 ranks
    assert not verdict.schedule_leaves_no_replica(both, facts)


def test_a_summary_that_says_stopped_after_exit_0(good_run, tmp_path):
    out, events, _ = good_run
    path = doctored(out, tmp_path, lambda f: f["summary"].attrs.__setitem__("status", "stopped"))
    expect_fails(path, events, 0, "exit 0 but /summary status 'stopped'")


def test_a_revival_that_did_not_happen(good_run, tmp_path):
    out, events, _ = good_run
    expect_fails(without(out, tmp_path, "revive"), events, 0,
                 "scheduled revival(s) that did not happen: rank 5 at step 6")


def test_a_last_step_below_full_degree(good_run, tmp_path):
    out, events, _ = good_run

    def shrink(f):
        f["replicas/tp_degree"][-1, 1] = 3
        steps = f["steps"][()]
        steps["live_ranks"][-1] = 7
        f["steps"][...] = steps
    path = doctored(out, tmp_path, shrink)
    expect_fails(path, events, 0, "the last step ran with 7 live ranks of 8")
    expect_fails(path, events, 0, "TP degrees [4, 3]")


def test_a_checkpoint_reload_while_a_replica_held_every_shard(good_run, tmp_path):
    out, events, _ = good_run

    def restore(ev):
        row = ev[kinds(ev) == "revive"][:1].copy()
        # At step 2: before any death or eviction, when both replicas held every shard.
        row["step"], row["kind"], row["rank"], row["detail"] = 2, b"restore", -1, b"from step_000004.h5"
        return np.concatenate([ev, row])
    path = doctored(out, tmp_path, lambda f: edit_events(f, restore))
    expect_fails(path, events, 0, "while replica(s) [0, 1] never lost a rank")


def test_a_straggler_its_policy_did_not_act_on(good_run, tmp_path):
    out, events, _ = good_run
    expect_fails(without(out, tmp_path, "evict", "evict_refused"), events, 0,
                 "straggler rank 1 not acted on by --straggler-policy evict")


def test_a_dead_process_recorded_as_alive(good_run, tmp_path):
    out, events, _ = good_run

    def unend(f):
        inc = f["ranks/incarnations"][()]
        inc["t_end"][np.flatnonzero(inc["rank"] == 5)[0]] = np.nan
        f["ranks/incarnations"][...] = inc
    path = doctored(out, tmp_path, unend)
    expect_fails(path, events, 0, "rank 5: process")


def test_a_process_of_the_run_still_running(good_run, tmp_path):
    out, events, _ = good_run
    # A process whose executable is named like ntpbench's (a copy of sleep), standing for a rank left behind.
    fake = tmp_path / "ntpbench"
    shutil.copy("/bin/sleep", fake)
    proc = subprocess.Popen([str(fake), "60"])
    try:
        def pid_of_rank_2(f):
            inc = f["ranks/incarnations"][()]
            inc["pid"][np.flatnonzero(inc["rank"] == 2)[0]] = proc.pid
            f["ranks/incarnations"][...] = inc
        path = doctored(out, tmp_path, pid_of_rank_2)
        expect_fails(path, events, 0, f"1 process(es) of the run still running: pids [{proc.pid}]")
    finally:
        proc.kill()
        proc.wait()


def test_shared_memory_left_behind(good_run):
    out, events, _ = good_run
    before = verdict.shm_entries()
    leftover = pathlib.Path("/dev/shm") / f"sm_segment.checker-test.{os.getpid()}"
    leftover.write_bytes(b"")
    try:
        expect_fails(out, events, 0, f"left in /dev/shm: {leftover.name}", before)
    finally:
        leftover.unlink()
    assert verdict.check_run(out, events, 0, before) == []
