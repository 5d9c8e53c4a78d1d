"""A rank that stops without dying (SIGSTOP: a wedged driver, a paused VM) leaves its peers waiting
in a collective that no error will end. The hang watchdog (--hang-timeout) ends the job instead:
exit code 5, a message naming the rank, the step and where it waited, and a results file that
holds the steps before it."""
import os
import signal
import subprocess
import time

import h5py

from conftest import ENV, MPIRUN, NTPBENCH


def descendants(pid):
    """Every process below `pid` (their PPid in /proc)."""
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/status") as f:
                    ppid = next(int(line.split()[1]) for line in f if line.startswith("PPid:"))
            except (OSError, StopIteration):
                continue
            children.setdefault(ppid, []).append(int(d))
    found, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.append(c)
            todo.append(c)
    return found


def world_rank(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        return int(env.get(b"OMPI_COMM_WORLD_RANK", b"-1"))
    except OSError:
        return -1


def rows(path):
    with h5py.File(path, "r") as f:
        return len(f["steps"])


def test_a_stopped_rank_ends_the_job_at_the_hang_timeout(tmp_path):
    out = tmp_path / "stopped.h5"
    log = tmp_path / "run.log"
    cmd = [*MPIRUN, "-np", "2", str(NTPBENCH), "--preset", "tiny", "--tp", "2", "--steps", "1000000",
           "--hang-timeout", "3", "--no-final-checkpoint", "--out", str(out)]
    with open(log, "w") as sink:
        run = subprocess.Popen(cmd, env=ENV, stdout=sink, stderr=subprocess.STDOUT, text=True)
    stopped = None
    try:
        deadline = time.time() + 120
        while "step    20/" not in log.read_text() and time.time() < deadline and run.poll() is None:
            time.sleep(0.2)
        assert "step    20/" in log.read_text(), log.read_text()[-3000:]
        rank1 = [p for p in descendants(run.pid) if world_rank(p) == 1]
        assert len(rank1) == 1, rank1
        stopped = rank1[0]
        os.kill(stopped, signal.SIGSTOP)
        t_stop = time.time()
        rc = run.wait(timeout=120)
        waited = time.time() - t_stop
    finally:
        if run.poll() is None:
            run.kill()
        if stopped is not None and os.path.exists(f"/proc/{stopped}"):
            os.kill(stopped, signal.SIGKILL)
    text = log.read_text()
    assert rc == 5, text[-3000:]
    assert "ntpbench: error: rank 0 made no progress for 3 s in step" in text, text[-3000:]
    assert "--hang-timeout" in text and "the results file holds the steps before it" in text
    # Not before the limit: rank 0's last progress may precede the stop by up to a step (it may have
    # been waiting for rank 1 already), so the limit runs out at most one step before 3 s after it.
    with h5py.File(out) as f:
        s = f["steps"][()]
    longest_step = float((s["host_t_end"] - s["host_t_start"]).max())
    assert waited >= 3 - longest_step, (waited, longest_step)
    # The rows written before the stop are all there, readable.
    assert rows(out) >= 20
