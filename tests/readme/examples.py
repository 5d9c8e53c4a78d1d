#!/usr/bin/env python3
"""The READMEs' commands, run as typed (make readme-examples).

Every fenced `sh` block of README.md, jobs/README.md and analysis/README.md is split into commands
(a trailing backslash continues a line; comments are dropped) and each runs with bash after
`source env.sh`, in the order the READMEs give them, in a scratch directory: links to this
checkout's build/, .venv/, env.sh, jobs/, analysis/ and tests/, and a results/ of its own, so that
an `--out results/...` never meets a file of an earlier run. A command passes when it exits 0
within its deadline, and a paced run (`--timing paced`, given or added by a script such as
jobs/local/run.sh) when its results say `ok`: its real work fit inside the emulated machine's time
(README, Timing), not `overran`.

Not run, each with its reason on the output:
- what needs a Slurm cluster (sbatch, the array submitter, the namespace cluster's scripts):
  tests/integration/test_slurm.py and test_cluster.py run those scripts on a cluster of their own;
- `make demo` and `make test` (this is run from a checkout that has done both);
- a command whose input files do not exist when its turn comes (a results file another make
  target writes: make demo, make soak, make stragglers, make bench-*): named with its input.

One line per command (status, seconds, the command), then the count; the output of a failing
command is printed after it. Exit status 1 when any command failed.

--smoke SECONDS (CI) gives each command SECONDS: a wrong flag, a missing file or a renamed script
fails within them; a command still running then is ended and counted as started, not passed, and
any later command that reads its results is not run.
Usage: examples.py [--timeout SECONDS] [--keep DIR] [--only SUBSTRING]
"""
from __future__ import annotations

import argparse
import glob
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
READMES = ["README.md", "jobs/README.md", "analysis/README.md"]
LINKS = ["build", ".venv", "env.sh", "jobs", "analysis", "tests"]
CLUSTER = ("sbatch", "submit-sweep.sh", "cluster-up.sh", "cluster-down.sh", "cluster-exec.sh", "source $CLUSTER_DIR")


def commands(readme: pathlib.Path) -> list[tuple[int, str]]:
    """(line, command) of each command in the file's ```sh blocks. A trailing backslash continues a
    line, a `for` or `while` runs to its `done`, and a block's `export` and `source` lines go before
    each later command of the block (they set up the shell it runs in)."""
    out, block, joined, start, depth, setup = [], False, "", 0, 0, []
    for n, line in enumerate(readme.read_text().splitlines(), 1):
        if line.startswith("```"):
            block = line.strip() in ("```sh", "```bash") if not block else False
            setup = []
            continue
        if not block:
            continue
        text = line.rstrip()
        if not joined:
            start = n
            if not text.strip() or text.lstrip().startswith("#"):
                continue
        if text.endswith("\\"):
            joined += text[:-1] + " "
            continue
        # A comment after the command (two spaces and #, as the READMEs write them).
        joined += re.split(r"\s{2,}#", text, maxsplit=1)[0]
        first = text.split()[0] if text.split() else ""
        depth += first in ("for", "while") and 1 or 0
        depth -= first == "done" and 1 or 0
        if depth > 0:
            joined += "\n"
            continue
        cmd = joined.strip()
        joined = ""
        if cmd.split()[0] in ("export", "source"):
            setup.append(cmd)
        out.append((start, " && ".join(setup[:-1] if cmd in setup else setup + [cmd]) if setup and cmd not in setup
                     else cmd))
    return out


def why_not(cmd: str, scratch: pathlib.Path) -> str:
    """Why `cmd` is not run here, or ''."""
    if any(word in cmd for word in CLUSTER):
        return "needs a Slurm cluster (tests/integration/test_slurm.py, test_cluster.py)"
    if cmd.startswith("make "):
        return "a make target (run from a checkout that has run make demo and make test)"
    for word in (w for token in shlex.split(cmd, posix=True) for w in braces(token)):
        if word.startswith("results/") and word.endswith((".h5", ".json")) and not glob.glob(str(scratch / word)):
            # An input, not an --out: inputs follow a subcommand or --replay, outputs follow --out.
            if not re.search(r"--out\s+" + re.escape(word), cmd):
                return f"needs {word}, which no command before it writes (a make target's results, or a run of yours)"
    return ""


def paced_status(scratch: pathlib.Path, since: float) -> str:
    """The /summary status of every paced run's results file written in `scratch` since `since`
    ('' if none): whether the command asked for paced timing or a script added it (run.sh, sbatch)."""
    import h5py
    found = []
    for path in scratch.rglob("*.h5"):
        if ".ckpt" in str(path.relative_to(scratch)) or path.stat().st_mtime < since:
            continue
        try:
            with h5py.File(path, "r") as f:
                if "paced_machine" not in f.attrs:
                    continue  # wall timing, or not a results file
                status = f["summary"].attrs.get("status", b"?") if "summary" in f else b"no /summary"
        except OSError:
            continue  # not HDF5 (a token file, say)
        found.append(status.decode() if isinstance(status, bytes) else str(status))
    return ",".join(sorted(set(found)))


