"""`simulate --from-run` and the profile-derived costs: the machines' profiles read once (machines.py), ntpbench's
layouts and heals ported (shards.py) and checked against the bytes real runs moved, the prediction of paced runs
(from_run.py) on synthetic files written as ntpbench writes them (synth.write_paced_run), and its negative
controls: a doctored /summary and a profile that charges another price must fail."""
import json
import math
import os
import shutil

import pytest
import yaml

from analysis.__main__ import main as cli
from analysis import simulate as sim
from analysis.simulate import shards
from analysis.simulate.from_run import LOST_FRACTION, predict
from analysis.simulate.machines import MACHINES_DIR, ProfileError, load_profile, profile_names
from analysis.runfile import load_run
from analysis.tests import synth


# ---------------------------------------------------------------------------------------------
# The profiles
# ---------------------------------------------------------------------------------------------

def test_profiles_are_read_from_the_yaml():
    raw = yaml.safe_load(open(os.path.join(MACHINES_DIR, "dgx-a100.yaml")))
    p = load_profile("dgx-a100")
    assert p.recovery == {k: float(v["value"]) for k, v in raw["recovery"].items()}
    assert p.sources["replace"] == raw["recovery"]["replace"]["source"]
    assert (p.scale_out_gbps, p.latency_us) == (raw["scale_out_gbps"], raw["latency_us"])
    # custom: dgx-a100's recovery, as ntpbench charges it.
    assert load_profile("custom").recovery == p.recovery
    assert {"dgx-a100", "dgx-h100", "gb200-nvl72", "custom"} <= set(profile_names())


def test_a_malformed_profile_is_refused(tmp_path):
    text = open(os.path.join(MACHINES_DIR, "dgx-a100.yaml")).read()
    (tmp_path / "dgx-a100.yaml").write_text(text.replace('restart: {value: 300, source:', 'restart: {value: 300, x:'))
    with pytest.raises(ProfileError, match="recovery.restart needs a source"):
        load_profile("dgx-a100", str(tmp_path))
    with pytest.raises(ProfileError, match="unknown machine 'nope'"):
        load_profile("nope")


def test_costs_from_profile_follow_ntpbench_rules():
    p = load_profile("gb200-nvl72")
    r = p.recovery
    c = sim.Costs.from_profile("gb200-nvl72", 480e9, 256, gpus=32000)
    shard = 480e9 * 16 / 256                                     # 30 GB per GPU
    assert c.recovery == r["detect"] + r["repair"] + r["reconfigure"]
    assert c.heal == pytest.approx(r["replace"] + r["reconfigure"] + p.latency_us * 1e-6 + shard / (p.scale_out_gbps * 1e9))
    assert c.restart == pytest.approx(r["restart"] + shard / (r["checkpoint_gbps"] * 1e9))
    assert c.checkpoint == pytest.approx(480e9 * 16 / 32000 / (r["checkpoint_gbps"] * 1e9))
    assert sim.Costs.from_profile("gb200-nvl72", 480e9, 256, link_gbps=25).heal == pytest.approx(
        r["replace"] + r["reconfigure"] + 5e-6 + 30e9 / 25e9)


def test_cost_flags_override_the_profile(capsys):
    base = ["simulate", "--gpus", "4096", "--domain-size", "8", "--gpus-per-replica", "64", "--what", "fig6",
            "--trials", "2", "--points", "1", "--machine", "dgx-h100"]
    assert cli(base) == 0
    out = capsys.readouterr().out
    assert "costs on dgx-h100" in out and "recovery 9 s (detect 5 + repair 2 + reconfigure 2)" in out
    assert cli(base + ["--recovery-seconds", "60", "--restart-seconds", "600"]) == 0
    out = capsys.readouterr().out
    assert "recovery 60 s (--recovery-seconds)" in out and "restart 600 s (--restart-seconds)" in out
    # Abort + re-init in the shrink's place: the profile's reinit figure.
    assert cli(base + ["--repair-mechanism", "reinit"]) == 0
    out = capsys.readouterr().out
    reinit = load_profile("dgx-h100").recovery["reinit"]
    assert reinit != 2 and f"recovery {5 + reinit + 2:g} s (detect 5 + reinit {reinit:g} + reconfigure 2)" in out
    assert cli(base + ["--machine", "nope"]) == 2


# ---------------------------------------------------------------------------------------------
# The layouts and heals (numbers from real runs of tiny at TP 2 x DP 2, tests/integration)
# ---------------------------------------------------------------------------------------------

