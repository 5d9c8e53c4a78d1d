#include "blas_core.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include <cblas.h>

namespace ntp {

namespace {
// Instruction-set levels, in order; each names the OpenBLAS core that targets it.
enum class Isa { Sse, Avx, Avx2, Avx512 };
const char* isa_name(Isa i) {
  switch (i) {
    case Isa::Sse: return "SSE3";
    case Isa::Avx: return "AVX";
    case Isa::Avx2: return "AVX2";
    case Isa::Avx512: return "AVX-512";
  }
  return "?";
}
const char* core_for(Isa i) {
  switch (i) {
    case Isa::Avx512: return "SkylakeX";
    case Isa::Avx2: return "Haswell";
    case Isa::Avx: return "Sandybridge";
    case Isa::Sse: return "Prescott";
  }
  return "Prescott";
}

// The x86-64 core names of OpenBLAS's DYNAMIC_ARCH (driver/others/dynamic.c), by the instruction
// set of their SGEMM kernels.
std::optional<Isa> isa_of_core(const std::string& core) {
  static const std::map<std::string, Isa> kCores = {
      {"SapphireRapids", Isa::Avx512}, {"Cooperlake", Isa::Avx512}, {"SkylakeX", Isa::Avx512},
      {"Haswell", Isa::Avx2},          {"Zen", Isa::Avx2},          {"Excavator", Isa::Avx2},
      {"Sandybridge", Isa::Avx},       {"Bulldozer", Isa::Avx},     {"Piledriver", Isa::Avx},
      {"Steamroller", Isa::Avx},       {"Prescott", Isa::Sse},      {"Core2", Isa::Sse},
      {"Penryn", Isa::Sse},            {"Dunnington", Isa::Sse},    {"Nehalem", Isa::Sse},
      {"Atom", Isa::Sse},              {"Opteron", Isa::Sse},       {"Opteron(SSE3)", Isa::Sse},
      {"Barcelona", Isa::Sse},         {"Bobcat", Isa::Sse},        {"Nano", Isa::Sse},
      {"Katmai", Isa::Sse},            {"Coppermine", Isa::Sse},    {"Northwood", Isa::Sse},
      {"Banias", Isa::Sse},            {"Athlon", Isa::Sse},        {"Generic", Isa::Sse}};
  const auto it = kCores.find(core);
  if (it == kCores.end()) return std::nullopt;
  return it->second;
}

Isa best_isa(const CpuVectorSupport& cpu) {
  return cpu.avx512 ? Isa::Avx512 : cpu.avx2_fma ? Isa::Avx2 : cpu.avx ? Isa::Avx : Isa::Sse;
}

// Set by select_blas_kernels for the second start: the library's own choice, which it no longer
// reports once OPENBLAS_CORETYPE is set.
constexpr const char* kMarker = "NTPBENCH_BLAS_LIBRARY_CORE";

// NTPBENCH_BLAS_CORE=library: the library's own choice, whatever it is (to measure it).
bool keep_library_core() {
  const char* v = std::getenv("NTPBENCH_BLAS_CORE");
  return v && std::string(v) == "library";
}

std::string library_version() {
  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...": the first two words.
  const std::string config = openblas_get_config();
  const auto first = config.find(' ');
  const auto second = first == std::string::npos ? first : config.find(' ', first + 1);
  return config.substr(0, second);
}
}  // namespace

CpuVectorSupport CpuVectorSupport::of_this_cpu() {
  CpuVectorSupport s;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // libgcc's answer includes the OS's: AVX and AVX-512 need their registers saved (XCR0).
  s.avx = __builtin_cpu_supports("avx");
  s.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  s.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512cd");
#endif
  return s;
}

std::optional<std::string> better_blas_core(const std::string& library_core, const CpuVectorSupport& cpu) {
  const auto have = isa_of_core(library_core);
  if (!have) return std::nullopt;
  const Isa want = best_isa(cpu);
  if (*have >= want) return std::nullopt;
  return std::string(core_for(want));
}

void select_blas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") || std::getenv(kMarker)) return;  // the user's choice, or done
  if (keep_library_core()) return;
  // Only a DYNAMIC_ARCH library chooses at load time; another has one core compiled in.
  if (!std::strstr(openblas_get_config(), "DYNAMIC_ARCH")) return;
  const std::string library_core = openblas_get_corename();
  const auto better = better_blas_core(library_core, CpuVectorSupport::of_this_cpu());
  if (!better) return;
  setenv("OPENBLAS_CORETYPE", better->c_str(), 1);
  setenv(kMarker, library_core.c_str(), 1);
  std::fflush(nullptr);
  execv("/proc/self/exe", argv);
  // Still here: the re-exec failed. Run on the library's choice and say so.
  std::fprintf(stderr, "ntpbench: warning: could not restart with OPENBLAS_CORETYPE=%s (%s); running on %s\n",
               better->c_str(), std::strerror(errno), library_core.c_str());
  unsetenv("OPENBLAS_CORETYPE");
  setenv(kMarker, ("failed:" + library_core).c_str(), 1);
}

std::string blas_core_note() {
  const std::string running = openblas_get_corename();
  const std::string head = library_version() + " " + running + " kernels";
  const char* marker = std::getenv(kMarker);
  const char* user = std::getenv("OPENBLAS_CORETYPE");
  const std::string cpu_isa = isa_name(best_isa(CpuVectorSupport::of_this_cpu()));
  if (marker && std::strncmp(marker, "failed:", 7) == 0)
    return head + ", the library's choice (ntpbench could not restart with a better core for a CPU with " +
           cpu_isa + ")";
  if (marker) {
    const auto was = isa_of_core(marker);
    std::string note = head + ", set by ntpbench (the library chose " + marker +
                       (was ? std::string(", ") + isa_name(*was) : std::string()) + ", for a CPU with " + cpu_isa +
                       ")";
    if (user && running != user) note += "; asked for " + std::string(user) + ", the library runs " + running;
    return note;
  }
  if (user) return head + ", OPENBLAS_CORETYPE=" + user + " set by the user";
  if (keep_library_core()) return head + ", the library's choice (kept by NTPBENCH_BLAS_CORE=library) for a CPU with " + cpu_isa;
  return head + ", the library's choice for a CPU with " + cpu_isa;
}

}  // namespace ntp
