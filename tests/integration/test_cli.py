"""Bad input never starts a run: each bad flag or schedule exits non-zero with a message that
names the problem (and the schedule's line), and writes no results file."""
import socket

import pytest

from conftest import ntpbench, schedule

BAD_SCHEDULES = {
    "unknown rank": ("events:\n  - {step: 2, kill: [9]}\n", "schedule.yaml:2: rank 9 does not exist"),
    "kill of a dead rank": ("events:\n  - {step: 2, kill: [1]}\n  - {step: 3, kill: [1]}\n",
                            "schedule.yaml:3: step 3: kill of rank 1, which is already dead"),
    "revive of a live rank": ("events:\n  - {step: 2, revive: [1]}\n", "revive of rank 1, which is alive"),
    "step out of range": ("events:\n  - {step: 99, kill: [1]}\n", "step 99 is outside the run (steps 1..6)"),
    "step zero": ("events:\n  - {step: 0, kill: [1]}\n", "step 0 is outside the run"),
    "negative rank": ("events:\n  - {step: 2, kill: [-1]}\n", "rank -1 does not exist"),
    "non-integer step": ("events:\n  - {step: 2.5, kill: [1]}\n", "step must be an integer, got '2.5'"),
    "non-integer rank": ("events:\n  - {step: 2, kill: [one]}\n", "rank must be an integer, got 'one'"),
    "unknown key": ("events:\n  - {step: 2, kil: [1]}\n", "unknown key 'kil' in an event"),
    "unknown top-level key": ("event:\n  - {step: 2, kill: [1]}\n", "unknown key 'event' in the schedule"),
    "malformed YAML": ("events:\n  - {step: 2, kill: [1]\n", "malformed YAML"),
    "negative repair": ("random: {mtbf_steps: 10, repair_steps: -2, seed: 1}\n", "repair_steps must be at least 1"),
    "random without seed": ("random: {mtbf_steps: 10, repair_steps: 2}\n", "'random' needs 'seed'"),
    "unknown host": ("events:\n  - {step: 2, kill_node: no-such-node}\n",
                     "schedule.yaml:2: no rank of this job runs on host 'no-such-node' (its hosts: "),
    "node as a list": ("events:\n  - {step: 2, kill_node: [a, b]}\n", "a node is named by its host name"),
    "revive_node of live ranks": (f"events:\n  - {{step: 2, revive_node: {socket.gethostname()}}}\n",
                                  "step 2: revive of rank 0, which is alive"),
}


@pytest.mark.parametrize("case", sorted(BAD_SCHEDULES))
def test_bad_schedule_never_starts(tmp_path, case):
    text, message = BAD_SCHEDULES[case]
    out = tmp_path / "run.h5"
    p = ntpbench(4, "--preset", "tiny", "--tp", 2, "--steps", 6, "--schedule", schedule(tmp_path, text),
                 "--out", out, check=False)
    assert p.returncode != 0, p.stdout
    assert message in p.stderr, p.stderr
    assert p.stderr.count("ntpbench: error") == 1  # said once, by rank 0
    assert not out.exists()


@pytest.mark.parametrize("args, message", [
    (["--no-such-flag"], "The following argument was not expected: --no-such-flag"),
    (["--tp", 3], "--tp 3 does not divide the 4 ranks of this job; --tp 1, 2, 4 would"),
    (["--tp", 8], "TP degree 8 exceeds the head count 4"),
    (["--micro-batch", 0], "--micro-batch"),
    (["--hidden", 66], "hidden size 66 is not a multiple of the head count 4"),
    (["--policy", "pray"], "--policy"),
    (["--boost", 1.5], "--boost"),
    (["--seq", 64, "--context", 32], "--seq 64 exceeds --context 32"),
    (["--data", "/no/such/file"], "cannot open data file '/no/such/file'"),
    (["--precision", "bf16"], "--precision bf16 needs --backend cuda; --backend cpu computes in fp32 only"),
    (["--precision", "bf16", "--backend", "cpu"], "--precision bf16 needs --backend cuda"),
    (["--precision", "fp16"], "--precision"),
    (["--steps", 0], "--steps: must be above 0, not 0"),
    (["--stesp", 4], "(--stesp: did you mean --steps?)"),
    (["--tpp", 2], "(--tpp: did you mean --tp?)"),
])
def test_bad_flags_are_refused(tmp_path, args, message):
    out = tmp_path / "run.h5"
    steps = [] if "--steps" in args else ["--steps", 2]
    p = ntpbench(4, "--preset", "tiny", *args, *steps, "--out", out, check=False)
    assert p.returncode != 0
    assert message in p.stderr + p.stdout, p.stderr + p.stdout
    assert not out.exists()


