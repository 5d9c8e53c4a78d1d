"""`python -m analysis soak` on synthetic files: a leak (growing memory or descriptors) is flagged,
a flat run passes, and a revived rank's new process is judged on its own samples (the end-to-end
check that real runs write the samples is tests/integration/test_soak.py)."""
import json
import subprocess
import sys

import h5py
import numpy as np
import pytest

from analysis import soak
from analysis.tests.conftest import REPO

STEPS, RANKS = 200, 8
BASE_RSS, BASE_FDS = 32_000_000, 20


def write(path, rss, fds, summary=True, policy="ntp", kill_mode="fence", revived_at=None):
    """A results file; `revived_at` lists the steps of revive events (default: one kill, heal, revive, kill)."""
    with h5py.File(path, "w") as f:
        f.attrs["schema_version"] = "1"
        f.attrs["policy"] = policy
        f.attrs["config"] = json.dumps({"steps": len(rss), "kill_mode": kill_mode})
        g = f.create_group("ranks")
        g.create_dataset("rss_bytes", data=np.asarray(rss, dtype="<i8"))
        g.create_dataset("open_fds", data=np.asarray(fds, dtype="<i4"))
        dtype = [("step", "<i8"), ("kind", "S16")]
        if revived_at is None:
            events = np.array([(10, b"kill"), (10, b"heal"), (15, b"revive"), (40, b"kill")], dtype=dtype)
        else:
            events = np.array([e for s in revived_at for e in ((s - 5, b"kill"), (s, b"revive"))], dtype=dtype)
        f.create_dataset("events", data=events)
        if summary:
            f.create_group("summary").attrs["steps"] = float(len(rss))
    return str(path)


def flat(rng):
    """Samples that wobble by +-1% around a constant, as a healthy process's do."""
    rss = BASE_RSS * (1 + 0.01 * rng.uniform(-1, 1, (STEPS, RANKS)))
    return rss.astype(np.int64), np.full((STEPS, RANKS), BASE_FDS)


