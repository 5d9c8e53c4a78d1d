"""Fixed-width text tables for the simulator's printouts."""
from __future__ import annotations

import pandas as pd


def _table(df: pd.DataFrame, cols: list[tuple[str, str, str]]) -> str:
    cells = [[h for _, h, _ in cols]] + [[(f.format(r[c]) if r[c] is not None else "-") for c, _, f in cols]
                                         for r in df.to_dict("records")]
    w = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    lines = ["  ".join(c.rjust(w[i]) for i, c in enumerate(row)) for row in cells]
    lines.insert(1, "  ".join("-" * x for x in w))
    return "\n".join(lines)
