#include "recorder.hpp"

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <stdexcept>

#include <cblas.h>

#include "blas_core.hpp"
#include "comm.hpp"

#ifndef NTPBENCH_GIT_REVISION
#define NTPBENCH_GIT_REVISION "unknown"
#endif
#ifndef NTPBENCH_VERSION
#define NTPBENCH_VERSION "0.0.0"
#endif

namespace ntp {

namespace {
constexpr hsize_t kChunkRows = 64;

// Rows are only appended: a dataset's chunk cache holds the chunk being filled and nothing else.
// (HDF5's default keeps up to 1 MiB of written chunks per dataset, which made the recorder's
// memory grow with the run until every cache was full.)
h5::Handle append_only_access(hid_t type, std::size_t row_elems) {
  h5::Handle dapl(H5Pcreate(H5P_DATASET_ACCESS), H5Pclose, "dapl");
  H5Pset_chunk_cache(dapl, H5D_CHUNK_CACHE_NSLOTS_DEFAULT, kChunkRows * row_elems * H5Tget_size(type), 1.0);
  return dapl;
}

h5::Handle make_extendible(hid_t loc, const std::string& name, hid_t type, std::vector<hsize_t> row_dims) {
  std::vector<hsize_t> dims = {0}, maxdims = {H5S_UNLIMITED}, chunk = {kChunkRows};
  std::size_t row_elems = 1;
  for (hsize_t d : row_dims) dims.push_back(d), maxdims.push_back(d), chunk.push_back(d), row_elems *= d;
  h5::Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), maxdims.data()), H5Sclose,
                   "dataspace " + name);
  h5::Handle plist(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "dcpl");
  H5Pset_chunk(plist, static_cast<int>(chunk.size()), chunk.data());
  const h5::Handle dapl = append_only_access(type, row_elems);
  return h5::Handle(H5Dcreate2(loc, name.c_str(), type, space, H5P_DEFAULT, plist, dapl), H5Dclose, "create " + name);
}

// Writes one row at index `row` of a dataset (over what is there).
void write_row(hid_t ds, hid_t mem_type, std::int64_t row, const std::vector<hsize_t>& row_dims, const void* data) {
  std::vector<hsize_t> start = {hsize_t(row)}, count = {1};
  for (hsize_t d : row_dims) start.push_back(0), count.push_back(d);
  h5::Handle fspace(H5Dget_space(ds), H5Sclose, "file space");
  H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
  h5::Handle mspace(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), H5Sclose, "mem space");
  if (H5Dwrite(ds, mem_type, mspace, fspace, H5P_DEFAULT, data) < 0) throw std::runtime_error("HDF5: row write");
}

// Writes one row at index `row` of an extendible dataset, growing it first.
void append_row(hid_t ds, hid_t mem_type, std::int64_t row, const std::vector<hsize_t>& row_dims, const void* data) {
  std::vector<hsize_t> size = {hsize_t(row + 1)};
  for (hsize_t d : row_dims) size.push_back(d);
  if (H5Dset_extent(ds, size.data()) < 0) throw std::runtime_error("HDF5: cannot extend dataset");
  write_row(ds, mem_type, row, row_dims, data);
}
}  // namespace

EventRow make_event(double time, std::int64_t step, const std::string& kind, int rank, int replica, double bytes,
                    double duration, const std::string& detail) {
  EventRow e{};
  e.time = time, e.step = step, e.rank = rank, e.replica = replica, e.bytes = bytes, e.duration = duration;
  e.host_time = time, e.host_duration = duration;  // RunRecord sets this host's where the clocks differ
  kind.copy(e.kind, sizeof e.kind - 1);
  detail.copy(e.detail, sizeof e.detail - 1);
  return e;
}

