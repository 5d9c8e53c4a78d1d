"""jobs/: the local mpirun launcher, the local sweep runner, and the scenario library (every schedule
and config passes `ntpbench --check` at the rank count it says it assumes)."""
import json
import os
import pathlib
import re
import shutil
import subprocess
import tomllib

import h5py
import pytest

from conftest import ENV, MPIRUN, NTPBENCH, ROOT, launcher_did_not_start, ntpbench


def text(v):
    """An HDF5 string attribute or field, whether stored fixed-length (bytes) or variable-length (str)."""
    return v.decode() if isinstance(v, bytes) else str(v)

JOBS = ROOT / "jobs"
SCHEDULES = sorted((JOBS / "schedules").glob("*.yaml"))
CONFIGS = sorted((JOBS / "configs").glob("*.toml"))
# Without OMP_NUM_THREADS from conftest: run.sh must choose the thread count itself.
# NTPBENCH: the scripts run the build under test (NTPBENCH_BUILD), not build/ by default.
LOCAL_ENV = {k: v for k, v in ENV.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")} | {"NTPBENCH": str(NTPBENCH)}


def run(cmd, timeout=300, **kw):
    p = subprocess.run([str(c) for c in cmd], env=kw.pop("env", LOCAL_ENV), capture_output=True, text=True,
                       timeout=timeout, **kw)
    return p


def two_cores():
    """Prefix that pins a command to 2 CPUs, so nproc says 2 on any machine (this one has 2 anyway)."""
    if shutil.which("taskset") and len(os.sched_getaffinity(0)) > 2:
        cpus = ",".join(map(str, sorted(os.sched_getaffinity(0))[:2]))
        return ["taskset", "-c", cpus]
    return []


def assumptions(path):
    """The `# assumes: ranks=8 tp=4 steps=30` line of a jobs/ file, as a dict of ints."""
    for line in path.read_text().splitlines():
        m = re.match(r"#\s*assumes:\s*(.*)", line)
        if m:
            return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}
    return {}


def check(ranks, *args):
    cmd = [*MPIRUN, "-np", ranks, NTPBENCH, *args, "--check"]
    p = run(cmd, env=ENV, timeout=120)
    if launcher_did_not_start(p):  # Open MPI's launcher failed before any rank ran (conftest.py): once more
        p = run(cmd, env=ENV, timeout=120)
    assert p.returncode == 0 and "ntpbench --check: OK" in p.stdout, \
        f"{' '.join(map(str, cmd))} exited {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    return p.stdout


