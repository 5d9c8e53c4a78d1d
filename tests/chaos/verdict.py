"""What a run under a failure schedule must have done, judged from its results file, its schedule
and its exit code alone (chaos.py --check-only; make chaos and the cluster chaos batch use it for
every seed). Each rule reads what happened, not what the run says of itself:

- deaths: every `kill` event is one the schedule caused (a `kill`, `hang` or `kill_node` of that
  rank), each scheduled death has its event, and no event says `unscheduled` but one for each kill
  the caller made from outside (`kill -9` of a rank's process after step S: its `unscheduled` event
  at step S + 1 to S + 3, counted as a death with no revival by the rules below);
- the exit: 0, or 3 only where the schedule itself leaves no replica that could train (a death
  with no revival that would let one train again); a run that stopped says so in /summary;
- revivals: each scheduled `revive` (and `revive_node`) at a step the run reached has its `revive`
  event, or a spare took the rank over before it (`takeover`);
- the end: where every death was revived, the last row has every trainer live and every replica at
  its full TP degree (a straggler evicted to the end excepted);
- restores: no checkpoint reload (`restore`, `rollback`) outside `--policy restart` while a
  replica that never lost a rank nor had one evicted held every shard;
- stragglers: under `--straggler-policy evict` or `rebalance`, each `straggler` event is acted on
  (`evict`, `evict_refused` or `rebalance`) at its step or the next, unless the rank died first or
  the run ended;
- processes: each rank's processes are its incarnations, one per life (1 + its revivals and
  takeovers), all but a live rank's last ended, and none of them (nor a spare) is still running;
- shared memory: nothing new in /dev/shm after the run that no live process maps (Open MPI's segments, the hang watch's
  records), where the caller took a listing before it.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import sys
from collections import Counter

import h5py
import numpy as np
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from shm_left import left_behind, shm_entries  # noqa: E402,F401  tests/shm_left.py (shm_entries: for callers)


def load_schedule(path: str | os.PathLike) -> list[dict]:
    """The explicit events of a schedule file (a `random:` generator's are not judged here)."""
    doc = yaml.safe_load(pathlib.Path(path).read_text()) or {}
    return sorted(doc.get("events") or [], key=lambda e: int(e["step"]))


class RunFacts:
    """What the rules read from one results file."""

    def __init__(self, path: str | os.PathLike):
        with h5py.File(path, "r") as f:
            a = f.attrs
            text = lambda v: v.decode() if isinstance(v, bytes) else str(v)  # noqa: E731
            self.tp, self.pp, self.dp = int(a["tp"]), int(a.get("pp", 1)), int(a["replicas"])
            self.trainers = self.tp * self.pp * self.dp
            self.policy = text(a["policy"])
            config = json.loads(text(a.get("config", "{}")))
            stragglers = config.get("stragglers") or {}
            self.straggler_policy = stragglers.get("policy", "tolerate") if stragglers.get("threshold") else "tolerate"
            self.hosts = json.loads(text(a["hosts"])) if "hosts" in a else []
            self.spare_pids = [int(s["pid"]) for s in json.loads(text(a["spares"]))] if "spares" in a else []
            ev = f["events"][()] if "events" in f else np.zeros(0, dtype=[("step", "i8")])
            self.events = [(int(e["step"]), text(e["kind"]), int(e["rank"]), text(e["detail"])) for e in ev]
            self.incarnations = [(int(r["rank"]), int(r["pid"]), float(r["t_end"]))
                                 for r in f["ranks/incarnations"][()]]
            steps = f["steps"][()]
            self.last_step = int(steps["step"][-1]) if len(steps) else 0
            self.last_live = int(steps["live_ranks"][-1]) if len(steps) else 0
            tp_degree = f["replicas/tp_degree"][()]
            self.last_degrees = [int(d) for d in tp_degree[-1]] if len(tp_degree) else []
            self.summary = {k: text(v) if isinstance(v, (bytes, str)) else float(v)
                            for k, v in f["summary"].attrs.items()} if "summary" in f else None

    def replica_of(self, rank: int) -> int:
        return rank // (self.tp * self.pp)

    def stage_of(self, rank: int) -> int:
        return rank % (self.tp * self.pp) // self.tp

    def of_kind(self, *kinds: str) -> list[tuple[int, int, str]]:
        return [(s, r, d) for s, k, r, d in self.events if k in kinds]


# An outside kill made after the line of step S lands in step S + 1, or later where rank 0's line
# came late: its event is looked for up to this many steps after S + 1.
OUTSIDE_SLACK = 2


def scheduled_deaths(events: list[dict], facts: RunFacts, outside=()) -> list[tuple[int, int]]:
    """(step, rank) of each death the schedule causes, and of each outside kill (made after step S:
    taken at S + 1)."""
    out = [(int(s) + 1, int(r)) for s, r in outside]
    for e in events:
        for r in [*e.get("kill", []), *e.get("hang", [])]:
            out.append((int(e["step"]), int(r)))
        if "kill_node" in e:
            out += [(int(e["step"]), r) for r, h in enumerate(facts.hosts) if h == e["kill_node"]]
    return out


def scheduled_revivals(events: list[dict], facts: RunFacts) -> list[tuple[int, int]]:
    out = []
    for e in events:
        out += [(int(e["step"]), int(r)) for r in e.get("revive", [])]
        if "revive_node" in e:
            out += [(int(e["step"]), r) for r, h in enumerate(facts.hosts) if h == e["revive_node"]]
    return out


def can_train(alive: set[int], facts: RunFacts) -> bool:
    """Whether some replica trains with these ranks alive: under restart only with every rank alive
    (the whole job stops at a failure and waits for it to be repaired); whole under dp-drop; under
    NTP with a live rank in each of its pipeline stages."""
    if facts.policy == "restart":
        return all(r in alive for r in range(facts.trainers))
    for replica in range(facts.dp):
        ranks = range(replica * facts.tp * facts.pp, (replica + 1) * facts.tp * facts.pp)
        if facts.policy == "dp-drop":
            if all(r in alive for r in ranks):
                return True
        elif all(any(r in alive for r in ranks if facts.stage_of(r) == st) for st in range(facts.pp)):
            return True
    return False


def schedule_leaves_no_replica(events: list[dict], facts: RunFacts, outside=()) -> bool:
    """Whether at some step the schedule's deaths (and the outside kills) leave no replica that trains,
    and none of the revivals still to come (were each to succeed) would let one train again (the
    run's exit 3)."""
    deaths, revivals = scheduled_deaths(events, facts, outside), scheduled_revivals(events, facts)
    alive = set(range(facts.trainers))
    for step in sorted({s for s, _ in deaths + revivals}):
        alive -= {r for s, r in deaths if s == step}
        alive |= {r for s, r in revivals if s == step}
        hope = alive | {r for s, r in revivals if s > step}
        if not can_train(alive, facts) and not can_train(hope, facts):
            return True
    return False


def check_run(path: str | os.PathLike, events: list[dict], rc: int, shm_before: set[str] | None = None,
              outside=()) -> list[str]:
    """Every rule above against one run: the problems found (empty: the run did what it should).
    outside: (S, rank) of each kill made from outside after step S's line."""
    try:
        facts = RunFacts(path)
    except (OSError, KeyError, ValueError) as e:
        return [f"unreadable results: {e}"]
    problems: list[str] = []
    outside = [(int(s), int(r)) for s, r in outside]
    stop_allowed = schedule_leaves_no_replica(events, facts, outside)

    # The exit, and what /summary says of it.
    if rc == 3 and not stop_allowed:
        problems.append("exit 3 (no replica can go on), but the schedule leaves a replica that can train")
    elif rc not in (0, 3):
        problems.append(f"exit {rc}")
    if facts.summary is None:
        problems.append("no /summary")
    elif rc == 3 and facts.summary.get("status") != "stopped":
        problems.append(f"exit 3 but /summary status {facts.summary.get('status')!r}, not 'stopped'")
    elif rc == 0 and facts.summary.get("status") == "stopped":
        problems.append("exit 0 but /summary status 'stopped'")

    # Deaths: the schedule's, each once, the outside kills', and no other.
    kills = facts.of_kind("kill")
    unscheduled = [(s, r, d) for s, r, d in kills if d.startswith("unscheduled")]
    unexplained = list(unscheduled)
    for s, r in outside:
        match = [u for u in unexplained if u[1] == r and s + 1 <= u[0] <= s + 1 + OUTSIDE_SLACK]
        if match:
            unexplained.remove(match[0])
        elif s + 1 <= facts.last_step:
            problems.append(f"the outside kill of rank {r} after step {s} has no death event (kill, unscheduled) "
                            f"by step {s + 1 + OUTSIDE_SLACK}")
    if unexplained:
        problems.append(f"{len(unexplained)} death(s) the schedule did not cause: "
                        + "; ".join(f"step {s} rank {r}: {d}" for s, r, d in unexplained))
    wanted = Counter(r for s, r in scheduled_deaths(events, facts) if s <= facts.last_step)
    got = Counter(r for _, r, d in kills if not d.startswith("unscheduled"))
    if got != wanted:
        problems.append(f"kill events for ranks {sorted(got.elements())}, scheduled deaths {sorted(wanted.elements())}")

    # Revivals the run reached.
    taken = {r for _, r, _ in facts.of_kind("takeover")}
    revived = Counter((s, r) for s, r, _ in facts.of_kind("revive"))
    missing = [(s, r) for s, r in scheduled_revivals(events, facts)
               if s <= facts.last_step and not revived[(s, r)] and r not in taken]
    if missing:
        problems.append("scheduled revival(s) that did not happen: " + ", ".join(f"rank {r} at step {s}" for s, r in missing))

    # The end: full degree where every death was revived.
    evicted_at_end = {r for _, r, _ in facts.of_kind("evict")} - {r for _, r, _ in facts.of_kind("rejoin")}
    all_back = (Counter(r for _, r in scheduled_deaths(events, facts, outside))
                == Counter(r for _, r in scheduled_revivals(events, facts)))
    if rc == 0 and all_back and not evicted_at_end:
        if facts.last_live != facts.trainers:
            problems.append(f"the last step ran with {facts.last_live} live ranks of {facts.trainers}, every death revived")
        if any(d != facts.tp for d in facts.last_degrees):
            problems.append(f"the last step's TP degrees {facts.last_degrees}, not {facts.tp} in every replica")

    # Restores: only where no replica held every shard.
    if facts.policy != "restart":
        for s, _, d in facts.of_kind("restore", "rollback"):
            hurt = {facts.replica_of(r) for t, r, _ in kills + facts.of_kind("evict") if t <= s and r >= 0}
            intact = sorted(set(range(facts.dp)) - hurt)
            if intact:
                problems.append(f"step {s}: a checkpoint reload ({d}) while replica(s) {intact} never lost a rank "
                                "and held every shard")

    # Stragglers: each named one acted on by its policy.
    if facts.straggler_policy in ("evict", "rebalance"):
        acted = {(s, r) for s, r, _ in facts.of_kind("evict", "evict_refused", "rebalance")}
        died = {(s, r) for s, r, _ in kills}
        for s, r, _ in facts.of_kind("straggler"):
            if s >= facts.last_step or any((t, r) in acted for t in (s, s + 1)):
                continue
            if any(t <= s + 1 and q == r for t, q in died):
                continue
            problems.append(f"step {s}: straggler rank {r} not acted on by --straggler-policy {facts.straggler_policy}")

    # Processes: one incarnation per life, ended but for a live rank's last, none still running.
    # A takeover is recorded with a `revive` of the same rank and step: one new life.
    lives = Counter(r for _, r in {(s, r) for s, r, _ in facts.of_kind("revive", "takeover")})
    for rank in range(facts.trainers):
        mine = [(pid, t_end) for r, pid, t_end in facts.incarnations if r == rank]
        if len(mine) != 1 + lives[rank]:
            problems.append(f"rank {rank}: {len(mine)} incarnation(s) for {1 + lives[rank]} life(s)")
            continue
        alive_at_end = rc == 0 and facts.summary is not None
        for i, (pid, t_end) in enumerate(mine):
            last = i == len(mine) - 1
            dead = got[rank] + Counter(r for _, r, _ in unscheduled)[rank] > lives[rank]
            if (not last or dead) and math.isnan(t_end):
                problems.append(f"rank {rank}: process {pid} has no end in /ranks/incarnations, yet it died")
            elif last and not dead and alive_at_end and not math.isnan(t_end):
                problems.append(f"rank {rank}: its live process {pid} is recorded as ended")
    left = [pid for pid in [p for _, p, _ in facts.incarnations] + facts.spare_pids if running_ntpbench(pid)]
    if left:
        problems.append(f"{len(left)} process(es) of the run still running: pids {left}")

    if shm_before is not None:
        new = left_behind(shm_before)
        if new:
            problems.append(f"left in /dev/shm: {', '.join(new)}")
    return problems


def running_ntpbench(pid: int) -> bool:
    """Whether process `pid` is an ntpbench still running (a later process with the pid is not)."""
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("ntpbench")
    except OSError:
        return False
