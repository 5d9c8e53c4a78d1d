#!/usr/bin/env python3
"""The READMEs' commands, run as typed (make readme-examples).

Every fenced `sh` block of README.md, docs/*.md (in DOCS's order: the README's old chapters), jobs/README.md
and analysis/README.md (or the files given with --readme) is split into commands (a trailing backslash continues a line; comments are dropped) and
each runs under `bash -e -o pipefail` after `source env.sh`, in the order the READMEs give them, in a
scratch directory: links to this checkout's build/, .venv/, env.sh, jobs/, analysis/ and tests/, and
a results/ of its own, so that an `--out results/...` never meets a file of an earlier run. Under
-e and pipefail a `for` loop fails when any of its runs fails, and a pipeline when any part does.
A command passes when it exits 0 within its deadline (one cut at the deadline fails), and when every
paced results file it wrote (root attribute `paced_machine`: the command asked for paced timing or
a script such as jobs/local/run.sh added it) says `ok` in /summary: its real work fit inside the
emulated machine's time (docs/timing.md), not `overran`. The files looked at are the *.h5 written
during the command under the scratch directory and under each of its `--out PATH`s, wherever they
point (/tmp included; `$VAR` taken as `*`, braces expanded).

Not run, each with its reason on the output:
- what needs a Slurm cluster (sbatch, the array submitter, the namespace cluster's scripts):
  tests/integration/test_slurm.py and test_cluster.py run those scripts on a cluster of their own;
- a command whose input files do not exist when its turn comes (a results file another make
  target writes: make demo, make soak, make stragglers, make bench-*): named with its input.
`make` lines are listed apart, each with the CI stage of .ci/run that runs its target, or why none
does, and counted apart.

--smoke SECONDS (CI): every command must still finish and pass, within SECONDS each; to stay short a
command may run in a reduced form that keeps its code path and its failure schedule valid, chosen
by these rules (each command's line says which form ran and why):
- an ntpbench run (build/ntpbench, or jobs/local/run.sh without --dry-run) of more than
  SMOKE_STEPS steps: when a later command reads its results, --steps is cut to the larger of
  SMOKE_STEPS and its --schedule's last event, so every event still happens and the reader gets a
  real file; otherwise --steps is cut to SMOKE_STEPS when every event falls by then, else --check is
  appended (flags, schedule and data validated against the job's ranks; nothing trained);
- a sweep (jobs/local/sweep.sh FILE) runs a copy of FILE in the scratch directory whose lines are
  cut as runs that are read (its report reads every task's results);
- everything else runs as typed.
Full mode (no --smoke) runs every command as typed, each within --timeout.

One line per command (status, seconds, the command; in smoke mode the form), then the count; the
output of a failing command is printed after it. Exit status 1 when any command failed or was cut.
Usage: examples.py [--smoke SECONDS] [--timeout SECONDS] [--keep DIR] [--only SUBSTRING]
                   [--readme PATH ...] [--list]
"""
from __future__ import annotations

import argparse
import fnmatch
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
sys.path.insert(0, str(ROOT / "tests"))
from shm_left import left_behind, shm_entries  # noqa: E402  tests/shm_left.py
# docs/ in the order of the README's chapters they came from: a command that reads a run's results
# comes after the command that writes them.
DOCS = ["running", "policies", "moe", "real-failures", "spares", "hangs", "stragglers", "schedules", "timing", "data",
        "cluster", "flags", "checks", "layout", "blas"]
# A page not named in DOCS still runs, after those named (by name).
READMES = ["README.md", *(f"docs/{d}.md" for d in DOCS),
           *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md") if p.stem not in DOCS),
           "jobs/README.md", "analysis/README.md"]
LINKS = ["build", ".venv", "env.sh", "jobs", "analysis", "tests"]
CLUSTER = ("sbatch", "submit-sweep.sh", "cluster-up.sh", "cluster-down.sh", "cluster-exec.sh", "source $CLUSTER_DIR")
# The most steps a reduced run takes when nothing later needs its events: enough for a few steps
# past start-up, the results file, the final checkpoint.
SMOKE_STEPS = 6
DEFAULT_STEPS = 20  # ntpbench's --steps default (src/train/options.hpp)
# Targets no CI stage runs, and why (the others are found in .ci/run).
NOT_IN_CI = {
    "demo": "installs what is missing and runs the full demo (every policy, paced, minutes); CI runs its "
            "parts: make deps, the build, make test",
}

