#!/usr/bin/env bash
# Reads one libFuzzer log (stdin or FILE) and exits 0 when its report is a fault of HDF5's own
# decoders, 1 otherwise. Debian 12's HDF5 1.10.8 reads past its own buffers on some damaged files
# (docs/checks.md), which no code of ours can prevent. Such a report is:
#   - AddressSanitizer's SEGV or buffer overflow on a READ (the loader hands HDF5 no buffer to
#     read from, only buffers to write into: a write fault may be a buffer of ours too small), and
#   - whose first frame outside the C library and ASan's own interceptors lies in libhdf5.
# Anything else (a write, a frame of ours first, an exception, a leak, a timeout) is ours to fix.
#   usage: fuzz/hdf5_fault.sh [LOG]
set -uo pipefail
awk '
  /ERROR: AddressSanitizer: (SEGV|heap-buffer-overflow|stack-buffer-overflow|global-buffer-overflow)/ { asan = 1 }
  asan && (/The signal is caused by a READ memory access/ || /^READ of size/) { read_fault = 1 }
  asan && !decided && /^ +#[0-9]+ 0x/ {
    if ($0 ~ /__interceptor_|__asan_|\/sysdeps\/|libc\.so/) next
    decided = 1
    in_hdf5 = ($0 ~ /libhdf5/)
  }
  END { exit (asan && read_fault && in_hdf5) ? 0 : 1 }
' "${1:-/dev/stdin}"