def test_a_refusal_every_rank_reaches_is_reported_by_rank_0_alone(tmp_path):
    """Open MPI 5.0.11's mpirun sometimes never returns when every rank exits non-zero after
    MPI_Finalize (16 of 200 launches of 12 ranks; src/comm/comm_mpi.cpp, finish_mpi). So rank 0
    alone carries the job's exit status; mpirun still exits with it."""
    exits = tmp_path / "exits"
    # Each rank through sh, which records the rank's own exit status and passes it on; rank 0 a
    # moment later, since mpirun ends the other ranks once one has exited non-zero.
    rank = "${OMPI_COMM_WORLD_RANK:-$PMIX_RANK}"
    record = f'"$0" "$@"; rc=$?; echo "{rank} $rc" >> {exits}; [ "{rank}" = 0 ] && sleep 2; exit $rc'
    p = ntpbench(4, "--preset", "tiny", "--tp", 3, "--steps", 2, "--out", tmp_path / "run.h5", check=False,
                 launch_through=["sh", "-c", record])
    assert p.returncode == 2, p.stdout + p.stderr
    assert "--tp 3 does not divide the 4 ranks" in p.stderr, p.stderr
    status = dict(map(int, line.split()) for line in exits.read_text().splitlines())
    assert status == {0: 2, 1: 0, 2: 0, 3: 0}, status


def test_existing_results_are_never_overwritten(tmp_path):
    out = tmp_path / "run.h5"
    out.write_bytes(b"an earlier result")
    p = ntpbench(2, "--preset", "tiny", "--steps", 2, "--out", out, check=False)
    assert p.returncode != 0 and "exists" in p.stderr
    assert out.read_bytes() == b"an earlier result"


def test_check_validates_without_training(tmp_path):
    good = schedule(tmp_path, "events:\n  - {step: 2, kill: [1]}\n  - {step: 4, revive: [1]}\n")
    p = ntpbench(4, "--preset", "tiny", "--tp", 2, "--steps", 6, "--schedule", good, "--check")
    assert "--check: OK" in p.stdout and "1 kills, 1 revivals" in p.stdout
    assert not list(tmp_path.glob("*.h5"))


def test_kill_node_resolves_to_the_ranks_of_that_host(tmp_path):
    # One host here: a node failure takes all 4 ranks (fence mode: signal refuses killing every rank).
    host = socket.gethostname()
    good = schedule(tmp_path, f"events:\n  - {{step: 2, kill_node: {host}}}\n  - {{step: 4, revive_node: {host}}}\n")
    p = ntpbench(4, "--preset", "tiny", "--tp", 2, "--steps", 6, "--schedule", good, "--kill-mode", "fence",
                 "--check")
    assert "4 kills, 4 revivals" in p.stdout, p.stdout


def test_help_explains_every_flag():
    p = ntpbench(1, "--help")
    for flag in ["--preset", "--tp", "--micro-batch", "--steps", "--seed", "--data", "--lr", "--clip", "--out",
                 "--checkpoint-every", "--checkpoint-dir", "--init-from", "--schedule", "--policy", "--timing",
                 "--device-gflops", "--tp-gbps", "--dp-gbps", "--link-latency-us", "--boost", "--replay", "--config",
                 "--check", "--backend", "--precision"]:
        assert flag in p.stdout, flag


def test_exit_codes_are_one_table_in_help_and_readme():
    """--help's footer and README's table list the same codes (src/timing/exit_codes.hpp)."""
    import re
    from conftest import ROOT
    footer = ntpbench(1, "--help").stdout.split("Exit codes:")[1]
    in_help = [int(c) for c in re.findall(r"(?:^|; )(\d+) ", " ".join(footer.split()))]
    text = (ROOT / "README.md").read_text()
    in_readme = [int(c) for c in re.findall(r"^\| (\d+) \|", text, re.M)]
    assert in_help == in_readme == [0, 1, 2, 3, 4, 5, 130], (in_help, in_readme)


