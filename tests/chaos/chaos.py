#!/usr/bin/env python3
"""Chaos: seeded schedules that mix every failure kind at once (make chaos).

Each seed draws a job (policy, spares, straggler policy, TP x DP or TP x PP x DP, gpt2, llama or
a llama mixture of experts) and a schedule of explicit events: kills at every phase (start, forward, backward, sync,
optimizer, `repair`: in the repair of another kill of its step, and `handover`: in the handover
of a revival of its step), hangs, slow episodes, several in one step, each killed rank revived
some steps later; in some jobs a rank the schedule never touches is killed from outside (`kill -9`
of its process once rank 0 printed a drawn step, under `restart` often in an idle stretch while
every replica waits for a revival), a death the run must record as unscheduled. The run goes under
real kills (ULFM) with a deadline, and is judged by
tests/chaos/verdict.py from its results file, its schedule and its exit code alone (the deaths are
the schedule's, each recorded once; exit 3 only where the schedule leaves no replica; every
revival happened; full degree at the end; no needless checkpoint reload; every straggler acted
on; no process and nothing in /dev/shm left behind), then must replay on one rank
(`ntpbench --replay`: AGREES) and have a /summary that `analysis report` recomputes from the rows.

One line per seed, a table at the end, and for each failing seed the command that reproduces it.
Usage: chaos.py BUILD_DIR OUT_DIR --seeds N [--first S] [--steps K] [--timeout SECONDS]
       chaos.py --check-only RUN.h5 SCHEDULE.yaml --rc N [--outside STEP:RANK ...] [--build BUILD_DIR]
       (judge one run; --outside: a rank killed from outside after that step's line)
"""
from __future__ import annotations

import argparse
import os
import pathlib
import random
import re
import shlex
import signal
import subprocess
import sys
import threading
import time


ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import verdict  # noqa: E402  tests/chaos/verdict.py: the rules a run is judged by
PHASES = ("start", "forward", "backward", "sync", "optimizer")
SPARES = 3  # spare processes of a job with spares, and so its most deaths (one spare each)


def draw_job(rng: random.Random) -> dict:
    """The axes that matter, one value each."""
    layout = rng.choice(["tp4dp2", "tp2pp2dp2"])
    job = {
        "policy": rng.choice(["ntp", "ntp-pw", "dp-drop", "restart"]),
        "spares": rng.choice(["none", "revive", "takeover"]),
        "straggler": rng.choice(["tolerate", "evict", "rebalance"]),
        "layout": layout,
        "model": rng.choice(["gpt2", "llama"]),
    }
    # Half the llama jobs are mixtures of experts (moe-tiny: llama-tiny's attention, 8 experts).
    # Drawn from a generator of its own, seeded by the main one's state, so every seed's other
    # draws and its schedule stay as they were before MoE existed (seeds 150 and 198, kept for a
    # survivor's SIGPIPE, keep their kills, policy and layout, now with experts).
    if job["model"] == "llama" and random.Random(str(rng.getstate())).random() < 0.5:
        job["model"] = "moe"
    return job


