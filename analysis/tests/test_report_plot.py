import json
import os

import pandas as pd

from analysis.__main__ import main as cli



def test_report_table_csv_json(runs, tmp_path, capsys):
    files = [runs[k] for k in ("healthy", "dpdrop", "ntp", "ntppw", "restart", "cut")]
    csv, js = tmp_path / "r.csv", tmp_path / "r.json"
    rc = cli(["report", *files, "--csv", str(csv), "--json", str(js)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    lines = out.splitlines()
    assert "policy" in lines[0] and "TPxPPxDP" in lines[0] and "ETTR" in lines[0] and "heal bytes" in lines[0]
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
                for k in ("throughput", "tp_degree", "phases")} | {"goodput_by_policy.png", "phase_totals.png"}
    assert {os.path.basename(p) for p in printed} == expected
    for p in printed:
        assert os.path.getsize(p) > 15_000, p    # a real figure, not an empty canvas
        with open(p, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_help_lists_every_flag(capsys):
    for cmd, flags in (("report", ["--csv", "--json"]), ("plot", ["--out"]),
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
