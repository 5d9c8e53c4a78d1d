#pragma once
// The host this rank runs on: how many BLAS/OpenMP threads it gets, and the SGEMM rate used as
// the peak for MFU when none is given.

namespace ntp {

// Sets BLAS and OpenMP threads for this rank (0 = cores on the node / ranks on the node). Returns the count.
int configure_threads(int requested);
// Single-rank sgemm rate (GFLOP/s) measured now, for MFU when no peak is given.
double measure_sgemm_gflops();

}  // namespace ntp
