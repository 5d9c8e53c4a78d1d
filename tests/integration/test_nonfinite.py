"""A non-finite loss or gradient norm at run time is caught before the update touches any
parameter: by default the run stops (exit 4) after recording the bad step as not committed; with
--on-nonfinite skip the update is skipped and counted, and a run whose last step is still
non-finite ends non-zero. Never a `done` line over a NaN loss with exit 0.

A learning rate of 1e30 without clipping blows the weights up in one update, so step 2's loss is
not finite (real arithmetic, no injected NaN).
"""
import h5py

from conftest import ntpbench, steps

DIVERGE = ["--preset", "tiny", "--tp", 2, "--steps", 5, "--lr", 1e30, "--clip", 0, "--quiet"]


def kinds(path):
    with h5py.File(path, "r") as f:
        return [e["kind"].decode() for e in f["events"][()]]


def test_nonfinite_step_stops_the_run_with_the_rows_written(tmp_path):
    out = tmp_path / "stop.h5"
    p = ntpbench(2, *DIVERGE, "--out", out, check=False)
    assert p.returncode == 4, p.stdout + p.stderr
    assert "step 2: the loss or the gradient norm is not finite" in p.stderr
    assert "done:" not in p.stdout
    s = steps(out)
    assert s["tokens_committed"].tolist() == [128, 0]
    assert kinds(out) == ["nonfinite"]
    with h5py.File(out, "r") as f:
        assert "summary" in f


def test_skip_counts_skipped_steps_and_a_diverged_run_still_fails(tmp_path):
    out = tmp_path / "skip.h5"
    p = ntpbench(2, *DIVERGE, "--on-nonfinite", "skip", "--out", out, check=False)
    assert p.returncode == 4, p.stdout + p.stderr
    assert "the training diverged" in p.stderr
    s = steps(out)
    assert s["tokens_committed"].tolist() == [128, 0, 0, 0, 0]
    assert (s["optimizer_step"] == 1).all()  # no update after the first
    with h5py.File(out, "r") as f:
        assert float(f["summary"].attrs["skipped_steps"]) == 4
