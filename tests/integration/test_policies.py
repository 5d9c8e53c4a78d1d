"""Every policy, and the edge cases of failure handling, through the real binary.

TP 4 x DP 2 (8 ranks) on `tiny`, B = 4 per replica: the per-step sample counts are what each
policy implies, and `--replay` on one rank reproduces the final parameters.
"""
import numpy as np
import pytest

from conftest import events, ntpbench, replay, replicas, schedule, steps

# The policies themselves, on the fence emulation (deterministic, any MPI); real kills of every
# policy are in test_real_failures.py.
TINY = ["--preset", "tiny", "--micro-batch", 4, "--quiet", "--kill-mode", "fence"]
KILL3_REVIVE8 = "events:\n  - {step: 3, kill: [3]}\n  - {step: 8, revive: [3]}\n"

# Samples per step for kill at 3, revive at 8, 12 steps.
EXPECTED = {
    "dp-drop": [8, 8] + [4] * 5 + [8] * 5,   # the damaged replica stops
    "ntp": [8, 8] + [7] * 5 + [8] * 5,       # TP 3 with batch floor(4 * 3 / 4) = 3
    "ntp-pw": [8] * 12,                      # TP 3 with the full batch
    "restart": [8, 8] + [0] * 5 + [8] * 5,   # everyone waits, then restarts
}


@pytest.mark.parametrize("policy", sorted(EXPECTED))
def test_policy_kill_and_revive(tmp_path, policy):
    out = tmp_path / f"{policy}.h5"
    ntpbench(8, *TINY, "--tp", 4, "--steps", 12, "--policy", policy, "--schedule",
             schedule(tmp_path, KILL3_REVIVE8), "--out", out)
    s = steps(out)
    assert s["samples"].tolist() == EXPECTED[policy]
    assert s["tokens"].tolist() == [n * 32 for n in EXPECTED[policy]]
    degrees = replicas(out).tolist()
    if policy in ("ntp", "ntp-pw"):
        assert degrees[2] == [3, 4] and degrees[7] == [4, 4]
    if policy == "restart":
        # No checkpoint yet: the revival restores the initial state and steps 1-2 are undone.
        assert s["tokens_committed"].tolist() == [0, 0] + [0] * 5 + [256] * 5
        assert s["optimizer_step"].tolist() == [1, 2] + [2] * 5 + [1, 2, 3, 4, 5]
        kinds = [k for _, k, _ in events(out)]
        assert "restore" in kinds and "rollback" in kinds and "recompute" in kinds
    else:
        assert (s["tokens_committed"] == s["tokens"]).all()
        assert any(k == "heal" for _, k, _ in events(out))
    replay(out)


def test_restart_resumes_from_the_last_checkpoint(tmp_path):
    out = tmp_path / "restart.h5"
    text = "events:\n  - {step: 7, kill: [5]}\n  - {step: 9, revive: [5]}\n"
    p = ntpbench(8, *TINY, "--tp", 4, "--steps", 12, "--policy", "restart", "--checkpoint-every", 5,
                 "--schedule", schedule(tmp_path, text), "--out", out)
    s = steps(out)
    # Steps 1-6 trained, 7-8 idle, 9 restores optimizer step 5: step 6 is undone and redone.
    assert s["optimizer_step"].tolist() == [1, 2, 3, 4, 5, 6, 6, 6, 6, 7, 8, 9]
    assert s["tokens_committed"].tolist() == [256] * 5 + [0] + [0, 0] + [256] * 4
    assert "step_000005.h5 (optimizer step 5)" in p.stdout
    # The console gives the policy as the reason, not lost shards (rank 5's replica-mates hold them).
    assert "--policy restart reloads the last checkpoint: restored" in p.stdout, p.stdout
    replay(out)


def test_replica_with_every_rank_dead_drops_out(tmp_path):
    out = tmp_path / "drop.h5"
    text = "events:\n  - {step: 3, kill: [4, 5, 6, 7]}\n  - {step: 6, revive: [4, 5, 6, 7]}\n"
    ntpbench(8, *TINY, "--tp", 4, "--steps", 8, "--policy", "ntp", "--schedule", schedule(tmp_path, text),
             "--out", out)
    assert replicas(out).tolist()[2:5] == [[4, 0]] * 3
    assert steps(out)["samples"].tolist() == [8, 8, 4, 4, 4, 8, 8, 8]
    replay(out)


def test_every_replica_down_idles_until_a_revival(tmp_path):
    out = tmp_path / "idle.h5"
    text = "events:\n  - {step: 4, kill: [0, 1, 2, 3, 4, 5, 6, 7]}\n  - {step: 6, revive: [0, 1, 2, 3, 4, 5, 6, 7]}\n"
    p = ntpbench(8, *TINY, "--tp", 4, "--steps", 8, "--policy", "ntp", "--checkpoint-every", 2,
                 "--schedule", schedule(tmp_path, text), "--out", out)
    s = steps(out)
    assert s["samples"].tolist() == [8, 8, 8, 0, 0, 8, 8, 8]
    assert (s["idle_seconds"][3:5] > 0).all() and np.isnan(s["loss"][3:5]).all()
    # Nobody kept step 3's state: the revival restores the checkpoint of step 2 and redoes step 3.
    assert "idle until a revival" in p.stdout and "optimizer step 2" in p.stdout
    assert s["tokens_committed"].tolist() == [256, 256, 0, 0, 0, 256, 256, 256]
    replay(out)


