"""Checkpoints are checked at load: a tensor holding NaN or Inf, or one that is not floating-point, is
refused, naming the file and the tensor, and the run exits non-zero instead of training from it."""
import subprocess

import h5py
import numpy as np
import pytest

from conftest import ENV, NTPBENCH, ROOT, ntpbench

TINY = ["--preset", "tiny", "--micro-batch", 2, "--quiet"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    out = d / "run.h5"
    ntpbench(2, *TINY, "--tp", 2, "--steps", 2, "--out", out)
    with h5py.File(out, "r") as f:
        return f.attrs["final_checkpoint"]


def poke(src, dst, tensor, value):
    """A copy of checkpoint `src` with one element of `tensor` set to `value`."""
    dst.write_bytes(open(src, "rb").read())
    with h5py.File(dst, "r+") as f:
        ds = f[tensor]
        flat = ds[()].reshape(-1)
        flat[7] = value
        ds[...] = flat.reshape(ds.shape)
    return dst


@pytest.mark.parametrize("tensor, value", [("h.0.attn.c_attn.weight", np.nan), ("optimizer/v/ln_f.bias", np.inf),
                                           ("wte", -np.inf)])
def test_non_finite_checkpoint_is_refused(tmp_path, checkpoint, tensor, value):
    bad = poke(checkpoint, tmp_path / "bad.h5", tensor, value)
    out = tmp_path / "resumed.h5"
    # One process without a launcher: the exit status is the binary's own.
    p = subprocess.run([str(NTPBENCH), *map(str, TINY), "--steps", "4", "--init-from", str(bad), "--out", str(out)],
                       env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0, p.stdout
    assert f"checkpoint {bad}: tensor '{tensor}' holds 1 non-finite value(s)" in p.stderr, p.stderr
    assert "done:" not in p.stdout


def test_finite_checkpoint_still_loads(tmp_path, checkpoint):
    out = tmp_path / "resumed.h5"
    ntpbench(2, *TINY, "--tp", 2, "--steps", 4, "--init-from", checkpoint, "--out", out)
    with h5py.File(out, "r") as f:
        assert np.isfinite(f["steps"]["loss"]).all()


def load(checkpoint, out, *model):
    """One process without a launcher starting from `checkpoint`: the exit status is the binary's own."""
    cmd = [str(NTPBENCH), *map(str, model or TINY), "--steps", "2", "--init-from", str(checkpoint), "--out", str(out)]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120)


def test_checkpoint_tensor_that_is_not_floats_is_refused(tmp_path, checkpoint):
    # HDF5 would convert an integer tensor to floats without a word.
    bad = tmp_path / "ints.h5"
    bad.write_bytes(open(checkpoint, "rb").read())
    with h5py.File(bad, "r+") as f:
        ints = np.round(f["wpe"][()] * 100).astype(np.int32)
        del f["wpe"]
        f["wpe"] = ints
    p = load(bad, tmp_path / "resumed.h5")
    assert p.returncode != 0, p.stdout
    assert "dataset 'wpe' does not hold 32- or 64-bit IEEE floating-point numbers" in p.stderr, p.stderr
    assert "done:" not in p.stdout


def test_damaged_checkpoint_found_by_fuzzing_is_refused(tmp_path):
    # fuzz_checkpoint's find (fuzz/regressions/): a 38 KB checkpoint of a V 16, d 8, one-layer model
    # whose damaged 'wpe' type description made HDF5's conversion ask for 4 GiB.
    bad = ROOT / "fuzz" / "regressions" / "checkpoint" / "oom-float-type-4gib.h5"
    model = ["--preset", "tiny", "--vocab", 16, "--context", 4, "--layers", 1, "--heads", 2, "--hidden", 8,
             "--seq", 4, "--micro-batch", 1, "--quiet"]
    p = load(bad, tmp_path / "resumed.h5", *model)
    assert p.returncode != 0, p.stdout
    assert "dataset 'wpe' does not hold 32- or 64-bit IEEE floating-point numbers" in p.stderr, p.stderr
    assert "done:" not in p.stdout


@pytest.mark.parametrize("attr, values", [("step", np.arange(3000, dtype=np.int64)),
                                          ("layers", np.full(3000, 2, dtype=np.int64)),
                                          ("model", np.array([b"gpt2"] * 3000))])
def test_attribute_holding_many_values_is_refused(tmp_path, checkpoint, attr, values):
    # H5Aread writes as many values as the file says: into a one-value buffer, that overflowed the
    # stack (fuzz_checkpoint's find in CI).
    bad = tmp_path / "many.h5"
    bad.write_bytes(open(checkpoint, "rb").read())
    with h5py.File(bad, "r+") as f:
        del f.attrs[attr]
        f.attrs[attr] = values
    p = load(bad, tmp_path / "resumed.h5")
    assert p.returncode != 0, p.stdout
    assert f"attribute '{attr}' on / holds 3000 values, expected one" in p.stderr, p.stderr
    assert "done:" not in p.stdout


@pytest.mark.parametrize("keep", [20000, 0])
def test_a_truncated_checkpoint_is_a_usage_error(tmp_path, checkpoint, keep):
    """A checkpoint cut short (or empty) is the user's input: exit 2 and one message naming the file,
    as for any refused checkpoint, never the MPI_Abort path (every rank reaches the same verdict)."""
    bad = tmp_path / "cut.h5"
    bad.write_bytes(open(checkpoint, "rb").read()[:keep])
    p = ntpbench(2, *TINY, "--tp", 2, "--steps", 1, "--init-from", bad, "--out", tmp_path / "x.h5", check=False)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.count(f"checkpoint {bad} cannot be read") == 1, p.stderr
    assert "MPI_ABORT" not in p.stderr and "error on rank" not in p.stderr, p.stderr


def test_a_resumed_cosine_schedule_goes_on_where_it_was(tmp_path):
    """--lr-schedule cosine decays to its minimum by the last step of the run, and a run resumed from a
    checkpoint of step 4 for 4 more steps ends at step 8: its learning rates are those of steps 5-8 of
    one 8-step run, not the minimum the first run's 4-step schedule had reached (the negative control:
    they differ from it)."""
    cosine = [*TINY, "--lr-schedule", "cosine", "--warmup", 1]
    whole, first, resumed = tmp_path / "whole.h5", tmp_path / "first.h5", tmp_path / "resumed.h5"
    ntpbench(1, *cosine, "--steps", 8, "--out", whole)
    ntpbench(1, *cosine, "--steps", 4, "--out", first)
    with h5py.File(first, "r") as f:
        ckpt = f.attrs["final_checkpoint"]
    ntpbench(1, *cosine, "--steps", 4, "--init-from", ckpt, "--out", resumed)
    with h5py.File(whole, "r") as w, h5py.File(first, "r") as a, h5py.File(resumed, "r") as b:
        lr_whole, lr_first, lr_resumed = w["steps"]["lr"], a["steps"]["lr"], b["steps"]["lr"]
        assert list(b["steps"]["optimizer_step"]) == [5, 6, 7, 8]
    np.testing.assert_allclose(lr_resumed, lr_whole[4:], rtol=1e-6)
    assert lr_resumed[0] > 1.5 * lr_first[-1], (lr_first, lr_resumed)
