"""analysis/stragglers.py on made-up runs: the episode read from `slow` events, goodput over a
window of steps (from the start of its first step: the reconfiguration before it is reported apart), the expectations' arithmetic, and the
command's refusal of a baseline that was slowed."""
import json

import numpy as np
import pandas as pd
import pytest

from analysis import stragglers
from analysis.runfile import EVENT_FIELDS, PHASES, Run


def make_run(step_seconds, tokens, events=(), straggler_policy="tolerate", policy="ntp", gaps=None, name="r.h5"):
    """A run of len(step_seconds) steps of 8 ranks (TP 4 x DP 2, B 8), steps back to back except for
    gaps[s] seconds before step s; every rank computes 80% of each step."""
    n = len(step_seconds)
    t, rows = 0.0, []
    for i, (dt, tok) in enumerate(zip(step_seconds, tokens)):
        t += (gaps or {}).get(i + 1, 0.0)
        rows.append({"step": i + 1, "t_start": t, "t_end": t + dt, "tokens_committed": tok})
        t += dt
    phases = np.zeros((n, 8, len(PHASES)))
    phases[:, :, PHASES.index("forward")] = 0.8 * np.asarray(step_seconds)[:, None] / 3
    phases[:, :, PHASES.index("backward")] = 0.8 * np.asarray(step_seconds)[:, None] * 2 / 3
    cfg = {"micro_batch": 8, "micro_batches": 1, "policy": policy,
           "stragglers": {"policy": straggler_policy, "threshold": 1.2, "window": 3}}
    ev = pd.DataFrame([dict(zip(EVENT_FIELDS, e)) for e in events], columns=EVENT_FIELDS)
    return Run(path=name, attrs={"config": json.dumps(cfg), "tp": 4, "replicas": 2}, steps=pd.DataFrame(rows),
               replicas={}, phase_times=phases, phases=list(PHASES), events=ev, summary={})


SLOW = [(0, 11, "slow", 3, 0, 0, 0, "compute x2, links x1"), (0, 31, "slow", 3, 0, 0, 0, "back to full speed")]


def test_the_episode_and_goodput_over_a_window():
    run = make_run([1.0] * 40, [512] * 40, SLOW, gaps={14: 0.5})
    assert stragglers.episode(run) == (11, 31, 2.0, 3)
    assert stragglers.goodput(run, 11, 13) == pytest.approx(3 * 512 / 3.0)
    # The 0.5 s before step 14 (a reconfiguration, `reconfig s`) is not the steady state.
    assert stragglers.goodput(run, 14, 15) == pytest.approx(2 * 512 / 2.0)
    assert stragglers.goodput(run, 1, 3) == pytest.approx(3 * 512 / 3.0)
    assert np.isnan(stragglers.goodput(run, 39, 41))  # no step 41


def test_expectations():
    healthy = make_run([1.0] * 40, [512] * 40)
    # Tolerate: H / (H + (f - 1) C) with C = 0.8 H.
    assert stragglers.expected(make_run([1.0] * 40, [512] * 40, SLOW), healthy, 2.0) == pytest.approx(1 / 1.8)
    # Evict under ntp: (1 + floor(8 x 3/4) / 8) / 2; under dp-drop: 1/2.
    ev = make_run([1.0] * 40, [512] * 40, SLOW, "evict", "ntp")
    assert stragglers.expected(ev, healthy, 2.0) == pytest.approx(0.875)
    assert stragglers.expected(make_run([1.0] * 40, [512] * 40, SLOW, "evict", "dp-drop"), healthy, 2.0) == 0.5
    # Rebalance: floor(8 x 1.02 x 3.5 / 4) = 7 of 8.
    rb = make_run([1.0] * 40, [512] * 40, SLOW, "rebalance")
    assert stragglers.expected(rb, healthy, 2.0) == pytest.approx(0.9375)


def test_the_table_against_a_healthy_run():
    healthy = make_run([1.0] * 40, [512] * 40)
    # Rebalanced from step 14 to 33: 480 tokens a step in the same time.
    tokens = [512] * 13 + [480] * 20 + [512] * 7
    seconds = [1.0] * 10 + [1.8] * 3 + [1.0] * 27
    acted = SLOW + [(0, 14, "rebalance", 3, 0, 8e6, 0.05, ""), (0, 34, "rebalance_end", 3, 0, 8e6, 0.05, "")]
    run = make_run(seconds, tokens, acted, "rebalance", gaps={14: 0.05, 34: 0.05})
    (row,) = stragglers.compare(healthy, [run])
    assert row["steady"] == (14, 30) and row["whole"] == (11, 34)
    assert row["measured"] == pytest.approx(480 / 512)  # the steady steps, not the reconfiguration before them
    assert row["reconfig_seconds"] == pytest.approx(0.1)
    table = stragglers.format_table([row])
    assert "rebalance" in table and "0.938" in table and "rebalance@14, rebalance_end@34" in table


def test_a_slowed_baseline_is_refused(tmp_path, monkeypatch, capsys):
    slowed = make_run([1.0] * 40, [512] * 40, SLOW)
    monkeypatch.setattr(stragglers, "load_or_say", lambda p: slowed)

    class Args:
        healthy, runs, plot, tolerance = "h.h5", ["r.h5"], None, None

    assert stragglers.main(Args) == 2
    assert "must be a healthy run" in capsys.readouterr().out
