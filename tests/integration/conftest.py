"""Helpers for the end-to-end tests: they launch the real ntpbench binary under mpirun."""
import os
import pathlib
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The build under test (NTPBENCH_BUILD, default build/) and the MPI it was built with: its mpirun,
# and --with-ft ulfm where that MPI has ULFM (recorded in the CMake cache).
BUILD = pathlib.Path(os.environ.get("NTPBENCH_BUILD", ROOT / "build"))
NTPBENCH = BUILD / "ntpbench"


def _cache(name, default=""):
    try:
        for line in (BUILD / "CMakeCache.txt").read_text().splitlines():
            if line.startswith(name + ":"):
                return line.split("=", 1)[1]
    except OSError:
        pass
    return default


ULFM = _cache("NTPBENCH_HAVE_ULFM") in ("1", "ON", "TRUE")
MPIRUN = [_cache("MPIEXEC_EXECUTABLE", "mpirun") or "mpirun", "--oversubscribe", *(["--with-ft", "ulfm"] if ULFM else [])]
# The launcher settings real failures need come from the MPI's own parameter file, as for a user
# (jobs/prte-mca-params.conf, installed by `make deps`), not from here.
ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMP_NUM_THREADS": "1"}


def skip_or_fail(reason, require):
    """Skips the test for `reason`, or fails it where the environment variable `require` is set:
    CI sets NTPBENCH_REQUIRE_* where a test must run, so that nothing it meant to cover is lost."""
    __tracebackhide__ = True  # report the test's line, not this one
    if os.environ.get(require, "") not in ("", "0"):
        pytest.fail(f"{reason} ({require} is set, so this is a failure, not a skip)")
    pytest.skip(reason)


@pytest.fixture
def ulfm():
    """For the tests that need real kills: a build whose MPI has ULFM (NTPBENCH_REQUIRE_ULFM=1: or fail)."""
    if not ULFM:
        skip_or_fail(f"this build's MPI has no ULFM ({BUILD}/CMakeCache.txt: NTPBENCH_HAVE_ULFM is off; "
                     "make MPI=system): fence mode only", "NTPBENCH_REQUIRE_ULFM")


# Marks a test (or, as `pytestmark`, a module) that needs ULFM.
needs_ulfm = pytest.mark.usefixtures("ulfm")


@pytest.fixture(scope="session", autouse=True)
def binary():
    if not NTPBENCH.exists():
        pytest.fail(f"{NTPBENCH} is missing: run `make build` first")


# timeout(1) that first prints every process's stacks (gdb) when the job hangs.
TIMEOUT_WITH_STACKS = ROOT / "tests" / "timeout_with_stacks.sh"


def launcher_did_not_start(p):
    """The launcher's own start-up failure, before any ntpbench process ran: nothing of ntpbench's in
    the output, and PRRTE's message for a PMIx server that could not listen."""
    out = p.stdout + p.stderr
    return p.returncode != 0 and "PMIx server's listener thread failed to start" in out and "ntpbench" not in p.stdout


def ntpbench(ranks, *args, check=True, timeout=300, launch_through=(), mpirun=MPIRUN, env=None):
    """Runs `mpirun -np ranks ntpbench args...` (each rank started by the command `launch_through`,
    if given; `mpirun` another launcher, `env` variables added); returns the CompletedProcess. A run
    still going after `timeout` seconds fails the test with where each of its processes waited."""
    cmd = [*mpirun, "-np", str(ranks), *launch_through, str(NTPBENCH), *map(str, args)]
    p = subprocess.run([str(TIMEOUT_WITH_STACKS), str(timeout), *cmd], env={**ENV, **(env or {})},
                       capture_output=True, text=True, timeout=timeout + 600)
    if launcher_did_not_start(p):
        # Open MPI 5.0's launcher itself failed before starting any process of ntpbench (seen about
        # once in 300 launches under CI, docs/checks.md): launched once more, and said so.
        print(f"note: mpirun's PMIx listener failed to start; launching again: {' '.join(cmd)}", file=sys.stderr)
        p = subprocess.run([str(TIMEOUT_WITH_STACKS), str(timeout), *cmd], env={**ENV, **(env or {})},
                           capture_output=True, text=True, timeout=timeout + 600)
    if p.returncode == 124:
        raise AssertionError(f"{' '.join(cmd)} hung: still running after {timeout} s\n{p.stdout[-3000:]}\n"
                             f"{p.stderr[-60000:]}")
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def replay(path):
    """`ntpbench --replay` on one rank must agree."""
    p = subprocess.run([str(NTPBENCH), "--replay", str(path), "--quiet"], env=ENV, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and "AGREES" in p.stdout, p.stdout + p.stderr
    return p.stdout


def steps(path):
    with h5py.File(path, "r") as f:
        return f["steps"][()]


def replicas(path, name="tp_degree"):
    with h5py.File(path, "r") as f:
        return f["replicas"][name][()]


def events(path):
    with h5py.File(path, "r") as f:
        e = f["events"][()]
    return [(int(r["step"]), r["kind"].decode(), int(r["rank"])) for r in e]


def damaged_throughput_ratio(path):
    """For a 10-step run with a rank dead from step 4 until its revival at step 9: tokens per (wall or
    emulated) second over steps 4-8 against steps 2-3 and 9-10 (step 1 warms up), medians; and the
    number of paced overruns."""
    s = steps(path)
    tput = s["tokens"] / (s["t_end"] - s["t_start"])
    healthy = np.median(np.r_[tput[1:3], tput[8:10]])
    damaged = np.median(tput[3:8])
    return damaged / healthy, int(s["paced_overrun"].sum())


def schedule(tmp_path, text, name="schedule.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def signal_when(cmd, out, find_pid, sig, poll=0.5, run_timeout=120):
    """Starts the job `cmd` writing the results file `out`, reads that file while it runs until
    `find_pid(f)` (f: the open h5py file) names a process, sends it `sig` and waits for the job's
    end. Returns the exit code, the output and the pid."""
    proc = subprocess.Popen(list(map(str, cmd)), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        pid, deadline = None, time.time() + 60
        while pid is None and time.time() < deadline:
            time.sleep(poll)
            try:
                with h5py.File(out, "r", locking=False) as f:
                    pid = find_pid(f)
            except (OSError, KeyError, IndexError):
                pass
        assert pid is not None, "the run did not get going"
        os.kill(pid, sig)
        output, _ = proc.communicate(timeout=run_timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, output, pid


def run_and_kill(out, procs, args, victim, min_steps=3, trainers=None, sig=9):
    """Starts a paced run of `procs` processes (`trainers` of them trainers: all by default), waits
    for min_steps rows, sends logical rank `victim`'s process signal `sig` (kill -9; SIGSTOP freezes
    it). Returns the exit code and output."""
    trainers = trainers or procs
    cmd = [*MPIRUN, "-np", str(procs), str(NTPBENCH), *map(str, args), "--timing", "paced",
           "--device-gflops", "0.2", "--out", str(out)]

    def victim_pid(f):
        inc = f["ranks"]["incarnations"][()]
        if len(f["steps"]) >= min_steps and len(inc) == trainers:
            return int(inc[inc["rank"] == victim]["pid"][0])
        return None

    rc, output, _ = signal_when(cmd, out, victim_pid, sig)
    return rc, output
