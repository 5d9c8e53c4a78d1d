"""The results file: every dataset and attribute of results/README.md with its documented type,
totals that add up, and crash safety (a killed job leaves every completed step readable)."""
import json
import math
import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from conftest import ENV, MPIRUN, NTPBENCH, ROOT, ntpbench, replay, schedule

STEP_FIELDS = {
    "step": "i8", "optimizer_step": "i8", "t_start": "f8", "t_end": "f8", "host_t_start": "f8", "host_t_end": "f8",
    "sample_begin": "i8", "samples": "i8",
    "tokens": "i8", "tokens_committed": "i8", "loss": "f8", "grad_norm": "f8", "lr": "f8", "flops": "f8",
    "mfu": "f8", "live_ranks": "i4", "active_replicas": "i4", "recovery_seconds": "f8", "idle_seconds": "f8",
    "paced_overrun": "i1", "paced_link_overruns": "i4",
}
EVENT_FIELDS = {"time": "f8", "step": "i8", "kind": "S16", "rank": "i4", "replica": "i4", "bytes": "f8",
                "duration": "f8", "detail": "S96", "host_time": "f8", "host_duration": "f8"}
STRING_ATTRS = ["schema_version", "ntpbench_version", "git_revision", "start_time", "hosts", "mpi_library_version",
                "policy", "timing", "config", "data", "blas_core", "blas_config", "OPENBLAS_CORETYPE",
                "OPENBLAS_L2_SIZE", "peak_gflops_source", "final_checkpoint"]
INT_ATTRS = ["ranks", "tp", "replicas", "tokens_per_sample", "threads_per_rank"]
SUMMARY = ["steps", "tokens", "tokens_committed", "wall_seconds", "step_seconds", "productive_seconds",
           "recovery_seconds", "idle_seconds", "throughput_tokens_per_s", "goodput_tokens_per_s", "ettr",
           "healthy_throughput_tokens_per_s", "goodput_ratio", "mfu", "failures", "revivals",
           "recovery_detect_seconds", "recovery_reconfigure_seconds", "recovery_heal_seconds",
           "recovery_recompute_seconds", "recovery_lost_seconds", "recovery_repair_seconds", "heal_bytes", "paced_overrun_steps", "final_loss", "recorder_seconds",
           "training_steps", "recovery_spawn_seconds", "recovery_spare_seconds", "spares_used", "host_wall_seconds"]