NTPBENCH = re.compile(r"(?<!\S)(?:\S*/)?ntpbench(?=\s|$)")
RUN_SH = re.compile(r"(?<!\S)(?:\S*/)?jobs/local/run\.sh(?=\s|$)")
SWEEP_SH = re.compile(r"(?<!\S)((?:\S*/)?jobs/local/sweep\.sh)\s+(\S+)")
# Where one command's arguments end: a newline or a shell operator.
ARGS_END = re.compile(r"\n|;|&&|\|")


def commands(readme: pathlib.Path) -> list[tuple[int, str]]:
    """(line, command) of each command in the file's ```sh blocks. A trailing backslash continues a
    line, a loop runs to its `done` (on its own line or not), and a block's `export` and `source` lines go before
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
        depth += loop_depth(text)
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


def loop_depth(line: str) -> int:
    """How many loops `line` opens less how many it closes: its `do` and `done` keywords (first in
    the line or after a `;`), outside quotes."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lex.whitespace_split = True
    try:
        tokens = list(lex)
    except ValueError:
        return 0
    keywords = [t for i, t in enumerate(tokens) if i == 0 or tokens[i - 1] == ";"]
    return keywords.count("do") - keywords.count("done")


def braces(word: str) -> list[str]:
    """bash's brace expansion of every {a,b,...} in `word`."""
    m = re.search(r"\{([^{}]*,[^{}]*)\}", word)
    if not m:
        return [word]
    return [w for alt in m.group(1).split(",") for w in braces(word[:m.start()] + alt + word[m.end():])]


def words(cmd: str) -> list[str]:
    try:
        return shlex.split(cmd, posix=True)
    except ValueError:
        return cmd.split()


def outputs(cmd: str) -> list[str]:
    """The command's `--out` paths as glob patterns: a shell variable stands for anything."""
    ws = words(cmd)
    found = [ws[i + 1] for i, w in enumerate(ws[:-1]) if w == "--out"] + [w[6:] for w in ws if w.startswith("--out=")]
    return [re.sub(r"\$\{?\w+\}?", "*", b) for w in found for b in braces(w)]


def inputs(cmd: str) -> list[str]:
    """The results files the command reads: results/ paths that do not follow --out."""
    ws = words(cmd)
    return [b for i, w in enumerate(ws) if w.startswith("results/") and (i == 0 or ws[i - 1] != "--out")
            for b in braces(w)]


def make_target(cmd: str) -> str:
    """The target of a `make` line ('' if the command is not one)."""
    ws = [w for w in cmd.split(" && ")[-1].split() if "=" not in w]
    return (ws[1] if len(ws) > 1 else "all") if ws and ws[0] == "make" else ""


def ci_stages() -> dict[str, str]:
    """target -> the first `stage ... make TARGET` line of .ci/run that runs it."""
    found: dict[str, str] = {}
    try:
        lines = (ROOT / ".ci" / "run").read_text().splitlines()
    except OSError:
        return found
    for n, line in enumerate(lines, 1):
        m = re.match(r"stage\s.*?\bmake\s+(?:\w+=\S*\s+)*([\w-]+)", line)
        if m:
            found.setdefault(m.group(1), f".ci/run:{n}: " + line.rstrip(" \\"))
    return found


def why_not(cmd: str, scratch: pathlib.Path) -> str:
    """Why `cmd` is not run here, or ''."""
    if any(word in cmd for word in CLUSTER):
        return "needs a Slurm cluster (tests/integration/test_slurm.py, test_cluster.py)"
    for word in inputs(cmd):
        if word.endswith((".h5", ".json")) and not glob.glob(str(scratch / word)):
            return f"needs {word}, which no command before it writes (a make target's results, or a run of yours)"
    return ""


# --- smoke forms -----------------------------------------------------------------------------------

def flag(args: str, name: str) -> str | None:
    m = re.search(rf"(?<!\S)--{name}(?:\s+|=)(\S+)", args)
    return m.group(1).strip("'\"") if m else None


def config_steps(args: str, scratch: pathlib.Path) -> str | None:
    cfg = flag(args, "config")
    try:
        text = (scratch / cfg).read_text() if cfg else ""
    except OSError:
        return None
    m = re.search(r"^\s*steps\s*=\s*(\d+)", text, re.M)
    return m.group(1) if m else None


