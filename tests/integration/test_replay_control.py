"""Negative controls for the comparisons every sharded test and `--replay` rest on: a shard of one
tensor put in its neighbour's place in a run's final checkpoint must make `--replay` disagree and
name that tensor, and a swapped shard of the AdamW moments must move the next steps' weights
beyond the per-tensor tolerance (param_compare.hpp)."""
import subprocess

import h5py
import numpy as np

from conftest import ENV, NTPBENCH, ntpbench

TINY = ["--preset", "tiny", "--micro-batch", 2, "--quiet"]
TENSOR = "h.0.mlp.c_fc.weight"  # Hugging Face [C, 4C]: TP shards its 4C columns


def swap_halves(f, name):
    """The two TP 2 shards of `name` (its last axis) swapped in place."""
    a = f[name][()]
    half = a.shape[-1] // 2
    f[name][...] = np.concatenate([a[..., half:], a[..., :half]], axis=-1)


def final_checkpoint(out):
    with h5py.File(out, "r") as f:
        return f.attrs["final_checkpoint"]


def replay(out):
    return subprocess.run([str(NTPBENCH), "--replay", str(out), "--quiet"], env=ENV, capture_output=True, text=True,
                          timeout=300)


def test_a_swapped_shard_makes_the_replay_disagree(tmp_path):
    out = tmp_path / "run.h5"
    ntpbench(2, *TINY, "--tp", 2, "--steps", 3, "--out", out)
    assert replay(out).returncode == 0  # the control: as written, it agrees
    with h5py.File(final_checkpoint(out), "r+") as f:
        swap_halves(f, TENSOR)
    p = replay(out)
    assert p.returncode == 1 and "DISAGREES" in p.stdout and TENSOR in p.stdout, p.stdout + p.stderr


def test_swapped_moments_of_one_shard_change_the_next_steps_beyond_tolerance(tmp_path):
    # Two resumes of the same checkpoint, one with the AdamW moments of TENSOR's shards swapped.
    out = tmp_path / "run.h5"
    ntpbench(2, *TINY, "--tp", 2, "--steps", 3, "--out", out)
    ckpt = final_checkpoint(out)
    bad = tmp_path / "swapped.h5"
    bad.write_bytes(open(ckpt, "rb").read())
    with h5py.File(bad, "r+") as f:
        for group in ("optimizer/m/", "optimizer/v/"):
            swap_halves(f, group + TENSOR)
    finals = []
    for name, start in (("good", ckpt), ("bad", bad)):
        o = tmp_path / f"{name}.h5"
        ntpbench(2, *TINY, "--tp", 2, "--steps", 6, "--init-from", start, "--out", o)
        with h5py.File(final_checkpoint(o), "r") as f:
            finals.append({k: f[k][()] for k in (TENSOR, "h.0.mlp.c_proj.weight")})
    good, bad_ = finals
    rel = lambda k: np.linalg.norm(bad_[k] - good[k]) / np.linalg.norm(good[k])  # noqa: E731
    # Far beyond the per-tensor tolerance after AdamW (test_training.cpp, 2e-3): 0.032 measured, 16x
    # over it; held to 5x. A tensor whose moments were left alone moves far less (c_proj: 8e-4,
    # through the changed activations).
    assert rel(TENSOR) > 5 * 2e-3, rel(TENSOR)
    assert rel("h.0.mlp.c_proj.weight") < rel(TENSOR) / 10