def test_schema(tmp_path):
    out = tmp_path / "run.h5"
    text = "events:\n  - {step: 2, kill: [1]}\n  - {step: 4, revive: [1]}\n"
    ntpbench(4, "--preset", "tiny", "--tp", 2, "--steps", 5, "--schedule", schedule(tmp_path, text), "--out", out,
             "--quiet")
    with h5py.File(out) as f:
        for a in STRING_ATTRS:
            assert isinstance(f.attrs[a], str), a
        for a in INT_ATTRS:
            assert f.attrs[a].dtype == np.int64, a
        assert f.attrs["peak_gflops_per_rank"].dtype == np.float64
        assert f.attrs["schema_version"] == "2"
        assert len(json.loads(f.attrs["hosts"])) == 4
        assert json.loads(f.attrs["config"])["tp"] == 2
        s = f["steps"]
        assert s.maxshape == (None,) and s.chunks is not None  # extendible, chunked
        for name, dt in STEP_FIELDS.items():
            assert s.dtype[name] == np.dtype(dt), name
        e = f["events"]
        for name, dt in EVENT_FIELDS.items():
            assert e.dtype[name] == np.dtype(dt), name
        kinds = [k.decode() for k in e["kind"]]
        assert {"kill", "revive", "detect", "reconfigure", "heal"} <= set(kinds)
        n = len(s)
        assert f["replicas/tp_degree"].shape == (n, 2) and f["replicas/tp_degree"].dtype == np.int32
        assert f["replicas/batch"].shape == (n, 2) and f["replicas/batch"].dtype == np.int32
        assert f["replicas/state"].shape == (n, 2) and f["replicas/state"].dtype == np.int8
        argv = json.loads(f.attrs["argv"])  # the command line as typed, beside the resolved config
        assert argv[0].endswith("ntpbench") and argv[argv.index("--steps") + 1] == "5", argv
        p = f["ranks/phase_times"]
        assert p.attrs["phases"].split(",") == ["forward", "backward", "tp_comm", "dp_comm", "pp_comm", "reshard",
                                                "optimizer", "recovery", "revival", "idle", "other"]
        assert p.shape == (n, 4, 11) and p.dtype == np.float64
        sm = f["summary"].attrs
        for k in SUMMARY:
            assert sm[k].dtype == np.float64, k
        # Totals add up.
        rows = s[()]
        assert sm["tokens"] == rows["tokens"].sum() and sm["tokens_committed"] == rows["tokens_committed"].sum()
        assert sm["steps"] == n and sm["failures"] == 1 and sm["revivals"] == 1
        assert np.isclose(sm["step_seconds"], (rows["t_end"] - rows["t_start"]).sum())
        # Under wall timing the emulated clock is this host's: the host columns are the same times.
        ev = e[()]
        assert sm["clock"] == "host" and sm["host_wall_seconds"] == sm["wall_seconds"]
        assert (rows["host_t_start"] == rows["t_start"]).all() and (rows["host_t_end"] == rows["t_end"]).all()
        assert (ev["host_time"] == ev["time"]).all() and (ev["host_duration"] == ev["duration"]).all()
        assert sm["wall_seconds"] >= sm["step_seconds"]
        # Phases are exclusive: a rank's phases up to a row add up to at most the run's time up to
        # that row's end (recovery before a step is charged to that step's row). Cumulative, because
        # each rank's row ends where it leaves the step's last barrier: with four ranks on two cores
        # one row can end milliseconds earlier on one rank than on another (up to 3 ms idle, 8 ms
        # under load, measured), and the next row gives the time back; a phase counted twice stays
        # counted in every later row.
        assert (np.cumsum(p[()].sum(axis=2), axis=0) <= rows["t_end"][:, None] + 10e-3).all()
        recovery = p[()][:, :, 6]
        assert recovery[1].max() > 0 and recovery[3].max() > 0  # the kill (step 2) and revival (step 4)
        assert f["replicas/tp_degree"][1].tolist() == [1, 2]


def test_killed_job_leaves_every_completed_step(tmp_path):
    out = tmp_path / "crash.h5"
    cmd = [*MPIRUN, "-np", "4", str(NTPBENCH), "--preset", "tiny", "--tp", "2", "--steps", "200",
           "--timing", "paced", "--device-gflops", "0.1", "--out", str(out), "--no-final-checkpoint"]
    p = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    printed = 0
    deadline = time.time() + 120
    for line in p.stdout:
        if line.startswith("step "):
            printed += 1
        if printed >= 4 or time.time() > deadline:
            break
    os.kill(p.pid, signal.SIGKILL)  # the launcher, as Slurm's time limit or kill -9 would
    p.wait()
    # The ranks, orphaned by the launcher's death, are killed the same way; wait until they are
    # gone (a live rank 0 still holds the file's lock).
    for _ in range(100):
        subprocess.run(["pkill", "-9", "-f", str(out)], check=False)
        if subprocess.run(["pgrep", "-f", str(out)], capture_output=True).returncode != 0:
            break
        time.sleep(0.1)
    assert printed >= 4
    # Dying ranks may hold the file's lock a moment longer.
    for _ in range(50):
        try:
            h5py.File(out, "r").close()
            break
        except BlockingIOError:
            time.sleep(0.2)
    with h5py.File(out, "r") as f:
        rows = f["steps"][()]
        assert len(rows) >= printed  # a step is printed only after its row is flushed
        assert rows["step"].tolist() == list(range(1, len(rows) + 1))
        assert np.isfinite(rows["loss"]).all()
        assert f["ranks/phase_times"].shape[0] >= printed
        assert "summary" not in f  # cut short: no summary, and that is visible