def last_event(schedule: str | None, scratch: pathlib.Path) -> tuple[int | None, str]:
    """The step of the schedule's last event (0 without one), or None with why it cannot be known."""
    if not schedule:
        return 0, ""
    if "$" in schedule:
        return None, f"its schedule {schedule} is named through a variable"
    try:
        text = (scratch / schedule).read_text()
    except OSError:
        return None, f"its schedule {schedule} cannot be read"
    text = re.sub(r"#.*", "", text)
    if re.search(r"^\s*random\s*:", text, re.M):
        return None, f"{schedule} draws failures at random over the whole run"
    steps = [int(s) for s in re.findall(r"\bstep\s*:\s*(\d+)", text)]
    return max(steps, default=0), ""


def plan(args: str, scratch: pathlib.Path, reader: str) -> tuple[str, int, str]:
    """What a smoke run does with one ntpbench run of `args`: ('typed'|'steps'|'check', steps, why).
    `reader`: the later command that reads its results ('' if none)."""
    steps_text = flag(args, "steps") or config_steps(args, scratch) or str(DEFAULT_STEPS)
    if not steps_text.isdigit():
        return "check", 0, f"its --steps {steps_text} is not a number"
    steps = int(steps_text)
    if steps <= SMOKE_STEPS:
        return "typed", steps, ""
    schedule = flag(args, "schedule")
    last, unknown = last_event(schedule, scratch)
    if reader:
        if last is None:
            return "typed", steps, ""
        target = max(last, SMOKE_STEPS)
        if target >= steps:
            return "typed", steps, ""
        events = f"; {schedule}'s last event is at step {last}" if schedule else ""
        return "steps", target, f"{reader} reads its results{events}"
    if last is not None and last <= SMOKE_STEPS:
        return "steps", SMOKE_STEPS, (f"every event of {schedule} is by step {last}; " if schedule else "") + \
            "no later command reads its results"
    why = unknown or f"{schedule}'s last event is at step {last}, past the {SMOKE_STEPS} steps of a smoke run"
    return "check", steps, why + ", and no later command reads its results"


def apply(cmd: str, start: int, end: int, kind: str, steps: int) -> str:
    """`cmd` with the arguments in [start, end) given `steps` steps or --check."""
    args = cmd[start:end]
    core = args.rstrip()
    if kind == "steps" and re.search(r"(?<!\S)--steps(?:\s+|=)\S+", core):
        core = re.sub(r"(?<!\S)--steps(?:\s+|=)\S+", f"--steps {steps}", core, count=1)
    else:
        core += f" --steps {steps}" if kind == "steps" else " --check"
    return cmd[:start] + core + args[len(args.rstrip()):] + cmd[end:]  # the whitespace after, kept


def smoke_form(cmd: str, scratch: pathlib.Path, reader: str) -> tuple[str, str]:
    """(the command a smoke run runs, why; '' when as typed)."""
    m = SWEEP_SH.search(cmd)
    if m:
        return smoke_sweep(cmd, m, scratch)
    whys = []
    # Right to left, so that an edit leaves the earlier positions valid.
    runs = [*NTPBENCH.finditer(cmd), *RUN_SH.finditer(cmd)]
    for m in sorted(runs, key=lambda r: -r.start()):
        end = ARGS_END.search(cmd, m.end())
        end = end.start() if end else len(cmd)
        args = cmd[m.end():end]
        if re.search(r"(?<!\S)--(replay|check|dry-run|help|version)(?=\s|$)", args):
            continue  # no training run
        kind, steps, why = plan(args, scratch, reader)
        if kind == "typed":
            continue
        cmd = apply(cmd, m.end(), end, kind, steps)
        whys.append(f"--steps {steps}: {why}" if kind == "steps" else f"--check: {why}")
    return cmd, "; ".join(whys)


def smoke_sweep(cmd: str, m: re.Match, scratch: pathlib.Path) -> tuple[str, str]:
    """A sweep file's copy in the scratch directory, each task cut as a run whose results are read."""
    path = m.group(2)
    try:
        lines = (scratch / path).read_text().splitlines()
    except OSError:
        return cmd, ""  # as typed: the sweep's own error
    out, cut, task = [], [], 0
    for line in lines:
        if line.strip() and not line.lstrip().startswith("#"):
            task += 1
            kind, steps, _ = plan(line, scratch, "the sweep's report")
            if kind != "typed":
                line = apply(line, 0, len(line), kind, steps)
                cut.append(f"task {task}: " + (f"--steps {steps}" if kind == "steps" else "--check"))
        out.append(line)
    if not cut:
        return cmd, ""
    copy = scratch / "smoke" / pathlib.Path(path).name
    copy.parent.mkdir(exist_ok=True)
    copy.write_text("\n".join(out) + "\n")
    reduced = cmd[:m.start(2)] + str(copy.relative_to(scratch)) + cmd[m.end(2):]
    return reduced, (f"{path}'s copy {copy.relative_to(scratch)}, its tasks cut to the larger of {SMOKE_STEPS} "
                     f"steps and their schedule's last event ({', '.join(cut)}): the sweep's report reads every "
                     "task's results")


