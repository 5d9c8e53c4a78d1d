/* An OpenBLAS that does not know this CPU, as Debian 12's 0.3.21 does not know a 5th-generation
 * Xeon: while no OPENBLAS_CORETYPE is set, openblas_get_corename() says "Prescott" (the real
 * library's kernels are untouched; only the name ntpbench decides on is the misread one). Loaded
 * with LD_PRELOAD by test_blas_core.py. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>

char* openblas_get_corename(void) {
  if (!getenv("OPENBLAS_CORETYPE")) return "Prescott";
  char* (*real)(void) = (char* (*)(void))dlsym(RTLD_NEXT, "openblas_get_corename");
  return real();
}
