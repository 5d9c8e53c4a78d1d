// Which OpenBLAS core ntpbench asks for (src/backend/blas_core.hpp).
#include <gtest/gtest.h>

#include <cblas.h>

#include "blas_core.hpp"

namespace ntp {
namespace {

CpuVectorSupport cpu(bool avx, bool avx2, bool avx512) { return {avx, avx2, avx512}; }

TEST(BlasCore, AFallbackCoreOnAnAvx512CpuGetsSkylakeX) {
  // Debian 12's OpenBLAS 0.3.21 names a 5th-generation Xeon `Prescott`.
  EXPECT_EQ(better_blas_core("Prescott", cpu(true, true, true)), "SkylakeX");
  EXPECT_EQ(better_blas_core("Nehalem", cpu(true, true, true)), "SkylakeX");
  EXPECT_EQ(better_blas_core("Haswell", cpu(true, true, true)), "SkylakeX");
  EXPECT_EQ(better_blas_core("Sandybridge", cpu(true, true, true)), "SkylakeX");
}

TEST(BlasCore, EachCpuLevelGetsItsOwnCore) {
  EXPECT_EQ(better_blas_core("Prescott", cpu(true, true, false)), "Haswell");
  EXPECT_EQ(better_blas_core("Prescott", cpu(true, false, false)), "Sandybridge");
  EXPECT_EQ(better_blas_core("Sandybridge", cpu(true, true, false)), "Haswell");
}

TEST(BlasCore, ACoreAsGoodAsTheCpuIsKept) {
  EXPECT_EQ(better_blas_core("SkylakeX", cpu(true, true, true)), std::nullopt);
  EXPECT_EQ(better_blas_core("Cooperlake", cpu(true, true, true)), std::nullopt);
  EXPECT_EQ(better_blas_core("SapphireRapids", cpu(true, true, true)), std::nullopt);
  EXPECT_EQ(better_blas_core("Zen", cpu(true, true, false)), std::nullopt);
  EXPECT_EQ(better_blas_core("Haswell", cpu(true, true, false)), std::nullopt);
  // A CPU without AVX: nothing newer than the SSE cores to ask for.
  EXPECT_EQ(better_blas_core("Prescott", cpu(false, false, false)), std::nullopt);
  // A core better than the CPU (a user's OPENBLAS_CORETYPE): not ours to lower.
  EXPECT_EQ(better_blas_core("SkylakeX", cpu(true, true, false)), std::nullopt);
}

TEST(BlasCore, ANameNotInTheTableIsTrusted) {
  EXPECT_EQ(better_blas_core("GraniteRapids", cpu(true, true, true)), std::nullopt);
  EXPECT_EQ(better_blas_core("", cpu(true, true, true)), std::nullopt);
}

TEST(BlasCore, ThisProcessRunsACoreAtTheCpusLevelOrSaysWhy) {
  // This test binary does not re-execute itself, so here the library's own choice runs: the
  // note must name it, and say whose choice it is.
  const std::string note = blas_core_note();
  EXPECT_NE(note.find(openblas_get_corename()), std::string::npos) << note;
  EXPECT_TRUE(note.find("the library's choice") != std::string::npos ||
              note.find("set by the user") != std::string::npos)
      << note;
}

}  // namespace
}  // namespace ntp
