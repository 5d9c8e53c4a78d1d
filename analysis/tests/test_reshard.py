"""analysis/reshard.py on made-up benchmark JSON: the rows it reads (skipped ones left out), the
fitted line, the prototype's ratio from its dimensions, and the command's output and figure."""
import json

import pytest

from analysis import reshard
from analysis.__main__ import main


def bench_json(tmp_path, points, sync=True, skipped=True, model="small"):
    rows = [{"name": f"reshard_slowdown/{model}/4->3/tokens{g}/iterations:1/manual_time", "reshard_over_compute": x,
             "slowdown": y, "link_overruns": 0, "time_scale": 1024, "reshard_MB": 1.5} for g, x, y in points]
    if sync:
        rows.append({"name": "ntp_sync_paced/small/4->3/iterations:1/manual_time", "exposed_ntp/uniform": 1.3,
                     "exposed_ntp_us": 260.0, "exposed_uniform_us": 200.0, "backward_ntp_us": 700.0,
                     "backward_uniform_us": 600.0, "r0_reshard_us": 16.0, "r0_allreduce_us": 245.0,
                     "link_overruns": 3, "time_scale": 4096})
    if skipped:
        rows.append({"name": "ntp_sync_paced/small/8->7/iterations:1/manual_time", "error_occurred": True,
                     "error_message": "needs 15 ranks"})
    p = tmp_path / "resilience.json"
    p.write_text(json.dumps({"context": {}, "benchmarks": rows}))
    return p


def test_the_line_through_exact_points(tmp_path):
    slow, sync = reshard.load(bench_json(tmp_path, [(300, 0.1, 1.02), (100, 0.3, 1.06), (30, 1.0, 1.20)]))
    assert len(slow) == 3 and len(sync) == 1  # the skipped 8->7 row is left out
    a, b, r2 = reshard.fit(slow)
    assert a == pytest.approx(1.0) and b == pytest.approx(0.2) and r2 == pytest.approx(1.0)


def test_a_line_per_model(tmp_path, capsys):
    """Two models on two exact lines: each gets its own, and the prototype is placed on each."""
    a = json.loads(bench_json(tmp_path, [(8192, 0.05, 1.05), (4096, 0.10, 1.10)], sync=False, skipped=False).read_text())
    b = json.loads(bench_json(tmp_path, [(8192, 0.10, 1.03), (4096, 0.20, 1.06)], sync=False, skipped=False,
                              model="gpt2").read_text())
    p = tmp_path / "both.json"
    p.write_text(json.dumps({"benchmarks": a["benchmarks"] + b["benchmarks"]}))
    slow, _ = reshard.load(p)
    per = reshard.fits_by_model(slow)
    assert per["small"][:2] == pytest.approx((1.0, 1.0)) and per["gpt2"][:2] == pytest.approx((1.0, 0.3))
    assert main(["reshard", str(p)]) == 0
    out = capsys.readouterr().out
    assert "fit gpt2: slowdown = 1.0000 + 0.3000" in out and "fit small: slowdown = 1.0000 + 1.0000" in out
    x = reshard.prototype_ratio(12288, 16384)
    row = next(line for line in out.splitlines() if line.split()[:2] == ["12288", "16384"])
    assert row.split()[-2:] == [f"{1 + 0.3 * x:.4f}", f"{1 + x:.4f}"], row  # gpt2's line, then small's


def test_the_prototype_ratio_from_its_dimensions():
    # h = 6144, T = 4096, TP 8: 12 h^2 / 8 fp32 values at 300 GB/s over 2 (24 h^2 T + 4 T^2 h) / 8 FLOPs at
    # 312 TFLOP/s.
    h, t = 6144, 4096
    expected = (12 * h * h / 8 * 4 / 300e9) / (2 * (24 * h * h * t + 4 * t * t * h) / 8 / 312e12)
    assert reshard.prototype_ratio(h, t) == pytest.approx(expected)
    assert 0.2 < expected < 0.25
    # More tokens, more compute for the same bytes: the ratio falls.
    assert reshard.prototype_ratio(h, 16384) < reshard.prototype_ratio(h, 4096) / 4


def test_the_command_prints_the_tables_and_draws_the_figure(tmp_path, capsys):
    png = tmp_path / "fig8.png"
    assert main(["reshard", str(bench_json(tmp_path, [(300, 0.1, 1.02), (30, 1.0, 1.20)])), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "ntp_sync_paced/small/4->3" in out and "1.300" in out
    assert "fit: slowdown = 1.0000 + 0.2000" in out
    assert "12288  16384" in out
    assert png.stat().st_size > 10_000


def test_a_file_without_the_rows_is_refused(tmp_path, capsys):
    p = tmp_path / "other.json"
    p.write_text(json.dumps({"benchmarks": [{"name": "heal/small/tp4xdp2/iterations:1"}]}))
    assert main(["reshard", str(p)]) == 1
    assert "make bench-reshard" in capsys.readouterr().err