def reader_of(cmd: str, later: list[tuple[str, str]]) -> str:
    """The first later command that reads what `cmd` writes (its location), or ''."""
    outs = outputs(cmd)
    for where, other in later:
        for inp in inputs(other):
            if any(fnmatch.fnmatch(o, inp) or fnmatch.fnmatch(inp, o) for o in outs):
                return where
    return ""


# --- running ---------------------------------------------------------------------------------------

def paced_status(cmd: str, scratch: pathlib.Path, since: float) -> dict[str, str]:
    """{path: /summary status} of every paced results file written since `since` under `scratch`
    and under each `--out` of `cmd`, whether the command asked for paced timing or a script added it
    (run.sh, sbatch)."""
    import h5py
    paths = set(scratch.rglob("*.h5"))
    for pattern in outputs(cmd):
        for hit in glob.glob(str(scratch / pattern)):  # an absolute pattern stays as it is
            hit = pathlib.Path(hit)
            paths.update(hit.rglob("*.h5") if hit.is_dir() else [hit] if hit.suffix == ".h5" else [])
    found = {}
    for path in paths:
        try:
            if ".ckpt" in str(path.resolve()) or path.stat().st_mtime < since:
                continue
            with h5py.File(path, "r") as f:
                if "paced_machine" not in f.attrs:
                    continue  # wall timing, or not a results file
                status = f["summary"].attrs.get("status", b"?") if "summary" in f else b"no /summary"
        except OSError:
            continue  # not HDF5 (a token file, say), or gone
        name = os.path.relpath(path, scratch) if path.resolve().is_relative_to(scratch.resolve()) else str(path)
        found[name] = status.decode() if isinstance(status, bytes) else str(status)
    return found


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


def scratch_dir(keep: str | None) -> pathlib.Path:
    d = pathlib.Path(keep) if keep else pathlib.Path(tempfile.mkdtemp(prefix="ntpbench-readme-"))
    d.mkdir(parents=True, exist_ok=True)
    for name in LINKS:
        if not (d / name).exists():
            (d / name).symlink_to(ROOT / name)
    for fresh in ("results", "smoke"):  # every run from nothing, as on a fresh clone
        shutil.rmtree(d / fresh, ignore_errors=True)
    (d / "results").mkdir()
    return d


