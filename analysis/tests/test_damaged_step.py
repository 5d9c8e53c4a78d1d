"""A damaged replica's step against its compute alone (analysis/damaged_step.py): measured from the
rows, named in `report` when policies are ranked, and carried to a cluster by `simulate
--damaged-from`, whose Fig. 6 then charges it."""
import json

import h5py
import pytest

from analysis import damaged_step
from analysis.__main__ import main as cli
from analysis.runfile import load_run

from . import synth


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("damaged")
    out = {}
    for policy in ("ntp", "dp-drop"):
        out[policy] = str(d / f"{policy}.h5")
        synth.write_paced_run(out[policy], policy=policy)
    return out


def test_the_excess_is_the_step_over_its_compute_alone(runs):
    steps = damaged_step.damaged_steps(load_run(runs["ntp"]))
    # ntp at TP [2, 1]: the damaged replica trains half the batch at half the degree, compute alone 1.
    assert [s.degrees for s in steps] == [(2, 1)]
    (s,) = steps
    assert s.compute == 1.0
    assert s.excess_seconds == pytest.approx(synth.PACED_DAMAGED_S - synth.PACED_HEALTHY_S, rel=0.02)
    assert s.measured == pytest.approx(synth.PACED_DAMAGED_S / synth.PACED_HEALTHY_S, rel=0.01)
    assert s.excess == pytest.approx(synth.PACED_DAMAGED_S / synth.PACED_HEALTHY_S - 1, rel=0.02)
    # dp-drop trains no damaged replica: nothing to measure.
    assert damaged_step.damaged_steps(load_run(runs["dp-drop"])) == []


def test_report_says_when_a_ranking_depends_on_tokens_per_step(runs, capsys):
    assert cli(["report", runs["ntp"], runs["dp-drop"]]) == 0
    out = capsys.readouterr().out
    assert f"note: {runs['ntp']} (ntp): a damaged step took" in out and "tokens per replica step" in out
    assert f"note: {runs['dp-drop']}" not in out
    # One policy alone ranks nothing: no note (the negative control).
    assert cli(["report", runs["ntp"]]) == 0
    assert "a damaged step took" not in capsys.readouterr().out


def fig6_ntp_loss(out: str) -> float:
    """Fig. 6's first row's `loss ntp`, in percent."""
    lines = out.split("Fig. 6 — throughput loss")[1].splitlines()
    names = [h.strip() for h in lines[1].split("  ") if h.strip()]
    return float(lines[3].split()[names.index("loss ntp")].rstrip("%"))


def test_simulate_carries_the_excess_to_the_cluster(runs, capsys, tmp_path):
    base = ["simulate", "--gpus", "4096", "--domain-size", "8", "--gpus-per-replica", "64", "--what", "fig6",
            "--trials", "4", "--points", "1", "--machine", "dgx-a100", "--out", str(tmp_path)]
    assert cli(base) == 0
    plain = fig6_ntp_loss(capsys.readouterr().out)
    # The run's own batch (4 x 32 tokens per replica step) on its own machine: the damaged step's extra
    # seconds over one GPU's pure compute of the emulated gpt2-medium (354,823,168 parameters over TP 2,
    # 6 FLOPs each per token, at the A100's 312 TFLOP/s).
    with h5py.File(runs["ntp"]) as f:
        tokens = json.loads(f.attrs["config"])["micro_batch"] * 32
    assert cli(base + ["--damaged-from", runs["ntp"], "--tokens-per-replica", str(tokens)]) == 0
    out = capsys.readouterr().out
    extra = synth.PACED_DAMAGED_S - synth.PACED_HEALTHY_S
    compute = 6 * 354_823_168 / 2 * tokens / 312e12
    carried = float(out.split("-> --damaged-excess ")[1].split()[0])
    assert carried == pytest.approx(extra / compute, rel=0.02)
    assert fig6_ntp_loss(out) > plain + 10  # every step with a damaged replica lasts much longer
    # 64 times the tokens per replica step: 1/64 of the share (the extra seconds stay, the step grows).
    assert cli(base + ["--damaged-from", runs["ntp"], "--tokens-per-replica", str(64 * tokens)]) == 0
    out = capsys.readouterr().out
    assert float(out.split("-> --damaged-excess ")[1].split()[0]) == pytest.approx(extra / compute / 64, rel=0.02)
    # On a machine with 2.67x the FLOP/s over scale-up bandwidth (gb200-nvl72: 2,500 over 900; the A100:
    # 312 over 300), 2.67x the share.
    assert cli([*base[:-4], "--machine", "gb200-nvl72", "--out", str(tmp_path), "--damaged-from", runs["ntp"],
                "--tokens-per-replica", str(64 * tokens)]) == 0
    out = capsys.readouterr().out
    ratio = (2500 / 900) / (312 / 300)
    assert float(out.split("-> --damaged-excess ")[1].split()[0]) == pytest.approx(extra / compute / 64 * ratio,
                                                                                 rel=0.02)
    # A run with nothing to measure is refused.
    assert cli(base + ["--damaged-from", runs["dp-drop"]]) == 2
    assert cli(base + ["--damaged-from", runs["ntp"], "--damaged-excess", "0.1"]) == 2
