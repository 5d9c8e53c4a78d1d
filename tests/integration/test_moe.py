"""Mixtures of experts end to end: the flags refused where they do not fit, the routing's record in
/steps, and nonuniform expert parallelism after a real failure: 8 ranks of moe-tiny (TP 4 = EP 4 x
DP 2), rank 3 killed at step 4 and revived at step 10; in between its replica trains at EP 3 with
rank 3's experts on the survivors, and --replay on one rank agrees. The same with 6 experts over
EP 4 (2+2+1+1, then 2+2+2 over the survivors) and a capacity that drops assignments.
"""
import json
import subprocess
import sys

import h5py
import pytest

from conftest import ROOT, events, needs_ulfm, ntpbench, replay, replicas, schedule, steps

MOE = ["--preset", "moe-tiny", "--quiet"]
KILL_AND_REVIVE = "events:\n  - {step: 4, kill: [3]}\n  - {step: 10, revive: [3]}\n"


@pytest.mark.parametrize("args, message", [
    (["--preset", "tiny", "--experts", 4], "--experts applies to --model llama only"),
    (["--preset", "moe-tiny", "--top-k", 9], "--top-k 9 must be between 1 and the expert count 8"),
    (["--preset", "moe-tiny", "--experts", 3, "--tp", 4], "TP degree 4 must be at most the expert count (3)"),
    (["--preset", "moe-tiny", "--capacity-factor", -1], "--capacity-factor"),
])
def test_bad_moe_flags_are_refused(tmp_path, args, message):
    p = ntpbench(1, *args, "--steps", 1, "--out", tmp_path / "x.h5", check=False)
    assert p.returncode == 2, p.stdout + p.stderr
    assert message in p.stdout + p.stderr, p.stdout + p.stderr
    assert not (tmp_path / "x.h5").exists()


