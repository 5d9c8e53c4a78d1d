"""The soak's samples in a real run: every rank's resident memory and open descriptors after every
step (/ranks/rss_bytes, /ranks/open_fds), -1 while a rank has no process, kept by the recorder
that takes over when logical rank 0 dies, and read by `python -m analysis soak` (`make soak` runs
the long version; analysis/tests/test_soak.py checks the growth rule on synthetic files)."""
import subprocess
import sys

import h5py
import numpy as np
import pytest

from conftest import ENV, ROOT, ULFM, ntpbench, replay, schedule

TINY = ["--preset", "tiny", "--micro-batch", 4, "--quiet"]


def usage(path):
    with h5py.File(path, "r") as f:
        return f["ranks/rss_bytes"][()], f["ranks/open_fds"][()], len(f["steps"])


def test_every_rank_samples_memory_and_descriptors_each_step(tmp_path):
    out = tmp_path / "healthy.h5"
    ntpbench(4, *TINY, "--tp", 2, "--steps", 25, "--out", out)
    rss, fds, n = usage(out)
    assert rss.shape == fds.shape == (n, 4) and n == 25
    # A process of this binary holds tens of MB and a few dozen descriptors (MPI's, stdio, HDF5's).
    assert ((rss > 5e6) & (rss < 4e9)).all(), rss[:3]
    assert ((fds >= 3) & (fds < 4096)).all(), fds[:3]
    p = subprocess.run([sys.executable, "-m", "analysis", "soak", str(out)], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "healthy.h5" in p.stdout and p.stdout.rstrip().endswith("ok")


@pytest.mark.skipif(not ULFM, reason="needs real kills (ULFM)")
def test_a_dead_rank_has_no_samples_and_its_new_process_does(tmp_path):
    # Logical rank 0 (the recorder) dies at step 4 and returns at step 7: the recorder moves to
    # rank 1, which reopens the file and goes on writing the samples.
    out = tmp_path / "rank0.h5"
    text = "events:\n  - {step: 4, kill: [0], at: backward}\n  - {step: 7, revive: [0]}\n"
    ntpbench(4, *TINY, "--tp", 2, "--steps", 10, "--kill-mode", "signal", "--policy", "ntp",
             "--schedule", schedule(tmp_path, text), "--out", out)
    rss, fds, n = usage(out)
    assert n == 10
    assert (rss[3:6, 0] == -1).all() and (fds[3:6, 0] == -1).all(), rss[:, 0]
    assert (rss[:3, 0] > 0).all() and (rss[6:, 0] > 0).all()
    assert (rss[:, 1:] > 0).all() and (fds[:, 1:] > 0).all()
    replay(out)
