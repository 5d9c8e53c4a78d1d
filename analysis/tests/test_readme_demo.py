"""The README's `make demo` block (written by `make readme-demo` from a real run) still matches what
`make demo` prints today: the report's header and footnote, the demo's policies and layout, every
row's recovery columns adding up, and the replay's verdict."""
import re
from pathlib import Path

import pytest

from analysis import readme_demo, report

ROOT = Path(__file__).resolve().parents[2]


def readme_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    start, end = text.index(readme_demo.BEGIN), text.index(readme_demo.END)
    lines = text[start:end].splitlines()
    fence = [i for i, line in enumerate(lines) if line.startswith("```")]
    assert len(fence) == 2, "the block holds one fenced code block"
    return lines[fence[0] + 1:fence[1]]


def demo_policies() -> list[str]:
    m = re.search(r"^DEMO_POLICIES\s*:=\s*(.+)$", (ROOT / "Makefile").read_text(), re.M)
    return m.group(1).split()


def tables(block: list[str]) -> list[tuple[list[str], list[str]]]:
    """The report's tables in the block: (header names, row lines) each."""
    heads = [i for i, line in enumerate(block) if line.startswith("file ")]
    out = []
    for k, i in enumerate(heads):
        end = heads[k + 1] if k + 1 < len(heads) else len(block)
        out.append((re.split(r"\s{2,}", block[i].strip()),
                    [line for line in block[i + 2:end] if line.startswith("results/demo/")]))
    return out


def test_header_and_footnote_are_todays():
    block = readme_block()
    heads = [names for names, _ in tables(block)]
    today = [[h for _, h, _ in report.COLUMNS], [h for _, h, _ in report.RECOVERY_COLUMNS]]
    assert heads == today, "the report's columns changed: run `make demo` then `make readme-demo`"
    assert "\n".join(block).find(report.RECOVERY_FOOTNOTE) > 0


def test_rows_are_the_demo_and_add_up():
    block = readme_block()
    (names, rows), (recovery_names, recovery_rows) = tables(block)
    assert [r.split()[1] for r in rows] == demo_policies()
    assert [r.split()[0] for r in recovery_rows] == [r.split()[0] for r in rows]
    for line, recovery_line in zip(rows, recovery_rows):
        cells = dict(zip(names, line.split()))
        assert cells["TPxPPxDP"] == "4x1x2" and cells["slots"] == "30" and cells["fail"] == "1", line
        assert cells["status"] == "ok", line
        cells.update(dict(zip(recovery_names, recovery_line.split())))
        parts = ["repair s", "detect s", "reconf s", "spawn s", "spare s", "heal s", "other s"]
        # Each cell is rounded to 1 ms: the seven parts may miss the total by 4 ms.
        assert float(cells["recov s"]) == pytest.approx(sum(float(cells[p]) for p in parts), abs=0.0045), line
        assert float(cells["spawn s"]) > 0, "the demo revives by spawning: its time is a column of its own"
    assert any(line.startswith("replay: AGREES") for line in block)


def test_replace_puts_the_new_block_between_the_markers(tmp_path):
    (tmp_path / "report.txt").write_text("table line\nfootnote\n\nfailures in ...\n")
    (tmp_path / "replay.txt").write_text("replay: 30 steps\nreplay: AGREES (tolerance ...)\n")
    text = f"before\n{readme_demo.BEGIN}\nold\n{readme_demo.END}\nafter\n"
    out = readme_demo.replace(text, readme_demo.block(tmp_path))
    assert out.startswith("before\n" + readme_demo.BEGIN) and out.endswith(readme_demo.END + "\nafter\n")
    assert "old" not in out and "table line\nfootnote\nreplay: AGREES (tolerance ...)\n```" in out
    assert "failures in" not in out
    with pytest.raises(ValueError):
        readme_demo.replace("no markers", "x")
