"""Several nodes for real: a 3-node Slurm cluster on this machine (tests/cluster/cluster-up.sh: each node
a network namespace with its own hostname, one slurmd each), Open MPI over TCP between the namespaces,
TP inside a node and replicas across nodes, and whole nodes failing.

Skipped, with the reason, only where the cluster cannot start (not root, no network namespaces,
Slurm absent and not installable); NTPBENCH_REQUIRE_CLUSTER=1 (CI sets it) turns those skips into
failures. `make test-cluster` runs this file alone.
"""
import json
import os
import re
import pathlib
import signal
import sys
import subprocess
import time

import h5py
import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "chaos"))
import chaos  # noqa: E402  tests/chaos/chaos.py: its phases and its checks

from conftest import BUILD, ENV, MPIRUN, NTPBENCH, ROOT, ULFM, needs_ulfm, replay, skip_or_fail

HARNESS = ROOT / "tests" / "cluster"
SBATCH = ROOT / "jobs" / "slurm" / "ntpbench.sbatch"
PY = ROOT / ".venv" / "bin" / "python"
NET = "10.77.0"
# What a real cluster sets too (jobs/README.md): Open MPI's TCP traffic and PRRTE's daemons on the
# cluster network only.
MCA = {"OMPI_MCA_btl_tcp_if_include": f"{NET}.0/24", "PRTE_MCA_oob_tcp_if_include": f"{NET}.0/24",
       "OMPI_MCA_mpi_yield_when_idle": "1", "OMPI_MCA_mpi_preconnect_mpi": "1"}
TINY = ["--preset", "tiny", "--tp", "4", "--quiet"]


def unavailable(msg):
    skip_or_fail(msg, "NTPBENCH_REQUIRE_CLUSTER")


def left_behind(d):
    """What of cluster DIR `d` still exists: its namespaces, links and mounts, and live daemons."""
    left = []
    objects = d / "objects"
    for line in objects.read_text().splitlines() if objects.exists() else []:
        kind, name = line.split()
        if kind == "netns" and pathlib.Path(f"/run/netns/{name}").exists():
            left.append(line)
        if kind == "link" and pathlib.Path(f"/sys/class/net/{name}").exists():
            left.append(line)
        if kind == "mount" and subprocess.run(["mountpoint", "-q", name]).returncode == 0:
            left.append(line)
    for line in (d / "pids").read_text().splitlines() if (d / "pids").exists() else []:
        pid, name = line.split()
        try:
            if pathlib.Path(f"/proc/{pid}/comm").read_text().strip() == name[:15]:
                left.append(f"process {name} {pid}")
        except OSError:
            pass
    return left


