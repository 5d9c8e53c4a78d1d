# ntpbench front door. `make demo` installs what is missing, builds and runs the main job;
# `make test` builds and runs every test. Everything else wraps CMake.

BUILD    ?= build
JOBS     ?= $(shell nproc)
VENV     ?= .venv
PY       := $(VENV)/bin/python
RANKS    ?= 8
NTPBENCH := $(BUILD)/ntpbench

# Debian 12 packages the build and the tests need.
APT_PACKAGES := build-essential cmake pkg-config git \
  openmpi-bin libopenmpi-dev libhdf5-openmpi-dev hdf5-tools \
  libopenblas-dev libopenblas-openmp-dev \
  libgtest-dev libgmock-dev libbenchmark-dev \
  libcli11-dev libyaml-cpp-dev nlohmann-json3-dev libfmt-dev \
  python3 python3-venv python3-pip

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Open MPI refuses root unless told; ranks may outnumber cores on a workstation.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
MPIRUN := mpirun --oversubscribe

.PHONY: all deps apt-deps py-deps build test demo clean help bench bench-bestblas

all: build

help:
	@echo "make deps    install missing Debian packages and the Python venv for analysis/"
	@echo "make build   configure and build into $(BUILD)/"
	@echo "make test    build, then run every C++ test (CTest) and the analysis tests (pytest)"
	@echo "make demo    deps + build, then the embedded default job ($(RANKS) ranks, small, TP 4) and its replay check"

deps: apt-deps py-deps

apt-deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing: $$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	else echo "Debian packages: all present"; fi

py-deps: $(VENV)/.installed

$(VENV)/.installed: analysis/requirements.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r analysis/requirements.txt
	touch $@

$(BUILD)/CMakeCache.txt: CMakeLists.txt
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test: build py-deps
	cd $(BUILD) && ctest --output-on-failure
	$(PY) -m pytest -q tests/integration analysis/tests

demo: deps build
	@mkdir -p results/demo
	$(MPIRUN) -np $(RANKS) $(NTPBENCH) --preset small --tp 4 --steps 30 --out results/demo/engine.h5 --overwrite
	$(NTPBENCH) --replay results/demo/engine.h5 --quiet

# Microbenchmarks (bench/, Google Benchmark JSON in results/bench/, tables from bench/report.py).
# Kernels and the whole step on one rank; collectives and the TP layer on 4 ranks, one BLAS/OpenMP
# thread per rank when ranks outnumber cores. OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are left as the
# environment sets them and recorded in each JSON's context; `make bench-bestblas` reruns the
# kernels and the step with both unset, so OpenBLAS picks the kernel for this CPU itself.
bench: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS) --target bench_kernels bench_comm bench_layer bench_step
	@mkdir -p results/bench
	@t=$$(( $$(nproc) / 4 )); [ $$t -ge 1 ] || t=1; set -e; \
	gb="--benchmark_out_format=json --benchmark_color=false"; \
	$(BUILD)/bench/bench_kernels $$gb --benchmark_out=results/bench/kernels.json; \
	$(BUILD)/bench/bench_step $$gb --benchmark_out=results/bench/step.json; \
	OMP_NUM_THREADS=$$t $(MPIRUN) -np 4 -x OMP_NUM_THREADS $(BUILD)/bench/bench_comm $$gb --benchmark_out=results/bench/comm.json; \
	OMP_NUM_THREADS=$$t $(MPIRUN) -np 4 -x OMP_NUM_THREADS $(BUILD)/bench/bench_layer $$gb --benchmark_out=results/bench/layer.json
	python3 bench/report.py results/bench/kernels.json results/bench/step.json results/bench/comm.json results/bench/layer.json

bench-bestblas: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS) --target bench_kernels bench_step
	@mkdir -p results/bench/bestblas
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(BUILD)/bench/bench_kernels --benchmark_out_format=json \
	  --benchmark_color=false --benchmark_out=results/bench/bestblas/kernels.json
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(BUILD)/bench/bench_step --benchmark_out_format=json \
	  --benchmark_color=false --benchmark_out=results/bench/bestblas/step.json
	python3 bench/report.py results/bench/bestblas

clean:
	rm -rf $(BUILD)
