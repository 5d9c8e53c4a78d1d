"""jobs/gpu/check.sh returns what ran whatever hangs, on a machine without a GPU: it runs against a
fake bundle of shell-script stubs (written without the executable bit, as a copy may leave them)
whose mpirun ignores SIGTERM and never returns, as Open MPI's mpirun can when every rank exits
non-zero. The check must finish within its budget, keep at most 8 files in its output folder
(check.log ending with the table, summary.txt, runs.tgz) and leave no process behind."""
import os
import pathlib
import re
import signal
import subprocess
import tarfile
import time
import uuid

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHECK = ROOT / "jobs" / "gpu" / "check.sh"
RUNS = ["gpt2-fp32", "gpt2-bf16", "gpt2-medium-fp32", "gpt2-medium-bf16", "gpt2-tf32", "shared-tp2-cuda",
        "shared-pp2-cuda"]
BENCHES = ["4to3", "8to7"]

NTPBENCH = r"""#!/usr/bin/env bash
# stub: a healthy run's step lines, and its --out file
out=; steps=10
while [ $# -gt 0 ]; do case $1 in --out) out=$2; shift ;; --steps) steps=$2; shift ;; esac; shift; done
for s in $(seq 1 "$steps"); do
  printf 'step %5d/%d | loss %.4f | norm 1.0000 | %8.1f ms | %9.0f tok/s | MFU %5.1f%% | TP 1\n' "$s" "$steps" 10.9 120.0 34000 20.5
done
echo "done: $steps steps"
[ -z "$out" ] || echo stub >"$out"
"""
TEST_CUDA = r"""#!/usr/bin/env bash
# stub: two passing tests, and the XML report
for a in "$@"; do case $a in --gtest_output=xml:*) echo '<testsuites tests="2"/>' >"${a#--gtest_output=xml:}" ;; esac; done
printf '%s\n' "[ RUN      ] Cuda.Memory" "[       OK ] Cuda.Memory (1 ms)" "[ RUN      ] Cuda.Gelu" \
  "[       OK ] Cuda.Gelu (1 ms)" "[==========] 2 tests from 1 test suite ran. (2 ms total)" "[  PASSED  ] 2 tests."
"""
# Answers --version, then hangs deaf to SIGTERM.
HANG = r"""#!/usr/bin/env bash
if [ "${1:-}" = --version ]; then echo "stub 1.0"; exit 0; fi
echo "[ RUN      ] Cuda.Memory"
trap '' TERM
sleep 1000
"""
BENCH = "#!/usr/bin/env bash\necho 'stub bench: never reached through the hung mpirun'\nexit 3\n"
ENV_SH = 'NTPBENCH_BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)\nNTPBENCH_BUNDLE_MISSING=\necho "gpu-bundle: stub"\n'
MANIFEST = "gpu-bundle of ntpbench (stub)\nglibc_needed: GLIBC_2.17\n\n  0  bin/ntpbench\n"


def make_bundle(path, hung_test_cuda=False, hung_env=False):
    files = {"bin/ntpbench": NTPBENCH, "bin/test_cuda": HANG if hung_test_cuda else TEST_CUDA,
             "bin/bench_resilience": BENCH, "bin/mpirun": HANG, "env.sh": ENV_SH + ("sleep 1000\n" if hung_env else ""),
             "MANIFEST.txt": MANIFEST}
    for name, text in files.items():
        f = path / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
        f.chmod(0o644)
    return path


def marked(mark):
    """The processes whose environment holds mark: whatever the check started, and their children."""
    found = []
    for p in pathlib.Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if mark.encode() in (p / "environ").read_bytes():
                    found.append(int(p.name))
            except OSError:
                pass
    return found