namespace {
// The HDF5 memory type of a column of C++ type T (a FixedText<N> is an N-byte string).
template <typename T>
h5::Handle column_type() {
  if constexpr (std::is_array_v<T>) {
    h5::Handle t(H5Tcopy(H5T_C_S1), H5Tclose, "string type");
    H5Tset_size(t, std::extent_v<T>);
    return t;
  } else {
    hid_t native = std::is_same_v<T, double>         ? H5T_NATIVE_DOUBLE
                   : std::is_same_v<T, std::int64_t> ? H5T_NATIVE_INT64
                   : std::is_same_v<T, std::int32_t> ? H5T_NATIVE_INT32
                                                     : H5T_NATIVE_INT8;
    static_assert(std::is_same_v<T, double> || std::is_same_v<T, std::int64_t> || std::is_same_v<T, std::int32_t> ||
                  std::is_same_v<T, std::int8_t>);
    return h5::Handle(H5Tcopy(native), H5Tclose, "column type");
  }
}

// The compound type of a row struct from its column list (H5Tinsert copies each member's type).
#define NTP_INSERT_COLUMN(type, name) H5Tinsert(t, #name, offsetof(Row, name), column_type<type>());
#define NTP_COMPOUND(RowType, COLUMNS)                                                            \
  [] {                                                                                            \
    using Row = RowType;                                                                          \
    h5::Handle t(H5Tcreate(H5T_COMPOUND, sizeof(Row)), H5Tclose, "compound type " #RowType);     \
    COLUMNS(NTP_INSERT_COLUMN)                                                                    \
    return t;                                                                                     \
  }()
}  // namespace

void Recorder::make_types() {
  row_type_ = NTP_COMPOUND(StepRow, NTP_STEP_COLUMNS);
  event_type_ = NTP_COMPOUND(EventRow, NTP_EVENT_COLUMNS);
  incarnation_type_ = NTP_COMPOUND(IncarnationRow, NTP_INCARNATION_COLUMNS);
}
#undef NTP_COMPOUND
#undef NTP_INSERT_COLUMN

Recorder::Recorder(const std::string& path, bool overwrite, int ranks, int replicas, int experts)
    : path_(path), ranks_(ranks), replicas_(replicas), experts_(experts) {
  namespace fs = std::filesystem;
  if (fs::exists(path) && !overwrite)
    throw std::runtime_error("results file '" + path + "' exists; choose another --out or pass --overwrite");
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
  file_ = std::make_unique<h5::File>(path, h5::Mode::Truncate);
  const hid_t f = file_->id();
  make_types();
  steps_ = make_extendible(f, "steps", row_type_, {});
  events_ = make_extendible(f, "events", event_type_, {});
  h5::ensure_groups(f, "replicas");
  tp_degrees_ = make_extendible(f, "replicas/tp_degree", H5T_STD_I32LE, {hsize_t(replicas)});
  batches_ = make_extendible(f, "replicas/batch", H5T_STD_I32LE, {hsize_t(replicas)});
  states_ = make_extendible(f, "replicas/state", H5T_STD_I8LE, {hsize_t(replicas)});
  h5::set_attr(f, "replicas/state", "values", std::string("0 healthy, 1 degraded, 2 down"));
  h5::ensure_groups(f, "ranks");
  phases_ = make_extendible(f, "ranks/phase_times", H5T_IEEE_F64LE, {hsize_t(ranks), hsize_t(kPhaseCount)});
  std::string names;
  for (auto n : kPhaseNames) {
    if (!names.empty()) names += ',';
    names += n;
  }
  h5::set_attr(f, "ranks/phase_times", "phases", names);
  h5::set_attr(f, "ranks/phase_times", "units", std::string("seconds"));
  incarnations_ = make_extendible(f, "ranks/incarnations", incarnation_type_, {});
  rss_ = make_extendible(f, "ranks/rss_bytes", H5T_STD_I64LE, {hsize_t(ranks)});
  h5::set_attr(f, "ranks/rss_bytes", "units", std::string("bytes (VmRSS after the step; -1: no process)"));
  fds_ = make_extendible(f, "ranks/open_fds", H5T_STD_I32LE, {hsize_t(ranks)});
  h5::set_attr(f, "ranks/open_fds", "units", std::string("descriptors (after the step; -1: no process)"));
  shares_ = make_extendible(f, "ranks/compute_share", H5T_IEEE_F32LE, {hsize_t(ranks)});
  h5::set_attr(f, "ranks/compute_share", "units",
               std::string("fraction of its replica's forward FLOPs per sequence (its TP share; 0: not training)"));
  probes_ = make_extendible(f, "ranks/probe_ratio", H5T_IEEE_F32LE, {hsize_t(ranks)});
  h5::set_attr(f, "ranks/probe_ratio", "units",
               std::string("an evicted straggler's probe time over the job's healthy one (NaN: not evicted)"));
  if (experts > 0) {
    h5::ensure_groups(f, "moe");
    expert_tokens_ = make_extendible(f, "moe/tokens_per_expert", H5T_STD_I64LE, {hsize_t(experts)});
    h5::set_attr(f, "moe/tokens_per_expert", "units",
                 std::string("assignments each expert kept in the step, all replicas, layers and passes (by "
                             "expert id, wherever it lived; -1: not gathered)"));
  }
  h5::set_attr(f, "/", "schema_version", std::string(kSchemaVersion));
  flush();
}

namespace {
h5::Handle open_dataset(hid_t f, const std::string& name) {
  h5::Handle probe(H5Dopen2(f, name.c_str(), H5P_DEFAULT), H5Dclose, "open " + name);
  h5::Handle type(H5Dget_type(probe), H5Tclose, "type of " + name);
  h5::Handle space(H5Dget_space(probe), H5Sclose, "space of " + name);
  std::vector<hsize_t> dims(static_cast<std::size_t>(H5Sget_simple_extent_ndims(space)));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  std::size_t row_elems = 1;
  for (std::size_t k = 1; k < dims.size(); ++k) row_elems *= dims[k];
  const h5::Handle dapl = append_only_access(type, row_elems);
  return h5::Handle(H5Dopen2(f, name.c_str(), dapl), H5Dclose, "open " + name);
}

// Every row of a dataset, read with `mem_type` into n * row_elems elements of T.
template <typename T>
std::vector<T> read_rows(hid_t ds, hid_t mem_type, std::size_t row_elems) {
  h5::Handle space(H5Dget_space(ds), H5Sclose, "file space");
  std::vector<hsize_t> dims(static_cast<std::size_t>(H5Sget_simple_extent_ndims(space)));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  std::vector<T> out(std::size_t(dims[0]) * row_elems);
  if (!out.empty() && H5Dread(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0)
    throw std::runtime_error("HDF5: cannot read rows back");
  return out;
}
}  // namespace

std::unique_ptr<Recorder> Recorder::reopen(const std::string& path, int ranks, int replicas, int experts) {
  std::unique_ptr<Recorder> r(new Recorder());
  r->path_ = path, r->ranks_ = ranks, r->replicas_ = replicas, r->experts_ = experts;
  // The previous writer was killed: what it flushed after its last row is on disk (writers take
  // no file lock: h5.cpp). Rows are appended after the ones read back here.
  r->file_ = std::make_unique<h5::File>(path, h5::Mode::ReadWrite);
  const hid_t f = r->file_->id();
  r->make_types();
  r->steps_ = open_dataset(f, "steps");
  r->events_ = open_dataset(f, "events");
  r->tp_degrees_ = open_dataset(f, "replicas/tp_degree");
  r->batches_ = open_dataset(f, "replicas/batch");
  r->states_ = open_dataset(f, "replicas/state");
  r->phases_ = open_dataset(f, "ranks/phase_times");
  r->incarnations_ = open_dataset(f, "ranks/incarnations");
  r->rss_ = open_dataset(f, "ranks/rss_bytes");
  r->fds_ = open_dataset(f, "ranks/open_fds");
  r->shares_ = open_dataset(f, "ranks/compute_share");
  r->probes_ = open_dataset(f, "ranks/probe_ratio");
  if (experts > 0) r->expert_tokens_ = open_dataset(f, "moe/tokens_per_expert");
  r->rows_ = read_rows<StepRow>(r->steps_, r->row_type_, 1);
  r->event_rows_ = read_rows<EventRow>(r->events_, r->event_type_, 1);
  r->incarnation_rows_ = read_rows<IncarnationRow>(r->incarnations_, r->incarnation_type_, 1);
  const auto tp = read_rows<int>(r->tp_degrees_, H5T_NATIVE_INT, replicas);
  const auto batch = read_rows<int>(r->batches_, H5T_NATIVE_INT, replicas);
  const auto state = read_rows<signed char>(r->states_, H5T_NATIVE_SCHAR, replicas);
  // Datasets are extended before their row is written: keep the rows every dataset holds.
  std::size_t n = std::min({r->rows_.size(), tp.size() / replicas, batch.size() / replicas, state.size() / replicas});
  r->rows_.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    ReplicaRow rr;
    rr.tp_degree.assign(tp.begin() + i * replicas, tp.begin() + (i + 1) * replicas);
    rr.batch.assign(batch.begin() + i * replicas, batch.begin() + (i + 1) * replicas);
    rr.state.assign(state.begin() + i * replicas, state.begin() + (i + 1) * replicas);
    r->replica_rows_.push_back(rr);
  }
  return r;
}

void Recorder::set_rank_stages(const std::vector<int>& stage) {
  const hsize_t n = stage.size();
  h5::Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose, "ranks/stage dataspace");
  h5::Handle ds(H5Dcreate2(file_->id(), "ranks/stage", H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                H5Dclose, "ranks/stage");
  if (H5Dwrite(ds, H5T_NATIVE_INT, H5S_ALL, H5S_ALL, H5P_DEFAULT, stage.data()) < 0)
    throw std::runtime_error(path_ + ": cannot write ranks/stage");
  h5::set_attr(file_->id(), "ranks/stage", "description",
               std::string("pipeline stage of each logical rank (rank = (replica x pp + stage) x tp + tp index)"));
}

void Recorder::set_attr(const std::string& name, const std::string& value) { h5::set_attr(file_->id(), "/", name, value); }
void Recorder::set_attr(const std::string& name, long long value) { h5::set_attr(file_->id(), "/", name, value); }
void Recorder::set_attr(const std::string& name, double value) { h5::set_attr(file_->id(), "/", name, value); }

void Recorder::append(const StepRow& row, const ReplicaRow& rep,
                      const std::vector<std::array<double, kPhaseCount>>& phase_seconds,
                      const std::vector<RankUsage>& usage, const std::vector<float>& compute_share,
                      const std::vector<std::int64_t>& expert_tokens) {
  if (static_cast<int>(phase_seconds.size()) != ranks_ || static_cast<int>(rep.tp_degree.size()) != replicas_ ||
      static_cast<int>(usage.size()) != ranks_ || static_cast<int>(compute_share.size()) != ranks_ ||
      !(expert_tokens.empty() || static_cast<int>(expert_tokens.size()) == experts_))
    throw std::logic_error("recorder: row shape changed");
  const auto n = static_cast<std::int64_t>(rows_.size());
  append_row(steps_, row_type_, n, {}, &row);
  append_row(tp_degrees_, H5T_NATIVE_INT, n, {hsize_t(replicas_)}, rep.tp_degree.data());
  append_row(batches_, H5T_NATIVE_INT, n, {hsize_t(replicas_)}, rep.batch.data());
  append_row(states_, H5T_NATIVE_SCHAR, n, {hsize_t(replicas_)}, rep.state.data());
  append_row(phases_, H5T_NATIVE_DOUBLE, n, {hsize_t(ranks_), hsize_t(kPhaseCount)}, phase_seconds.data());
  std::vector<std::int64_t> rss(usage.size());
  std::vector<std::int32_t> fds(usage.size());
  for (std::size_t k = 0; k < usage.size(); ++k) rss[k] = usage[k].rss_bytes, fds[k] = usage[k].open_fds;
  append_row(rss_, H5T_NATIVE_INT64, n, {hsize_t(ranks_)}, rss.data());
  append_row(fds_, H5T_NATIVE_INT32, n, {hsize_t(ranks_)}, fds.data());
  append_row(shares_, H5T_NATIVE_FLOAT, n, {hsize_t(ranks_)}, compute_share.data());
  std::vector<float> probes(usage.size());
  for (std::size_t k = 0; k < usage.size(); ++k) probes[k] = usage[k].probe_ratio;
  append_row(probes_, H5T_NATIVE_FLOAT, n, {hsize_t(ranks_)}, probes.data());
  if (experts_ > 0) {
    const std::vector<std::int64_t> unknown(std::size_t(experts_), -1);
    append_row(expert_tokens_, H5T_NATIVE_INT64, n, {hsize_t(experts_)},
               (expert_tokens.empty() ? unknown : expert_tokens).data());
  }
  rows_.push_back(row);
  replica_rows_.push_back(rep);
  flush();
}

void Recorder::incarnation_start(int rank, long long pid, const std::string& host, double t) {
  // A process already holding the rank is recorded once (a handover cut short records its new
  // processes again after the repair, where the failure may have come first).
  for (std::size_t i = incarnation_rows_.size(); i-- > 0;)
    if (incarnation_rows_[i].rank == rank) {
      if (incarnation_rows_[i].pid == pid && std::isnan(incarnation_rows_[i].t_end)) return;
      break;
    }
  IncarnationRow row{};
  row.rank = rank, row.pid = pid, row.t_start = t, row.t_end = std::nan("");
  host.copy(row.host, sizeof row.host - 1);
  append_row(incarnations_, incarnation_type_, static_cast<std::int64_t>(incarnation_rows_.size()), {}, &row);
  incarnation_rows_.push_back(row);
  flush();
}

void Recorder::incarnation_end(int rank, double t) {
  for (std::size_t i = incarnation_rows_.size(); i-- > 0;) {
    auto& row = incarnation_rows_[i];
    if (row.rank != rank || !std::isnan(row.t_end)) continue;
    row.t_end = t;
    write_row(incarnations_, incarnation_type_, static_cast<std::int64_t>(i), {}, &row);
    flush();
    return;
  }
}

void Recorder::event(const EventRow& e) {
  append_row(events_, event_type_, static_cast<std::int64_t>(event_rows_.size()), {}, &e);
  event_rows_.push_back(e);
  flush();
}

Recorder::RolledBack Recorder::roll_back_after(std::int64_t optimizer_step) {
  RolledBack out;
  for (std::size_t i = 0; i < rows_.size(); ++i) {
    auto& r = rows_[i];
    if (r.tokens_committed == 0 || r.optimizer_step <= optimizer_step) continue;
    r.tokens_committed = 0;
    ++out.rows;
    out.seconds += r.t_end - r.t_start, out.host_seconds += r.host_t_end - r.host_t_start;
    write_row(steps_, row_type_, static_cast<std::int64_t>(i), {}, &r);  // the file keeps one row per executed step
  }
  flush();
  return out;
}

std::pair<double, double> Recorder::last_moment() const {
  std::pair<double, double> last{0, 0};
  if (!rows_.empty()) last = {rows_.back().host_t_end, rows_.back().t_end};
  for (const EventRow& e : event_rows_)
    if (e.host_time + e.host_duration > last.first) last = {e.host_time + e.host_duration, e.time + e.duration};
  return last;
}

void Recorder::write_summary(double wall_seconds, double host_wall_seconds, int ranks, double peak_gflops, bool paced) {
  double tokens = 0, committed = 0, step_s = 0, productive = 0, recovery = 0, idle = 0, flops = 0;
  int overruns = 0, training_steps = 0;
  std::vector<double> healthy;
  for (std::size_t i = 0; i < rows_.size(); ++i) {
    const auto& r = rows_[i];
    const double dt = r.t_end - r.t_start;
    tokens += r.tokens, committed += r.tokens_committed, step_s += dt, recovery += r.recovery_seconds;
    idle += r.idle_seconds, flops += r.flops, overruns += r.paced_overrun;
    if (r.tokens_committed > 0) productive += dt, ++training_steps;
    const auto& st = replica_rows_[i].state;
    if (r.samples > 0 && dt > 0 && std::all_of(st.begin(), st.end(), [](signed char s) { return s == 0; }))
      healthy.push_back(r.tokens / dt);
  }
  double detect = 0, reconf = 0, heal = 0, recompute = 0, heal_bytes = 0, lost = 0, repair = 0, spawn = 0, spare = 0;
  int failures = 0, revivals = 0, spares_used = 0;
  for (const auto& e : event_rows_) {
    const std::string k = e.kind;
    if (k == "kill") ++failures;
    if (k == "revive") ++revivals;
    if (k == "detect") detect += e.duration;
    if (k == "reconfigure") reconf += e.duration;
    if (k == "heal" || k == "restore") heal += e.duration, heal_bytes += e.bytes;
    if (k == "recompute") recompute += e.duration;
    if (k == "lost") lost += e.duration;
    if (k == "repair") repair += e.duration;
    if (k == "spawn") spawn += e.duration;
    if (k == "spare" || k == "takeover") spare += e.duration, ++spares_used;
  }
  double median = 0;
  if (!healthy.empty()) {
    std::sort(healthy.begin(), healthy.end());
    const std::size_t m = healthy.size() / 2;
    median = healthy.size() % 2 ? healthy[m] : 0.5 * (healthy[m - 1] + healthy[m]);
  }
  const hid_t f = file_->id();
  h5::ensure_groups(f, "summary");
  auto put = [&](const char* k, double v) { h5::set_attr(f, "summary", k, v); };
  put("steps", double(rows_.size()));
  put("training_steps", double(training_steps));
  put("tokens", tokens);
  put("tokens_committed", committed);
  put("wall_seconds", wall_seconds);
  put("host_wall_seconds", host_wall_seconds);
  // Which clock the times are on: the emulated machine's under paced timing (emulated_clock.hpp).
  h5::set_attr(f, "summary", "clock", std::string(paced ? "emulated" : "host"));
  put("step_seconds", step_s);
  put("productive_seconds", productive);
  put("recovery_seconds", recovery);
  put("idle_seconds", idle);
  put("throughput_tokens_per_s", step_s > 0 ? tokens / step_s : 0.0);
  put("goodput_tokens_per_s", wall_seconds > 0 ? committed / wall_seconds : 0.0);
  put("ettr", wall_seconds > 0 ? productive / wall_seconds : 0.0);
  put("healthy_throughput_tokens_per_s", median);
  put("goodput_ratio", median > 0 && wall_seconds > 0 ? committed / wall_seconds / median : 0.0);
  put("mfu", step_s > 0 && peak_gflops > 0 ? flops / (step_s * ranks * peak_gflops * 1e9) : 0.0);
  put("failures", double(failures));
  put("revivals", double(revivals));
  put("recovery_detect_seconds", detect);
  put("recovery_reconfigure_seconds", reconf);
  put("recovery_heal_seconds", heal);
  put("recovery_recompute_seconds", recompute);
  put("recovery_lost_seconds", lost);
  put("recovery_repair_seconds", repair);
  put("recovery_spawn_seconds", spawn);
  put("recovery_spare_seconds", spare);
  put("spares_used", double(spares_used));
  put("heal_bytes", heal_bytes);
  put("paced_overrun_steps", double(overruns));
  const PacedVerdict v = paced_verdict();
  put("paced_overrun_seconds", v.compute_seconds);
  put("paced_link_overrun_seconds", v.link_seconds);
  put("paced_overrun_share", v.compute_share);
  put("paced_link_overrun_share", v.link_share);
  h5::set_attr(f, "summary", "status", std::string(paced && v.overran() ? "overran" : "ok"));
  put("final_loss", rows_.empty() ? 0.0 : rows_.back().loss);
  flush();
}

double worst_rank_lateness(const std::vector<RankLateness>& ranks, bool peers_uneven) {
  double worst = 0;
  for (const RankLateness& r : ranks) worst = std::max(worst, r.compute_over + (peers_uneven ? 0 : r.link_late) + r.host);
  return worst;
}

PacedVerdict paced_verdict(const std::vector<StepRow>& rows) {
  PacedVerdict v;
  double link_even = 0, rank_seconds = 0, even_rank_seconds = 0;
  for (const auto& r : rows) {
    ++v.steps, v.steps_overran += r.paced_overrun != 0;
    const double rank_s = (r.host_t_end - r.host_t_start) * r.live_ranks;  // lateness is this host's
    v.compute_seconds += r.paced_overrun_seconds, v.link_seconds += r.paced_link_overrun_seconds;
    rank_seconds += rank_s;
    if (!r.paced_peers_uneven) link_even += r.paced_link_overrun_seconds, even_rank_seconds += rank_s;
  }
  v.compute_share = rank_seconds > 0 ? v.compute_seconds / rank_seconds : 0.0;
  v.link_share = even_rank_seconds > 0 ? link_even / even_rank_seconds : 0.0;
  return v;
}

PacedVerdict Recorder::paced_verdict() const { return ntp::paced_verdict(rows_); }

void Recorder::mark_stopped(const std::string& why) {
  h5::set_attr(file_->id(), "summary", "status", std::string("stopped"));
  h5::set_attr(file_->id(), "summary", "stop_reason", why);
  flush();
}

void Recorder::set_summary(const std::string& name, double value) {
  h5::ensure_groups(file_->id(), "summary");
  h5::set_attr(file_->id(), "summary", name, value);
  flush();
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

std::vector<std::vector<int>> read_replica_batches(hid_t file) {
  std::vector<std::vector<int>> rows;
  if (!h5::exists(file, "replicas/batch")) return rows;
  const auto shape = h5::shape_of(file, "replicas/batch");
  std::vector<int> flat(shape.at(0) * shape.at(1));
  h5::Handle ds(H5Dopen2(file, "replicas/batch", H5P_DEFAULT), H5Dclose, "open /replicas/batch");
  if (!flat.empty() && H5Dread(ds, H5T_NATIVE_INT, H5S_ALL, H5S_ALL, H5P_DEFAULT, flat.data()) < 0)
    throw std::runtime_error("HDF5: cannot read /replicas/batch");
  for (long i = 0; i < shape[0]; ++i)
    rows.emplace_back(flat.begin() + i * shape[1], flat.begin() + (i + 1) * shape[1]);
  return rows;
}

namespace {
std::vector<std::string>& command_line() {
  static std::vector<std::string> args;
  return args;
}
}  // namespace

void set_command_line(int argc, char** argv) { command_line().assign(argv, argv + argc); }

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
          {"blas_core_choice", blas_core_note()},
          {"OPENBLAS_CORETYPE", env("OPENBLAS_CORETYPE")},
          {"OPENBLAS_L2_SIZE", env("OPENBLAS_L2_SIZE")},
          {"argv", nlohmann::json(command_line()).dump()}};
}

}  // namespace ntp
