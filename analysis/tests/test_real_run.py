"""A real small run of ntpbench (4 ranks, tiny, TP 2), read through the schema-1 contract: the build
in NTPBENCH_BUILD (default build/, as for tests/integration), under the mpirun it was built with.

Skipped only when the binary has not been built. It does NOT accept the pre-v1 development
schema ("0.1"): until the recorder writes schema 1 (results/README.md) this test fails, on purpose,
with the loader's message naming the version it found.
"""
import os
import shutil
import subprocess

import h5py
import numpy as np
import pytest

from analysis import metrics
from analysis.__main__ import main as cli
from analysis.runfile import EVENT_FIELDS, PHASES, REPLICA_DATASETS, STEP_FIELDS, SUMMARY_KEYS, load_run

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("NTPBENCH_BUILD", os.path.join(REPO, "build"))
BINARY = os.path.join(BUILD, "ntpbench")
STEPS = 6


def build_mpirun():
    """The build's launcher (MPIEXEC_EXECUTABLE in its CMake cache), else the first `mpirun` on PATH."""
    try:
        with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
            found = [line.split("=", 1)[1].strip() for line in f if line.startswith("MPIEXEC_EXECUTABLE:")]
    except OSError:
        found = []
    return found[0] if found and found[0] else shutil.which("mpirun")


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    if not os.path.exists(BINARY):
        pytest.skip(f"{BINARY} not built (run `make build`); the real-run analysis test needs it")
    mpirun = build_mpirun()
    if mpirun is None:
        pytest.skip("mpirun not found")
    out = str(tmp_path_factory.mktemp("real") / "tiny.h5")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [mpirun, "--oversubscribe", "-np", "4", BINARY, "--preset", "tiny", "--tp", "2", "--steps", str(STEPS),
           "--out", out, "--no-final-checkpoint", "--quiet"]
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"{' '.join(cmd)} failed:\n{res.stdout}\n{res.stderr}"
    return out


def test_real_run_schema_v1(real_run):
    with h5py.File(real_run, "r") as f:
        version = f.attrs.get("schema_version")
        version = version.decode() if isinstance(version, bytes) else str(version)
        assert version == "2", f"recorder writes schema_version {version!r}; results/README.md documents '2'"
        for a in ("ntpbench_version", "git_revision", "start_time", "hosts", "mpi_library_version", "ranks", "tp",
                  "replicas", "policy", "kill_mode", "kill_mode_reason", "timing", "config", "data", "tokens_per_sample", "threads_per_rank",
                  "peak_gflops_per_rank", "peak_gflops_source", "blas_core", "blas_config",
                  "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
            assert a in f.attrs, f"root attribute {a} missing"
        names = f["steps"].dtype.names
        assert [n for n in STEP_FIELDS if n not in names] == [], "missing /steps fields"
        for d in REPLICA_DATASETS:
            assert f[f"replicas/{d}"].shape == (STEPS, 2), d
        assert f["ranks/phase_times"].shape == (STEPS, 4, len(PHASES))
        names = f["ranks/phase_times"].attrs["phases"]
        assert (names.decode() if isinstance(names, bytes) else str(names)).split(",") == list(PHASES)
        if "events" in f:
            assert [n for n in EVENT_FIELDS if n not in f["events"].dtype.names] == []
        assert [k for k in SUMMARY_KEYS if k not in f["summary"].attrs] == [], "missing /summary attributes"
        assert int(f["summary"].attrs["tokens"]) == int(np.sum(f["steps"]["tokens"]))


def test_real_run_metrics_agree(real_run):
    run = load_run(real_run)
    bad = metrics.compare(run)
    assert bad == [], "\n".join(map(str, bad))
    rec = metrics.recompute(run)
    assert rec["steps"] == STEPS and rec["failures"] == 0
    assert rec["goodput_ratio"] == pytest.approx(rec["goodput_tokens_per_s"] / rec["healthy_throughput_tokens_per_s"])
    assert 0 < rec["ettr"] <= 1


def test_real_run_report_and_plot(real_run, tmp_path, capsys):
    assert cli(["report", real_run, "--csv", str(tmp_path / "r.csv")]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "2x1x2" in out and " ok" in out
    assert cli(["plot", real_run, "--out", str(tmp_path / "plots")]) == 0
    paths = capsys.readouterr().out.split()
    assert len(paths) == 6     # throughput, tp_degree, phases; loss, goodput_by_policy, phase_totals
    for p in paths:
        assert os.path.getsize(p) > 10_000, p