def end_leftovers(scratch: pathlib.Path) -> int:
    """Ends every process still working in `scratch` (its working directory there): Open MPI's
    launcher puts the ranks in process groups of their own, so ending a command's group leaves its
    ranks running, and writing their results, for a while. Returns how many were ended."""
    ended = 0
    where = os.path.realpath(scratch)
    for _ in range(50):
        found = []
        for proc in pathlib.Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                cwd = os.readlink(proc / "cwd")
            except OSError:
                continue
            if cwd == where or cwd.startswith(where + "/"):
                found.append(int(proc.name))
        if not found:
            return ended
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                ended += 1
            except OSError:
                pass
        time.sleep(0.1)
    return ended


def braces(word: str) -> list[str]:
    """bash's brace expansion of one {a,b,...} in `word` (the READMEs use no more)."""
    m = re.search(r"\{([^{}]*,[^{}]*)\}", word)
    return [word[:m.start()] + alt + word[m.end():] for alt in m.group(1).split(",")] if m else [word]


def scratch_dir(keep: str | None) -> pathlib.Path:
    d = pathlib.Path(keep) if keep else pathlib.Path(tempfile.mkdtemp(prefix="ntpbench-readme-"))
    d.mkdir(parents=True, exist_ok=True)
    for name in LINKS:
        if not (d / name).exists():
            (d / name).symlink_to(ROOT / name)
    shutil.rmtree(d / "results", ignore_errors=True)  # every run from nothing, as on a fresh clone
    (d / "results").mkdir()
    return d


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--timeout", type=float, default=600, help="seconds each command may take (default 600)")
    ap.add_argument("--keep", help="scratch directory to use and keep (default: a new one under /tmp)")
    ap.add_argument("--only", help="run only commands containing this text")
    ap.add_argument("--list", action="store_true", help="print the commands and why any would not run; run none")
    ap.add_argument("--smoke", type=float, metavar="SECONDS",
                    help="a smoke test (CI): each command gets SECONDS; one still running then is ended and counted "
                         "as started (not as passed), and a command that reads what it would have written is not run")
    a = ap.parse_args()
    scratch = scratch_dir(a.keep)
    print(f"readme examples: in {scratch}", flush=True)
    ran = failed = skipped = started_only = 0
    cut_short: list[str] = []  # --smoke: the outputs of commands ended at the deadline
    for readme in READMES:
        for line, cmd in commands(ROOT / readme):
            where = f"{readme}:{line}"
            if a.only and a.only not in cmd:
                continue
            reason = why_not(cmd, scratch)
            if not reason and any(out in cmd.split() for out in cut_short):
                reason = "reads the results of a command ended at the --smoke deadline"
            if a.list:
                print(f"{where:<24} {cmd}" + (f"\n{'':<24} not run: {reason}" if reason else ""))
                continue
            if reason:
                skipped += 1
                print(f"not run  {where:<24} {cmd[:90]}\n         {reason}", flush=True)
                continue
            t = time.monotonic()
            started = time.time()
            # Its own process group, so that a command past its deadline is ended with everything it
            # started (mpirun and its ranks), not only its shell.
            p = subprocess.Popen(["bash", "-c", f"source env.sh && {cmd}"], cwd=scratch, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, start_new_session=True)
            try:
                out, _ = p.communicate(timeout=a.smoke or a.timeout)
                rc = p.returncode
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, _ = p.communicate()
                rc = "timeout"
            end_leftovers(scratch)
            if rc == "timeout" and a.smoke:
                started_only += 1
                cut_short += re.findall(r"(?:--out|-o)\s+(\S+)", cmd)
                print(f"{'started':<8} {where:<24} {time.monotonic() - t:6.1f} s  {cmd[:110]} [ended at the smoke deadline]",
                      flush=True)
                continue
            ran += 1
            status = paced_status(scratch, started) if rc == 0 else ""
            ok = rc == 0 and status in ("", "ok")
            if rc == 0 and not ok:
                out = f"the paced run's status: {status} (its real work ran past the emulated time)"
            failed += not ok
            note = f" [paced: {status}]" if status else ""
            print(f"{'ok' if ok else 'FAILED':<8} {where:<24} {time.monotonic() - t:6.1f} s  {cmd[:110]}{note}",
                  flush=True)
            if not ok:
                print(f"         exit {rc}; the last of its output:\n" + "\n".join("         | " + l for l in
                                                                               out.strip().splitlines()[-25:]), flush=True)
    print(f"\n{ran - failed} of {ran} commands ran as typed; {skipped} not run (reasons above)"
          + (f"; {started_only} started and ended at the --smoke deadline ({a.smoke:g} s)" if a.smoke else ""))
    if failed or a.keep:
        print(f"the scratch directory is kept: {scratch}")
    elif not a.list:
        shutil.rmtree(scratch)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