def test_a_rank_dead_at_a_checkpoint_restores_from_it_after_its_revival(tmp_path):
    """Rank 2 is down when step 5's checkpoint is written (replica 0 sits out), comes back, and is
    among the live ranks when every replica goes down and replica 1 restores that checkpoint. When
    replica 0 then returns, every one of its ranks must hold the restored state: rank 2 too knows
    the checkpoint it missed (found by the dp-drop soak, whose replay disagreed)."""
    out = tmp_path / "missed.h5"
    text = ("events:\n  - {step: 3, kill: [2]}\n  - {step: 7, revive: [2]}\n  - {step: 8, kill: [6]}\n"
            "  - {step: 10, kill: [2]}\n  - {step: 12, revive: [6]}\n  - {step: 14, revive: [2]}\n")
    p = ntpbench(8, *TINY, "--tp", 4, "--steps", 16, "--policy", "dp-drop", "--checkpoint-every", 5,
                 "--schedule", schedule(tmp_path, text), "--out", out)
    assert "restored" in p.stdout and "step_000005.h5 (optimizer step 5)" in p.stdout, p.stdout
    assert replicas(out).tolist()[13] == [4, 4]
    replay(out)


def test_every_replica_down_without_revival_is_refused(tmp_path):
    out = tmp_path / "never.h5"
    text = "events:\n  - {step: 4, kill: [3, 7]}\n"
    p = ntpbench(8, *TINY, "--tp", 4, "--steps", 8, "--policy", "dp-drop", "--schedule", schedule(tmp_path, text),
                 "--out", out, check=False)
    assert p.returncode == 2, p.stdout + p.stderr  # the schedule is refused before any step: a usage error
    assert "every replica is down" in p.stderr and "no revival is scheduled" in p.stderr
    assert p.stderr.count("no revival is scheduled") == 1, p.stderr  # rank 0's message alone
    assert not out.exists()


def test_shard_lost_in_every_replica_falls_back_to_the_checkpoint(tmp_path):
    out = tmp_path / "lost.h5"
    text = "events:\n  - {step: 4, kill: [0, 2]}\n  - {step: 7, revive: [0, 2]}\n"
    p = ntpbench(4, *TINY, "--tp", 2, "--steps", 9, "--policy", "ntp", "--checkpoint-every", 2,
                 "--schedule", schedule(tmp_path, text), "--out", out)
    assert "no live replica holds every shard" in p.stdout and "optimizer step 2" in p.stdout
    s = steps(out)
    assert s["tokens_committed"][2] == 0  # step 3 was undone
    assert replicas(out).tolist()[3] == [1, 1]
    replay(out)


def test_rank_zero_can_fail(tmp_path):
    out = tmp_path / "rank0.h5"
    text = "events:\n  - {step: 3, kill: [0]}\n  - {step: 6, revive: [0]}\n"
    ntpbench(8, *TINY, "--tp", 4, "--steps", 8, "--policy", "ntp", "--schedule", schedule(tmp_path, text),
             "--out", out)
    assert replicas(out).tolist()[3] == [3, 4]
    replay(out)


def test_kill_during_the_step_that_heals_another(tmp_path):
    out = tmp_path / "overlap.h5"
    text = ("events:\n  - {step: 3, kill: [1]}\n  - {step: 6, revive: [1], kill: [6]}\n"
            "  - {step: 9, revive: [6]}\n")
    ntpbench(8, *TINY, "--tp", 4, "--steps", 10, "--policy", "ntp", "--schedule", schedule(tmp_path, text),
             "--out", out)
    d = replicas(out).tolist()
    assert d[2] == [3, 4] and d[5] == [4, 3] and d[9] == [4, 4]
    replay(out)


def test_revive_kill_again_revive_again(tmp_path):
    out = tmp_path / "again.h5"
    text = ("events:\n  - {step: 2, kill: [5]}\n  - {step: 4, revive: [5]}\n  - {step: 6, kill: [5]}\n"
            "  - {step: 8, revive: [5]}\n")
    ntpbench(8, *TINY, "--tp", 4, "--steps", 9, "--policy", "ntp-pw", "--schedule", schedule(tmp_path, text),
             "--out", out)
    assert [r[1] for r in replicas(out).tolist()] == [4, 3, 3, 4, 4, 3, 3, 4, 4]
    replay(out)


def test_three_degrees_at_once(tmp_path):
    # 12 ranks, TP 4 x DP 3: replicas at TP 3 and TP 2 beside a healthy TP 4.
    out = tmp_path / "mixed.h5"
    text = "events:\n  - {step: 3, kill: [3, 6, 7]}\n  - {step: 7, revive: [3, 6, 7]}\n"
    ntpbench(12, *TINY, "--tp", 4, "--steps", 8, "--policy", "ntp", "--schedule", schedule(tmp_path, text),
             "--out", out)
    d = replicas(out).tolist()
    assert d[3] == [3, 2, 4] and d[7] == [4, 4, 4]
    assert steps(out)["samples"].tolist() == [12, 12] + [3 + 2 + 4] * 4 + [12, 12]
    replay(out)
