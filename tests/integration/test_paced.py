"""Paced timing: TP 4 x DP 2 with one rank dead for several steps. During the damaged window,
tokens per emulated second relative to healthy are 7/8 under ntp, 1/2 under dp-drop and 0.975
under ntp-pw --boost 1.3 (the damaged replica needs 4/3 of the speed and gets 1.3), each within 5%.

The model divides evenly at TP 3 and TP 4 (12 heads, 384 MLP columns, 240 vocabulary rows), so a
damaged rank's share is exactly 4/3 of a healthy one's; the emulated device is slow enough that
paced compute dominates the real (oversubscribed) communication.
"""
import pytest

from conftest import damaged_throughput_ratio, ntpbench, schedule

MODEL = ["--preset", "tiny", "--heads", 12, "--hidden", 96, "--vocab", 240, "--micro-batch", 4, "--tp", 4]
PACED = ["--timing", "paced", "--device-gflops", 0.05, "--boost", 1.3]
EXPECTED = {"ntp": 7 / 8, "dp-drop": 1 / 2, "ntp-pw": 1 / (4 / 3 / 1.3)}


@pytest.mark.parametrize("policy", sorted(EXPECTED))
def test_damaged_throughput_ratio(tmp_path, policy):
    out = tmp_path / f"{policy}.h5"
    text = "events:\n  - {step: 4, kill: [3]}\n  - {step: 9, revive: [3]}\n"
    ntpbench(8, *MODEL, *PACED, "--steps", 10, "--policy", policy, "--schedule", schedule(tmp_path, text),
             "--out", out, "--no-final-checkpoint", "--quiet")
    ratio, overruns = damaged_throughput_ratio(out)
    print(f"{policy}: damaged/healthy tokens per emulated second {ratio:.4f} (expected {EXPECTED[policy]:.4f}), "
          f"overruns {overruns}")
    assert ratio == pytest.approx(EXPECTED[policy], rel=0.05)
