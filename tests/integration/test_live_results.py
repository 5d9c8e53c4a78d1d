"""A run's results file is readable while the run writes it: by h5py with its default file locking,
by `python -m analysis report`, and followed live by `python -m analysis watch`, which ends when the
run does."""
import re
import subprocess
import sys
import time

import h5py

from conftest import ENV, MPIRUN, NTPBENCH, ROOT

STEPS = 80


def wait_for_rows(path, rows, deadline):
    """Opens the file (default locking, as a user would) until it holds `rows` steps."""
    while time.time() < deadline:
        try:
            with h5py.File(path, "r") as f:
                n = len(f["steps"])
                assert "summary" not in f
                if n >= rows:
                    return n
        except BlockingIOError:
            raise  # the writer holds an exclusive lock: exactly what must not happen
        except (FileNotFoundError, KeyError):
            pass  # not created yet, or its datasets not yet there
        time.sleep(0.2)
    raise AssertionError(f"{path} did not reach {rows} steps")


def test_a_running_job_is_readable_and_watched_to_its_end(tmp_path):
    out = tmp_path / "live.h5"
    cmd = [*MPIRUN, "-np", "2", str(NTPBENCH), "--preset", "tiny", "--tp", "2", "--steps", str(STEPS),
           "--timing", "paced", "--device-gflops", "0.3", "--out", str(out), "--no-final-checkpoint", "--quiet"]
    run = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watch = subprocess.Popen([sys.executable, "-m", "analysis", "watch", str(out), "--timeout", "240"], cwd=ROOT,
                             env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_rows(out, 5, time.time() + 120)
        # `report` mid-run: the completed steps, marked INCOMPLETE.
        rep = subprocess.run([sys.executable, "-m", "analysis", "report", str(out)], cwd=ROOT, env=ENV,
                             capture_output=True, text=True, timeout=60)
        assert run.poll() is None, "the run ended before report read it mid-run"
        assert rep.returncode == 0, rep.stdout + rep.stderr
        assert "INCOMPLETE" in rep.stdout
        run_out, _ = run.communicate(timeout=240)
        run_end = time.time()
        assert run.returncode == 0, run_out
        watch_out, watch_err = watch.communicate(timeout=60)
        watch_end = time.time()
    finally:
        for p in (run, watch):
            if p.poll() is None:
                p.kill()
    assert watch.returncode == 0, watch_out + watch_err
    lines = watch_out.splitlines()
    shown = [int(m.group(1)) for m in re.finditer(rf"step (\d+)/{STEPS} ", watch_out)]
    assert len(set(shown)) >= 3, lines  # progress, a plain line per change (stdout is a pipe)
    assert shown == sorted(shown) and max(shown) < STEPS
    assert all("| ETA " in l and "| TP [2] |" in l and "goodput" in l for l in lines if f"/{STEPS} " in l), lines
    assert re.search(rf"live.h5: done \| {STEPS} steps in ", lines[-1]), lines
    assert watch_end - run_end < 5  # it ends when the run does (within a refresh or two)