def run(cmd: str, scratch: pathlib.Path, deadline: float) -> tuple[int | str, str]:
    """(exit status or 'cut', output) of `cmd` under bash -e -o pipefail."""
    # Its own process group, so that a command past its deadline is ended with everything it
    # started (mpirun and its ranks), not only its shell.
    shm_before = shm_entries()
    p = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", f"source env.sh\n{cmd}"], cwd=scratch,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=deadline)
        rc: int | str = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        rc = "cut"
    if end_leftovers(scratch) or rc == "cut":
        # Processes ended by force leave Open MPI's shared memory behind (their launcher did not
        # clean up): what this command left, and no live process maps, goes.
        for name in left_behind(shm_before):
            try:
                os.unlink(f"/dev/shm/{name}") if not os.path.isdir(f"/dev/shm/{name}") else shutil.rmtree(f"/dev/shm/{name}")
            except OSError:
                pass
    return rc, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--timeout", type=float, default=600, help="seconds each command may take (default 600)")
    ap.add_argument("--keep", help="scratch directory to use and keep (default: a new one under /tmp)")
    ap.add_argument("--only", help="run only commands containing this text")
    ap.add_argument("--readme", action="append", metavar="PATH",
                    help="a README to take the commands from instead of README.md, docs/*.md, jobs/ and analysis/ "
                         "(repeatable)")
    ap.add_argument("--list", action="store_true", help="print the commands and why any would not run; run none")
    ap.add_argument("--smoke", type=float, metavar="SECONDS",
                    help="a smoke test (CI): each command gets SECONDS and must finish and pass in them, run as "
                         "typed or in a reduced form (see above)")
    a = ap.parse_args()
    readmes = [pathlib.Path(p).resolve() for p in a.readme] if a.readme else [ROOT / r for r in READMES]
    everything = []
    for readme in readmes:
        name = os.path.relpath(readme, ROOT) if readme.is_relative_to(ROOT) else str(readme)
        everything += [(f"{name}:{line}", cmd) for line, cmd in commands(readme)]
    scratch = scratch_dir(a.keep)
    stages = ci_stages()
    print(f"readme examples: in {scratch}" + (f"; --smoke: {a.smoke:g} s each, reduced forms below" if a.smoke else ""),
          flush=True)
    passed = reduced = failed = cut = 0
    not_run: dict[str, int] = {}
    in_ci = not_in_ci = 0
    failures: list[tuple[str, list[str]]] = []  # (where, its --out patterns) of each failed command
    t0 = time.monotonic()
    for i, (where, cmd) in enumerate(everything):
        if a.only and a.only not in cmd:
            continue
        target = make_target(cmd)
        if target:
            stage = stages.get(target)
            place = (f"run by CI: {stage}" if stage
                     else f"not in CI: {NOT_IN_CI.get(target, 'no stage of .ci/run runs it')}")
            in_ci += bool(stage)
            not_in_ci += not stage
            print(f"{'make':<8} {where:<24} {cmd}\n         {place}", flush=True)
            continue
        # What a failed command left (a run cut short, say) is no input to judge a reader by.
        broken = [w for w, outs in failures for inp in inputs(cmd) for o in outs
                  if fnmatch.fnmatch(o, inp) or fnmatch.fnmatch(inp, o)]
        reason = f"reads the results of {broken[0]}, which failed" if broken else why_not(cmd, scratch)
        form, why = cmd, ""
        if a.smoke and not reason and not a.list:
            form, why = smoke_form(cmd, scratch, reader_of(cmd, everything[i + 1:]))
        if a.list:
            print(f"{where:<24} {cmd}" + (f"\n{'':<24} not run: {reason}" if reason else ""))
            continue
        if reason:
            key = ("a Slurm cluster" if "Slurm" in reason else "a failed command's results" if "which failed" in reason
                   else "another target's results")
            not_run[key] = not_run.get(key, 0) + 1
            print(f"not run  {where:<24} {cmd[:90]}\n         {reason}", flush=True)
            continue
        t = time.monotonic()
        started = time.time()
        rc, out = run(form, scratch, a.smoke or a.timeout)
        paced = paced_status(form, scratch, started) if rc == 0 else {}
        status = ",".join(sorted(set(paced.values())))
        ok = rc == 0 and status in ("", "ok")
        if rc == "cut":
            cut += 1
            out += f"\n[cut at the deadline: {a.smoke or a.timeout:g} s]"
        elif rc == 0 and not ok:
            out = "\n".join(f"{path}: the paced run's status is {st} (its real work ran past the emulated time)"
                            for path, st in sorted(paced.items()) if st != "ok")
        failed += not ok
        if not ok:
            failures.append((where, outputs(form)))
        passed += ok
        reduced += ok and bool(why)
        note = f" [paced: {status}]" if status else ""
        line = " ".join(cmd.split())
        print(f"{'ok' if ok else 'FAILED':<8} {where:<24} {time.monotonic() - t:6.1f} s  {line[:110]}{note}", flush=True)
        if a.smoke:
            shown = "\n                  ".join(" ".join(part.split()) for part in form.split("\n"))
            print("         as typed" if not why else f"         reduced: {shown}\n         because {why}", flush=True)
        if not ok:
            print(f"         {'cut at the deadline' if rc == 'cut' else f'exit {rc}'}; the last of its output:\n"
                  + "\n".join("         | " + l for l in out.strip().splitlines()[-25:]), flush=True)
    if a.list:
        if not a.keep:
            shutil.rmtree(scratch)
        return 0
    print(f"\n{passed} of {passed + failed} commands passed"
          + (f" ({passed - reduced} as typed, {reduced} reduced for --smoke {a.smoke:g})" if a.smoke else " as typed")
          + f"; {failed} failed" + (f" ({cut} cut at the deadline)" if cut else "")
          + f"; {sum(not_run.values())} not run"
          + (f" ({', '.join(f'{n} need {k}' for k, n in not_run.items())})" if not_run else "")
          + f"; {in_ci + not_in_ci} make lines ({in_ci} run by CI, {not_in_ci} not in CI)"
          + f"; {time.monotonic() - t0:.0f} s")
    if failed or a.keep:
        print(f"the scratch directory is kept: {scratch}")
    else:
        shutil.rmtree(scratch)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
