#pragma once
// The results file of a run (rank 0 writes it). Rows are appended to extendible, chunked
// datasets and the file is flushed after every step, so a job killed mid-run leaves a file that
// opens and holds every completed step. See results/README.md for the schema.
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "h5.hpp"
#include "phase_clock.hpp"

namespace ntp {

inline constexpr const char* kSchemaVersion = "0.1";

struct StepRow {
  std::int64_t step;
  double t_start, t_end;          // seconds since the run started
  std::int64_t sample_begin;      // global cursor at the start of the step
  std::int64_t samples;           // sequences processed this step (all replicas)
  std::int64_t tokens;            // tokens processed
  std::int64_t tokens_committed;  // tokens whose update was applied and never rolled back
  double loss;                    // mean token loss over the step's global batch
  double grad_norm;               // before clipping
  double lr;
  double flops;                   // analytic model FLOPs of the step
  double mfu;                     // flops / (step time * ranks * peak per rank)
};

class Recorder {
 public:
  // Refuses to replace an existing file unless overwrite.
  Recorder(const std::string& path, bool overwrite, int ranks);
  const std::string& path() const { return path_; }

  void set_attr(const std::string& name, const std::string& value);
  void set_attr(const std::string& name, long long value);
  void set_attr(const std::string& name, double value);
  // Appends a step: its row, the TP degree of every replica, and every rank's phase times.
  void append(const StepRow& row, const std::vector<int>& replica_tp,
              const std::vector<std::array<double, kPhaseCount>>& phase_seconds);
  void set_summary(const std::string& name, double value);
  void flush();

 private:
  std::string path_;
  std::unique_ptr<h5::File> file_;
  h5::Handle steps_, tp_degrees_, phases_, row_type_;
  int ranks_;
  std::int64_t rows_ = 0;
  int replicas_ = -1;
};

// One integer column of a results file's /steps table (e.g. "samples").
std::vector<std::int64_t> read_steps_column(hid_t file, const std::string& field);

// Root attributes every run records: versions, hosts, BLAS core, environment.
nlohmann::json environment_record();

}  // namespace ntp