def test_parameter_counts():
    assert shards.parameter_count(shards.Model.preset("tiny")) == 118_528
    assert shards.parameter_count(shards.Model.preset("gpt2")) == 124_439_808          # GPT-2's 124M
    assert shards.parameter_count(shards.Model.preset("gpt2-medium")) == 354_823_168   # 355M
    m = shards.Model.preset("llama-tiny")
    assert sum(t.unit_elems * (1 if t.dim == "replicated" else m.units(t.dim)) for t in shards.model_tensors(m)) \
        == shards.parameter_count(m)


def test_mixture_of_experts_parameters_and_units():
    # Mixtral 8x7B: 46.7B parameters (every expert and the router; ntpbench's parameter_count).
    assert shards.parameter_count(shards.Model.preset("mixtral-8x7b")) == 46_702_792_704
    m = shards.Model.preset("moe-tiny")
    assert sum(t.unit_elems * (1 if t.dim == "replicated" else m.units(t.dim)) for t in shards.model_tensors(m)) \
        == shards.parameter_count(m) == 255_296
    # Whole experts per rank; the MLP dimension has no units (and a dense model no experts).
    assert (m.units("experts"), m.units("mlp")) == (8, 0)
    assert shards.Model.preset("llama-tiny").units("experts") == 0
    c = shards.plan_configuration("ntp", m, 4, 1, 2, 8, [1, 1, 1, 0, 1, 1, 1, 1])
    assert c.replicas[0].layout["experts"] == [0, 0, 0, 1, 1, 1, 2, 2]  # EP 3: rank 3's experts on the survivors
    assert c.replicas[1].layout["experts"] == [0, 0, 3, 1, 1, 3, 2, 2]  # EP 4, synced by expert with EP 3
    assert c.replicas[0].layout["mlp"] == []


def test_core_extra_layout_is_the_papers():
    # 24 heads at TP 8 with N2 = 6: core ranks hold {0,1,2}, {4,5,6}, ...; extra 6 holds {3,7,11}, 7 {15,19,23}.
    owners = shards.core_extra_owners(24, 8, 6)
    assert [u for u in range(24) if owners[u] == 0] == [0, 1, 2]
    assert [u for u in range(24) if owners[u] == 6] == [3, 7, 11]
    assert [u for u in range(24) if owners[u] == 7] == [15, 19, 23]
    assert shards.core_extra_owners(10, 3, 3) == shards.even_owners(10, 3)


@pytest.mark.parametrize("policy,death,revival", [
    # (sum over ranks, most any rank sent, most any rank received), as the real runs' heal events
    ("ntp", (693_504, 693_504, 693_504), (728_832, 693_504, 728_832)),
    ("dp-drop", (0, 0, 0), (1_457_664, 764_160, 728_832)),
])
def test_heal_bytes_match_real_runs(policy, death, revival):
    m = shards.Model.preset("tiny")
    plan = lambda alive: shards.plan_configuration(policy, m, 2, 1, 2, 4, alive)  # noqa: E731
    healthy, damaged = plan([1, 1, 1, 1]), plan([1, 1, 1, 0])
    assert shards.state_survives(m, healthy, [True, True], damaged.alive)
    sent, recv = shards.heal_traffic(m, healthy, [True, True], damaged)
    assert (sum(sent), max(sent), max(recv)) == death
    valid = [rp.active for rp in damaged.replicas]
    sent, recv = shards.heal_traffic(m, damaged, valid, plan([1, 1, 1, 1]))
    assert (sum(sent), max(sent), max(recv)) == revival
    # A restore reads each rank's shard: 12 bytes per parameter of its padded arena.
    assert shards.restore_rank_bytes(m, healthy) == [728_832] * 4


def test_ntp_batches_and_states():
    m = shards.Model.preset("small")
    c = shards.plan_configuration("ntp", m, 4, 1, 2, 8, [1] * 5 + [0] + [1] * 2)
    assert c.degrees() == (4, 3) and c.batches() == (8, 6) and c.states() == (0, 1)
    c = shards.plan_configuration("ntp-pw", m, 4, 1, 2, 8, [1] * 5 + [0] + [1] * 2)
    assert c.batches() == (8, 8)
    assert shards.plan_configuration("restart", m, 4, 1, 2, 8, [1] * 5 + [0] + [1] * 2).active_replicas == 0


# ---------------------------------------------------------------------------------------------
# The prediction
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def paced(tmp_path_factory):
    d = tmp_path_factory.mktemp("paced")
    spec = {"ntp": dict(policy="ntp", checkpoint_every=3), "dp-drop": dict(policy="dp-drop"),
            "restart": dict(policy="restart", kill_step=4, revive_step=7, checkpoint_every=2),
            "doctored": dict(policy="ntp", doctor={"ettr": 1.05, "goodput_tokens_per_s": 1.05})}
    out = {}
    for name, kw in spec.items():
        out[name] = str(d / f"{name}.h5")
        synth.write_paced_run(out[name], **kw)
    return out


