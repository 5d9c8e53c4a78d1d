import math

import h5py
import numpy as np
import pytest

from analysis import metrics
from analysis.runfile import SUMMARY_KEYS, SchemaError, load_run


def test_load_every_part(runs):
    run = load_run(runs["ntp"])
    assert run.attrs["schema_version"] == "2" and run.policy == "ntp"
    assert (run.tp, run.dp, run.ranks) == (4, 2, 8)
    n = len(run.steps)
    assert n == 12
    assert run.replicas["tp_degree"].shape == (n, 2)
    assert run.phase_times.shape == (n, 8, 9) and run.phases[0] == "forward"
    assert set(run.events["kind"]) >= {"kill", "revive", "detect", "reconfigure", "heal"}
    assert isinstance(run.events["kind"].iloc[0], str)
    assert set(run.summary) == set(SUMMARY_KEYS)
    # The synthetic rows follow the policy: the damaged replica runs at TP 3.
    assert run.replicas["tp_degree"][4, 1] == 3 and run.replicas["state"][4, 1] == 1


@pytest.mark.parametrize("name", ["healthy", "dpdrop", "ntp", "ntppw", "restart", "corrupt"])
def test_recompute_matches_summary(runs, name):
    run = load_run(runs[name])
    rec = metrics.recompute(run)
    bad = metrics.compare(run, rec)
    if name == "corrupt":
        assert [m.name for m in bad] == ["goodput_tokens_per_s"]
        assert "goodput_tokens_per_s" in str(bad[0])
    else:
        assert bad == [], [str(m) for m in bad]
        for k in SUMMARY_KEYS:
            a, b = float(run.summary[k]), float(rec[k])
            assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9, abs=1e-12), k


def test_restart_rollback_figures(runs):
    run = load_run(runs["restart"])
    rec = metrics.recompute(run)
    # As ntpbench writes it: `step` is the slot (unique), the redone update repeats its optimizer step.
    assert run.steps["step"].is_unique
    assert run.steps["optimizer_step"].tolist().count(5) == 2    # step 5 redone after the restore
    assert rec["tokens_committed"] < rec["tokens"]
    assert rec["productive_seconds"] < rec["step_seconds"]
    assert rec["recovery_recompute_seconds"] > 0 and rec["failures"] == 1 and rec["revivals"] == 1
    assert rec["ettr"] < rec["step_seconds"] / rec["wall_seconds"]


def test_dpdrop_and_counts(runs):
    rec = metrics.recompute(load_run(runs["dpdrop"]))
    assert rec["failures"] == 1 and rec["revivals"] == 1
    assert rec["heal_bytes"] == 2.5e6
    assert rec["goodput_ratio"] < 1
    assert metrics.recompute(load_run(runs["ntp"]))["paced_overrun_steps"] == 2


def test_missing_summary_key_is_a_mismatch(runs, tmp_path):
    import shutil
    p = tmp_path / "partial.h5"
    shutil.copy(runs["ntp"], p)
    with h5py.File(p, "a") as f:
        del f["summary"].attrs["ettr"]
    bad = metrics.compare(load_run(p))
    assert [m.name for m in bad] == ["ettr"] and "missing" in str(bad[0])


def test_cut_short_file(runs):
    run = load_run(runs["cut"])
    assert run.summary is None and not run.complete
    rec = metrics.recompute(run)
    assert rec["steps"] == 7 and rec["wall_seconds"] == pytest.approx(run.steps["t_end"].iloc[-1])
    assert metrics.compare(run) == []


def test_absent_events_gives_empty_frame(runs, tmp_path):
    import shutil
    p = tmp_path / "noevents.h5"
    shutil.copy(runs["healthy"], p)
    with h5py.File(p, "a") as f:
        del f["events"]
    run = load_run(p)
    assert len(run.events) == 0 and list(run.events.columns)[:3] == ["time", "step", "kind"]
    assert metrics.recompute(run)["failures"] == 0
    assert any("no /events" in n for n in run.notes)


@pytest.mark.parametrize("version", ["0.1", "3", None])
def test_unknown_schema_refused(runs, tmp_path, version):
    import shutil
    p = tmp_path / "old.h5"
    shutil.copy(runs["healthy"], p)
    with h5py.File(p, "a") as f:
        if version is None:
            del f.attrs["schema_version"]
        else:
            f.attrs["schema_version"] = np.bytes_(version)
    with pytest.raises(SchemaError, match="schema_version"):
        load_run(p)


def test_missing_step_field_refused(runs, tmp_path):
    p = tmp_path / "lean.h5"
    src = load_run(runs["healthy"])
    import shutil
    shutil.copy(runs["healthy"], p)
    with h5py.File(p, "a") as f:
        arr = f["steps"][()]
        keep = [n for n in arr.dtype.names if n != "idle_seconds"]
        del f["steps"]
        f.create_dataset("steps", data=arr[keep])
    with pytest.raises(SchemaError, match="idle_seconds"):
        load_run(p)
    assert len(src.steps) == 12


def test_undefined_figures_accept_zero_or_nan(runs, tmp_path):
    """A run with no all-healthy step has no healthy throughput: /summary may hold 0 or NaN."""
    import shutil
    p = tmp_path / "degraded.h5"
    shutil.copy(runs["ntp"], p)
    with h5py.File(p, "a") as f:
        f["replicas/state"][:, 1] = 1
        f["summary"].attrs["healthy_throughput_tokens_per_s"] = 0.0
        f["summary"].attrs["goodput_ratio"] = np.nan
    run = load_run(p)
    assert math.isnan(metrics.recompute(run)["healthy_throughput_tokens_per_s"])
    assert metrics.compare(run) == []
