#include "recorder.hpp"

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <stdexcept>

#include <cblas.h>

#include "comm.hpp"

#ifndef NTPBENCH_GIT_REVISION
#define NTPBENCH_GIT_REVISION "unknown"
#endif
#ifndef NTPBENCH_VERSION
#define NTPBENCH_VERSION "0.0.0"
#endif

namespace ntp {

namespace {
h5::Handle make_extendible(hid_t loc, const std::string& name, hid_t type, std::vector<hsize_t> row_dims) {
  std::vector<hsize_t> dims = {0}, maxdims = {H5S_UNLIMITED}, chunk = {64};
  for (hsize_t d : row_dims) dims.push_back(d), maxdims.push_back(d), chunk.push_back(d);
  h5::Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), maxdims.data()), H5Sclose,
                   "dataspace " + name);
  h5::Handle plist(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "dcpl");
  H5Pset_chunk(plist, static_cast<int>(chunk.size()), chunk.data());
  return h5::Handle(H5Dcreate2(loc, name.c_str(), type, space, H5P_DEFAULT, plist, H5P_DEFAULT), H5Dclose,
                    "create " + name);
}

// Writes one row at index `row` of an extendible dataset (growing it first).
void append_row(hid_t ds, hid_t mem_type, std::int64_t row, const std::vector<hsize_t>& row_dims, const void* data) {
  std::vector<hsize_t> size = {hsize_t(row + 1)}, start = {hsize_t(row)}, count = {1};
  for (hsize_t d : row_dims) size.push_back(d), start.push_back(0), count.push_back(d);
  if (H5Dset_extent(ds, size.data()) < 0) throw std::runtime_error("HDF5: cannot extend dataset");
  h5::Handle fspace(H5Dget_space(ds), H5Sclose, "file space");
  H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
  h5::Handle mspace(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), H5Sclose, "mem space");
  if (H5Dwrite(ds, mem_type, mspace, fspace, H5P_DEFAULT, data) < 0) throw std::runtime_error("HDF5: row write");
}
}  // namespace

Recorder::Recorder(const std::string& path, bool overwrite, int ranks) : path_(path), ranks_(ranks) {
  namespace fs = std::filesystem;
  if (fs::exists(path) && !overwrite)
    throw std::runtime_error("results file '" + path + "' exists; choose another --out or pass --overwrite");
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
  file_ = std::make_unique<h5::File>(path, h5::Mode::Truncate);
  const hid_t f = file_->id();

  row_type_ = h5::Handle(H5Tcreate(H5T_COMPOUND, sizeof(StepRow)), H5Tclose, "compound type");
#define FIELD(name, type) H5Tinsert(row_type_, #name, HOFFSET(StepRow, name), type)
  FIELD(step, H5T_NATIVE_INT64);
  FIELD(t_start, H5T_NATIVE_DOUBLE);
  FIELD(t_end, H5T_NATIVE_DOUBLE);
  FIELD(sample_begin, H5T_NATIVE_INT64);
  FIELD(samples, H5T_NATIVE_INT64);
  FIELD(tokens, H5T_NATIVE_INT64);
  FIELD(tokens_committed, H5T_NATIVE_INT64);
  FIELD(loss, H5T_NATIVE_DOUBLE);
  FIELD(grad_norm, H5T_NATIVE_DOUBLE);
  FIELD(lr, H5T_NATIVE_DOUBLE);
  FIELD(flops, H5T_NATIVE_DOUBLE);
  FIELD(mfu, H5T_NATIVE_DOUBLE);
#undef FIELD
  steps_ = make_extendible(f, "steps", row_type_, {});
  h5::ensure_groups(f, "ranks");
  phases_ = make_extendible(f, "ranks/phase_times", H5T_IEEE_F64LE, {hsize_t(ranks), hsize_t(kPhaseCount)});
  std::string names;
  for (auto n : kPhaseNames) names += (names.empty() ? "" : ",") + std::string(n);
  h5::set_attr(f, "ranks/phase_times", "phases", names);
  h5::set_attr(f, "ranks/phase_times", "units", std::string("seconds"));
  h5::set_attr(f, "/", "schema_version", std::string(kSchemaVersion));
}

void Recorder::set_attr(const std::string& name, const std::string& value) { h5::set_attr(file_->id(), "/", name, value); }
void Recorder::set_attr(const std::string& name, long long value) { h5::set_attr(file_->id(), "/", name, value); }
void Recorder::set_attr(const std::string& name, double value) { h5::set_attr(file_->id(), "/", name, value); }

void Recorder::append(const StepRow& row, const std::vector<int>& replica_tp,
                      const std::vector<std::array<double, kPhaseCount>>& phase_seconds) {
  if (replicas_ < 0) {
    replicas_ = static_cast<int>(replica_tp.size());
    h5::ensure_groups(file_->id(), "replicas");
    tp_degrees_ = make_extendible(file_->id(), "replicas/tp_degree", H5T_STD_I32LE, {hsize_t(replicas_)});
  }
  if (static_cast<int>(phase_seconds.size()) != ranks_ || static_cast<int>(replica_tp.size()) != replicas_)
    throw std::logic_error("recorder: row shape changed");
  append_row(steps_, row_type_, rows_, {}, &row);
  append_row(tp_degrees_, H5T_NATIVE_INT, rows_, {hsize_t(replicas_)}, replica_tp.data());
  append_row(phases_, H5T_NATIVE_DOUBLE, rows_, {hsize_t(ranks_), hsize_t(kPhaseCount)}, phase_seconds.data());
  ++rows_;
  flush();
}

void Recorder::set_summary(const std::string& name, double value) {
  h5::ensure_groups(file_->id(), "summary");
  h5::set_attr(file_->id(), "summary", name, value);
}

void Recorder::flush() { file_->flush(); }

std::vector<std::int64_t> read_steps_column(hid_t file, const std::string& field) {
  const auto shape = h5::shape_of(file, "steps");
  std::vector<std::int64_t> out(shape.at(0));
  h5::Handle ds(H5Dopen2(file, "steps", H5P_DEFAULT), H5Dclose, "open /steps");
  // A compound memory type with the one field: HDF5 matches members by name.
  h5::Handle t(H5Tcreate(H5T_COMPOUND, sizeof(std::int64_t)), H5Tclose, "compound type");
  H5Tinsert(t, field.c_str(), 0, H5T_NATIVE_INT64);
  if (!out.empty() && H5Dread(ds, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0)
    throw std::runtime_error("HDF5: /steps has no field '" + field + "'");
  return out;
}

nlohmann::json environment_record() {
  auto env = [](const char* k) {
    const char* v = std::getenv(k);
    return v ? std::string(v) : std::string();
  };
  char when[64];
  std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return {{"ntpbench_version", NTPBENCH_VERSION},
          {"git_revision", NTPBENCH_GIT_REVISION},
          {"start_time", when},
          {"mpi_library_version", mpi_library_version()},
          {"blas_core", std::string(openblas_get_corename())},
          {"blas_config", std::string(openblas_get_config())},
          {"OPENBLAS_CORETYPE", env("OPENBLAS_CORETYPE")},
          {"OPENBLAS_L2_SIZE", env("OPENBLAS_L2_SIZE")}};
}

}  // namespace ntp