@pytest.mark.parametrize("name", ["ntp", "dp-drop", "restart"])
def test_prediction_within_tolerance(paced, name):
    run = load_run(paced[name])
    f, p = predict(run)
    assert p.ettr == pytest.approx(run.summary["ettr"], rel=0.01)
    assert p.goodput == pytest.approx(run.summary["goodput_tokens_per_s"], rel=0.01)
    assert p.moved_bytes == run.summary["heal_bytes"]            # the ported heal plan moves ntpbench's bytes
    assert p.parts["replace"] == 20 and p.parts["repair"] == 2 and p.parts["detect"] == 5


def test_restart_rolls_back_and_restores(paced):
    run = load_run(paced["restart"])
    _, p = predict(run)
    # Killed at slot 4 after the checkpoint at optimizer step 2: slot 3 is undone; idle 4-6; 10 - 1 - 3 committed.
    assert p.tokens_committed == run.summary["tokens_committed"] == 6 * 8 * 32
    assert p.parts["restart"] == 300 and p.parts["restore"] == pytest.approx(synth.PACED_RESTORE[1] - 300)
    assert p.parts["checkpoint"] == pytest.approx(3 * synth.PACED_CHECKPOINT_S)   # optimizer steps 2, then 4 and 6


def test_lost_fraction_of_a_kill():
    assert LOST_FRACTION["start"] == 0 and LOST_FRACTION["backward"] == pytest.approx(1 / 3)


def test_cli_verdict_and_negative_controls(paced, tmp_path, capsys):
    good = [paced["ntp"], paced["dp-drop"], paced["restart"]]
    assert cli(["simulate", "--from-run", *good]) == 0
    out = capsys.readouterr().out
    assert "step times taken from the run" in out and out.count(" ok\n") == 3 and "verdict: ok" in out
    # A doctored /summary (ETTR and goodput 5% up) is caught.
    assert cli(["simulate", "--from-run", *good, paced["doctored"]]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "doctored.h5" in out.split("verdict:")[1]
    # So is a machine that charges another price: replace doubled in a copied profile.
    machines = tmp_path / "machines"
    shutil.copytree(MACHINES_DIR, machines)
    y = machines / "dgx-a100.yaml"
    y.write_text(y.read_text().replace("replace: {value: 20,", "replace: {value: 40,"))
    assert cli(["simulate", "--from-run", paced["ntp"], "--machines-dir", str(machines)]) == 1
    out = capsys.readouterr().out
    assert "recovery.replace is 40, the run was charged 20" in out
    # A generous tolerance lets the doctored file pass.
    assert cli(["simulate", "--from-run", paced["doctored"], "--tolerance", "0.1"]) == 0


def test_unpaced_or_unreadable_files_fail(runs, tmp_path, capsys):
    wall = tmp_path / "wall.h5"
    synth.write_run(str(wall), policy="ntp", kill_step=4, revive_step=8, timing="wall")
    assert cli(["simulate", "--from-run", str(wall)]) == 1
    assert "not paced" in capsys.readouterr().err
    assert cli(["simulate", "--from-run", runs["ntp"]]) == 1          # paced, but no paced_machine
    assert "no root attribute paced_machine" in capsys.readouterr().err
    bad = tmp_path / "x.h5"
    bad.write_text("not hdf5")
    assert cli(["simulate", "--from-run", str(bad)]) == 1


def test_custom_machine_takes_its_links_from_the_run(paced, tmp_path):
    import h5py
    p = tmp_path / "custom.h5"
    shutil.copy(paced["ntp"], p)
    with h5py.File(p, "r+") as f:
        pm, cfg = json.loads(f.attrs["paced_machine"]), json.loads(f.attrs["config"])
        pm["machine"] = cfg["pacing"]["machine"] = "custom"
        cfg["pacing"]["dp_gbps"], cfg["pacing"]["latency_us"] = 50.0, 5.0   # a link twice as fast as dgx-a100's
        f.attrs["paced_machine"], f.attrs["config"] = json.dumps(pm), json.dumps(cfg)
    _, fast = predict(load_run(str(p)))
    _, a100 = predict(load_run(paced["ntp"]))
    assert fast.parts["replace"] == a100.parts["replace"] == 20         # dgx-a100's recovery
    assert fast.parts["heal"] < a100.parts["heal"]
    assert math.isclose(fast.parts["heal"] - 2 * 5e-6, (a100.parts["heal"] - 2 * 5e-6) / 2, rel_tol=1e-9)
