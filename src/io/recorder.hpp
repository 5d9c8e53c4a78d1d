#pragma once
// The results file of a run (written by the recorder's rank: logical rank 0, or after its death
// the lowest live rank, which reopens the file and goes on). Rows are appended to extendible,
// chunked datasets and the file is flushed after every step, so a job killed mid-run leaves a
// file that opens and holds every completed step. See results/README.md for the schema.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "h5.hpp"
#include "phase_clock.hpp"

namespace ntp {

inline constexpr const char* kSchemaVersion = "2";

// The columns of the compound datasets, declared once. Each list X(C++ type, name) makes its row
// struct here and its HDF5 compound type in recorder.cpp, in this order; results/README.md's
// tables are checked against the files (tests/integration/test_schema_doc.py), so a column added
// here without its documentation fails there.
template <std::size_t N>
using FixedText = char[N];  // a fixed-length, NUL-padded string column

// Paced timing: a step overran when its worst rank's real time past emulated time (compute over,
// transfers late where no peer was expected late, the host's own time outside the paced calls) is
// above this share of the step's time; a run is `overran` when more than this share of its steps
// did, and more than one (a single step that a moment of the machine's own load delayed does not
// change a run's figures; a rank late in every step, or again and again, does).
inline constexpr double kPacedOverrunLimit = 0.01;

// Paced timing's verdict from the rows: the steps that overran, and, to say by how much, real time
// past emulated time summed over the ranks as a share of the ranks' step time: compute in every
// step, transfers in the steps where no peer was expected to be late.
struct PacedVerdict {
  int steps = 0, steps_overran = 0;
  double compute_seconds = 0, link_seconds = 0, compute_share = 0, link_share = 0;
  bool overran() const { return steps_overran > std::max(1.0, kPacedOverrunLimit * steps); }
};

// One rank's real time past emulated time in a step, as it reports it.
struct RankLateness {
  double compute_over = 0;  // compute phases past their emulated end
  double link_late = 0;     // transfers that ended after their emulated end
  double host = 0;          // outside the paced calls
};
// The step's worst rank: its seconds past emulated time (late transfers count only where no peer
// was expected late: then they are waits, as on the machine). One late rank delays its replica, so
// the worst, not an average.
double worst_rank_lateness(const std::vector<RankLateness>& ranks, bool peers_uneven);
// The run's verdict from its rows (Recorder::paced_verdict: its own).
struct StepRow;
PacedVerdict paced_verdict(const std::vector<StepRow>& rows);
// Lateness below this is a crowded core's scheduling (a rank that wakes a timeslice late), which
// this host cannot judge finer: measured 4-5 ms on 8 ranks over 2 cores in steps of 72 ms. It is
// excused only in a step it leaves mostly emulated (at most this share of it): a step of 2 ms that
// is 2 ms of the host's own time is the host's figure, not the machine's, however short.
inline constexpr double kPacedJitterSeconds = 0.01;
inline constexpr double kPacedJitterShare = 0.1;
inline bool step_overran(double worst_rank_seconds, double step_seconds) {
  if (worst_rank_seconds <= kPacedOverrunLimit * step_seconds) return false;
  const bool a_timeslice = worst_rank_seconds <= kPacedJitterSeconds && worst_rank_seconds <= kPacedJitterShare * step_seconds;
  return !a_timeslice;
}

// /steps: one row per executed step.
#define NTP_STEP_COLUMNS(X)                                                                       \
  X(std::int64_t, step)             /* schedule step (slot), from 1 */                            \
  X(std::int64_t, optimizer_step)   /* AdamW steps taken after this row (back after a restore) */ \
  X(double, t_start)                /* seconds since the run started */                           \
  X(double, t_end)                  /* paced: the emulated clock (emulated_clock.hpp) */          \
  X(double, host_t_start)           /* this host's run clock (the same as t_* under wall timing) */ \
  X(double, host_t_end)                                                                           \
  X(std::int64_t, sample_begin)     /* global cursor at the start of the step */                  \
  X(std::int64_t, samples)          /* sequences processed this step (all replicas) */            \
  X(std::int64_t, tokens)           /* tokens processed */                                        \
  X(std::int64_t, tokens_committed) /* tokens whose update was applied and never rolled back */   \
  X(double, loss)                   /* mean token loss over the step's global batch */            \
  X(double, grad_norm)              /* before clipping */                                         \
  X(double, lr)                                                                                   \
  X(double, flops)                  /* analytic model FLOPs of the step */                        \
  X(double, mfu)                    /* flops / (step time * ranks * peak per rank) */             \
  X(std::int32_t, live_ranks)                                                                     \
  X(std::int32_t, active_replicas)                                                                \
  X(double, recovery_seconds)       /* detect + reconfigure + heal before this step */            \
  X(double, idle_seconds)           /* waiting with every replica down, before this step */       \
  X(std::int8_t, paced_overrun)     /* paced: the step overran (its worst rank past the limit) */ \
  X(std::int32_t, paced_link_overruns) /* paced transfers, all ranks, that ended after their emulated end */ \
  X(double, paced_overrun_seconds)  /* paced: seconds compute ran over emulated time, summed over ranks */ \
  X(double, paced_link_overrun_seconds) /* paced: seconds transfers ended late, summed over ranks */      \
  X(std::int8_t, paced_peers_uneven) /* a rank slowed or a replica damaged: waits on late peers expected */ \
  X(double, paced_host_seconds)     /* paced: real seconds outside the paced calls, summed over ranks */ \
  X(double, paced_worst_rank_seconds) /* paced: the worst rank's real time past emulated time in the step */ \
  X(std::int64_t, control_calls)    /* calls on the run's group, all ranks, since their last report (-1: none) */ \
  X(double, control_bytes)          /* their payload bytes sent and received, all ranks (NaN: none) */ \
  X(std::int64_t, moe_kept)         /* MoE: expert assignments kept, all replicas and layers (0: dense) */ \
  X(std::int64_t, moe_dropped)      /* MoE: assignments dropped by --capacity-factor */ \
  X(double, moe_load_max)           /* MoE: busiest expert of a layer's pass / an even share (NaN: dense) */

// /events: kills, revivals and what they caused.
#define NTP_EVENT_COLUMNS(X) \
  X(double, time)            \
  X(std::int64_t, step)      \
  X(FixedText<16>, kind)     \
  X(std::int32_t, rank)      \
  X(std::int32_t, replica)   \
  X(double, bytes)           \
  X(double, duration)        \
  X(FixedText<96>, detail)   \
  X(double, host_time)       \
  X(double, host_duration)

// /ranks/incarnations: one process that held a logical rank; a rank killed and revived for real
// has two, the second a new process.
#define NTP_INCARNATION_COLUMNS(X) \
  X(std::int32_t, rank)            \
  X(std::int64_t, pid)             \
  X(FixedText<64>, host)           \
  X(double, t_start)               /* seconds since the run started */ \
  X(double, t_end)                 /* NaN while it lives */

#define NTP_ROW_MEMBER(type, name) type name;
struct StepRow {
  NTP_STEP_COLUMNS(NTP_ROW_MEMBER)
};
struct EventRow {
  NTP_EVENT_COLUMNS(NTP_ROW_MEMBER)
};
struct IncarnationRow {
  NTP_INCARNATION_COLUMNS(NTP_ROW_MEMBER)
};
#undef NTP_ROW_MEMBER

EventRow make_event(double time, std::int64_t step, const std::string& kind, int rank, int replica, double bytes,
                    double duration, const std::string& detail);

// One rank's process after a step (/ranks/rss_bytes, /ranks/open_fds): -1 where no live process
// of the rank reported (dead, or a row written without its report).
// A rank's process after the step, and an evicted straggler's probe.
struct RankUsage {
  std::int64_t rss_bytes = -1;
  std::int32_t open_fds = -1;
  float probe_ratio = std::numeric_limits<float>::quiet_NaN();  // evicted: its probe over the healthy one
};

struct ReplicaRow {
  std::vector<int> tp_degree, batch;
  std::vector<signed char> state;
};

class Recorder {
 public:
  // Refuses to replace an existing file unless overwrite. experts: a mixture of experts' count
  // (0: a dense model, and no /moe group).
  Recorder(const std::string& path, bool overwrite, int ranks, int replicas, int experts);
  // Takes over a file whose writer died (the recorder moves to the next live rank): reads back
  // the rows, events and incarnations it holds and appends after them.
  static std::unique_ptr<Recorder> reopen(const std::string& path, int ranks, int replicas, int experts);
  const std::string& path() const { return path_; }

