#pragma once
// The loaders under test read paths: each input is written to a file of this process's own
// (libFuzzer may run jobs side by side) and read back from there.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <unistd.h>

namespace ntp::fuzz {

inline std::string write_input(const std::uint8_t* data, std::size_t size, const char* suffix) {
  const char* dir = std::getenv("TMPDIR");
  const std::string path = std::string(dir && *dir ? dir : "/tmp") + "/ntpbench-fuzz-" + std::to_string(getpid()) + suffix;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0)
    throw std::runtime_error("cannot write the fuzz input to " + path);
  return path;
}

}  // namespace ntp::fuzz