def test_config_file_sets_flags(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text('preset = "tiny"\nsteps = 3\ntp = 2\nmicro-batch = 2\n')
    out = tmp_path / "run.h5"
    ntpbench(2, "--config", cfg, "--out", out, "--quiet")
    import h5py, json
    with h5py.File(out) as f:
        c = json.loads(f.attrs["config"])
    assert c["tp"] == 2 and c["steps"] == 3 and c["micro_batch"] == 2 and c["preset"] == "tiny"
    assert c["backend"] == "cpu" and c["precision"] == "fp32"


def test_config_file_precision_is_checked(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text('preset = "tiny"\nsteps = 2\nprecision = "bf16"\n')
    out = tmp_path / "run.h5"
    p = ntpbench(1, "--config", cfg, "--out", out, check=False)
    assert p.returncode != 0
    assert "--precision bf16 needs --backend cuda" in p.stderr + p.stdout, p.stderr + p.stdout
    assert not out.exists()


# Every floating-point flag: NaN (which compares false, so a range check alone lets it through), and
# values that are infinite or overflow the field's type, are refused naming the flag (exit 2).
NON_FINITE = [
    ("--lr", "nan"), ("--lr", "inf"), ("--lr", "1e39"), ("--beta1", "nan"), ("--beta2", "nan"), ("--eps", "nan"),
    ("--eps", "-inf"), ("--weight-decay", "nan"), ("--clip", "nan"), ("--clip", "1e39"), ("--min-lr-ratio", "nan"),
    ("--replay-tol", "nan"), ("--device-gflops", "nan"), ("--device-gflops", "inf"), ("--tp-gbps", "nan"),
    ("--dp-gbps", "nan"), ("--link-latency-us", "nan"), ("--boost", "nan"), ("--peak-gflops", "nan"),
    ("--peak-gflops", "inf"),
]


@pytest.mark.parametrize("flag, value", NON_FINITE)
def test_non_finite_flags_are_refused(tmp_path, flag, value):
    out = tmp_path / "run.h5"
    p = ntpbench(1, "--preset", "tiny", "--steps", 2, flag, value, "--out", out, check=False)
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"{flag}: {value} is not a finite number" in p.stderr + p.stdout, p.stderr + p.stdout
    assert not out.exists()


@pytest.mark.parametrize("key, value", [("lr", "nan"), ("boost", "inf"), ("eps", "-inf")])
def test_non_finite_config_values_are_refused(tmp_path, key, value):
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'preset = "tiny"\nsteps = 2\n{key} = {value}\n')
    out = tmp_path / "run.h5"
    p = ntpbench(1, "--config", cfg, "--out", out, check=False)
    assert p.returncode == 2, p.stdout + p.stderr
    # The file and line of the value, then the flag's message.
    assert f"{cfg}:3: --{key}: {value} is not a finite number" in p.stderr, p.stderr + p.stdout
    assert not out.exists()


@pytest.mark.parametrize("value, message", [('"thirty"', "--steps: 'thirty' is not a number"),
                                            ("0", "--steps: must be above 0, not 0")])
def test_a_bad_config_value_names_its_file_and_line(tmp_path, value, message):
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'preset = "tiny"\n# thirty steps\nsteps = {value}\n')
    p = ntpbench(1, "--config", cfg, "--out", tmp_path / "run.h5", check=False)
    assert p.returncode == 2 and p.stderr.count(f"{cfg}:3: {message}") == 1, p.stderr + p.stdout
    # The same value on the command line is the command line's: no file named.
    p = ntpbench(1, "--config", cfg, "--steps", 0, "--out", tmp_path / "run.h5", check=False)
    assert p.returncode == 2 and "--steps: must be above 0, not 0" in p.stderr and f"{cfg}:" not in p.stderr, p.stderr


# A schedule that says nothing is refused naming the file: no failures is the run without --schedule.
@pytest.mark.parametrize("text", ["", "# nothing here\n", "~\n", "null\n", "events: []\n", "events:\n"])
def test_empty_schedule_is_refused(tmp_path, text):
    out = tmp_path / "run.h5"
    sched = schedule(tmp_path, text)
    p = ntpbench(2, "--preset", "tiny", "--tp", 2, "--steps", 4, "--schedule", sched, "--out", out, check=False)
    assert p.returncode != 0, p.stdout
    assert f"{sched}: the schedule is empty: it has no events and no 'random' generator" in p.stderr, p.stderr
    assert not out.exists()


def test_a_generator_alone_is_a_schedule(tmp_path):
    # No explicit events, and a generator that draws no failure in 4 steps: accepted.
    sched = schedule(tmp_path, "events: []\nrandom: {mtbf_steps: 1000000, repair_steps: 2, seed: 1}\n")
    p = ntpbench(2, "--preset", "tiny", "--tp", 2, "--steps", 4, "--schedule", sched, "--check")
    assert "--check: OK" in p.stdout
