"""Stragglers: a schedule's `slow` event makes a rank's emulated device slower; with
--straggler-threshold every rank names it a straggler within --straggler-window steps, from the
same numbers, and names the end of its episode; the job runs at its pace (tolerated) and computes
what one rank computes (--replay AGREES). A healthy paced run names nobody.

8 ranks of `tiny` (TP 4 x DP 2), paced at 0.2 GFLOP/s, where the emulated device's time is well
above the real compute of 8 ranks sharing 2 cores (an honest emulation: no overruns to blur it)."""
import h5py
import numpy as np

from conftest import ntpbench, replay, schedule, steps

PACED = ["--preset", "tiny", "--tp", 4, "--micro-batch", 4, "--quiet", "--timing", "paced", "--device-gflops", 0.2,
         "--straggler-threshold", 1.2, "--straggler-window", 3]


def event_rows(path, kinds):
    with h5py.File(path, "r") as f:
        e = f["events"][()]
    return [(int(x["step"]), x["kind"].decode(), int(x["rank"]), x["detail"].decode()) for x in e
            if x["kind"].decode() in kinds]


def test_a_slowed_rank_is_named_within_the_window_and_released(tmp_path):
    out = tmp_path / "slow.h5"
    text = "events:\n  - {step: 5, slow: [2], factor: 2.0}\n  - {step: 15, slow: [2], factor: 1}\n"
    ntpbench(8, *PACED, "--steps", 22, "--schedule", schedule(tmp_path, text), "--out", out)
    ev = event_rows(out, ("slow", "straggler", "straggler_end"))
    assert [(s, k, r) for s, k, r, _ in ev] == [(5, "slow", 2), (7, "straggler", 2), (15, "slow", 2),
                                                (17, "straggler_end", 2)], ev
    ratio = float(ev[1][3].split("x")[0].split()[-1])
    assert 1.8 <= ratio <= 2.2, ev[1]  # the factor, measured
    s = steps(out)
    dt = s["t_end"] - s["t_start"]
    slow, healthy = np.median(dt[6:14]), np.median(np.r_[dt[1:4], dt[16:]])
    # Tolerated: the job waits for the slowed rank at every TP collective and the DP sync; its
    # compute is most of a paced step here, so the step takes longer, but at most twice as long.
    assert 1.2 * healthy < slow < 2.05 * healthy, (slow, healthy)
    replay(out)


def test_a_healthy_paced_run_names_nobody(tmp_path):
    out = tmp_path / "healthy.h5"
    ntpbench(8, *PACED, "--steps", 20, "--out", out)
    assert event_rows(out, ("straggler", "straggler_end")) == []
