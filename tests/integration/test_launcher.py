"""ntpbench refuses a launcher of another MPI than the one it was built against (src/app/launcher.cpp):
Debian's Open MPI 4.1 `mpirun`, first on PATH, ran the Open MPI 5 build's steps 30 to 300 times
slower and without fault tolerance, without a word. The refusal is exit 2 and one message naming
the build's own mpirun; NTPBENCH_ALLOW_ANY_LAUNCHER=1 lets such a launch run."""
import pathlib
import subprocess

import pytest

from conftest import ENV, MPIRUN, NTPBENCH, ntpbench

# Debian's launcher, for the venv's build. (The venv's launcher cannot start the build against
# Debian's at all: its LD_LIBRARY_PATH puts Open MPI 5's libmpi under Debian's libmpi_cxx, and the
# loader exits 127 before main.)
FOREIGN = pathlib.Path("/usr/bin/mpirun")
TINY = ["--preset", "tiny", "--tp", 2, "--steps", 2, "--quiet", "--no-final-checkpoint"]


@pytest.fixture
def foreign():
    if pathlib.Path(MPIRUN[0]) == FOREIGN:
        pytest.skip(f"this build is against the MPI of {FOREIGN}")
    if not FOREIGN.exists():
        pytest.skip(f"{FOREIGN} is not installed: no other MPI's launcher to try")
    return [str(FOREIGN), "--oversubscribe"]


def test_another_mpis_launcher_is_refused_once(foreign, tmp_path):
    out = tmp_path / "refused.h5"
    p = ntpbench(2, *TINY, "--out", out, mpirun=foreign, check=False, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.count("ntpbench: error:") == 1, p.stderr
    assert f"Launch it with {MPIRUN[0]}" in p.stderr and "NTPBENCH_ALLOW_ANY_LAUNCHER=1" in p.stderr, p.stderr
    assert not out.exists()


def test_any_launcher_runs_when_allowed(foreign, tmp_path):
    out = tmp_path / "allowed.h5"
    p = ntpbench(2, *TINY, "--out", out, mpirun=foreign, env={"NTPBENCH_ALLOW_ANY_LAUNCHER": "1"}, check=False,
                 timeout=120)
    assert "Launch it with" not in p.stderr, p.stderr
    assert p.returncode == 0 and out.exists(), p.stdout + p.stderr


def test_processes_alone_in_their_worlds_under_a_launcher_of_more_are_refused(tmp_path):
    # What another MPI's launcher can leave: each process an MPI world of one, while the launcher's
    # variables say it started two. Every one exits 2; the one it numbered 0 alone says why.
    said = []
    for rank in (0, 1):
        env = {**ENV, "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": str(rank)}
        p = subprocess.run([str(NTPBENCH), *map(str, TINY), "--out", tmp_path / f"alone{rank}.h5"], env=env,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 2, p.stdout + p.stderr
        said.append(p.stderr)
    assert "started 2 processes (OMPI_COMM_WORLD_SIZE), but this one's MPI world holds 1" in said[0], said[0]
    assert said[1] == "", said[1]