def draw_schedule(rng: random.Random, ranks: int, steps: int, max_deaths: int) -> list[dict]:
    """Explicit events a valid schedule accepts: a rank is killed only while alive, revived only
    while dead, has at most one event a step, and every death is revived before the end; fewer
    than half the ranks dead at once, at most `max_deaths` in all (a job with spares has one per
    death)."""
    deaths = 0
    dead_until: dict[int, int] = {}  # rank -> the step of its revival
    slow_until: dict[int, int] = {}  # rank -> the step its slow episode ends
    events: list[dict] = []
    for step in range(3, steps - 1):
        busy = set()  # ranks with an event this step
        for r in [r for r, back in dead_until.items() if back == step]:
            events.append({"step": step, "revive": [r]})
            del dead_until[r]
            busy.add(r)
        for r in [r for r, end in slow_until.items() if end == step]:
            if r not in dead_until and r not in busy:
                events.append({"step": step, "slow": [r], "factor": 1.0})
                busy.add(r)
            del slow_until[r]
        alive = [r for r in range(ranks) if r not in dead_until and r not in busy]
        room = lambda: len(dead_until) < ranks // 2 - 1 and deaths < max_deaths  # noqa: E731
        # A death in the handover of this step's revival (after the new process joined, before its heal).
        revived = any("revive" in e and e["step"] == step for e in events)
        if revived and alive and step < steps - 3 and rng.random() < 0.3 and room():
            victim = rng.choice(alive)
            events.append({"step": step, "kill": [victim], "at": "handover"})
            deaths += 1
            dead_until[victim] = min(steps - 2, step + rng.randint(2, 6))
            slow_until.pop(victim, None)
            alive.remove(victim)
            busy.add(victim)
        if step >= steps - 4:
            continue  # the last steps only revive and end episodes
        if rng.random() < 0.35 and alive and room():
            victim = rng.choice(alive)
            kind = "hang" if rng.random() < 0.2 else "kill"
            events.append({"step": step, kind: [victim], "at": rng.choice(PHASES)})
            deaths += 1
            dead_until[victim] = min(steps - 2, step + rng.randint(2, 6))
            slow_until.pop(victim, None)  # a replacement starts at full speed
            alive.remove(victim)
            # A second death in the repair of the first.
            if kind == "kill" and alive and rng.random() < 0.3 and room():
                second = rng.choice(alive)
                events.append({"step": step, "kill": [second], "at": "repair"})
                deaths += 1
                dead_until[second] = min(steps - 2, step + rng.randint(2, 6))
                slow_until.pop(second, None)
        elif rng.random() < 0.2:
            calm = [r for r in alive if r not in slow_until]
            if calm:
                r = rng.choice(calm)
                events.append({"step": step, "slow": [r], "factor": rng.choice([2.0, 3.0])})
                slow_until[r] = min(steps - 2, step + rng.randint(2, 5))
    events.sort(key=lambda e: e["step"])
    return events


def draw_outside(rng: random.Random, events: list[dict], job: dict, ranks: int, steps: int) -> tuple[int, int] | None:
    """(S, rank): kill `rank` from outside once step S's line is out. The rank is one the schedule never
    names (its process is the first), no event falls in steps S + 1 to S + 3 (where the kill lands),
    and under `restart` S is in an idle stretch (a scheduled death not yet revived) when there is one.
    None where no such step is left, or a job with spares has none to spare."""
    named = {r for e in events for k, v in e.items() if isinstance(v, list) for r in v}
    free = [r for r in range(ranks) if r not in named]
    deaths = sum(len(e.get("kill", [])) + len(e.get("hang", [])) for e in events)
    if not free or (job["spares"] != "none" and deaths >= SPARES):
        return None
    busy = {int(e["step"]) for e in events}
    quiet = [s for s in range(3, steps - 4) if not busy & {s + 1, s + 2, s + 3}]
    idle = []
    if job["policy"] == "restart":
        down: dict[int, int] = {}
        for s in range(1, steps + 1):
            for e in events:
                if int(e["step"]) == s:
                    down.update({r: s for r in e.get("kill", []) + e.get("hang", [])})
                    for r in e.get("revive", []):
                        down.pop(r, None)
            if down and s in quiet:
                idle.append(s)
    choices = idle if idle and rng.random() < 0.7 else quiet
    return (rng.choice(choices), rng.choice(free)) if choices else None


def rank_process(rank: int, out: pathlib.Path) -> int | None:
    """The pid of `rank`'s first process of the run writing `out` (its environment names its rank in
    MPI_COMM_WORLD, its command line the results file)."""
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if str(out) not in (d / "cmdline").read_bytes().decode(errors="replace"):
                continue
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env and os.path.basename(os.readlink(d / "exe")).startswith("ntpbench"):
            return int(d.name)
    return None


def yaml_of(events: list[dict]) -> str:
    def one(e):
        parts = []
        for k, v in e.items():
            parts.append(f"{k}: {list(v) if isinstance(v, list) else v}")
        return "  - {" + ", ".join(parts) + "}"
    return "events:\n" + "\n".join(one(e) for e in events) + "\n"