def up(d, nodes, extra_env=None):
    env = {**os.environ, **(extra_env or {})}
    try:
        return subprocess.run([HARNESS / "cluster-up.sh", str(nodes), d], capture_output=True, text=True,
                              timeout=300, env=env)
    except subprocess.TimeoutExpired:
        subprocess.run([HARNESS / "cluster-down.sh", d], capture_output=True, timeout=120)
        unavailable("tests/cluster/cluster-up.sh did not finish within 300 s")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A 3-node cluster for this module; the client environment to reach it. Always taken down, and
    the teardown checks that nothing of it is left."""
    d = tmp_path_factory.mktemp("cluster")
    p = up(d, 3)
    if p.returncode == 77:
        unavailable(f"the cluster cannot run here: {p.stderr.strip()[-500:]}")
    if p.returncode != 0:
        unavailable(f"the cluster did not start (cluster-up.sh exited {p.returncode}):\n{p.stderr[-3000:]}")
    env = {k: v for k, v in ENV.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
    env.update(MCA, SLURM_CONF=str(d / "slurm.conf"), CLUSTER_DIR=str(d), NTPBENCH=str(NTPBENCH),
               NTPBENCH_RESULTS=str(d / "results"))
    (d / "results").mkdir()
    try:
        yield d, env
    finally:
        down = subprocess.run([HARNESS / "cluster-down.sh", d], capture_output=True, text=True, timeout=180)
        assert down.returncode == 0, down.stderr
        assert left_behind(d) == [], f"cluster-down.sh left {left_behind(d)}"


def sbatch(env, name, nodes, *args, per_node=4, timeout=300):
    """Submits jobs/slurm/ntpbench.sbatch, waits for it; returns (exit code, its log, its run.h5).

    These tests are of failures on several nodes, not of the clock: they pass --time-scale 1. The
    script would add --time-scale auto on these one-core nodes (four ranks each), and auto then
    honestly needs 2048 to 8192: a message among four ranks sharing a core takes milliseconds, the
    custom machine's latency is 5 us. At those factors the same 12-step job took 72 s to over 600 s
    with the machine's load. The auto factor itself is tested in test_paced.py."""
    if "--timing" not in args and "--time-scale" not in args:
        args = (*args, "--time-scale", 1)
    out = subprocess.run(["sbatch", "--parsable", "--wait", f"--job-name={name}", f"--nodes={nodes}",
                          f"--ntasks-per-node={per_node}", "--output", f"{env['NTPBENCH_RESULTS']}/{name}-%j.out",
                          str(SBATCH), *map(str, args)],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    job = out.stdout.strip().splitlines()[0] if out.stdout.strip() else "?"
    log = pathlib.Path(env["NTPBENCH_RESULTS"]) / f"{name}-{job}.out"
    text = log.read_text() if log.exists() else out.stderr
    # Shown whole with a failing test's captured output (an assertion's message is cut short).
    print(f"--- {name} (job {job}): exit {out.returncode}\n{text}")
    h5 = pathlib.Path(env["NTPBENCH_RESULTS"]) / f"{name}-{job}" / "run.h5"
    if h5.exists():
        with h5py.File(h5, "r") as f:
            for e in f["events"][()] if "events" in f else []:
                print(f"event step {e['step']} rank {e['rank']} {e['kind'].decode()}: {e['detail'].decode()}")
    return out.returncode, text, h5


def on_node(d, node, *cmd, env, timeout=240, **kw):
    return subprocess.run([HARNESS / "cluster-exec.sh", d, node, *map(str, cmd)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, **kw)


def hostfile_mpirun(d, env, nodes, ranks, mapping, *args):
    """`mpirun --hostfile` from node1 as a user on a cluster would, daemons started by cluster-rsh.sh."""
    hf = d / f"hostfile-{nodes}"
    hf.write_text("".join(f"node{k} slots=4\n" for k in range(1, nodes + 1)))
    cmd = [MPIRUN[0], *(["--with-ft", "ulfm"] if ULFM else []), "--mca", "plm_rsh_agent", HARNESS / "cluster-rsh.sh",
           "--hostfile", hf, "-np", ranks, "--map-by", mapping, "--oversubscribe", "--bind-to", "none",
           "-x", "OMP_NUM_THREADS=1", "-x", "OMPI_MCA_btl_tcp_if_include", "-x", "OMPI_MCA_mpi_yield_when_idle",
           "-x", "OMPI_MCA_mpi_preconnect_mpi",
           NTPBENCH, "--threads", 1, *args]
    return on_node(d, "node1", *cmd, env=env)


def veth_bytes(d, node):
    """Bytes the bridge side of `node`'s veth link has carried (both ways)."""
    link = next(line.split()[1] for line in (d / "objects").read_text().splitlines()
                if line.startswith("link ") and line.endswith(f"-{node[4:]}"))
    stats = pathlib.Path(f"/sys/class/net/{link}/statistics")
    return int((stats / "rx_bytes").read_text()) + int((stats / "tx_bytes").read_text())


def attrs_hosts(h5):
    with h5py.File(h5, "r") as f:
        return json.loads(f.attrs["hosts"]), [(int(r["rank"]), r["host"].decode(), int(r["pid"]), float(r["t_end"]))
                                             for r in f["ranks/incarnations"][()]]


def events(h5, kind):
    with h5py.File(h5, "r") as f:
        return [(int(e["step"]), int(e["rank"]), e["detail"].decode()) for e in f["events"][()]
                if e["kind"].decode() == kind]


def report(h5):
    p = subprocess.run([PY, "-m", "analysis", "report", str(h5)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_the_scripts_leave_nothing_behind(tmp_path):
    """A start that fails half-way (after the bridge, namespaces and munged exist) removes what it
    made; a good start and cluster-down.sh (twice) leave nothing either."""
    bad = tmp_path / "bad"
    p = up(bad, 2, {"CLUSTER_CPUS": "many"})
    if p.returncode == 77:
        unavailable(f"the cluster cannot run here: {p.stderr.strip()[-500:]}")
    assert p.returncode != 0 and "CLUSTER_CPUS 'many'" in p.stderr, p.stderr
    assert (bad / "objects").read_text().count("netns") == 2  # it had made them ...
    assert left_behind(bad) == []                              # ... and removed them
    good = tmp_path / "good"
    p = up(good, 2)
    assert p.returncode == 0, p.stderr[-3000:]
    assert len(left_behind(good)) > 0
    for _ in range(2):
        down = subprocess.run([HARNESS / "cluster-down.sh", good], capture_output=True, text=True, timeout=180)
        assert down.returncode == 0, down.stderr
        assert left_behind(good) == []


BLOCK = ["node1"] * 4 + ["node2"] * 4


def test_two_nodes_through_slurm(cluster):
    d, env = cluster
    before = veth_bytes(d, "node2")
    rc, log, h5 = sbatch(env, "two", 2, *TINY, "--steps", 6)
    assert rc == 0, log
    hosts, incarnations = attrs_hosts(h5)
    assert hosts == BLOCK, hosts  # TP groups (ranks 0-3, 4-7) each inside one node
    assert [h for _, h, _, _ in incarnations] == BLOCK
    # The replicas' gradient sync crossed node2's link: TCP between the namespaces.
    assert veth_bytes(d, "node2") - before > 100_000
    replay(h5)


def test_two_nodes_through_a_hostfile_and_the_link_model(cluster):
    """mpirun --hostfile with the rsh agent; ranks in blocks per node, then spread round-robin: the
    paced TP all-reduces then cross nodes and take the scale-out link (--dp-gbps), so they slow down."""
    d, env = cluster
    # 8 steps: the median of 7 is the link model's even when a few steps stall (one run here had
    # 0.25 s of TP comm inside a node in two of three steps, against 0.006 s in the rest).
    paced = ["--timing", "paced", "--device-gflops", 0.5, "--dp-gbps", 0.01, "--steps", 8]
    tp_comm, seen = {}, {}
    for mapping in ("ppr:4:node", "node"):
        out = d / f"hostfile-{mapping}.h5"
        p = hostfile_mpirun(d, env, 2, 8, mapping, *TINY, *paced, "--out", out)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        hosts, _ = attrs_hosts(out)
        assert sorted(hosts) == sorted(BLOCK), hosts
        with h5py.File(out, "r") as f:
            names = f["ranks/phase_times"].attrs["phases"]
            phases = (names.decode() if isinstance(names, bytes) else str(names)).split(",")
            # Median over (step, rank) after the first step: one stalled step (a TCP retransmit on a
            # fresh link, a starved core) must not stand for the link model.
            per_step = f["ranks/phase_times"][1:, :, phases.index("tp_comm")]
            tp_comm[mapping] = float(np.median(per_step))
            seen[mapping] = per_step.round(4).tolist()
        if mapping == "ppr:4:node":
            assert hosts == BLOCK
            replay(out)
        else:
            assert hosts == ["node1", "node2"] * 4
            assert "the TP group of ranks 0..3 spans hosts node1, node2" in p.stdout
    assert tp_comm["node"] > 2 * tp_comm["ppr:4:node"], (tp_comm, seen)


def test_sbatch_refuses_tp_groups_that_do_not_fit_a_node(cluster):
    d, env = cluster
    rc, log, _ = sbatch(env, "misfit", 2, *TINY, "--steps", 2, per_node=3)
    assert rc != 0
    assert "TP 4 does not divide the 3 ranks on a node" in log, log


def test_the_node_failure_schedule_passes_check(cluster):
    d, env = cluster
    rc, log, _ = sbatch(env, "check", 3, *TINY, "--steps", 30, "--schedule", ROOT / "jobs/schedules/node-failure.yaml",
                        "--check")
    assert rc == 0 and "(4 kills, 4 revivals)" in log, log


def check_node_failure(h5, revived, collateral_ok=False):
    """Node2's ranks 4-7 were lost at step 8 as one node failure (with real kills, ranks on other
    nodes may die with them: see test_a_node_killed_from_outside); replica 1 dropped out whole; the
    report counts the GPUs lost and names node2; the run replays."""
    down = events(h5, "node_down")
    assert [(s, detail) for s, _, detail in down] == [(8, "node2: ranks [4, 5, 6, 7]")], down
    dead = sorted(r for _, r, _ in events(h5, "kill"))
    assert set(dead) >= {4, 5, 6, 7} and (collateral_ok or dead == [4, 5, 6, 7]), dead
    with h5py.File(h5, "r") as f:
        st = f["steps"][()]
        down_rows = slice(7, 10 if revived else 12)  # steps 8..10 (revived at 11) or 8..12
        assert len(st) == 12 and all(st["live_ranks"][down_rows] == 12 - len(dead)), st["live_ranks"]
        assert all(st["active_replicas"][down_rows] <= 2)  # node2's replica dropped out whole
        if revived:
            assert st["live_ranks"][-1] == 12 and st["active_replicas"][-1] == 3
    rep = report(h5)
    # The failure row names node2 lost whole; its ranks read "4-7", or wider with collateral deaths.
    line = next((line for line in rep.splitlines() if "node2 (4)" in line), "")
    assert line.split()[:2] == ["8", str(len(dead))], rep  # step 8, GPUs lost
    assert dead != [4, 5, 6, 7] or line.split()[2] == "4-7", rep
    replay(h5)


@pytest.mark.parametrize("policy", ["ntp", "dp-drop"])
def test_node_killed_and_revived_on_three_nodes(cluster, policy, tmp_path):
    """kill_node and revive_node on 12 ranks (TP 4 per node). A revival cannot be a new process on
    a multi-host job with Open MPI 5.0 (open-mpi/ompi#13521), so the default kill mode fences it."""
    d, env = cluster
    sched = d / "node-kill-revive.yaml"
    sched.write_text("events:\n  - {step: 8, kill_node: node2, at: backward}\n  - {step: 11, revive_node: node2}\n")
    rc, log, h5 = sbatch(env, f"nodefail-{policy}", 3, *TINY, "--steps", 12, "--schedule", sched, "--policy", policy)
    assert rc == 0, log
    assert "kills are fenced" in log, log
    check_node_failure(h5, revived=True)
    assert [d for s, _, d in events(h5, "node_up")] == ["node2: ranks [4, 5, 6, 7]"]


@needs_ulfm
def test_node_processes_really_die_under_signal(cluster):
    d, env = cluster
    sched = d / "node-kill.yaml"
    sched.write_text("events:\n  - {step: 8, kill_node: node2, at: backward}\n")
    rc, log, h5 = sbatch(env, "nodesig", 3, *TINY, "--steps", 12, "--schedule", sched, "--policy", "ntp",
                         "--kill-mode", "signal")
    assert rc == 0, log
    assert "died" in log, log
    _, inc = attrs_hosts(h5)
    ended = {r for r, host, _, t_end in inc if t_end == t_end}  # t_end is NaN while alive
    assert ended >= {4, 5, 6, 7} and ended == {r for _, r, _ in events(h5, "kill")}, ended
    check_node_failure(h5, revived=False, collateral_ok=True)


def alive(pid):
    return os.path.exists(f"/proc/{pid}")


@needs_ulfm
def test_a_node_killed_from_outside(cluster):
    """Every ntpbench process on node2, found in /ranks/incarnations, killed at once from outside.

    A survivor on another node sometimes died with them (rank 3 on node1 in one run, five ranks in
    another): Open MPI 5.0's TCP transport wrote to the vanished peer's socket and SIGPIPE, left at
    its default, ended the writer without a word. ntpbench now ignores SIGPIPE (comm/fault.hpp,
    ignore_broken_links: the same death ended survivors in `make chaos` on one host). Until batches
    of runs here show no such death, the policy stays ntp (a replica that loses a rank trains on at
    lower TP) and the test requires node2's ranks among the dead, not only them."""
    d, env = cluster
    # Slow emulated devices (~0.5 s a step): the kill lands within the first few of 40 steps.
    args = [*TINY, "--steps", 40, "--timing", "paced", "--device-gflops", 0.1, "--policy", "ntp",
            "--kill-mode", "signal", "--out", d / "outside.h5"]
    job = subprocess.Popen(["sbatch", "--wait", "--job-name=outside", "--nodes=3", "--ntasks-per-node=4",
                            "--output", d / "outside.out", SBATCH, *map(str, args)], env=env, cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victims = []
    deadline = time.monotonic() + 120
    while not victims and time.monotonic() < deadline:
        time.sleep(1)
        try:
            with h5py.File(d / "outside.h5", "r") as f:
                if len(f["steps"]) >= 2:
                    victims = [int(r["pid"]) for r in f["ranks/incarnations"][()] if r["host"] == b"node2"]
        except (OSError, KeyError):
            pass
    assert len(victims) == 4, (victims, (d / "outside.out").read_text() if (d / "outside.out").exists() else "")
    assert all(alive(pid) for pid in victims), [(pid, alive(pid)) for pid in victims]  # none died unprompted
    # Killed one after another: on a crowded 2-core host this process can lose its core between two
    # kills, and node2's Open MPI daemon may end the others first. Their end is what the test wants.
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _, err = job.communicate(timeout=300)
    log = (d / "outside.out").read_text()
    assert job.returncode == 0, log + err
    kills = events(d / "outside.h5", "kill")
    dead = {r for _, r, _ in kills}
    assert {4, 5, 6, 7} <= dead, kills
    assert all(detail == "unscheduled: the process died" for _, _, detail in kills), (kills, log)
    _, inc = attrs_hosts(d / "outside.h5")
    assert {r for r, _, _, t_end in inc if t_end == t_end} == dead  # exactly the dead have ended
    with h5py.File(d / "outside.h5", "r") as f:
        st = f["steps"][()]
        assert len(st) == 40 and st["live_ranks"][-1] == 12 - len(dead) and 1 <= st["active_replicas"][-1] <= 2
    rep = report(d / "outside.h5")
    line = next((line for line in rep.splitlines() if "node2 (4)" in line), "")  # node2 lost whole
    assert len(line.split()) > 1 and line.split()[1] == str(len(dead)), rep  # GPUs lost
    replay(d / "outside.h5")


def spare_pids(h5):
    with h5py.File(h5, "r") as f:
        return {s["pid"]: s["host"] for s in json.loads(f.attrs["spares"])}


def no_spare_named(h5):
    """The ranks the no_spare events name (each says "rank(s) [...] stay dead")."""
    return {int(r) for _, _, detail in events(h5, "no_spare") for r in re.findall(r"\d+", detail.split("stay dead")[0])}


@needs_ulfm
@pytest.mark.parametrize("use", ["takeover", "revive"])
def test_a_spare_host_takes_a_dead_node(cluster, use):
    """Three nodes of 4 tasks, the last one a spare host: node2 dies for real (--kill-mode signal)
    and node3's spares take its ranks 4-7, at once (takeover) or at the revival (revive), with no
    fall-back to fenced kills: the processes of node3 hold them to the end, mpirun exits 0, and the
    run replays.

    Open MPI 5.0.11's TCP path can take a peer on another node down with node2 (test_a_node_killed_
    from_outside). When that peer is one of node3's spares, node3 can no longer hold a whole node:
    the run must say so (spare_lost, and node2's ranks named in no_spare) and train on; the job is
    then run once more, since the handover itself was not exercised."""
    d, env = cluster
    sched = d / f"spare-host-{use}.yaml"
    text = "events:\n  - {step: 4, kill_node: node2, at: backward}\n"
    # A takeover also loses node1's rank 3 in the same step (as Open MPI's TCP path sometimes takes
    # a peer down with a node): the spare host goes to the whole node, and rank 3 stays dead.
    sched.write_text(text + ("  - {step: 4, kill: [3], at: backward}\n" if use == "takeover"
                             else "  - {step: 7, revive_node: node2}\n"))
    for attempt in (1, 2):
        rc, log, h5 = sbatch(env, f"spare-{use}-{attempt}", 3, *TINY, "--steps", 9, "--schedule", sched, "--policy",
                             "ntp", "--kill-mode", "signal", "--spare-hosts", 1, "--spare-use", use)
        assert rc == 0, log
        assert "kills are fenced" not in log, log
        lost = events(h5, "spare_lost")
        if not lost:
            break
        # A spare of node3 died with node2: whichever of node2's ranks no spare took stay dead, named.
        _, inc = attrs_hosts(h5)
        unserved = {r for r in (4, 5, 6, 7) if [host for rank, host, _, _ in inc if rank == r][-1] != "node3"}
        assert unserved and unserved <= no_spare_named(h5), (lost, events(h5, "no_spare"), log)
        print(f"note: Open MPI took spare(s) of node3 down with node2 ({lost}); running the job again", file=sys.stderr)
    else:
        pytest.fail(f"a spare of node3 died with node2 in both runs: {lost}\n{log}")
    hosts, inc = attrs_hosts(h5)
    assert hosts == BLOCK, hosts  # the 8 trainers' hosts at job start; node3's 4 processes are spares
    spares = spare_pids(h5)
    assert sorted(spares.values()) == ["node3"] * 4, spares
    # Ranks 4-7: first their node2 process (ended), then one of node3's spares, alive at the end.
    dead = sorted(r for _, r, _ in events(h5, "kill"))
    assert set(dead) >= ({3, 4, 5, 6, 7} if use == "takeover" else {4, 5, 6, 7}), (dead, log)
    for r in (4, 5, 6, 7):
        mine = [(host, pid, t_end) for rank, host, pid, t_end in inc if rank == r]
        assert mine[0][0] == "node2" and mine[0][2] == mine[0][2], (mine, log)  # ended (not NaN)
        assert mine[-1][0] == "node3" and mine[-1][1] in spares and mine[-1][2] != mine[-1][2], (mine, log)
    kind = "takeover" if use == "takeover" else "spare"
    taken = events(h5, kind)  # one event per rank a spare took
    assert sorted((s, r) for s, r, _ in taken) == [(4 if use == "takeover" else 7, r) for r in (4, 5, 6, 7)], taken
    with h5py.File(h5, "r") as f:
        st = f["steps"][()]
        # A rank of node1 that dies with node2 (scheduled here under takeover; Open MPI's TCP path
        # can also take one down, test_a_node_killed_from_outside) has no spare slot on node1: it
        # stays dead, and says so.
        assert st["live_ranks"][-1] == 8 - (len(dead) - 4) and st["active_replicas"][-1] == 2
    if use == "takeover":
        # Rank 3, and any other rank that died with the node, stay dead and are named. The node's own
        # deaths can reach the survivors in two repairs of step 4: ranks of the first wait, named
        # without a spare, until the rest of their node is known dead and the spare host takes it all.
        stray = set(dead) - {4, 5, 6, 7}
        none = events(h5, "no_spare")
        named = no_spare_named(h5)
        assert {s for s, _, _ in none} == {4} and named - {4, 5, 6, 7} == stray and stray <= named, (none, log)
    replay(h5)


def draw_cluster_chaos(seed):
    """One seeded job on the 3-node cluster with node3 a spare host: a trainer node lost whole at a
    random phase, a rank of the other trainer node hung (SIGSTOP) before or after it, the policy and
    the spares' use drawn. Returns (schedule text, sbatch arguments)."""
    import random
    rng = random.Random(seed)
    node = rng.choice(["node1", "node2"])
    other = "node2" if node == "node1" else "node1"
    hung = rng.choice([0, 1, 2, 3] if other == "node1" else [4, 5, 6, 7])
    kill_step, hang_step = rng.randint(3, 5), rng.randint(3, 7)
    use = rng.choice(["takeover", "revive"])
    policy = rng.choice(["ntp", "dp-drop"])
    lines = [f"  - {{step: {kill_step}, kill_node: {node}, at: {rng.choice(chaos.PHASES)}}}",
             f"  - {{step: {hang_step}, hang: [{hung}], at: {rng.choice(('forward', 'backward', 'optimizer'))}}}"]
    if use == "revive":
        lines.append(f"  - {{step: {kill_step + 3}, revive_node: {node}}}")
    args = ["--steps", 10, "--policy", policy, "--kill-mode", "signal", "--spare-hosts", 1, "--spare-use", use,
            "--failure-timeout", 1.5]
    return "events:\n" + "\n".join(lines) + "\n", args


@needs_ulfm
@pytest.mark.parametrize("seed", range(1, 1 + int(os.environ.get("NTPBENCH_CLUSTER_CHAOS_SEEDS", "2"))))
def test_cluster_chaos(cluster, seed):
    """Chaos on several nodes (tests/chaos/chaos.py's checks): a trainer node killed for real at a
    random phase, node3's spares taking it (at once or at its revival), a rank of the other node
    frozen and ended by its host's survivors. Judged by chaos.py's checker (tests/chaos/verdict.py:
    the schedule's deaths each recorded once, exit 3 only where the schedule leaves no replica,
    revivals done, nothing left behind), and it must add up and replay. NTPBENCH_CLUSTER_CHAOS_SEEDS sets how many seeds."""
    d, env = cluster
    text, args = draw_cluster_chaos(seed)
    sched = d / f"chaos-{seed}.yaml"
    sched.write_text(text)
    print(f"seed {seed}: {' '.join(map(str, args))}\n{text}")
    shm_before = chaos.verdict.shm_entries()
    rc, log, h5 = sbatch(env, f"chaos-{seed}", 3, *TINY, *args, "--schedule", sched)
    problems = chaos.check(BUILD, h5, chaos.verdict.load_schedule(sched), rc, log, shm_before)
    assert not problems, (problems, log)
    assert [s for s, _, _ in events(h5, "node_down")], events(h5, "node_down")
