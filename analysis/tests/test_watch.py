"""`python -m analysis watch`: the live view on synthetic files (the end-to-end test with a running
job is tests/integration/test_live_results.py)."""
import io
import re

from analysis import watch


class Pipe(io.StringIO):
    def isatty(self):
        return False


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_a_finished_run_is_reported_done_at_once(runs):
    out = Pipe()
    assert watch.watch(runs["ntp"], interval=0.01, timeout=5, out=out) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and "ntp.h5: done | 12 steps" in lines[0] and "goodput" in lines[0]


def test_a_run_without_summary_shows_progress_until_the_timeout(runs):
    out = Pipe()
    assert watch.watch(runs["cut"], interval=0.05, timeout=0.3, out=out) == 1
    lines = out.getvalue().splitlines()
    # A plain line per change: the unchanged file is printed once, then the timeout.
    assert len(lines) == 2, lines
    m = re.search(r"step (\d+)/7 .*\| ETA (\S+) \| TP \[(\d+), (\d+)\] \| loss (\S+) \| goodput (\S+) tok/s", lines[0])
    assert m, lines[0]
    assert int(m.group(1)) == 7  # the file's last row (it was cut short after its last step)
    assert "no /summary after 0.3 s" in lines[1]


def test_progress_figures(runs):
    p = watch.read_progress(runs["cut"])
    assert not p.done and p.total == 7 and p.rows == p.step
    assert p.goodput > 0 and p.eta_s is not None and len(p.tp) == 2


def test_a_missing_file_is_waited_for(tmp_path):
    out = Pipe()
    assert watch.watch(str(tmp_path / "later.h5"), interval=0.05, timeout=0.2, out=out) == 1
    assert "later.h5: waiting for the file to appear" in out.getvalue()


def test_a_terminal_gets_one_redrawn_line(runs):
    out = Tty()
    assert watch.watch(runs["cut"], interval=0.05, timeout=0.3, out=out) == 1
    text = out.getvalue()
    assert text.count("\r") >= 2 and text.count("step ") >= 2 and text.count("\n") == 2