def run_cli(*paths):
    return subprocess.run([sys.executable, "-m", "analysis", "soak", *map(str, paths)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_a_flat_run_passes(tmp_path):
    rss, fds = flat(np.random.default_rng(0))
    row, problems = soak.check_file(write(tmp_path / "flat.h5", rss, fds))
    assert problems == []
    assert abs(row["rss"].value) < 0.02 and row["fds"].value == 0
    assert (row["failures"], row["revivals"]) == (2, 1)
    p = run_cli(tmp_path / "flat.h5")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ok" in p.stdout.splitlines()[-1] and "RSS growth max" in p.stdout


def test_growing_memory_on_one_rank_fails(tmp_path):
    rss, fds = flat(np.random.default_rng(1))
    rss[:, 5] += np.arange(STEPS) * 20_000  # 20 kB a step: 12% over the run
    path = write(tmp_path / "leak.h5", rss, fds)
    row, problems = soak.check_file(path)
    assert row["rss"].rank == 5 and row["rss"].value > 0.05
    assert any("RSS grew" in p and "rank 5" in p for p in problems)
    p = run_cli(path)
    assert p.returncode == 1 and "FAIL" in p.stdout and "RSS grew" in p.stderr


def test_growing_descriptors_fail(tmp_path):
    rss, fds = flat(np.random.default_rng(2))
    fds[:, 2] += np.arange(STEPS) // 20  # one more descriptor every 20 steps: 20 -> 29
    row, problems = soak.check_file(write(tmp_path / "fds.h5", rss, fds))
    assert row["fds"].rank == 2 and any("open fds grew" in p for p in problems)


def test_a_revived_process_is_judged_on_its_own_samples(tmp_path):
    # Rank 3 dies at step 80 (no sample), and its new process starts 5 steps later from a larger
    # baseline: two incarnations, each flat, so no growth; joined into one series it would be 20%.
    rss, fds = flat(np.random.default_rng(3))
    rss[80:85, 3], fds[80:85, 3] = -1, -1
    rss[85:, 3] = rss[85:, 3] * 1.2
    row, problems = soak.check_file(write(tmp_path / "revived.h5", rss, fds))
    assert problems == [] and row["rss"].total == RANKS + 1 and row["rss"].judged == RANKS + 1
    assert row["rss"].value < 0.02


def test_too_few_samples_and_an_unfinished_run_fail(tmp_path):
    rss, fds = flat(np.random.default_rng(4))
    _, problems = soak.check_file(write(tmp_path / "short.h5", rss[:soak.MIN_SAMPLES - 1], fds[:soak.MIN_SAMPLES - 1]))
    assert any("too few samples" in p for p in problems)
    _, problems = soak.check_file(write(tmp_path / "cut.h5", rss, fds, summary=False))
    assert any("did not finish" in p for p in problems)
    path = write(tmp_path / "short-run.h5", rss, fds)
    with h5py.File(path, "a") as f:
        f.attrs["config"] = json.dumps({"steps": STEPS + 10})
    _, problems = soak.check_file(path)
    assert any(f"{STEPS} rows of samples for a run of {STEPS + 10} steps" in p for p in problems)


@pytest.mark.parametrize("column, expect", [
    ([5, 5, -1, 6, 6, 0, 7], [[5, 5], [6, 6], [7]]),
    ([-1, -1], []),
])
def test_incarnations_are_runs_of_samples(column, expect):
    assert [s.tolist() for s in soak.incarnations(np.array(column))] == expect


# --library-cost: what the MPI keeps per replaced process (ulfm_respawn_cost's JSON).
COST_RSS = 200_000


def library_cost(tmp_path, ranks=RANKS):
    path = tmp_path / "cost.json"
    path.write_text(json.dumps({"ranks": ranks, "rss_bytes_per_replacement": COST_RSS, "open_fds_first": 19,
                                "open_fds_max": 19 + ranks - 1, "library": "Open MPI v5.0.11"}))
    return soak.LibraryCost.load(str(path)), path


def replaced_run(rng, leak_per_step=0):
    """A signal-mode run with a revival every 10 steps, where every process grows by the library's
    cost at each revival (and, with a leak, by `leak_per_step` bytes a step), and gains one descriptor
    per replaced peer up to the peer count."""
    revived_at = list(range(10, STEPS, 10))
    rss, fds = flat(rng)
    for s in revived_at:  # row i is sampled after step i + 1: a revival at step s shows from row s - 1
        rss[s - 1:] += COST_RSS
        fds[s - 1:] += 1 if s // 10 < RANKS else 0
    rss += (np.arange(STEPS) * leak_per_step)[:, None]
    return rss, fds, revived_at


def test_growth_the_library_explains_passes_with_its_cost_and_fails_without(tmp_path):
    rss, fds, revived_at = replaced_run(np.random.default_rng(5))
    path = write(tmp_path / "signal.h5", rss, fds, kill_mode="signal", revived_at=revived_at)
    _, raw = soak.check_file(path)
    assert any("RSS grew" in p for p in raw) and any("open fds grew" in p for p in raw)
    cost, cost_path = library_cost(tmp_path)
    row, problems = soak.check_file(path, cost)
    assert problems == [], problems
    assert row["rss"].value > 0.05 and abs(row["rss"].beyond) < 0.02
    assert row["fds"].value > 0.05 and row["fds"].beyond <= 0.0
    p = subprocess.run([sys.executable, "-m", "analysis", "soak", path, "--library-cost", str(cost_path)],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "200 kB resident per replaced process" in p.stdout and "RSS beyond MPI" in p.stdout


def test_a_leak_of_its_own_fails_beside_the_library_share(tmp_path):
    rss, fds, revived_at = replaced_run(np.random.default_rng(6), leak_per_step=20_000)  # +12% of its own
    cost, _ = library_cost(tmp_path)
    row, problems = soak.check_file(write(tmp_path / "leak.h5", rss, fds, kill_mode="signal",
                                          revived_at=revived_at), cost)
    assert row["rss"].beyond > 0.05
    assert any("beyond the MPI library's share" in p and "RSS" in p for p in problems)


def test_the_library_share_applies_to_signal_runs_at_its_own_rank_count_only(tmp_path):
    rss, fds, revived_at = replaced_run(np.random.default_rng(7))
    fenced = write(tmp_path / "fence.h5", rss, fds, kill_mode="fence", revived_at=revived_at)
    cost, _ = library_cost(tmp_path)
    row, problems = soak.check_file(fenced, cost)  # fence mode spawns nothing: judged on the raw growth
    assert np.isnan(row["rss"].beyond) and any("RSS grew" in p for p in problems)
    signal = write(tmp_path / "signal.h5", rss, fds, kill_mode="signal", revived_at=revived_at)
    other, _ = library_cost(tmp_path, ranks=4)
    _, problems = soak.check_file(signal, other)
    assert any("measured at 4 ranks, this run has 8" in p for p in problems)


def test_a_revival_inside_the_last_window_counts_only_where_it_shows(tmp_path):
    # Logical rank 5's first process in a CI soak (ntp-pw, 300 steps), descriptor for descriptor: 18
    # at the start, +1 for the replacement revived at step 35, -1 when that peer and three others
    # die at step 43, +4 when all four come back in one spawn at step 48, then rank 5 dies at
    # step 50. Its 49 samples have windows of 4; the four revivals land in the last window's last
    # two samples. Judged on the windows' middles they would not count at all (+5.6%: one
    # descriptor over 18, a failure); taken off the samples they raise, nothing is left.
    rss, fds = flat(np.random.default_rng(8))
    fds[:, :] = 18
    fds[34:, :] += 1
    fds[42:, :] -= 1
    fds[47:, :] += 4
    rss[49:54, 5] = fds[49:54, 5] = -1  # rank 5 died at step 50 and came back at step 55
    path = write(tmp_path / "window.h5", rss, fds, kill_mode="signal", revived_at=[35, 48, 48, 48, 48, 55])
    cost, _ = library_cost(tmp_path)
    row, problems = soak.check_file(path, cost)
    assert row["fds"].beyond <= 0.0 and problems == [], problems
    # The same four descriptors with no revival behind them are growth of the process's own.
    path = write(tmp_path / "window.h5", rss, fds, kill_mode="signal", revived_at=[35, 55])
    row, problems = soak.check_file(path, cost)
    assert row["fds"].beyond > 0.05, row["fds"]
    assert any("open fds grew" in p and "beyond" in p for p in problems), problems
