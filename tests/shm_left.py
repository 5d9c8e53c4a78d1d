#!/usr/bin/env python3
"""What runs leave in /dev/shm: Open MPI's shared-memory segments (`sm_segment.*`, 16 MB each) and
the hang watch's record directories (`ntpbench-*`). An entry left behind is one that appeared during
the runs and that no live process maps (another job running beside them maps its own).

Used by tests/chaos/verdict.py (every chaos seed) and `make soak`:
  shm_left.py snapshot FILE   write the entries there now to FILE
  shm_left.py check FILE      exit 1, naming them, if entries not in FILE are left behind
"""
from __future__ import annotations

import os
import pathlib
import sys


def shm_entries() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(("sm_segment.", "ntpbench-"))}
    except OSError:
        return set()


def shm_in_use() -> set[str]:
    """The /dev/shm entries some live process maps (a directory's, by its files)."""
    used = set()
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for line in (proc / "maps").read_text().splitlines():
                if "/dev/shm/" in line:
                    used.add(line.split("/dev/shm/", 1)[1].split("/")[0].split(" ")[0])
        except OSError:
            continue
    return used


def left_behind(before: set[str]) -> list[str]:
    return sorted(shm_entries() - before - shm_in_use())


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("snapshot", "check"):
        print(__doc__, file=sys.stderr)
        return 2
    path = pathlib.Path(argv[1])
    if argv[0] == "snapshot":
        path.write_text("\n".join(sorted(shm_entries())) + "\n")
        return 0
    left = left_behind(set(path.read_text().split()))
    if left:
        print(f"left in /dev/shm by the runs (no live process maps them): {', '.join(left)}")
        return 1
    print("nothing left in /dev/shm")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