def check(tmp_path, env, path=None, term_after=None):
    """Runs check.sh into tmp_path/out (SIGTERM after term_after s, if given); returns (status,
    seconds, console, out). Fails the test if any process it started is left running."""
    out = tmp_path / "out"
    mark = f"GPU_CHECK_TEST={uuid.uuid4()}"
    full = {**os.environ, **env, "GPU_CHECK_TEST": mark.split("=", 1)[1], "CHECK_WORK": str(tmp_path / "work")}
    if path is not None:
        full["PATH"] = path
    start = time.monotonic()
    p = subprocess.Popen([str(CHECK), str(out)], cwd=ROOT, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    try:
        if term_after is not None:
            time.sleep(term_after)
            p.send_signal(signal.SIGTERM)
        console, _ = p.communicate(timeout=int(env.get("CHECK_BUDGET", 60)) + 40)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
    seconds = time.monotonic() - start
    time.sleep(0.5)
    left = marked(mark)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"processes left running: {left}\n{console}"
    return p.returncode, seconds, console, out


def table(out):
    rows = {}
    for line in (out / "summary.txt").read_text().splitlines():
        words = line.split()
        if words and words[0] in RUNS + BENCHES:
            rows[words[0]] = line
    return rows


def assert_output_folder(out):
    files = sorted(f.name for f in out.iterdir())
    assert len(files) <= 8 and all((out / f).is_file() for f in files), files
    summary = (out / "summary.txt").read_text()
    assert (out / "check.log").read_text().endswith(summary), "check.log does not end with the table"
    rows = table(out)
    assert sorted(rows) == sorted(RUNS + BENCHES), summary
    return summary, rows


def archived(out):
    with tarfile.open(out / "runs.tgz") as t:
        return set(t.getnames())


def test_hung_mpirun_times_out_and_the_rest_of_its_group_is_skipped(tmp_path):
    bundle = make_bundle(tmp_path / "bundle")
    env = {"BUNDLE": str(bundle), "CHECK_BUDGET": "40", "RUN_TIMEOUT": "5", "BENCH_TIMEOUT": "5", "TEST_TIMEOUT": "10"}
    rc, seconds, console, out = check(tmp_path, env)
    assert rc != 0, console
    assert seconds < 40 + 10, console
    assert all(os.access(bundle / "bin" / b, os.X_OK) for b in ("ntpbench", "test_cuda", "mpirun")), "bundle not chmod +x"
    summary, rows = assert_output_folder(out)
    assert "GPU tests: 2 passed, 0 failed, 0 skipped (rc 0" in summary
    for name in RUNS[:5]:
        assert " ok (" in rows[name], summary
    assert "FAIL timeout after 5s (killed)" in rows["shared-tp2-cuda"], summary
    assert "SKIPPED: after shared-tp2-cuda timed out" in rows["shared-pp2-cuda"], summary
    assert "FAIL timeout after 5s (killed)" in rows["4to3"], summary
    assert "SKIPPED: after 4to3 timed out" in rows["8to7"], summary
    assert "gpt2-bf16 vs gpt2-fp32: step 1 loss 10.9000 vs 10.9000 (0.0e+00 relative, ok)" in summary
    assert summary.splitlines()[-1].startswith("check.sh: FAIL in "), summary
    names = archived(out)
    for f in ("test_cuda.log", "test_cuda.xml", "gpt2-fp32.out", "gpt2-fp32.h5", "gpt2-tf32.h5", "shared-tp2-cuda.out",
              "bench-4to3.out"):
        assert f"runs/{f}" in names, sorted(names)


def test_budget_caps_a_hung_step_and_skips_the_rest(tmp_path):
    """test_cuda hangs deaf to SIGTERM: its 90 s limit is cut to what the 20 s budget leaves."""
    bundle = make_bundle(tmp_path / "bundle", hung_test_cuda=True)
    rc, seconds, console, out = check(tmp_path, {"BUNDLE": str(bundle), "CHECK_BUDGET": "20", "KILL_AFTER": "2"})
    assert rc != 0, console
    assert seconds < 20 + 5, console
    summary, rows = assert_output_folder(out)
    m = re.search(r"GPU tests: FAIL timeout after (\d+)s \(killed\): 0 passed", summary)
    assert m and 10 <= int(m.group(1)) <= 13, summary
    for name in RUNS + BENCHES:
        assert "SKIPPED: budget: " in rows[name], summary
    assert "runs/test_cuda.log" in archived(out)


def test_sigterm_ends_the_check_with_the_table(tmp_path):
    """A TERM from outside (an outer time limit) ends the step in progress at once; the table follows."""
    bundle = make_bundle(tmp_path / "bundle", hung_test_cuda=True)
    rc, seconds, console, out = check(tmp_path, {"BUNDLE": str(bundle)}, term_after=4)
    assert rc != 0, console
    assert seconds < 4 + 8, console
    summary, rows = assert_output_folder(out)
    assert "GPU tests: FAIL timeout" in summary and "stopped at the deadline" in summary.splitlines()[-1], summary
    assert all("SKIPPED: the check was stopped" in rows[n] for n in RUNS + BENCHES), summary


def test_a_check_stuck_outside_any_launch_is_stopped_past_its_deadline(tmp_path):
    """The bundle's env.sh (sourced, so under no time limit) hangs: the watchdog notes it in
    summary.txt and check.log CHECK_GRACE s past the deadline, and kills the check."""
    bundle = make_bundle(tmp_path / "bundle", hung_env=True)
    rc, seconds, console, out = check(tmp_path, {"BUNDLE": str(bundle), "CHECK_BUDGET": "6", "CHECK_GRACE": "3"})
    assert rc == -signal.SIGKILL, console
    assert 6 + 3 <= seconds < 6 + 3 + 5, console
    summary = (out / "summary.txt").read_text()
    note = "check.sh: stopped, stuck 3s past its 6s budget outside any launch"
    assert summary.splitlines()[-1].startswith(note) and (out / "check.log").read_text().splitlines()[-1].startswith(note)
    assert all(row.endswith("not reached") for row in table(out).values()), summary


NVIDIA_SMI = r"""#!/usr/bin/env bash
case "${1:-}" in
  --query-gpu=*) echo "index, name, driver_version, memory.total [MiB], clocks.max.sm [MHz], power.limit [W], compute_mode"
                 echo "0, NVIDIA H200, 570.86.15, 143771 MiB, 1980 MHz, 700.00 W, Exclusive_Process" ;;
  *) echo "stub nvidia-smi" ;;
esac
"""


def test_exclusive_process_gpu_skips_the_shared_runs(tmp_path):
    bundle = make_bundle(tmp_path / "bundle")
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text(NVIDIA_SMI)
    (fake / "nvidia-smi").chmod(0o755)
    env = {"BUNDLE": str(bundle), "BENCH_TIMEOUT": "2", "KILL_AFTER": "1"}
    rc, seconds, console, out = check(tmp_path, env, path=f"{fake}:{os.environ['PATH']}")
    assert rc == 1, console
    assert "NOTE: the GPU's compute mode is Exclusive_Process" in console
    summary, rows = assert_output_folder(out)
    assert summary.startswith("GPU: NVIDIA H200 (compute mode Exclusive_Process)"), summary
    assert (out / "nvidia-smi.txt").read_text() == "stub nvidia-smi\n"
    assert " ok (" in rows["gpt2-fp32"] and "MFU vs BF16 peak; ok (" in rows["gpt2-bf16"], summary
    for name in ("shared-tp2-cuda", "shared-pp2-cuda"):
        assert "SKIPPED: GPU compute mode Exclusive_Process: two ranks cannot share it" in rows[name], summary


def test_no_bundle_and_no_mpi_compiler_gives_one_line_and_the_table(tmp_path):
    # PATH: every command of the system's folders but the MPI ones (mpicxx, mpirun...)
    bin_ = tmp_path / "path"
    bin_.mkdir()
    for d in ("/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        for f in pathlib.Path(d).glob("*") if pathlib.Path(d).is_dir() else []:
            if not f.name.startswith("mpi") and not (bin_ / f.name).exists():
                (bin_ / f.name).symlink_to(f)
    env = {"BUNDLE": str(tmp_path / "no-bundle"), "BUILD": str(tmp_path / "no-build")}
    rc, seconds, console, out = check(tmp_path, env, path=str(bin_))
    assert rc == 1, console
    assert seconds < 20, console
    lines = [line for line in console.splitlines() if "nothing to run" in line]
    assert len(lines) == 1 and "no MPI compiler (mpicxx)" in lines[0], console
    assert "configure" not in console and "cmake" not in console, console
    summary, rows = assert_output_folder(out)
    assert "GPU tests: SKIPPED: no binaries (no bundle, no mpicxx)" in summary, summary
    for name in RUNS + BENCHES:
        assert "SKIPPED: no binaries (no bundle, no mpicxx)" in rows[name], summary
