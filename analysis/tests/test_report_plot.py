import json
import os

import numpy as np
import pandas as pd
import pytest

from analysis.__main__ import main as cli



def test_report_table_csv_json(runs, tmp_path, capsys):
    files = [runs[k] for k in ("healthy", "dpdrop", "ntp", "ntppw", "restart", "cut")]
    csv, js = tmp_path / "r.csv", tmp_path / "r.json"
    rc = cli(["report", *files, "--csv", str(csv), "--json", str(js)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    lines = out.splitlines()
    # The default fits a terminal: the columns that decide, not ETTR or the recovery's parts.
    assert "policy" in lines[0] and "TPxPPxDP" in lines[0] and "good/healthy" in lines[0] and "recov s" in lines[0]
    headers = [line for line in lines if line.startswith("file ")]
    assert len(headers) == 1 and "ETTR" not in headers[0] and "repair s" not in headers[0]
    assert len(lines[0]) - max(len(str(f)) for f in files) <= 100  # the header, besides the file's name
    rc = cli(["report", *files, "--wide"])
    wide, err = capsys.readouterr()
    assert rc == 0, err
    assert "ETTR" in wide.splitlines()[0] and "heal bytes" in wide.splitlines()[0] and "repair s" in wide
    for name in ("dp-drop", "ntp-pw", "restart", "4x1x2"):
        assert name in out
    assert "INCOMPLETE" in out and "no /summary" in out      # the cut-short file says so
    df = pd.read_csv(csv)
    assert len(df) == 6 and {"goodput_tokens_per_s", "ettr", "mfu", "recovery_heal_seconds"} <= set(df.columns)
    data = json.loads(js.read_text())
    assert data[1]["policy"] == "dp-drop" and data[1]["failures"] == 1


def test_report_detects_corrupt_summary(runs, capsys):
    rc = cli(["report", runs["ntp"], runs["corrupt"]])
    out, err = capsys.readouterr()
    assert rc == 1
    assert "goodput_tokens_per_s" in err and "corrupt.h5" in err
    assert "SUMMARY MISMATCH" in out


def test_report_refuses_unknown_schema(runs, tmp_path, capsys):
    import shutil

    import h5py
    import numpy as np
    p = tmp_path / "v0.h5"
    shutil.copy(runs["healthy"], p)
    with h5py.File(p, "a") as f:
        f.attrs["schema_version"] = np.bytes_("0.1")
    assert cli(["report", str(p)]) == 1
    assert "not supported" in capsys.readouterr().err


def test_plot_writes_pngs(runs, tmp_path, capsys):
    files = [runs[k] for k in ("dpdrop", "restart", "cut")]
    out_dir = tmp_path / "plots"
    assert cli(["plot", *files, "--out", str(out_dir)]) == 0
    printed = capsys.readouterr().out.split()
    expected = {f"{s}_{k}.png" for s in ("dpdrop", "restart", "cut")
                for k in ("throughput", "tp_degree", "phases")} | {"loss.png", "goodput_by_policy.png", "phase_totals.png"}
    assert {os.path.basename(p) for p in printed} == expected
    for p in printed:
        assert os.path.getsize(p) > 15_000, p    # a real figure, not an empty canvas
        with open(p, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_help_lists_every_flag(capsys):
    for cmd, flags in (("report", ["--csv", "--json", "--diff"]), ("plot", ["--out"]),
                       ("simulate", ["--gpus", "--domain-size", "--gpus-per-replica", "--rate-multiplier",
                                     "--calibrate", "--trials", "--spares", "--placement", "--boost"])):
        try:
            cli([cmd, "--help"])
        except SystemExit as e:
            assert e.code == 0
        out = capsys.readouterr().out
        for fl in flags:
            assert fl in out, (cmd, fl)


def test_failure_events_count_lost_gpus_nodes_and_replicas():
    """Kills grouped by step: GPUs (ranks) lost, their hosts, nodes lost whole, replicas out."""
    from types import SimpleNamespace
    from analysis.report import failure_events, format_failures
    hosts = ["n1"] * 4 + ["n2"] * 4 + ["n3"] * 4
    ev = pd.DataFrame({"step": [3, 8, 8, 8, 8, 8, 9], "kind": ["kill"] + ["kill"] * 5 + ["revive"],
                       "rank": [1, 4, 5, 6, 7, 9, 1]})
    run = SimpleNamespace(events=ev, attrs={"hosts": json.dumps(hosts)}, tp=4, pp=1)
    got = failure_events(run)
    assert [(e["step"], e["gpus_lost"], e["hosts"], e["whole_nodes"], e["whole_replicas"]) for e in got] == [
        (3, 1, {"n1": 1}, [], []),
        (8, 5, {"n2": 4, "n3": 1}, ["n2"], [1]),
    ]
    table = format_failures("run.h5", got)
    assert "4-7,9" in table and "n2 (4), n3 (1)" in table


def test_loss_series_restart_committed_in_optimizer_order(runs):
    """Restart (kill at step 6, checkpoint every 4): step 5 runs, is rolled back and redone. The line is
    the committed rows in optimizer order; the rolled-back row stands apart at its optimizer step."""
    from analysis.plots import loss_series
    from analysis.runfile import load_run
    run = load_run(runs["restart"])
    df = loss_series(run)
    done, undone = df[df["committed"]], df[~df["committed"]]
    assert done["optimizer_step"].tolist() == list(range(1, 13))          # progress never goes back
    per_step = 2 * 4 * 32                                                  # dp x micro-batch x T
    assert done["tokens"].tolist() == [per_step * k for k in range(1, 13)]
    assert done["loss"].tolist() == pytest.approx([5.5 - 0.01 * k for k in range(1, 13)])
    assert undone["optimizer_step"].tolist() == [5] and undone["row"].tolist() == [4]
    assert undone["tokens"].tolist() == [per_step * 5]       # 4 committed steps before it + its own
    # A file without optimizer_step: committed rows in row order, the others left out.
    run.steps = run.steps.drop(columns="optimizer_step")
    old = loss_series(run)
    assert old["committed"].all() and old["optimizer_step"].tolist() == list(range(1, 13))
    assert old["tokens"].tolist() == done["tokens"].tolist()


def test_loss_series_counts_committed_tokens(runs):
    """ntp cuts the damaged replica's batch: the token axis advances by what each step committed."""
    from analysis.plots import loss_series
    from analysis.runfile import load_run
    run = load_run(runs["ntp"])
    df = loss_series(run)
    assert df["committed"].all() and df["optimizer_step"].tolist() == list(range(1, 13))
    assert df["tokens"].tolist() == run.steps["tokens_committed"].cumsum().tolist()
    steps = np.diff(df["tokens"].to_numpy())
    assert steps.min() < steps.max()                          # fewer tokens while a rank is down


def test_outage_spans():
    from types import SimpleNamespace
    from analysis.plots import outage_spans
    ev = pd.DataFrame({"time": [1.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
                       "kind": ["kill", "kill", "revive", "takeover", "kill", "revive", "kill"],
                       "rank": [3, 5, 3, 5, 3, 1, 2]})
    got = outage_spans(SimpleNamespace(events=ev))
    assert got == [{"rank": 3, "start": 1.0, "end": 2.0}, {"rank": 5, "start": 1.0, "end": 3.0},
                   {"rank": 3, "start": 4.0, "end": None}, {"rank": 2, "start": 6.0, "end": None}]


def test_cross_run_figures_carry_the_warning(runs, tmp_path, monkeypatch):
    from analysis import plots
    from analysis.runfile import load_run
    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig))
    rs = [load_run(runs["ntp"]), load_run(runs["dpdrop"])]
    labels = ["ntp", "dpdrop\n(dp-drop)"]
    for fn in (plots.plot_goodput_by_policy, plots.plot_phase_totals, plots.plot_loss):
        fn(rs, labels, str(tmp_path / "x.png"), ["ranks differs: 8 (ntp.h5); 4 (dpdrop.h5)"])
        fn(rs, labels, str(tmp_path / "x.png"), [])
    titles = [" ".join([f._suptitle.get_text() if f._suptitle else ""] + [a.get_title(loc) for a in f.axes
                                                                 for loc in ("left", "center")])
              for f in figs]
    assert all("NOT COMPARABLE: ranks differs" in t for t in titles[0::2])
    assert not any("NOT COMPARABLE" in t for t in titles[1::2])
    ticks = [t.get_text() for t in figs[1].axes[0].get_xticklabels()]
    assert ticks == labels                                     # one label per bar, none repeated
    assert "phase" in titles[3] and "seconds" in titles[3]


def test_bar_label():
    from types import SimpleNamespace
    from analysis.plots import bar_label
    assert bar_label("ntp", SimpleNamespace(policy="ntp")) == "ntp"
    assert bar_label("run3", SimpleNamespace(policy="restart")) == "run3\n(restart)"