def test_run_sh_oversubscribes_and_paces_by_itself(tmp_path):
    out = tmp_path / "run.h5"
    p = run([*two_cores(), JOBS / "local" / "run.sh", "-n", 8, "--preset", "tiny", "--tp", 4, "--steps", 4,
             "--out", out, "--quiet"], timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    cmdline = next(l for l in p.stdout.splitlines() if l.startswith("run.sh: +"))
    assert "--oversubscribe" in cmdline and "--timing paced" in cmdline, cmdline
    assert "--bind-to none" in cmdline and "--threads 1" in cmdline and "-x OMP_NUM_THREADS" in cmdline, cmdline
    # No machine named: the demo's, whose compute:communication ratio a real job has.
    assert "--machine dgx-a100 --emulate-shape gpt2-xl" in cmdline, cmdline
    with h5py.File(out, "r") as f:
        assert text(f.attrs["timing"]) == "paced"
        machine = json.loads(text(f.attrs["paced_machine"]))
        assert machine["machine"] == "dgx-a100" and machine["emulate_shape"] == "gpt2-xl", machine
        assert int(f.attrs["ranks"]) == 8 and int(f.attrs["threads_per_rank"]) == 1
        assert len(f["steps"]) == 4


def test_run_sh_keeps_user_choices_and_binds_when_cores_suffice(tmp_path):
    # Dry runs: the command only. A user's --timing wins; few ranks are bound, not oversubscribed.
    p = run([*two_cores(), JOBS / "local" / "run.sh", "-n", 8, "--dry-run", "--preset", "tiny", "--timing", "wall"])
    assert p.returncode == 0, p.stderr
    assert "--timing paced" not in p.stdout and "--timing wall" in p.stdout and "--oversubscribe" in p.stdout
    assert "--machine" not in p.stdout
    # A machine named (here in a config file), or a llama preset: no machine added, or llama's shape.
    cfg = tmp_path / "h100.toml"
    cfg.write_text('preset = "tiny"\nmachine = "dgx-h100"\n')
    p = run([*two_cores(), JOBS / "local" / "run.sh", "-n", 8, "--dry-run", "--config", cfg])
    assert p.returncode == 0 and "--timing paced" in p.stdout and "--machine" not in p.stdout, p.stdout
    p = run([*two_cores(), JOBS / "local" / "run.sh", "-n", 8, "--dry-run", "--preset", "llama-tiny"])
    assert p.returncode == 0 and "--machine dgx-a100 --emulate-shape llama-8b" in p.stdout, p.stdout
    p = run([*two_cores(), JOBS / "local" / "run.sh", "-n", 2, "--dry-run", "--preset", "tiny"])
    assert p.returncode == 0, p.stderr
    assert "--oversubscribe" not in p.stdout and "--timing paced" not in p.stdout
    assert "--bind-to core" in p.stdout


@pytest.mark.parametrize("path", SCHEDULES, ids=[p.name for p in SCHEDULES])
def test_schedule_passes_check(path):
    body = path.read_text()
    assert body.startswith("#"), f"{path.name} must begin with a comment saying what it models"
    a = assumptions(path)
    # Unless the file says otherwise: 8 ranks as TP 4, and a run long enough for its last event.
    steps = a.get("steps") or max([int(s) for s in re.findall(r"step:\s*(\d+)", body)] or [100])
    if "kill_node" in body:
        # Hosts named node1.. exist only on a cluster (tests/integration/test_cluster.py checks the
        # file there); on this one host the schedule is parsed and its host refused by name.
        p = ntpbench(a.get("ranks", 8), "--preset", "tiny", "--tp", a.get("tp", 4), "--steps", steps,
                     "--schedule", path, "--check", check=False)
        assert p.returncode == 2 and "no rank of this job runs on host 'node2'" in p.stderr, p.stderr
        return
    out = check(a.get("ranks", 8), "--preset", "tiny", "--tp", a.get("tp", 4), "--steps", steps, "--schedule", path)
    kills = int(re.search(r"\((\d+) kills", out).group(1))
    # A straggler schedule slows a rank instead (jobs/schedules/one-straggler*.yaml).
    slows = len(re.findall(r"slow:\s*\[\s*\d", body))
    assert kills >= 1 or slows >= 1, f"{path.name} kills and slows nobody in {steps} steps: {out}"
    if path.name == "llama3-random.yaml":  # Llama 3's rate, scaled: a few failures in 8 ranks x 100 steps
        assert (a["ranks"], steps) == (8, 100) and 2 <= kills <= 5, out


@pytest.fixture(scope="module")
def flag_names():
    p = run([NTPBENCH, "--help"], env=ENV)
    return set(re.findall(r"--([a-z][a-z0-9-]*)", p.stdout))


def test_every_preset_has_a_config():
    p = run([NTPBENCH, "--help"], env=ENV)
    presets = re.search(r"--preset TEXT:\{([^}]*)\}", p.stdout).group(1).split(",")
    assert sorted(presets) == sorted(c.stem for c in CONFIGS)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_config_passes_check(path, flag_names):
    body = path.read_text()
    assert body.startswith("#"), f"{path.name} must begin with a comment saying what it models"
    conf = tomllib.loads(body)
    # CLI11 ignores keys it does not know (e.g. micro_batch for micro-batch): check the names here.
    unknown = [k for k in conf if k not in flag_names]
    assert not unknown, f"{path.name}: {unknown} are not ntpbench flags"
    assert conf["preset"] == path.stem
    ranks = assumptions(path).get("ranks")
    assert ranks, f"{path.name} needs a '# assumes: ranks=N' line"
    out = check(ranks, "--config", path)
    assert f"model {path.stem} " in out and f"TP {conf['tp']}" in out, out


def test_local_sweep_runs_the_example_and_reports(tmp_path):
    sweep = JOBS / "sweeps" / "policies.txt"
    tasks = [l for l in sweep.read_text().splitlines() if l.strip() and not l.lstrip().startswith("#")]
    # Wide: four paced tasks at an automatic time scale took 24 to 134 s each in one CI run (318 s in all).
    p = run([JOBS / "local" / "sweep.sh", sweep, "-o", tmp_path / "sweep"], cwd=ROOT, timeout=700)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    files = sorted((tmp_path / "sweep").glob("task-*.h5"))
    assert len(files) == len(tasks) >= 4
    for i, line in enumerate(tasks, 1):
        with h5py.File(tmp_path / "sweep" / f"task-{i}.h5", "r") as f:
            assert text(f.attrs["policy"]) in line and text(f.attrs["timing"]) == "paced"
    report = (tmp_path / "sweep" / "report.txt").read_text()
    assert "policy" in report and "good tok/s" in report
    assert sum(1 for l in report.splitlines() if "task-" in l and l.rstrip().endswith("ok")) == len(tasks), report
    assert report in p.stdout