def command(build: pathlib.Path, job: dict, steps: int, schedule: pathlib.Path, out: pathlib.Path) -> list[str]:
    mpirun = str(ROOT / ".venv/bin/mpirun")
    trainers = 8
    spares = 0 if job["spares"] == "none" else SPARES
    procs = trainers + spares
    model = {"gpt2": ["--preset", "tiny", "--heads", "8", "--hidden", "128"], "llama": ["--preset", "llama-tiny"],
             "moe": ["--preset", "moe-tiny"]}[job["model"]]
    layout = ["--tp", "4"] if job["layout"] == "tp4dp2" else ["--tp", "2", "--pp", "2", "--micro-batches", "2"]
    cmd = [mpirun, "--with-ft", "ulfm", "--oversubscribe", "-np", str(procs), "-x", "OMP_NUM_THREADS=1",
           str(build / "ntpbench"), *model, *layout, "--steps", str(steps), "--policy", job["policy"],
           "--kill-mode", "signal", "--failure-timeout", "1.5", "--timing", "paced", "--device-gflops", "0.5",
           "--schedule", str(schedule), "--checkpoint-every", "4", "--quiet", "--overwrite", "--out", str(out)]
    if job["straggler"] != "tolerate":
        cmd += ["--straggler-threshold", "1.3", "--straggler-window", "2", "--straggler-policy", job["straggler"]]
    if spares:
        cmd += ["--spares-per-host", str(spares), "--spare-use", job["spares"]]
    return cmd


LAUNCHER_FAILED = "PMIx server's listener thread failed to start"


STEP_LINE = re.compile(r"^step\s+(\d+)/\d+ ")


