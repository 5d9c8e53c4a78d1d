"""tests/readme/examples.py (make readme-examples) on READMEs of our own: a command that fails, is
cut at the smoke deadline, fails in a loop's first run or in a pipeline's first part, or writes a
paced results file that says `overran` must fail the runner, and name the command; a good one
passes. No MPI: the commands are shell builtins and h5py."""
import pathlib
import subprocess
import sys

import h5py
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUNNER = ROOT / "tests" / "readme" / "examples.py"


def run_readme(tmp_path, *commands, smoke=3):
    readme = tmp_path / "README.md"
    readme.write_text("# a README\n\n```sh\n" + "\n".join(commands) + "\n```\n")
    return subprocess.run([sys.executable, str(RUNNER), "--readme", str(readme), "--smoke", str(smoke),
                           "--keep", str(tmp_path / "scratch")], capture_output=True, text=True, timeout=120)


def test_a_good_readme_passes(tmp_path):
    p = run_readme(tmp_path, "echo hello")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 of 1 commands passed (1 as typed, 0 reduced" in p.stdout


@pytest.mark.parametrize("command", [
    "exit 1",
    "sleep 30",                                              # past the 3 s deadline: a cut is a failure
    "for i in 1 2; do [ $i = 2 ]; done",                    # the first run fails, the last passes
    "false | true",                                          # pipefail
], ids=["exit-1", "cut", "for-loop", "pipeline"])
def test_a_failing_command_fails_the_runner(tmp_path, command):
    p = run_readme(tmp_path, "echo before", command)
    assert p.returncode != 0, p.stdout
    failed = [line for line in p.stdout.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1 and command.split(";")[0] in failed[0], p.stdout
    assert "1 of 2 commands passed" in p.stdout and "1 failed" in p.stdout
    if command.startswith("sleep"):
        assert "(1 cut at the deadline)" in p.stdout


WRITE = """import sys, h5py
with h5py.File(sys.argv[sys.argv.index('--out') + 1], 'w') as f:
    f.attrs['paced_machine'] = '{}'
    f.create_group('summary').attrs['status'] = sys.argv[1]
"""


@pytest.mark.parametrize("status", ["overran", "ok"])
def test_a_paced_results_file_outside_the_scratch_directory_is_judged(tmp_path, status):
    # tmp_path is under /tmp, outside the runner's scratch directory: only the --out scan finds it.
    (tmp_path / "write.py").write_text(WRITE)
    out = tmp_path / "elsewhere" / "run.h5"
    out.parent.mkdir()
    p = run_readme(tmp_path, f"{sys.executable} {tmp_path}/write.py {status} --out {out}")
    with h5py.File(out, "r") as f:
        assert f["summary"].attrs["status"] == status
    if status == "ok":
        assert p.returncode == 0, p.stdout + p.stderr
        assert "[paced: ok]" in p.stdout
    else:
        assert p.returncode != 0, p.stdout
        assert "FAILED" in p.stdout and f"{out}: the paced run's status is overran" in p.stdout, p.stdout


def test_make_lines_are_listed_with_their_ci_stage(tmp_path):
    p = run_readme(tmp_path, "make test", "make demo", "echo ok")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "run by CI: .ci/run:" in p.stdout and "not in CI:" in p.stdout
    assert "2 make lines (1 run by CI, 1 not in CI)" in p.stdout


def test_a_reader_of_a_failed_command_is_not_run(tmp_path):
    p = run_readme(tmp_path, "touch results/x.h5; false --out results/x.h5", "cat results/x.h5")
    assert p.returncode != 0, p.stdout
    assert "reads the results of" in p.stdout and "which failed" in p.stdout, p.stdout
    assert "0 of 1 commands passed" in p.stdout and "1 not run (1 need a failed command's results)" in p.stdout


FAKE = """#!/bin/sh
# Stands for ntpbench: records its arguments where --out says, unless it only checks.
case " $* " in *" --check "*) exit 0 ;; esac
while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
echo "$ARGS" > "$out"
"""


def test_smoke_forms_follow_the_rules(tmp_path):
    fake = tmp_path / "ntpbench"
    fake.write_text(FAKE.replace("$ARGS", "ran"))
    fake.chmod(0o755)
    p = run_readme(
        tmp_path,
        r"printf 'events:\n  - {step: 4, kill: [2]}\n  - {step: 9, revive: [2]}\n' > sched.yaml",
        f"{fake} --steps 30 --schedule sched.yaml --out results/read.h5",    # read below: every event kept
        f"{fake} --steps 30 --schedule sched.yaml --out results/unread.h5",  # events past SMOKE_STEPS: --check
        f"{fake} --steps 30 --out results/short.h5",                         # no schedule: SMOKE_STEPS
        f"{fake} --steps 4 --out results/typed.h5",                          # short already: as typed
        "cat results/read.h5",
    )
    assert p.returncode == 0, p.stdout + p.stderr
    reduced = [line.split("reduced: ", 1)[1] for line in p.stdout.splitlines() if "reduced: " in line]
    assert reduced == [f"{fake} --steps 9 --schedule sched.yaml --out results/read.h5",
                       f"{fake} --steps 30 --schedule sched.yaml --out results/unread.h5 --check",
                       f"{fake} --steps 6 --out results/short.h5"], p.stdout
    assert "3 as typed, 3 reduced" in p.stdout, p.stdout