def test_the_routing_is_recorded(tmp_path):
    """Every step's kept and dropped assignments: with no capacity none is dropped and every token's
    top 2 of each layer are kept (2 layers x 2 x the step's tokens); with a capacity of 0.5 at least
    half the assignments are dropped, and the busiest expert's load is recorded against the mean."""
    free, capped = tmp_path / "free.h5", tmp_path / "capped.h5"
    ntpbench(2, *MOE, "--tp", 2, "--steps", 3, "--out", free, "--no-final-checkpoint")
    ntpbench(2, *MOE, "--tp", 2, "--steps", 3, "--capacity-factor", 0.5, "--out", capped, "--no-final-checkpoint")
    s, c = steps(free), steps(capped)
    assert (s["moe_dropped"] == 0).all() and (s["moe_kept"] == 2 * 2 * s["tokens"]).all(), s
    assert (c["moe_dropped"] >= c["tokens"] * 2 * 2 / 2).all(), c
    assert (c["moe_kept"] + c["moe_dropped"] == 2 * 2 * c["tokens"]).all(), c
    assert (s["moe_load_max"] >= 1).all() and (c["moe_load_max"] <= 0.5 + 1e-9).all(), (s, c)
    with h5py.File(free, "r") as f:
        model = json.loads(f.attrs["config"])["model"]
    assert model["experts"] == 8 and model["top_k"] == 2
    # Per expert: each row sums to the step's kept assignments (counted once per replica-stage, not
    # once per TP rank), and no expert holds more than the worst pass's load allows over the step.
    for run, st in ((free, s), (capped, c)):
        per_expert = tokens_per_expert(run)
        assert per_expert.shape == (3, 8) and (per_expert >= 0).all(), per_expert
        assert (per_expert.sum(axis=1) == st["moe_kept"]).all(), (per_expert, st["moe_kept"])
        even = st["tokens"] * 2 * 2 / 8  # layers x top-k x tokens over the experts
        assert (per_expert.max(axis=1) <= st["moe_load_max"] * even + 1e-9).all(), (per_expert, st)
    # The report's routing line: the shares read back from the file, and what capacity dropped.
    for run, st in ((free, s), (capped, c)):
        rep = subprocess.run([sys.executable, "-m", "analysis", "report", str(run)], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
        assert rep.returncode == 0, rep.stdout + rep.stderr
        share = tokens_per_expert(run).sum(axis=0) / st["moe_kept"].sum()
        line = next(l for l in rep.stdout.splitlines() if l.startswith("routing in"))
        assert (f"{st['moe_kept'].sum()} assignments kept, {st['moe_dropped'].sum()} dropped" in line
                and f"most {100 * share.max():.1f}% (expert {share.argmax()})" in line
                and f"least {100 * share.min():.1f}% (expert {share.argmin()})" in line), (line, share)
    dense = tmp_path / "dense.h5"
    ntpbench(1, "--preset", "tiny", "--steps", 1, "--quiet", "--out", dense, "--no-final-checkpoint")
    with h5py.File(dense, "r") as f:
        assert "moe" not in f


def tokens_per_expert(path):
    with h5py.File(path, "r") as f:
        return f["moe/tokens_per_expert"][()]


@needs_ulfm
@pytest.mark.parametrize("extra", [[], ["--experts", 6, "--capacity-factor", 1.0]])
def test_a_real_failure_moves_the_experts_and_replays(tmp_path, extra):
    out = tmp_path / "moe.h5"
    ntpbench(8, *MOE, "--tp", 4, "--steps", 14, "--policy", "ntp", "--kill-mode", "signal", *extra,
             "--schedule", schedule(tmp_path, KILL_AND_REVIVE), "--out", out)
    degrees = replicas(out).tolist()
    assert degrees[2] == [4, 4] and all(d == [3, 4] for d in degrees[3:9]) and degrees[9] == [4, 4], degrees
    kinds = [k for _, k, _ in events(out)]
    assert "kill" in kinds and "revive" in kinds, kinds
    s = steps(out)
    assert (s["tokens_committed"] == s["tokens"]).all(), s
    # Rank 3's experts train on its survivors while it is dead: every expert, by id, keeps tokens.
    # A row whose reports a failure kept from the recorder says so (-1 throughout).
    per_expert, gathered = tokens_per_expert(out), s["control_calls"] >= 0
    assert (per_expert[~gathered] == -1).all() and gathered[4:9].all(), (per_expert, gathered)
    assert (per_expert[gathered].sum(axis=1) == s["moe_kept"][gathered]).all(), (per_expert, s["moe_kept"])
    assert (per_expert[4:9] > 0).all(), per_expert
    replay(out)
    # The first step against the same replicas on one rank each (TP 1, DP 2): the same loss.
    two = tmp_path / "two.h5"
    ntpbench(2, *MOE, "--tp", 1, "--steps", 1, *extra, "--out", two, "--no-final-checkpoint")
    assert steps(two)["loss"][0] == pytest.approx(s["loss"][0], rel=1e-5)


@needs_ulfm
def test_pipeline_stages_with_micro_batches_replay(tmp_path):
    """TP 2 x PP 2 x DP 2 over 2 micro-batches of 4: the balancing loss is per micro-batch, so the
    replay must run each replica's micro-batches as passes of --micro-batch sequences (it took
    them as half the replica's batch, 2 sequences, and disagreed in chaos seeds 16 and 23)."""
    out = tmp_path / "pp.h5"
    text = "events:\n  - {step: 4, kill: [3]}\n  - {step: 8, revive: [3]}\n"
    ntpbench(8, *MOE, "--tp", 2, "--pp", 2, "--micro-batches", 2, "--steps", 10, "--policy", "ntp",
             "--kill-mode", "signal", "--schedule", schedule(tmp_path, text), "--out", out)
    assert replicas(out, "batch").tolist()[4] == [4, 8]
    # Each stage routes its own layers: the row is summed over the stages.
    assert (tokens_per_expert(out).sum(axis=1) == steps(out)["moe_kept"]).all()
    replay(out)
