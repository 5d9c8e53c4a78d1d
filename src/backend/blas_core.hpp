#pragma once
// Which OpenBLAS kernels run, and why. OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its
// kernels once, when the library loads, from the CPU model it recognises; a CPU newer than the
// library (a 5th-generation Xeon under Debian 12's 0.3.21) is not recognised and gets the SSE3
// `Prescott` kernels: 3.6x slower GEMMs, silently. The library honours OPENBLAS_CORETYPE, but
// only at load time, so ntpbench checks before anything else: when the library's core is of an
// older instruction set than the CPU runs (AVX-512, AVX2 + FMA, AVX) and the user set no
// OPENBLAS_CORETYPE, the process sets it and executes itself again (same PID, same arguments and
// environment otherwise, before MPI starts), and the second start records why.
// NTPBENCH_BLAS_CORE=library keeps the library's own choice (to measure it).
#include <optional>
#include <string>

namespace ntp {

// The vector instruction sets the CPU (and the OS, which must save their registers) supports.
struct CpuVectorSupport {
  bool avx = false;
  bool avx2_fma = false;
  bool avx512 = false;  // F, BW, VL, DQ and CD: what OpenBLAS's SkylakeX kernels use
  static CpuVectorSupport of_this_cpu();
};

// The OpenBLAS core to ask for when `library_core` (openblas_get_corename()) uses an older
// instruction set than `cpu` supports: "SkylakeX" (AVX-512), "Haswell" (AVX2 + FMA) or
// "Sandybridge" (AVX). None when the library's core already matches, or when the name is not one
// this table knows (a newer library's: trusted).
std::optional<std::string> better_blas_core(const std::string& library_core, const CpuVectorSupport& cpu);

// Called first in main, before MPI_Init: re-executes this program with OPENBLAS_CORETYPE set when
// better_blas_core says so (once: the second start sees a marker). Returns only when no re-exec
// happened (or it failed, which the note then says).
void select_blas_kernels(char** argv);

// One line for the banner and the results file: the core running, and who chose it, e.g.
// "OpenBLAS 0.3.21 SkylakeX kernels, set by ntpbench (the library chose Prescott, SSE3, for a CPU
// with AVX-512)".
std::string blas_core_note();

}  // namespace ntp
