# gpu-bundle/env.sh (copied there from jobs/gpu/bundle-env.sh by jobs/gpu/make_bundle.sh).
# Source it from bash:  . gpu-bundle/env.sh
#
# Puts the bundle's bin/ first on PATH and finds the CUDA libraries the bundle does not carry
# (the runtime, cuBLAS/cuBLASLt and NCCL, whose sonames make_bundle.sh wrote to cuda-libs.txt;
# the driver's libcuda.so.1), adding their folders to LD_LIBRARY_PATH. Where it looks, first
# match wins, per library:
#   1. NTPBENCH_CUDA_LIBS (folders, colon-separated), if set;
#   2. the lib/ folders of the Python packages `nvidia.*` (the pip wheels nvidia-cuda-runtime,
#      nvidia-cublas, nvidia-nccl-cu13: site-packages/nvidia/cu13/lib, .../nvidia/nccl/lib), asking
#      python3 (and /opt/torch/.venv/bin/python3) where `import nvidia` is;
#   3. /usr/local/cuda/lib64, /usr/local/cuda/lib, /usr/local/cuda/targets/x86_64-linux/lib;
#   4. site-packages/nvidia/*/lib globbed under /usr/local/lib, /usr/lib and /opt/*/.venv;
#   5. the loader's cache (ldconfig -p) and LD_LIBRARY_PATH as they are.
# It prints one line per library (NTPBENCH_BUNDLE_QUIET=1: none) and sets NTPBENCH_BUNDLE (the
# bundle's folder), OPAL_PREFIX (the same) and NTPBENCH_BUNDLE_MISSING (the libraries not found,
# empty when all were).

NTPBENCH_BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export NTPBENCH_BUNDLE
# Open MPI finds its help files and settings through OPAL_PREFIX (mpirun sets it from its own
# path; a binary started without mpirun, a singleton, needs it here).
OPAL_PREFIX=$NTPBENCH_BUNDLE
export OPAL_PREFIX
case ":$PATH:" in *":$NTPBENCH_BUNDLE/bin:"*) ;; *) PATH="$NTPBENCH_BUNDLE/bin:$PATH" ;; esac
export PATH

_ntpb_candidates() {
  local d py
  if [ -n "${NTPBENCH_CUDA_LIBS:-}" ]; then tr ':' '\n' <<<"$NTPBENCH_CUDA_LIBS"; fi
  for py in python3 /opt/torch/.venv/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    "$py" -c '
import glob, os
try:
    import nvidia
except Exception:
    raise SystemExit(0)
for base in list(getattr(nvidia, "__path__", [])):
    for d in sorted(glob.glob(os.path.join(base, "*", "lib"))):
        print(d)
' 2>/dev/null
  done
  printf '%s\n' /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib
  for d in /usr/local/lib/python3*/*-packages/nvidia/*/lib /usr/lib/python3*/*-packages/nvidia/*/lib \
           /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
    [ -d "$d" ] && echo "$d"
  done
  if [ -n "${LD_LIBRARY_PATH:-}" ]; then tr ':' '\n' <<<"$LD_LIBRARY_PATH"; fi
}

_ntpb_find() {  # _ntpb_find SONAME: the path it is loaded from, or nothing
  local d p
  while read -r d; do
    [ -n "$d" ] && [ -e "$d/$1" ] && { echo "$d/$1"; return; }
  done <<<"$_NTPB_DIRS"
  p=$(ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n && /x86-64/ { print $NF; exit }')
  [ -n "$p" ] && echo "$p"
}

_NTPB_DIRS=$(_ntpb_candidates | awk 'NF && !seen[$0]++')
NTPBENCH_BUNDLE_MISSING=
_ntpb_libs=$(grep -v '^#' "$NTPBENCH_BUNDLE/cuda-libs.txt" 2>/dev/null)
[ -n "$_ntpb_libs" ] || _ntpb_libs="libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2"
for _ntpb_lib in $_ntpb_libs libcuda.so.1; do
  _ntpb_path=$(_ntpb_find "$_ntpb_lib")
  if [ -z "$_ntpb_path" ]; then
    NTPBENCH_BUNDLE_MISSING="$NTPBENCH_BUNDLE_MISSING $_ntpb_lib"
    [ "${NTPBENCH_BUNDLE_QUIET:-0}" = 1 ] || printf 'gpu-bundle: %-20s NOT FOUND\n' "$_ntpb_lib"
    continue
  fi
  _ntpb_dir=$(dirname "$_ntpb_path")
  # Folders the loader searches anyway (its cache) need no entry; the others go first.
  if ! ldconfig -p 2>/dev/null | grep -q " => $_ntpb_path\$"; then
    case ":${LD_LIBRARY_PATH:-}:" in
      *":$_ntpb_dir:"*) ;;
      *) LD_LIBRARY_PATH="$_ntpb_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
    esac
  fi
  [ "${NTPBENCH_BUNDLE_QUIET:-0}" = 1 ] || printf 'gpu-bundle: %-20s %s\n' "$_ntpb_lib" "$(readlink -f "$_ntpb_path")"
done
# The bundle carries Debian 12's libstdc++ and libgcc_s, which need that glibc (MANIFEST.txt:
# glibc_needed). On an older glibc, the machine's own copies are preloaded instead, when the rest
# of the bundle can run there (glibc_needed_without_libstdcxx) and they are found.
_ntpb_have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
_ntpb_need=$(sed -n 's/^glibc_needed: GLIBC_//p' "$NTPBENCH_BUNDLE/MANIFEST.txt" 2>/dev/null)
_ntpb_rest=$(sed -n 's/^glibc_needed_without_libstdcxx: GLIBC_//p' "$NTPBENCH_BUNDLE/MANIFEST.txt" 2>/dev/null)
_ntpb_older() { [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1)" = "$1" ]; }
if [ -n "$_ntpb_have" ] && [ -n "$_ntpb_need" ] && _ntpb_older "$_ntpb_have" "$_ntpb_need"; then
  if [ -n "$_ntpb_rest" ] && _ntpb_older "$_ntpb_have" "$_ntpb_rest"; then
    echo "gpu-bundle: this glibc is $_ntpb_have, the bundle needs $_ntpb_rest: it cannot run here" >&2
    NTPBENCH_BUNDLE_MISSING="$NTPBENCH_BUNDLE_MISSING glibc>=$_ntpb_rest"
  else
    for _ntpb_lib in libstdc++.so.6 libgcc_s.so.1; do
      _ntpb_path=$(ldconfig -p 2>/dev/null | awk -v n="$_ntpb_lib" '$1 == n && /x86-64/ { print $NF; exit }')
      [ -n "$_ntpb_path" ] && LD_PRELOAD="$_ntpb_path${LD_PRELOAD:+ $LD_PRELOAD}"
    done
    export LD_PRELOAD
    echo "gpu-bundle: this glibc is $_ntpb_have, the bundle's libstdc++ needs $_ntpb_need: preloading ${LD_PRELOAD:-nothing found}" >&2
  fi
fi
export LD_LIBRARY_PATH NTPBENCH_BUNDLE_MISSING
NTPBENCH_BUNDLE_MISSING=${NTPBENCH_BUNDLE_MISSING# }
unset _NTPB_DIRS _ntpb_libs _ntpb_lib _ntpb_path _ntpb_dir _ntpb_have _ntpb_need _ntpb_rest
unset -f _ntpb_candidates _ntpb_find _ntpb_older
