"""`python -m analysis simulate --from-run` against real paced runs: the model of analysis/simulate/from_run.py
(step times taken from the run, every recovery part charged from jobs/machines/dgx-a100.yaml, heals and
restores by the bytes its port of ntpbench's layouts moves) predicts each run's emulated ETTR and goodput
within 2%, and its negative controls fail: the same files against a profile whose `replace` costs twice as
much, and a copy whose /summary was doctored.

4 ranks of tiny (TP 2 x DP 2) charged as gpt2-medium on an emulated DGX A100 at time scale 64, 10 steps,
rank 3 killed for real (SIGKILL) at step 3 and revived by a new process at step 6, under ntp, dp-drop and
restart (a checkpoint every 2 steps)."""
import shutil
import subprocess
import sys

import h5py
import pytest

from conftest import ROOT, needs_ulfm, ntpbench, schedule

sys.path.insert(0, str(ROOT))
from analysis.runfile import load_run  # noqa: E402
from analysis.simulate import shards  # noqa: E402
from analysis.simulate.from_run import predict  # noqa: E402

POLICIES = {"ntp": [], "dp-drop": [], "restart": ["--checkpoint-every", 2]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("from_run")
    sched = schedule(d, "events:\n  - {step: 3, kill: [3]}\n  - {step: 6, revive: [3]}\n")
    out = {}
    for policy, extra in POLICIES.items():
        out[policy] = d / f"{policy}.h5"
        ntpbench(4, "--preset", "tiny", "--tp", 2, "--timing", "paced", "--machine", "dgx-a100", "--emulate-shape",
                 "gpt2-medium", "--time-scale", 64, "--steps", 10, "--schedule", sched, "--policy", policy, *extra,
                 "--out", out[policy], "--quiet")
    return out


def simulate(*args):
    return subprocess.run([sys.executable, "-m", "analysis", "simulate", "--from-run", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@needs_ulfm
@pytest.mark.parametrize("policy", list(POLICIES))
def test_prediction_within_two_percent(runs, policy):
    run = load_run(runs[policy])
    assert run.summary["status"] == "ok" and run.attrs["kill_mode"] == "signal", run.summary
    f, p = predict(run)
    assert p.ettr == pytest.approx(run.summary["ettr"], rel=0.02), (p.parts, run.summary)
    assert p.goodput == pytest.approx(run.summary["goodput_tokens_per_s"], rel=0.02), (p.parts, run.summary)
    # The port of ntpbench's heal and restore plans moves the run's bytes exactly.
    assert p.moved_bytes == run.summary["heal_bytes"]
    assert p.tokens_committed == run.summary["tokens_committed"]
    assert f.notes == [] and p.notes == [], (f.notes, p.notes)


@needs_ulfm
def test_cli_verdict_and_negative_controls(runs, tmp_path):
    files = [runs[p] for p in POLICIES]
    ok = simulate(*files)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "step times taken from the run" in ok.stdout and "verdict: ok: 3 run(s)" in ok.stdout
    # A profile that charges twice the replacement: every run revived a rank, so none matches.
    machines = tmp_path / "machines"
    shutil.copytree(ROOT / "jobs" / "machines", machines)
    y = machines / "dgx-a100.yaml"
    y.write_text(y.read_text().replace("replace: {value: 20,", "replace: {value: 40,"))
    dear = simulate(*files, "--machines-dir", machines)
    assert dear.returncode == 1 and dear.stdout.count("MISMATCH") == 4, dear.stdout + dear.stderr
    assert "recovery.replace is 40, the run was charged 20" in dear.stdout
    # A doctored /summary: ETTR and goodput 3% up.
    doctored = tmp_path / "doctored.h5"
    shutil.copy(runs["ntp"], doctored)
    with h5py.File(doctored, "r+") as f:
        for k in ("ettr", "goodput_tokens_per_s"):
            f["summary"].attrs[k] = f["summary"].attrs[k] * 1.03
    bad = simulate(doctored)
    assert bad.returncode == 1 and "MISMATCH" in bad.stdout, bad.stdout + bad.stderr


@needs_ulfm
def test_a_takeover_is_predicted_as_one_reconfiguration(tmp_path):
    """Spares taking a death over at once (--spare-use takeover): the survivors forget the lost shards,
    the handover reconfigures once and heals the spare in; the model charges the same, with the run's
    own figures (--takeover-s, --detect-s) as its input."""
    sched = schedule(tmp_path, "events:\n  - {step: 3, kill: [3]}\n  - {step: 6, revive: [3]}\n")
    out = tmp_path / "takeover.h5"
    ntpbench(5, "--preset", "tiny", "--tp", 2, "--timing", "paced", "--machine", "dgx-a100", "--emulate-shape",
             "gpt2-medium", "--time-scale", 64, "--steps", 8, "--schedule", sched, "--policy", "ntp",
             "--spares-per-host", 1, "--spare-use", "takeover", "--takeover-s", 7, "--detect-s", 1, "--out", out,
             "--quiet")
    run = load_run(str(out))
    f, p = predict(run)
    assert p.ettr == pytest.approx(run.summary["ettr"], rel=0.02), (p.parts, run.summary)
    assert p.moved_bytes == run.summary["heal_bytes"]          # one heal: the spare's shard
    assert p.parts["reconfigure"] == 2 and p.parts["takeover"] == 7 and p.parts["detect"] == 1


@needs_ulfm
def test_a_mixture_of_experts_run_is_predicted(tmp_path):
    """moe-tiny (TP 2 = EP 2 x DP 2) charged as Mixtral 8x7B, rank 3 killed at step 3 and revived at 6 under ntp:
    the port moves the experts as ntpbench did (the heals' bytes exactly) and predicts ETTR and goodput within 2%.
    Negative control: the same run read as the dense Llama of the same widths (no experts) moves other bytes."""
    sched = schedule(tmp_path, "events:\n  - {step: 3, kill: [3]}\n  - {step: 6, revive: [3]}\n")
    out = tmp_path / "moe.h5"
    ntpbench(4, "--preset", "moe-tiny", "--tp", 2, "--timing", "paced", "--machine", "dgx-a100", "--emulate-shape",
             "mixtral-8x7b", "--time-scale", 2, "--steps", 8, "--schedule", sched, "--policy", "ntp",
             "--out", out, "--quiet")
    run = load_run(out)
    assert run.summary["status"] == "ok", run.summary
    f, p = predict(run)
    assert f.model.experts == 8 and p.moved_bytes == run.summary["heal_bytes"] > 0, (p.parts, run.summary)
    assert p.ettr == pytest.approx(run.summary["ettr"], rel=0.02), (p.parts, run.summary)
    assert p.goodput == pytest.approx(run.summary["goodput_tokens_per_s"], rel=0.02), (p.parts, run.summary)
    assert f.notes == [] and p.notes == [], (f.notes, p.notes)
    dense = shards.Model(**{**f.model.__dict__, "experts": 0, "top_k": 0})
    healthy = shards.plan_configuration("ntp", dense, 2, 1, 2, 8, [1, 1, 1, 1])
    damaged = shards.plan_configuration("ntp", dense, 2, 1, 2, 8, [1, 1, 1, 0])
    sent, _ = shards.heal_traffic(dense, healthy, [True, True], damaged)
    assert sum(sent) not in (0, run.summary["heal_bytes"])