def test_mfu_peak_is_the_machines(tmp_path):
    """The peak is a property of the machine: probed at the rank's threads, kept in a cache per
    machine and thread count, never below the best earlier probe; no step's MFU exceeds 1."""
    env = {**ENV, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    cache = tmp_path / "cache" / "ntpbench" / "sgemm-peak.tsv"
    peaks = []
    for n in (1, 2):
        out = tmp_path / f"run{n}.h5"
        p = subprocess.run([str(NTPBENCH), "--preset", "tiny", "--steps", "3", "--quiet", "--no-final-checkpoint",
                            "--out", str(out)], env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        with h5py.File(out, "r") as f:
            peaks.append(float(f.attrs["peak_gflops_per_rank"]))
            threads = int(f.attrs["threads_per_rank"])
            assert "per-core rate" in f.attrs["peak_gflops_source"] and str(cache) in f.attrs["peak_gflops_source"]
            assert (f["steps"]["mfu"] <= 1.0).all() and (f["steps"]["mfu"] > 0).all()
        lines = [l.split("\t") for l in cache.read_text().splitlines()]
        mine = [float(v) for k, v in lines if f"|threads={threads}|" in k]
        assert len(mine) == 1 and mine[0] == pytest.approx(max(peaks), rel=1e-4)
    assert peaks[1] >= peaks[0]  # the second run starts from the first one's probe


def test_an_interrupt_says_where_the_run_stopped_and_keeps_the_file(tmp_path):
    """SIGINT (Ctrl-C) to a run: one line naming the step and the file, exit status 130, and every
    completed step readable. (Under mpirun the ranks get SIGTERM from the launcher, which then stops
    forwarding their output: the same line is written but Open MPI 5.0 drops it.)"""
    out = tmp_path / "interrupted.h5"
    p = subprocess.Popen([str(NTPBENCH), "--preset", "tiny", "--steps", "500", "--timing", "paced", "--device-gflops",
                          "0.2", "--quiet", "--out", str(out)],
                         env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            time.sleep(0.3)
            try:
                with h5py.File(out, "r", locking=False) as f:
                    if len(f["steps"]) >= 3:
                        break
            except (OSError, KeyError):
                pass
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    lines = [line for line in err.splitlines() if "interrupted" in line]
    assert len(lines) == 1 and str(out) in lines[0], err
    saved = int(lines[0].split(": ")[2].split()[0])
    with h5py.File(out, "r") as f:
        assert len(f["steps"]) == saved >= 3 and f["steps"]["step"][-1] == saved


def test_the_closing_line_tells_slots_from_training_steps(tmp_path):
    """--steps counts slots: under restart a failure leaves idle slots and rolls steps back, and the
    closing line, /summary and the report say how many trained."""
    out = tmp_path / "restart.h5"
    p = ntpbench(8, "--preset", "tiny", "--tp", 4, "--steps", 30, "--policy", "restart", "--kill-mode", "fence",
                 "--checkpoint-every", 5, "--schedule", ROOT / "jobs/schedules/one-failure.yaml", "--quiet",
                 "--out", out)
    with h5py.File(out) as f:
        st = f["steps"][()]
        trained = int((st["tokens_committed"] > 0).sum())
        idle = int((st["samples"] == 0).sum())
        assert f["summary"].attrs["training_steps"] == trained < 30
    line = next(line for line in p.stdout.splitlines() if line.startswith("done:"))
    assert line.startswith(f"done: 30 slots, {trained} training steps committed ({idle} idle, "
                           f"{30 - trained - idle} rolled back)"), line
    rep = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "analysis", "report", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0 and "trained" in rep.stdout.splitlines()[0], rep.stdout + rep.stderr


def test_paced_overruns_are_counted_with_a_scale_that_keeps_up(tmp_path):
    """A device of 5 TFLOP/s cannot be emulated here: every step overran, in seconds past emulated
    time, the run is judged overran, and the closing line names the power of 2 by which the rates
    would have to be slowed (the worst ratio with 10% to spare)."""
    out = tmp_path / "overrun.h5"
    p = ntpbench(2, "--preset", "tiny", "--tp", 2, "--steps", 4, "--timing", "paced", "--device-gflops", 5000,
                 "--quiet", "--out", out)
    line = next(line for line in p.stdout.splitlines() if line.startswith("paced timing"))
    with h5py.File(out) as f:
        n = int(f["summary"].attrs["paced_overrun_steps"])
        ratio = float(f["summary"].attrs["paced_overrun_worst_ratio"])
        seconds = float(f["summary"].attrs["paced_overrun_seconds"])
        status = f["summary"].attrs["status"]
        per_step = f["steps"]["paced_overrun_seconds"]
        assert seconds == pytest.approx(float(per_step.sum())) and (per_step > 0).all()
    assert (status.decode() if isinstance(status, bytes) else status) == "overran"
    assert n == 4 and ratio > 1 and line.startswith(f"paced timing OVERRAN: {n} of 4 steps had a rank"), line
    suggested = float(line.rsplit("--time-scale ", 1)[1].split()[0])
    assert suggested == 2 ** math.ceil(math.log2(1.1 * ratio)), line


def test_paced_link_overruns_are_counted_per_step(tmp_path):
    """Two ranks of one TP group, one per core. Links emulated far faster than this machine's MPI
    copies (1e6 GB/s, no latency): TP all-reduces end after their emulated end (those over the 50 us
    slack; 11-32 in 3 steps here), counted in /steps (and on the closing line when the run overran).
    Links far slower (20 ms a message): none does."""
    counts = {}
    for name, link in (("fast", ["--tp-gbps", 1e6, "--link-latency-us", 0]),
                       ("slow", ["--tp-gbps", 1, "--link-latency-us", 20000])):
        out = tmp_path / f"{name}.h5"
        p = ntpbench(2, "--preset", "tiny", "--tp", 2, "--steps", 3, "--timing", "paced", "--threads", 1, *link,
                     "--quiet", "--out", out)
        with h5py.File(out) as f:
            counts[name] = f["steps"]["paced_link_overruns"].tolist()
        named = [line for line in p.stdout.splitlines() if line.startswith("paced timing")]
        steps_with = sum(n > 0 for n in counts[name])
        # The closing line speaks only of a run that overran (1% of its step time), and then counts them.
        if named:
            assert f"({sum(counts[name])} in {steps_with} steps;" in named[0], p.stdout
    assert sum(counts["fast"]) > 0 and counts["slow"] == [0, 0, 0], counts


def test_wall_timing_on_shared_cores_is_said_once_and_recorded(tmp_path):
    out = tmp_path / "wall.h5"
    p = ntpbench(4, "--preset", "tiny", "--tp", 2, "--steps", 2, "--quiet", "--out", out)
    shared = 4 > os.cpu_count()
    assert p.stdout.count("note: --timing wall with") == (1 if shared else 0), p.stdout
    with h5py.File(out) as f:
        assert ("shared_cores" in f.attrs) == shared
        if shared:
            assert f.attrs["shared_cores"] == f"{4 / os.cpu_count():.2g} ranks per core on the most crowded host"


def test_a_run_without_a_launcher_leaves_no_shared_memory(tmp_path):
    """A one-rank run and its --replay started without mpirun (singletons): Open MPI leaves each one's
    16 MB shared-memory segment in /dev/shm and nothing else removes it, so ntpbench does at its end
    (a launcher removes its own job's, killed ranks' included)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from shm_left import left_behind, shm_entries
    before = shm_entries()
    out = tmp_path / "single.h5"
    p = subprocess.run([str(NTPBENCH), "--preset", "tiny", "--tp", "1", "--steps", "2", "--quiet", "--out", str(out)],
                       env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    replay(out)
    assert left_behind(before) == []
