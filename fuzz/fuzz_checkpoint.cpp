// The checkpoint loader (src/io/checkpoint.cpp) on arbitrary bytes, written to a file and loaded
// into a one-layer model with its AdamW state: it loads, or throws CheckpointError (wrong model,
// non-finite tensor) or the HDF5 layer's std::runtime_error ("HDF5: ...": not HDF5, damaged, a
// tensor missing, misshapen or not floats), the two errors ntpbench reports; anything else (a
// crash, another exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string_view>

#include "checkpoint.hpp"
#include "make_model.hpp"
#include "model.hpp"
#include "self_comm.hpp"
#include "temp_file.hpp"

namespace {
// The seed checkpoints' model (fuzz/corpus/checkpoint, docs/checks.md): V 16, context 4, one
// layer, 2 heads, d 8; small, so that a mutation lands in the metadata as often as in the floats.
struct Job {
  ntp::ModelConfig m{16, 4, 1, 2, 8};
  std::unique_ptr<ntp::Backend> be = ntp::make_cpu_backend();
  ntp::fuzz::SelfComm self;
  std::unique_ptr<ntp::Model> model = ntp::make_model(*be, m, ntp::TpLayout::even(m, 1), 0, self, 1, 4);
  ntp::AdamW opt{*be, model->layout(), ntp::OptimizerConfig{}};
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Job job;  // built once: a fresh model per input would be most of the time spent
  const std::string path = ntp::fuzz::write_input(data, size, ".h5");
  try {
    ntp::load_checkpoint(path, *job.model, &job.opt);
  } catch (const ntp::CheckpointError&) {
  } catch (const std::runtime_error& e) {
    if (std::string_view(e.what()).substr(0, 6) != "HDF5: ") throw;  // not the HDF5 layer's: a bug
  }
  return 0;
}