  void set_attr(const std::string& name, const std::string& value);
  void set_attr(const std::string& name, long long value);
  void set_attr(const std::string& name, double value);
  // /ranks/stage: the pipeline stage of each logical rank (fixed for the run).
  void set_rank_stages(const std::vector<int>& stage);
  // Appends a step: its row, each replica's degree/batch/state, every rank's phase times, process
  // usage and share of its replica's compute (/ranks/compute_share), and a mixture of experts'
  // assignments kept per expert (/moe/tokens_per_expert; empty: not gathered, written as -1);
  // flushes.
  void append(const StepRow& row, const ReplicaRow& replicas,
              const std::vector<std::array<double, kPhaseCount>>& phase_seconds, const std::vector<RankUsage>& usage,
              const std::vector<float>& compute_share, const std::vector<std::int64_t>& expert_tokens);
  void event(const EventRow& e);
  // A process takes logical rank `rank` at time t; the rank's current process ends at time t.
  void incarnation_start(int rank, long long pid, const std::string& host, double t);
  void incarnation_end(int rank, double t);
  // A restore to optimizer step s: committed rows past s lose their commit. Returns the rows and
  // their step time (the work to be recomputed), on the rows' clock and on this host's.
  struct RolledBack {
    int rows = 0;
    double seconds = 0, host_seconds = 0;
  };
  RolledBack roll_back_after(std::int64_t optimizer_step);
  // The file's last moment on this host's run clock and on the rows' clock (a recorder that takes
  // the file over resumes the emulated clock there); (0, 0) for an empty file.
  std::pair<double, double> last_moment() const;
  // Writes /summary from the rows and events (wall_seconds: the whole run on the rows' clock,
  // host_wall_seconds on this host's; paced: --timing paced, whose verdict `status` is then overran
  // when real time exceeded emulated time in more than kPacedOverrunLimit of the ranks' step time).
  void write_summary(double wall_seconds, double host_wall_seconds, int ranks, double peak_gflops, bool paced);
  PacedVerdict paced_verdict() const;
  void set_summary(const std::string& name, double value);
  // A run that ended before its last step (exit 3 or 4): /summary status `stopped`, and why.
  void mark_stopped(const std::string& why);
  const std::vector<StepRow>& rows() const { return rows_; }
  void flush();

 private:
  Recorder() = default;
  void make_types();
  std::string path_;
  std::unique_ptr<h5::File> file_;
  h5::Handle steps_, tp_degrees_, batches_, states_, phases_, events_, row_type_, event_type_, incarnations_,
      incarnation_type_, rss_, fds_, shares_, probes_, expert_tokens_;
  int ranks_ = 0, replicas_ = 0, experts_ = 0;
  std::vector<StepRow> rows_;
  std::vector<ReplicaRow> replica_rows_;
  std::vector<EventRow> event_rows_;
  std::vector<IncarnationRow> incarnation_rows_;
};

// One integer column of a results file's /steps table (e.g. "samples").
std::vector<std::int64_t> read_steps_column(hid_t file, const std::string& field);
// /replicas/batch, row by row: each replica's sequences at each step (empty for a file without it).
std::vector<std::vector<int>> read_replica_batches(hid_t file);

// Root attributes every run records: versions, hosts, BLAS core, environment, and the command line
// given to set_command_line (main does, before anything else).
nlohmann::json environment_record();
void set_command_line(int argc, char** argv);

}  // namespace ntp
