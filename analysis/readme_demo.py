"""Puts what `make demo` printed into README.md, so that the README shows a real run's output.

`make demo` writes its comparison table (`analysis report`) to results/demo/report.txt and its
replay verdict to results/demo/replay.txt; `make readme-demo` runs this module on them, which
replaces the README's block between the two markers below with their text, the date and the
machine's core count. analysis/tests/test_readme_demo.py checks that the block still matches
what the report prints today (its header, its columns that add up, the demo's policies).

    python3 -m analysis.readme_demo README.md results/demo
"""
from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path

BEGIN = "<!-- make demo output: begin (make readme-demo writes this block from a real run) -->"
END = "<!-- make demo output: end -->"


def block(demo_dir: Path) -> str:
    report = (demo_dir / "report.txt").read_text().splitlines()
    table = []
    for line in report:  # the table and its footnote: up to the first blank line
        if not line.strip():
            break
        table.append(line)
    replay = [line for line in (demo_dir / "replay.txt").read_text().splitlines() if "AGREES" in line or "DIFFERS" in line]
    when = datetime.date.today().isoformat()
    return "\n".join([BEGIN, f"On {when}, {os.cpu_count()} cores:", "", "```", *table, *replay, "```", END])


def replace(readme: str, new_block: str) -> str:
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README has no block between '{BEGIN}' and '{END}'")
    return readme[:start] + new_block + readme[end + len(END):]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    readme, demo_dir = Path(argv[0]), Path(argv[1])
    try:
        readme.write_text(replace(readme.read_text(), block(demo_dir)))
    except (OSError, ValueError) as e:
        print(f"error: {e} (run `make demo` first)", file=sys.stderr)
        return 1
    print(f"{readme}: the `make demo` block now shows {demo_dir}/report.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
