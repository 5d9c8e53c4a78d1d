"""Every kind of user error, launched again and again under `mpirun`: each launch must end with exit
2 and one message, and the launcher must never outlive its ranks. Open MPI 5.0's launcher was seen
to stay asleep after every rank had gone (3 of 16 launches with a truncated checkpoint, when every
rank exited non-zero or called MPI_Abort); ntpbench's user errors take neither path (one rank
carries the exit status, README "Real failures"), and this loop is what shows it. Each launch runs
under `timeout --kill-after`: a launcher still there at the deadline fails the test, as does a
process of the job left behind.

NTPBENCH_BAD_INPUT_REPEATS sets the launches per kind (`make bad-input` runs 20; `make test`, 4)."""
import os
import subprocess

import h5py
import pytest

from conftest import ENV, MPIRUN, NTPBENCH, ntpbench

REPEATS = int(os.environ.get("NTPBENCH_BAD_INPUT_REPEATS", "4"))
TINY = ["--preset", "tiny", "--tp", "2", "--steps", "2", "--quiet"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """One bad input of each kind: (name, extra flags, what its one message says)."""
    d = tmp_path_factory.mktemp("bad")
    good = d / "good.h5"
    ntpbench(2, *TINY, "--out", good)
    with h5py.File(good, "r") as f:
        ckpt = f.attrs["final_checkpoint"]
        ckpt = ckpt.decode() if isinstance(ckpt, bytes) else str(ckpt)
    truncated = d / "truncated.h5"
    data = open(ckpt, "rb").read()
    truncated.write_bytes(data[: len(data) // 2])
    (d / "bad.toml").write_text('seq = "thirty"\n')
    (d / "bad.yaml").write_text("events:\n  - {step: 1, kill: [99]}\n")
    (d / "bad.bin").write_bytes(b"not a token file")
    not_a_run = d / "not-a-run.h5"
    with h5py.File(not_a_run, "w") as f:
        f.attrs["nothing"] = 1
    return [
        ("flag value", ["--steps", "0"], "--steps"),
        ("unknown flag", ["--stesp", "4"], "did you mean --steps?"),
        ("config", ["--config", str(d / "bad.toml")], "bad.toml:1"),
        ("schedule", ["--schedule", str(d / "bad.yaml")], "bad.yaml"),
        ("data", ["--data", str(d / "bad.bin")], "bad.bin"),
        ("checkpoint", ["--init-from", str(truncated)], "truncated.h5"),
        ("replay file", ["--replay", str(not_a_run)], "not-a-run.h5"),  # on one rank, as --replay runs
    ]


def test_every_user_error_ends_the_launch_every_time(inputs, tmp_path):
    failures = []
    for name, flags, message in inputs:
        for i in range(REPEATS):
            out = tmp_path / f"{name.replace(' ', '-')}-{i}.h5"
            ranks = "1" if "--replay" in flags else "2"
            cmd = [*MPIRUN, "-np", ranks, str(NTPBENCH), *TINY, *flags, "--out", str(out)]
            p = subprocess.run(["timeout", "--kill-after=5", "60", *cmd], env=ENV, capture_output=True, text=True)
            output = p.stdout + p.stderr
            left = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout.split()
            if p.returncode in (124, 137):
                failures.append(f"{name} #{i}: the launcher was still there after 60 s")
            elif (p.returncode != 2 or message not in output or "MPI_ABORT" in output
                  or output.count("ntpbench: error") + output.count("Run with --help") != 1):
                failures.append(f"{name} #{i}: exit {p.returncode}, not one message naming {message!r}:\n{output[-800:]}")
            if left:
                failures.append(f"{name} #{i}: {len(left)} process(es) left behind")
                subprocess.run(["pkill", "-9", "-f", str(out)])
    assert not failures, f"{len(failures)} of {len(inputs) * REPEATS} launches:\n" + "\n".join(failures[:10])
