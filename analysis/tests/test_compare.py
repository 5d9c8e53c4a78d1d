"""report --diff (figure by figure, B - A, B / A, the configuration note) and comparability."""
import math

import pandas as pd
import pytest

from analysis import compare, metrics
from analysis.__main__ import main as cli
from analysis.runfile import SUMMARY_KEYS, load_run
from analysis.tests import synth


def _table(out: str) -> dict:
    """metric -> the four cells after it, from the --diff table."""
    rows = {}
    for line in out.splitlines():
        cells = line.split()
        if len(cells) == 5 and cells[0] in SUMMARY_KEYS:
            rows[cells[0]] = cells[1:]
    return rows


def test_diff_values_differences_ratios(runs, capsys):
    a, b = runs["ntp"], runs["ntppw"]
    assert cli(["report", a, b, "--diff"]) == 0
    out = capsys.readouterr().out
    rows = _table(out)
    assert set(rows) == set(SUMMARY_KEYS)                  # every recomputed figure
    ra, rb = metrics.recompute(load_run(a)), metrics.recompute(load_run(b))
    for key in ("tokens_committed", "goodput_tokens_per_s", "ettr", "recovery_heal_seconds", "final_loss"):
        va, vb, d, ratio = rows[key]
        assert float(va) == pytest.approx(ra[key], rel=1e-5)
        assert float(vb) == pytest.approx(rb[key], rel=1e-5)
        assert float(d) == pytest.approx(rb[key] - ra[key], rel=1e-5, abs=1e-9)
        assert float(ratio) == pytest.approx(rb[key] / ra[key], rel=1e-3)
    # ntp-pw keeps the damaged replica's batch: more committed tokens than ntp
    assert int(rows["tokens_committed"][1]) > int(rows["tokens_committed"][0])
    assert rows["paced_overrun_steps"] == ["2", "0", "-2", "0.0000"]   # the ntp file has two overruns
    assert rows["spares_used"][3] == "-"                  # A is 0: no ratio
    assert "same apart from the policy" in out and "note:" not in out


def test_diff_notes_config_differences(runs, tmp_path, capsys):
    other = tmp_path / "longer.h5"
    synth.write_run(str(other), policy="ntp-pw", tp=2, dp=2, steps=14, kill_step=4, revive_step=9, timing="wall")
    assert cli(["report", runs["dpdrop"], str(other), "--diff"]) == 0
    out = capsys.readouterr().out
    note = out[out.index("note: the configurations differ"):]
    assert "(1 key(s))" in note and "steps: A 12, B 14" in note
    assert "policy" not in note.split("\n", 1)[1]          # the policy is what is compared
    diffs = compare.config_differences(load_run(runs["dpdrop"]), load_run(runs["ntp"]))
    assert diffs == [("ranks", 4, 8), ("tp", 2, 4)]        # the rank count comes from the root attributes


def test_diff_csv_and_bad_input(runs, tmp_path, capsys):
    csv = tmp_path / "d.csv"
    assert cli(["report", runs["ntp"], runs["restart"], "--diff", "--csv", str(csv)]) == 0
    df = pd.read_csv(csv)
    assert list(df.columns) == ["metric", "a", "b", "diff", "ratio"] and len(df) == len(SUMMARY_KEYS)
    row = df.set_index("metric").loc["steps"]
    assert (row["a"], row["b"], row["diff"]) == (12, 13, 1)
    capsys.readouterr()
    assert cli(["report", runs["ntp"], "--diff"]) == 2
    assert "two runs" in capsys.readouterr().err
    assert cli(["report", runs["ntp"], runs["corrupt"], "--diff"]) == 1   # a /summary that disagrees


def test_diff_rows_undefined():
    a = {k: 0.0 for k in SUMMARY_KEYS}
    b = {k: 2.0 for k in SUMMARY_KEYS}
    a["mfu"], b["ettr"] = 4.0, math.nan
    rows = {r["metric"]: r for r in compare.diff_rows(a, b)}
    assert rows["mfu"]["diff"] == -2.0 and rows["mfu"]["ratio"] == 0.5
    assert math.isnan(rows["steps"]["ratio"]) and rows["steps"]["diff"] == 2.0
    assert math.isnan(rows["ettr"]["diff"]) and math.isnan(rows["ettr"]["ratio"])


def test_not_comparable(runs, tmp_path, capsys):
    same = [load_run(runs["ntp"]), load_run(runs["ntppw"])]
    assert compare.comparability_problems(same) == []
    wall = tmp_path / "wall.h5"
    synth.write_run(str(wall), policy="ntp", tp=2, dp=2, kill_step=4, revive_step=8, timing="wall")
    problems = compare.comparability_problems(same + [load_run(str(wall))])
    assert [p.split(":")[0] for p in problems] == ["timing differs", "ranks differs"]
    assert "wall (wall.h5)" in problems[0] and "8 (ntp.h5, ntppw.h5); 4 (wall.h5)" in problems[1]
    assert cli(["plot", runs["ntp"], str(wall), "--out", str(tmp_path / "p")]) == 0
    err = capsys.readouterr().err
    assert "not comparable" in err and "timing differs" in err
    assert cli(["plot", runs["ntp"], runs["ntppw"], "--out", str(tmp_path / "q")]) == 0
    assert "not comparable" not in capsys.readouterr().err