def run(cmd: list[str], env: dict, timeout: float, outside: tuple[int, int] | None = None,
        out: pathlib.Path | None = None) -> tuple[int, str, bool]:
    """The job under a deadline (timeout_with_stacks.sh prints its stacks past it): exit code, output,
    and whether the outside kill (S, rank) was made: SIGKILL to the rank's process as soon as a line
    of step S or later is out."""
    p = subprocess.Popen([str(ROOT / "tests/timeout_with_stacks.sh"), str(timeout), *cmd], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    killed = threading.Event()

    def read():
        for line in p.stdout:
            lines.append(line)
            m = STEP_LINE.match(line)
            if outside and not killed.is_set() and m and int(m.group(1)) >= outside[0]:
                pid = rank_process(outside[1], out)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    killed.set()
                    lines.append(f"chaos: killed rank {outside[1]} (pid {pid}) from outside after step "
                                 f"{m.group(1)}'s line\n")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        rc = p.wait(timeout=timeout + 120)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = 124
    reader.join(timeout=30)
    return rc, "".join(lines), killed.is_set()


def check(build: pathlib.Path, out: pathlib.Path, events: list[dict], rc: int, log: str = "",
          shm_before: set[str] | None = None, outside=()) -> list[str]:
    """verdict.check_run's rules, then the replay (a run that reached its end) and the report."""
    if not out.exists():
        return ([f"exit {rc}"] if rc not in (0, 3) else []) + ["no results file"]
    problems = verdict.check_run(out, events, rc, shm_before, outside)
    if rc == 0:
        rep = subprocess.run([str(build / "ntpbench"), "--replay", str(out), "--quiet"], capture_output=True,
                             text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if rep.returncode != 0 or "AGREES" not in rep.stdout:
            problems.append("replay: " + ((rep.stdout + rep.stderr).strip().splitlines() or ["no output"])[-1][:200])
    report = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "analysis", "report", str(out)],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    if report.returncode != 0:
        problems.append("report: " + report.stderr.strip()[-200:])
    return problems


def end_leftovers(pids: list[int]) -> None:
    """Ends what a failed run left running, so that the next seed starts clean."""
    for pid in pids:
        if verdict.running_ntpbench(pid):
            try:
                os.kill(pid, 9)
            except OSError:
                pass


def run_pids(out: pathlib.Path) -> list[int]:
    try:
        facts = verdict.RunFacts(out)
        return [p for _, p, _ in facts.incarnations] + facts.spare_pids
    except (OSError, KeyError, ValueError):
        return []


def check_only(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="chaos.py --check-only", description="Judge one run by verdict.py's rules.")
    ap.add_argument("run", type=pathlib.Path)
    ap.add_argument("schedule", type=pathlib.Path)
    ap.add_argument("--rc", type=int, required=True, help="the run's exit code")
    ap.add_argument("--outside", nargs="*", default=[], metavar="STEP:RANK",
                    help="a rank killed from outside after that step's line")
    ap.add_argument("--build", type=pathlib.Path, default=ROOT / "build", help="for the replay (default build/)")
    a = ap.parse_args(argv)
    outside = [tuple(int(x) for x in o.split(":")) for o in a.outside]
    problems = check(a.build, a.run, verdict.load_schedule(a.schedule), a.rc, outside=outside)
    for p in problems:
        print(f"FAIL: {p}")
    print("ok" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


def main() -> int:
    if sys.argv[1:2] == ["--check-only"]:
        return check_only(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", type=pathlib.Path)
    ap.add_argument("out", type=pathlib.Path)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first", type=int, default=1)
    ap.add_argument("--also", type=int, nargs="*", default=[],
                    help="seeds to run after the range (regressions: seeds that once failed)")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--timeout", type=int, default=300, help="deadline of one run, seconds")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMP_NUM_THREADS": "1",
           "PRTE_MCA_prte_allowed_exit_without_sync": "1", "PRTE_MCA_state_base_recoverable": "1"}
    rows, failed = [], []
    for seed in [*range(a.first, a.first + a.seeds), *a.also]:
        rng = random.Random(seed)
        job = draw_job(rng)
        ranks = 8
        events = draw_schedule(rng, ranks, a.steps, max_deaths=SPARES if job["spares"] != "none" else 8)
        schedule = a.out / f"seed{seed}.yaml"
        schedule.write_text(yaml_of(events))
        out = a.out / f"seed{seed}.h5"
        # The outside kill from a generator of its own, so that a seed's job and schedule stay what
        # they were before outside kills were drawn (the regression seeds still reproduce).
        orng = random.Random(f"outside {seed}")
        # (More often under restart: its idle stretches are where an outside death once went unrecorded.)
        drawn = orng.random() < (0.7 if job["policy"] == "restart" else 0.3)
        outside = draw_outside(orng, events, job, ranks, a.steps) if drawn else None
        cmd = command(a.build, job, a.steps, schedule, out)
        if outside:
            cmd.remove("--quiet")  # the step lines tell when to kill
        t0 = time.time()
        shm_before = verdict.shm_entries()
        rc, log, made = run(cmd, env, a.timeout, outside, out)
        relaunched = rc != 0 and LAUNCHER_FAILED in log and "ntpbench" not in log and not out.exists()
        if relaunched:
            # Open MPI 5.0's launcher failed before any ntpbench process ran (tests/integration/
            # conftest.py, launcher_did_not_start): not the run's failure; once more, and said so.
            rc, log, made = run(cmd, env, a.timeout, outside, out)
        (a.out / f"seed{seed}.log").write_text(log)
        kills = [outside] if outside and made else []
        problems = ["hung (deadline)"] if rc == 124 else check(a.build, out, events, rc, log, shm_before, kills)
        end_leftovers(run_pids(out))
        kinds = sorted({k for e in events for k in e if k not in ("step", "at", "factor")}
                       | ({"outside"} if kills else set()))
        line = (f"seed {seed:>4}: {job['policy']:<7} spares {job['spares']:<8} stragglers {job['straggler']:<9} "
                f"{job['layout']:<9} {job['model']:<5} {len(events):>2} events ({','.join(kinds)}) "
                f"{time.time() - t0:6.1f} s  {'ok' if not problems else 'FAIL: ' + '; '.join(problems)}"
                + (" (the launcher failed to start once: relaunched)" if relaunched else "")
                + (f" (outside kill of rank {outside[1]} after step {outside[0]} not made: no such line)"
                   if outside and not made else ""))
        print(line, flush=True)
        rows.append((seed, job, problems))
        if problems:
            failed.append((seed, cmd + ([f"# then kill -9 rank {outside[1]} after step {outside[0]}"] if kills else []),
                           problems))
    print(f"\n{len(rows) - len(failed)} of {len(rows)} seeds passed")
    for seed, cmd, problems in failed:
        print(f"seed {seed}: {'; '.join(problems)}\n  {shlex.join(cmd)}\n  log: {a.out}/seed{seed}.log")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
