"""The soak's samples in a real run: every rank's resident memory and open descriptors after every
step (/ranks/rss_bytes, /ranks/open_fds), -1 while a rank has no process, kept by the recorder
that takes over when logical rank 0 dies, and read by `python -m analysis soak` (`make soak` runs
the long version; analysis/tests/test_soak.py checks the growth rule on synthetic files)."""
import json
import subprocess
import sys

import h5py
import numpy as np
import pytest

from conftest import BUILD, ENV, MPIRUN, ROOT, needs_ulfm, ntpbench, replay, schedule

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


@needs_ulfm
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


@needs_ulfm
def test_the_library_cost_program_measures_replacements_and_the_soak_reads_it(tmp_path):
    # bench/ulfm_respawn_cost at 4 ranks, 8 cycles: a sample per cycle, a fitted cost, and a rank 0
    # that ends holding a descriptor for a peer in another job. Then a real-kill run is judged with it.
    tool = BUILD / "bench" / "ulfm_respawn_cost"
    if not tool.exists():
        pytest.skip("built without the benchmarks (-DNTPBENCH_BENCH=OFF)")
    cost = tmp_path / "cost.json"
    p = subprocess.run([*MPIRUN, "-np", "4", str(tool), "--cycles", "8", "--timeout", "120", "--json", str(cost)],
                       env=ENV, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "4 ranks, 8 replacements, freed handles" in p.stdout, p.stdout
    j = json.loads(cost.read_text())
    assert j["ranks"] == 4 and len(j["rss_bytes"]) == len(j["open_fds"]) == 8
    assert all(r > 5e6 for r in j["rss_bytes"]) and j["open_fds_max"] > j["open_fds_first"]
    assert np.isfinite(j["rss_bytes_per_replacement"]) and j["rss_bytes_per_replacement"] > 0
    bad = subprocess.run([*MPIRUN, "-np", "2", str(tool)], env=ENV, capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "needs at least 3 ranks" in bad.stderr

    out = tmp_path / "signal.h5"
    text = "events:\n  - {step: 3, kill: [1]}\n  - {step: 6, revive: [1]}\n"
    ntpbench(4, *TINY, "--tp", 2, "--steps", 25, "--kill-mode", "signal", "--schedule", schedule(tmp_path, text),
             "--out", out)
    p = subprocess.run([sys.executable, "-m", "analysis", "soak", str(out), "--library-cost", str(cost)], cwd=ROOT,
                       env=ENV, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "MPI library's share (Open MPI" in p.stdout and "RSS beyond MPI" in p.stdout
