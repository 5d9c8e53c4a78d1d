"""Pipeline parallelism through the real binary: TP 2 x PP 2 x DP 2 (8 ranks) of `llama-tiny` (one
layer per stage) and `tiny`, 4 micro-batches of 1 per replica, 1F1B.

A rank of the second stage dies in the middle of a step's backward and comes back; every policy
keeps the run exact (`--replay` on one rank AGREES), and under ntp every stage of the damaged
replica trains at TP 1 with its micro-batches cut to floor(4 x 1 / 2) = 2. Real kills where the
build's MPI has ULFM, the fence emulation elsewhere.
"""
import h5py
import numpy as np
import pytest

from conftest import ULFM, events, ntpbench, replay, replicas, schedule, steps

MODE = "signal" if ULFM else "fence"
PIPE = ["--tp", 2, "--pp", 2, "--micro-batch", 1, "--micro-batches", 4, "--quiet", "--kill-mode", MODE]
# Rank 2 = replica 0, stage 1, TP index 0.
KILL2_REVIVE6 = "events:\n  - {step: 3, kill: [2], at: backward}\n  - {step: 6, revive: [2]}\n"

EXPECTED = {
    "dp-drop": [8, 8] + [4] * 3 + [8] * 3,   # the damaged replica stops
    "ntp": [8, 8] + [6] * 3 + [8] * 3,       # TP 1 on both stages, 2 of 4 micro-batches
    "ntp-pw": [8] * 8,                       # TP 1 with every micro-batch
    "restart": [8, 8] + [0] * 3 + [8] * 3,   # everyone waits, then restarts
}


@pytest.mark.parametrize("policy", sorted(EXPECTED))
def test_stage_kill_and_revive(tmp_path, policy):
    out = tmp_path / f"{policy}.h5"
    p = ntpbench(8, "--preset", "llama-tiny", *PIPE, "--steps", 8, "--policy", policy, "--schedule",
                 schedule(tmp_path, KILL2_REVIVE6), "--out", out)
    s = steps(out)
    assert s["samples"].tolist() == EXPECTED[policy], p.stdout
    degrees = replicas(out).tolist()
    if policy in ("ntp", "ntp-pw"):
        assert degrees[2] == [1, 2] and degrees[6] == [2, 2]
        assert any(k == "heal" for _, k, _ in events(out))
    with h5py.File(out, "r") as f:
        assert f.attrs["pp"] == 2 and f.attrs["micro_batches"] == 4
        assert f["ranks/stage"][()].tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
        phases = f["ranks/phase_times"].attrs["phases"]
        phases = (phases.decode() if isinstance(phases, bytes) else str(phases)).split(",")
        pp = f["ranks/phase_times"][()][:, :, phases.index("pp_comm")]
        assert (pp[:2] > 0).all(), "every rank of a healthy pipeline sends or receives activations"
    replay(out)


def test_gpt2_tied_embedding_across_stages(tmp_path):
    """GPT-2's wte lives on the first stage (embedding) and the last (LM head); the two all-reduce
    its gradient, so the replay of a run with a heal on the last stage still agrees."""
    out = tmp_path / "gpt2.h5"
    ntpbench(8, "--preset", "tiny", *PIPE, "--steps", 8, "--policy", "ntp", "--schedule",
             schedule(tmp_path, KILL2_REVIVE6), "--out", out)
    assert steps(out)["samples"].tolist() == EXPECTED["ntp"]
    replay(out)


def test_pipeline_matches_one_stage(tmp_path):
    """The same run at PP 1 and PP 2 (same micro-batches): identical losses up to rounding."""
    a, b = tmp_path / "pp1.h5", tmp_path / "pp2.h5"
    common = ["--preset", "tiny", "--layers", 4, "--micro-batch", 2, "--micro-batches", 3, "--steps", 4, "--quiet"]
    ntpbench(2, *common, "--tp", 2, "--out", a)
    ntpbench(4, *common, "--tp", 2, "--pp", 2, "--out", b)
    la, lb = steps(a)["loss"], steps(b)["loss"]
    assert np.allclose(la, lb, rtol=1e-5, atol=0), (la, lb)


@pytest.mark.parametrize("args, message", [
    (["--pp", 3, "--layers", 3], "--tp 1 x --pp 3 = 3 does not divide the 4 ranks"),
    (["--pp", 4, "--layers", 2], "--pp 4 stages for a model of 2 layers"),
    (["--micro-batches", 0], "--micro-batches"),
])
def test_bad_pipeline_flags_are_refused(tmp_path, args, message):
    p = ntpbench(4, "--preset", "tiny", "--steps", 2, *args, "--out", tmp_path / "x.h5", check=False)
    assert p.returncode == 2, p.stdout + p.stderr
    assert message in p.stdout + p.stderr
