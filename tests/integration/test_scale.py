"""make bench-scale's parts end to end on 8 ranks: jobs/local/scale.sh runs one real death and
revival and replays it, and `analysis scale` reads its files into a row; a failed replay makes the
table's exit status 1 (the negative control). The growth fit itself: analysis/tests/test_scale.py."""
import json
import subprocess
import sys

from conftest import ENV, MPIRUN, NTPBENCH, ROOT, needs_ulfm

pytestmark = needs_ulfm


def test_scale_script_and_table(tmp_path):
    out = tmp_path / "scale"
    env = {**ENV, "NTPBENCH": str(NTPBENCH), "MPIRUN": MPIRUN[0]}
    r = subprocess.run(["bash", str(ROOT / "jobs/local/scale.sh"), str(out), "8"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    side = json.loads((out / "8.json").read_text())
    assert side["mpirun_exit"] == 0 and side["replay_exit"] == 0, side
    assert side["host_used_bytes_peak"] >= side["host_used_bytes_before"] > 0
    table = subprocess.run([sys.executable, "-m", "analysis", "scale", str(out)], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
    assert table.returncode == 0, table.stdout + table.stderr
    row = next(line for line in table.stdout.splitlines() if line.startswith("| 8 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 16 and "-" not in cells[1:], row  # every figure measured, the revival's included
    # Every process of the run sampled (8 ranks and the replacement), each with some anonymous memory.
    assert side["anon_processes"] >= 8 and side["anon_bytes_median"] > 1e6, side
    # The control plane of a healthy step, counted: per rank at least the report gather and the
    # commit vote, and the report's 26 doubles at least once.
    header = [c.strip() for c in table.stdout.splitlines()[0].strip("|").split("|")]
    calls, nbytes = float(cells[header.index("ctl calls/rank/step")]), float(cells[header.index("ctl B/rank/step")])
    assert 2 <= calls <= 10 and 208 <= nbytes <= 2000, row

    side["replay_exit"] = 1
    (out / "8.json").write_text(json.dumps(side))
    bad = subprocess.run([sys.executable, "-m", "analysis", "scale", str(out)], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 1 and "replay exit 1" in bad.stdout, bad.stdout


def test_scale_script_refuses_a_count_the_heads_cannot_split(tmp_path):
    env = {**ENV, "NTPBENCH": str(NTPBENCH), "MPIRUN": MPIRUN[0]}
    r = subprocess.run(["bash", str(ROOT / "jobs/local/scale.sh"), str(tmp_path), "12"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "TP 3 must divide the 64 heads" in r.stderr
