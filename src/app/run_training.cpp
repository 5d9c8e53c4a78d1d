// The training driver: validates the job, runs the schedule's steps (killing and reviving ranks
// as it says), prints a line per step and every recovery on rank 0, records every step to HDF5
// and writes checkpoints. run_training() reads top to bottom: start-up, the step loop, the end.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "fault.hpp"
#include "machine.hpp"
#include "recorder.hpp"
#include "run.hpp"
#include "schedule.hpp"
#include "trainer.hpp"

namespace ntp {

namespace {

std::string default_out() {
  char buf[64];
  std::time_t now = std::time(nullptr);
  std::strftime(buf, sizeof buf, "results/ntpbench-%Y%m%d-%H%M%S.h5", std::localtime(&now));
  return buf;
}

std::string checkpoint_path(const Options& o, int step) {
  return (std::filesystem::path(checkpoint_dir_for(o)) / fmt::format("step_{:06d}.h5", step)).string();
}

// What every rank reports to rank 0 after a step (the metrics channel).
struct Report {
  std::array<double, kPhaseCount> phases{};
  double trained = 0, loss = 0, grad_norm = 0, overruns = 0;
};
constexpr int kReportSize = sizeof(Report) / sizeof(double);

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// The peak MFU is measured against, and where it came from.
struct Peak {
  double gflops = 0;
  std::string source;
};

Peak find_peak(const Options& o, Comm& world, int threads) {
  const bool root = world.rank() == 0;
  if (o.peak_gflops > 0) return {o.peak_gflops, "--peak-gflops"};
  if (o.pacing.enabled) return {o.pacing.device_gflops, "--device-gflops (paced timing)"};
  if (o.backend != "cpu") {
    if (root) fmt::print("note: --backend {} without --peak-gflops: MFU is not reported\n", o.backend);
    return {0, "unknown: pass --peak-gflops (the device's peak) for MFU"};
  }
  world.barrier();  // measure with every rank busy at once, as in the steps
  double peak = measure_sgemm_gflops();
  world.allreduce_max(&peak, 1);
  return {peak, fmt::format("cblas_sgemm 1024^3 measured at start-up, {} thread(s) per rank, fastest rank", threads)};
}

// On leaving a scope, every live rank waits for the others (the root's last writes happen inside
// it): a process that saw a failure then ends without MPI_Finalize (finish_mpi).
struct GroupBarrierOnExit {
  Comm& group;
  ~GroupBarrierOnExit() {
    try {
      group.barrier();
    } catch (const std::exception&) {
    }
  }
};

// Where a rank's scheduled death strikes, as the trainer names it.
StepPoint step_point(KillAt at) {
  switch (at) {
    case KillAt::Forward: return StepPoint::Forward;
    case KillAt::Backward: return StepPoint::Backward;
    case KillAt::Sync: return StepPoint::Sync;
    default: return StepPoint::Optimizer;
  }
}

// A scheduled kill in signal mode: the process ends here, as a crashed GPU's host process would.
[[noreturn]] void die() {
  std::fflush(nullptr);
  raise(SIGKILL);
  std::abort();  // not reached
}

// What a replacement process is told when it joins (run_joined).
struct JoinMessage {
  Options options;
  int step = 0;
  double elapsed = 0;              // the survivors' clock
  std::vector<int> ranks;          // logical ranks taken by the new processes, in spawn order
  JoinState state;                 // logical_rank filled by each joiner
  std::string last_checkpoint;
  int recorder = 0;                // logical rank holding the results file
};

nlohmann::json to_json(const JoinMessage& m) {
  const JoinState& s = m.state;
  return {{"options", to_json(m.options)}, {"step", m.step}, {"elapsed", m.elapsed}, {"ranks", m.ranks},
          {"alive", std::vector<int>(s.alive.begin(), s.alive.end())},
          {"valid", std::vector<int>(s.valid.begin(), s.valid.end())}, {"cursor", s.cursor},
          {"initial_cursor", s.initial_cursor}, {"steps", s.steps}, {"initial_steps", s.initial_steps},
          {"restore_path", s.restore_path}, {"last_checkpoint", m.last_checkpoint},
          {"threads", m.options.threads}, {"recorder", m.recorder}};
}

JoinMessage join_message_from_json(const nlohmann::json& j) {
  JoinMessage m;
  m.options = options_from_json(j.at("options"));
  m.options.threads = j.at("threads");
  m.step = j.at("step");
  m.elapsed = j.at("elapsed");
  m.ranks = j.at("ranks").get<std::vector<int>>();
  for (int a : j.at("alive").get<std::vector<int>>()) m.state.alive.push_back(char(a));
  for (int v : j.at("valid").get<std::vector<int>>()) m.state.valid.push_back(char(v));
  m.state.cursor = j.at("cursor");
  m.state.initial_cursor = j.at("initial_cursor");
  m.state.steps = j.at("steps");
  m.state.initial_steps = j.at("initial_steps");
  m.state.restore_path = j.at("restore_path");
  m.last_checkpoint = j.at("last_checkpoint");
  m.recorder = j.at("recorder");
  return m;
}

// A string from the group's rank 0 to every member.
std::string broadcast_string(Comm& c, std::string s) {
  long long n = static_cast<long long>(s.size());
  c.broadcast(&n, sizeof n, 0);
  s.resize(static_cast<std::size_t>(n));
  c.broadcast(s.data(), s.size(), 0);
  return s;
}

// Real failures left no replica able to train and no revival is scheduled: the run cannot go on.
struct NoProgress : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One run of the training loop on this rank. The group's rank 0 (the lowest live logical rank)
// owns the recorder and prints.
class TrainingRun {
 public:
  TrainingRun(Options o, Comm& world, Schedule schedule)
      : o_(std::move(o)), group_(&world), me_(world.rank()), schedule_(std::move(schedule)),
        threads_(configure_threads(o_.threads)), trainer_(std::make_unique<Trainer>(o_, world, o_.micro_batch)),
        alive_(world.size(), 1), phase_rows_(world.size()) {
    if (!o_.init_from.empty()) trainer_->load_checkpoint(o_.init_from, o_.init_weights_only);
    o_.opt.total_steps = trainer_->steps_taken() + o_.steps;
    peak_ = find_peak(o_, world, threads_);
    for (int r = 0; r < world.size(); ++r) members_.push_back(r);
    arm();
  }
  // A replacement process: the survivors' state from `m`, over `group` (which includes it).
  TrainingRun(const JoinMessage& m, int logical_rank, std::unique_ptr<Comm> group, Schedule schedule)
      : o_(m.options), group_(group.get()), owned_group_(std::move(group)), me_(logical_rank),
        schedule_(std::move(schedule)), threads_(configure_threads(o_.threads)), alive_(m.state.alive),
        phase_rows_(m.state.alive.size()), recorder_(m.recorder), last_ckpt_(m.last_checkpoint) {
    JoinState js = m.state;
    js.logical_rank = me_;
    trainer_ = std::make_unique<Trainer>(o_, *group_, o_.micro_batch, js);
    t0_ = std::chrono::steady_clock::now() - std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                   std::chrono::duration<double>(m.elapsed));
    arm();
  }

  void open_results();
  void print_banner() const;
  void start_clock();
  // Applies step s's kills and revivals; returns the recovery's seconds (0 when nothing happens).
  double apply_events(int s);
  // The step, redone after a failure until it commits (signal mode); returns when it has.
  void run_step(int s, double recovery_seconds);
  void finish();
  // After NoProgress: the root closes the file with what it holds (a /summary over the rows).
  void abandon(const NoProgress& e);
  // A replacement process's part of the revival at step s (the survivors are in revive()).
  double join(int s, const std::vector<int>& ranks);

 private:
  // The rank that holds the results file: logical rank 0 at the start; when it dies, the lowest
  // live logical rank takes over, and keeps it (a revived rank 0 does not take it back).
  bool root() const { return me_ == recorder_; }
  int root_index() const {
    return static_cast<int>(std::find(members_.begin(), members_.end(), recorder_) - members_.begin());
  }
  bool signal() const { return o_.kill_mode == "signal"; }
  double now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  void arm();
  StepResult attempt(double& idle_seconds);
  void report(int s, const StepResult& r, double t_start, double recovery_seconds, double idle_seconds);
  double recover(int s, const PeerFailure& e, double t_attempt);
  double revive(int s, const std::vector<int>& ranks);
  double reconfigure(int s, const StepEvents& ev);
  void adopt(std::unique_ptr<Comm> group);
  void record_processes(const std::vector<int>& only);
  void take_over_recorder(const std::vector<int>& lost);
  void maybe_checkpoint(int s, bool trained);
  void record_recovery(int s, const StepEvents& ev, const Recovery& rc, double t_event, const double worst[3],
                       double bytes, int steps_before, const std::vector<std::string>* kill_details = nullptr,
                       double t_kill = -1);
  void record_step(int s, const StepResult& r, double t_start, double t_end, double recovery_seconds,
                   double idle_seconds);

  Options o_;
  Comm* group_;                       // the live ranks, in logical order
  std::unique_ptr<Comm> owned_group_;  // once the launcher's world has been shrunk or grown
  int me_;                            // logical rank
  std::vector<int> members_;          // logical rank of each group member
  const Schedule schedule_;
  const int threads_;
  std::unique_ptr<Trainer> trainer_;
  Peak peak_;
  std::unique_ptr<Recorder> rec_;  // root only
  std::vector<char> alive_;
  std::vector<std::array<double, kPhaseCount>> phase_rows_;
  int recorder_ = 0;  // logical rank holding the results file
  std::optional<KillAt> doom_;
  StepResult last_;  // this rank's latest step result  // signal mode: this rank's scheduled death in the current step
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  std::vector<double> healthy_step_seconds_;
  std::string last_ckpt_;
  double last_step_seconds_ = 0;
  double recorder_seconds_ = 0;  // rank 0's time appending and flushing rows
};

// Signal mode: the trainer agrees before every update and strikes this rank's scheduled death.
void TrainingRun::arm() {
  if (!signal()) return;
  trainer_->set_commit_agreement(true);
  trainer_->set_step_hook([this](StepPoint p) {
    if (doom_ && *doom_ != KillAt::Start && step_point(*doom_) == p) die();
  });
}

void TrainingRun::open_results() {
  if (root()) {
    rec_ = std::make_unique<Recorder>(o_.out, o_.overwrite, group_->size(), trainer_->topology().replicas);
    const nlohmann::json env = environment_record();
    for (auto& [k, v] : env.items()) rec_->set_attr(k, v.get<std::string>());
    rec_->set_attr("config", to_json(o_).dump());
    rec_->set_attr("ranks", static_cast<long long>(group_->size()));
    rec_->set_attr("tp", static_cast<long long>(o_.tp));
    rec_->set_attr("replicas", static_cast<long long>(trainer_->topology().replicas));
    rec_->set_attr("timing", o_.timing);
    rec_->set_attr("policy", o_.schedule.empty() ? std::string("none") : o_.policy);
    rec_->set_attr("threads_per_rank", static_cast<long long>(threads_));
    rec_->set_attr("peak_gflops_per_rank", peak_.gflops);
    rec_->set_attr("peak_gflops_source", peak_.source);
    rec_->set_attr("data", trainer_->data().describe());
    rec_->set_attr("tokens_per_sample", static_cast<long long>(o_.seq));
  }
  const auto hosts = group_->gather(host_name(), 0);
  if (root()) rec_->set_attr("hosts", nlohmann::json(hosts).dump());
  record_processes({});
}

// /ranks/incarnations: which process holds each logical rank (the group's members not in
// `only`, unless it is empty, are left as they are). Collective over the group.
void TrainingRun::record_processes(const std::vector<int>& only) {
  const auto who =
      group_->gather(fmt::format("{} {}", static_cast<long long>(getpid()), host_name()), root_index());
  if (!root()) return;
  for (std::size_t k = 0; k < who.size(); ++k) {
    const int r = members_[k];
    if (!only.empty() && std::find(only.begin(), only.end(), r) == only.end()) continue;
    const auto space = who[k].find(' ');
    rec_->incarnation_start(r, std::stoll(who[k].substr(0, space)), who[k].substr(space + 1), only.empty() ? 0.0 : now());
  }
}

void TrainingRun::print_banner() const {
  if (!root() || o_.quiet) return;
  const ModelConfig& m = o_.model;
  fmt::print("ntpbench: {} ranks = {} replicas x TP {} | model {} (L={} H={} d={} V={}, {:.2f}M params) | "
             "B={} per replica, T={} | {} thread(s)/rank | timing {}{}\n",
             group_->size(), trainer_->topology().replicas, o_.tp, o_.preset, m.layers, m.heads, m.hidden, m.vocab,
             parameter_count(m) / 1e6, o_.micro_batch, o_.seq, threads_, o_.timing,
             o_.schedule.empty() ? "" : fmt::format(" | policy {} | schedule {}", o_.policy, o_.schedule));
  fmt::print("data: {}\nresults: {}\n", trainer_->data().describe(), o_.out);
  if (o_.backend != "cpu") fmt::print("communication: {}\n", trainer_->communication());
  std::fflush(stdout);
}

void TrainingRun::start_clock() {
  group_->barrier();  // everyone starts the clock together
  t0_ = std::chrono::steady_clock::now();
  trainer_->clock().take();  // phase accounting starts with the first step
}

double TrainingRun::apply_events(int s) {
  const StepEvents& ev = schedule_.at(s);
  if (ev.kill.empty() && ev.revive.empty()) return 0;
  if (!signal()) return reconfigure(s, ev);
  // Signal mode: a victim dies at its phase of this step and the others find out from MPI; ranks
  // to revive are new processes. A kill of a rank already dead (an unscheduled death) is moot, as
  // is a revival of one that lives.
  for (std::size_t i = 0; i < ev.kill.size(); ++i)
    if (ev.kill[i] == me_) doom_ = ev.kill_at[i];
  std::vector<int> back;
  for (int r : ev.revive)
    if (!alive_[r]) back.push_back(r);
  return back.empty() ? 0 : revive(s, back);
}

// Fence mode: every rank applies the schedule's membership at once.
double TrainingRun::reconfigure(int s, const StepEvents& ev) {
  const double t_event = now();
  for (int r : ev.kill) alive_[r] = 0;
  for (int r : ev.revive) alive_[r] = 1;
  const int before = trainer_->steps_taken();
  const Recovery rc = trainer_->reconfigure(alive_);
  // The recovery's figures: slowest rank for times, all ranks for bytes.
  double worst[3] = {rc.detect, rc.reconfigure, rc.heal};
  group_->allreduce_max(worst, 3);
  double bytes = rc.heal_bytes;
  group_->allreduce_sum(&bytes, 1);
  if (root()) record_recovery(s, ev, rc, t_event, worst, bytes, before);
  return worst[0] + worst[1] + worst[2];
}

// The group is now `group` (after a shrink or a spawn): every member's logical rank, and the
// trainer talks over it.
void TrainingRun::adopt(std::unique_ptr<Comm> group) {
  trainer_->set_group(*group);
  std::unique_ptr<Comm> old = std::move(owned_group_);  // the trainer's communicators were split from it
  owned_group_ = std::move(group);
  group_ = owned_group_.get();
  members_ = group_->allgather(me_);
  std::fill(alive_.begin(), alive_.end(), 0);
  for (int r : members_) alive_[r] = 1;
}

// Signal mode, on the survivors: new processes take the dead logical ranks `ranks`
// (MPI_Comm_spawn, then merged), are told the run's state, and are healed from their peers.
double TrainingRun::revive(int s, const std::vector<int>& ranks) {
  const double t_event = now();
  std::vector<std::string> args;  // the child learns everything from the join message
  auto merged = group_->spawn(std::filesystem::read_symlink("/proc/self/exe").string(), args,
                              static_cast<int>(ranks.size()));
  JoinMessage m;
  m.options = o_;
  m.options.threads = threads_;
  m.step = s;
  m.elapsed = now();
  m.ranks = ranks;
  m.state = trainer_->join_state(-1);
  m.last_checkpoint = last_ckpt_;
  m.recorder = recorder_;
  broadcast_string(*merged, merged->rank() == 0 ? to_json(m).dump() : std::string());
  adopt(merged->split(0, me_));
  record_processes(ranks);
  const double spawn_seconds = now() - t_event;
  StepEvents ev;
  ev.revive = ranks;
  const double rec = reconfigure(s, ev);
  if (root()) rec_->event(make_event(t_event, s, "spawn", -1, -1, 0, spawn_seconds,
                                     fmt::format("{} new process(es) for rank(s) {}", ranks.size(), ranks)));
  return spawn_seconds + rec;
}

// A new process's side of revive(): the same adoption and reconfiguration.
double TrainingRun::join(int s, const std::vector<int>& ranks) {
  members_ = group_->allgather(me_);
  record_processes(ranks);
  StepEvents ev;
  ev.revive = ranks;
  return reconfigure(s, ev);
}

// Rank 0: the recovery's events and its line on the console.
void TrainingRun::record_recovery(int s, const StepEvents& ev, const Recovery& rc, double t_event,
                                  const double worst[3], double bytes, int steps_before,
                                  const std::vector<std::string>* kill_details, double t_kill) {
  for (std::size_t i = 0; i < ev.kill.size(); ++i)
    rec_->event(make_event(t_kill >= 0 ? t_kill : t_event, s, "kill", ev.kill[i], ev.kill[i] / o_.tp, 0, 0,
                           kill_details ? (*kill_details)[i] : ""));
  for (int r : ev.revive) rec_->event(make_event(t_event, s, "revive", r, r / o_.tp, 0, 0, ""));
  const std::string change = fmt::format("TP {} -> {}", rc.before, rc.after);
  rec_->event(make_event(t_event, s, "detect", -1, -1, 0, worst[0], ""));
  rec_->event(make_event(t_event + worst[0], s, "reconfigure", -1, -1, 0, worst[1], change));
  std::string what = fmt::format("step {:5d}: {}{}| detect {:.2f} ms | reconfigure {:.2f} ms | ", s,
                                 ev.kill.empty() ? "" : fmt::format("kill {} ", ev.kill),
                                 ev.revive.empty() ? "" : fmt::format("revive {} ", ev.revive), worst[0] * 1e3,
                                 worst[1] * 1e3);
  const double t_heal = t_event + worst[0] + worst[1];
  if (rc.restored) {
    rec_->event(make_event(t_heal, s, "restore", -1, -1, bytes, worst[2],
                           fmt::format("from {} (optimizer step {})", rc.restored_from, rc.restored_step)));
    const auto [lost_rows, lost_seconds] = rec_->roll_back_after(rc.restored_step);
    rec_->event(make_event(t_event, s, "rollback", -1, -1, 0, 0,
                           fmt::format("{} steps rolled back (optimizer step {} -> {})", lost_rows, steps_before,
                                       rc.restored_step)));
    rec_->event(make_event(t_event, s, "recompute", -1, -1, 0, lost_seconds, fmt::format("{} steps to redo", lost_rows)));
    what += fmt::format("no live replica holds every shard: restored {} (optimizer step {}), {} steps rolled "
                        "back ({:.2f} s to recompute) | {}",
                        rc.restored_from, rc.restored_step, lost_rows, lost_seconds, change);
  } else if (trainer_->configuration().active_replicas() == 0) {
    what += fmt::format("every replica is down: idle until a revival | {}", change);
  } else {
    rec_->event(make_event(t_heal, s, "heal", -1, -1, bytes, worst[2], change));
    what += fmt::format("heal {:.2f} MB in {:.2f} ms | {}", bytes / 1e6, worst[2] * 1e3, change);
  }
  fmt::print("{}\n", what);
  std::fflush(stdout);
}

void TrainingRun::run_step(int s, double recovery_seconds) {
  for (;;) {
    const double t_start = now();
    double idle_seconds = 0;
    const int before = trainer_->steps_taken();
    try {
      if (doom_ == KillAt::Start) die();
      const StepResult r = attempt(idle_seconds);
      last_ = r;
      report(s, r, t_start, recovery_seconds, idle_seconds);
      maybe_checkpoint(s, r.samples > 0);
      return;
    } catch (const PeerFailure& e) {
      if (!signal()) throw;
      recovery_seconds += recover(s, e, t_start);
      // A step that committed before the failure showed (uniformly: the agreement) is not redone;
      // if its row died with the recorder, the new one writes what it knows (its own phases).
      if (trainer_->steps_taken() != before) {
        if (root() && static_cast<int>(rec_->rows().size()) < s) record_step(s, last_, t_start, now(), recovery_seconds, 0);
        return;
      }
    }
  }
}

// One attempt at the step: the trainer's step (which agrees before the update in signal mode),
// then the wait that ends every rank's row at the same moment.
StepResult TrainingRun::attempt(double& idle_seconds) {
  if (trainer_->configuration().active_replicas() == 0) {
    // Nobody can train: the slot lasts as long as a healthy step would (the repair is measured
    // in steps), and it counts against goodput.
    PhaseScope idle(trainer_->clock(), Phase::Idle);
    double wait = root() ? (healthy_step_seconds_.empty() ? last_step_seconds_ : median(healthy_step_seconds_)) : 0;
    group_->broadcast(&wait, sizeof wait, root_index());
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    idle_seconds = wait;
  }
  const StepResult r = trainer_->step();  // with no active replica: advances nothing
  {
    // Ranks that trained less (or not at all) wait here for the rest: idle time, and every
    // rank's phases of this row then end at the same moment.
    PhaseScope idle(trainer_->clock(), Phase::Idle);
    group_->barrier();
  }
  return r;
}

// The metrics channel: every rank's phases and loss to the root, which records the row.
void TrainingRun::report(int s, const StepResult& r, double t_start, double recovery_seconds, double idle_seconds) {
  Report mine;
  const auto waited = trainer_->clock().take();
  for (int k = 0; k < kPhaseCount; ++k) mine.phases[k] = r.phase_seconds[k] + waited[k];
  mine.trained = r.trained, mine.loss = r.loss, mine.grad_norm = r.grad_norm, mine.overruns = r.overruns;
  std::vector<double> gathered(root() ? std::size_t(group_->size()) * kReportSize : 0);
  group_->gather(reinterpret_cast<const double*>(&mine), kReportSize, gathered.data(), root_index());
  if (!root()) return;
  std::fill(phase_rows_.begin(), phase_rows_.end(), std::array<double, kPhaseCount>{});
  Report agg;
  bool overrun = false;
  for (int k = 0; k < group_->size(); ++k) {
    const auto* rep = reinterpret_cast<const Report*>(&gathered[std::size_t(k) * kReportSize]);
    phase_rows_[members_[k]] = rep->phases;
    if (rep->trained && !agg.trained) agg = *rep;
    overrun = overrun || rep->overruns > 0;
  }
  StepResult row = r;
  row.loss = agg.loss, row.grad_norm = agg.grad_norm, row.overruns = overrun ? 1 : 0;
  record_step(s, row, t_start, now(), recovery_seconds, idle_seconds);
}

// The recorder moves: the lowest live logical rank (this one, now the group's rank 0) reopens the
// results file its dead predecessor wrote and appends from there.
void TrainingRun::take_over_recorder(const std::vector<int>& lost) {
  rec_ = Recorder::reopen(o_.out, static_cast<int>(alive_.size()), trainer_->topology().replicas);
  for (const auto& row : rec_->rows())
    if (row.samples > 0 && row.live_ranks == int(alive_.size()) && row.active_replicas == trainer_->topology().replicas)
      healthy_step_seconds_.push_back(row.t_end - row.t_start);
  if (!rec_->rows().empty()) last_step_seconds_ = rec_->rows().back().t_end - rec_->rows().back().t_start;
  fmt::print("logical rank {} takes over the results file from rank(s) {} ({} rows so far)\n", me_, lost,
             rec_->rows().size());
  rec_->event(make_event(now(), static_cast<std::int64_t>(rec_->rows().size()) + 1, "recorder", me_, me_ / o_.tp, 0, 0,
                         fmt::format("rank {} reopened the file", me_)));
}

// Signal mode: a peer died (or a survivor revoked the group). Every survivor takes the same path:
// an agreement vote for the attempt (unless the failure came from that vote), shrink to the live
// ranks, and the policy's reconfiguration over them. Returns the seconds it took.
double TrainingRun::recover(int s, const PeerFailure& e, double t_attempt) {
  double t_notice = now();
  double total = 0;
  bool voted = dynamic_cast<const CommitRefused*>(&e) != nullptr;
  for (;;) {
    try {
      const double t0 = now();
      trainer_->revoke_all();
      if (!voted) group_->agree(false);
      voted = false;
      const std::vector<int> before = members_;
      adopt(group_->shrink());
      if (!alive_[recorder_]) recorder_ = members_.front();
      double times[3] = {t_notice, -t_notice, now() - t0};  // last notice, first notice, repair
      group_->allreduce_max(times, 3);
      const double first = -times[1];
      StepEvents ev;
      std::vector<int> lost;
      for (int r : before)
        if (!alive_[r]) lost.push_back(r);
      ev.kill = lost;
      std::vector<std::string> how;
      const int steps_before = trainer_->steps_taken();
      const Recovery rc = trainer_->reconfigure(alive_);
      double worst[3] = {rc.detect, rc.reconfigure, rc.heal};
      group_->allreduce_max(worst, 3);
      double bytes = rc.heal_bytes;
      group_->allreduce_sum(&bytes, 1);
      if (trainer_->configuration().active_replicas() == 0 && !schedule_.revival_after(s)) {
        std::vector<int> dead;
        for (int r = 0; r < int(alive_.size()); ++r)
          if (!alive_[r]) dead.push_back(r);
        throw NoProgress(fmt::format("step {}: rank(s) {} are dead, no replica can train under --policy {} and no "
                                     "revival is scheduled",
                                     s, dead, o_.policy));
      }
      if (root()) {
        if (!rec_) take_over_recorder(lost);
        const StepEvents& sched = schedule_.at(s);
        fmt::print("step {:5d}: rank(s) {} died | first survivor noticed {:.2f} ms into the step, the last {:.2f} ms "
                   "later | revoke + agree + shrink {:.2f} ms\n",
                   s, lost, (first - t_attempt) * 1e3, (times[0] - first) * 1e3, times[2] * 1e3);
        for (int r : lost) {
          rec_->incarnation_end(r, first);
          auto it = std::find(sched.kill.begin(), sched.kill.end(), r);
          how.push_back(it == sched.kill.end()
                            ? std::string("unscheduled: the process died")
                            : fmt::format("scheduled: SIGKILL at {}", kill_at_name(sched.kill_at[it - sched.kill.begin()])));
        }
        rec_->event(make_event(first, s, "lost", -1, -1, 0, first - t_attempt,
                               "the interrupted attempt's time until the first survivor noticed"));
        rec_->event(make_event(first, s, "notice", -1, -1, 0, times[0] - first,
                               "from the first survivor's notice to the last's"));
        rec_->event(make_event(times[0], s, "repair", -1, -1, 0, times[2], "revoke + agree + shrink"));
        record_recovery(s, ev, rc, times[0] + times[2], worst, bytes, steps_before, &how, first);
      }
      total += (now() - t_notice);
      return total;
    } catch (const PeerFailure&) {
      // Another failure during the repair: the same path again, over what is left.
      total += now() - t_notice;
      t_notice = now();
    }
  }
}

// Rank 0: the step's row (with every rank's phases from the metrics channel) and its line.
void TrainingRun::record_step(int s, const StepResult& r, double t_start, double t_end, double recovery_seconds,
                              double idle_seconds) {
  const Configuration& cfg = trainer_->configuration();
  const bool overrun = r.overruns > 0;
  const StepResult& agg = r;
  const double secs = t_end - t_start;
  const long long tokens = r.samples * o_.seq;
  const double flops = training_flops(o_.model, r.samples, o_.seq);
  const double peak = peak_.gflops;
  const double mfu = secs > 0 && peak > 0 ? flops / (secs * group_->size() * peak * 1e9) : std::nan("");
  const double nan = std::nan("");
  StepRow row{s, trainer_->steps_taken(), t_start, t_end, r.sample_begin, r.samples, tokens, tokens,
              r.samples ? agg.loss : nan, r.samples ? agg.grad_norm : nan, r.lr, flops, mfu, cfg.live_ranks(),
              cfg.active_replicas(), recovery_seconds, idle_seconds, static_cast<std::int8_t>(overrun)};
  ReplicaRow rr;
  for (const auto& rp : cfg.replicas) {
    rr.tp_degree.push_back(rp.active() ? rp.degree() : 0);
    rr.batch.push_back(rp.batch);
    rr.state.push_back(static_cast<signed char>(rp.state));
  }
  const auto tr = std::chrono::steady_clock::now();
  rec_->append(row, rr, phase_rows_);
  recorder_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - tr).count();
  if (r.samples > 0) {
    last_step_seconds_ = secs;
    if (cfg.active_replicas() == trainer_->topology().replicas && cfg.live_ranks() == int(alive_.size()))
      healthy_step_seconds_.push_back(secs);
  }
  if (o_.quiet) return;
  if (r.samples > 0)
    fmt::print("step {:5d}/{} | loss {:.4f} | norm {:.4f} | {:8.1f} ms | {:9.0f} tok/s | MFU {:5.1f}% | TP {}{}\n", s,
               o_.steps, agg.loss, agg.grad_norm, secs * 1e3, tokens / secs, 100 * mfu, cfg.degrees(),
               overrun ? " | paced overrun" : "");
  else
    fmt::print("step {:5d}/{} | idle: every replica is down | {:8.1f} ms\n", s, o_.steps, secs * 1e3);
  std::fflush(stdout);
}

void TrainingRun::maybe_checkpoint(int s, bool trained) {
  if (o_.checkpoint_every <= 0 || !trained || trainer_->steps_taken() % o_.checkpoint_every != 0) return;
  const std::string path = checkpoint_path(o_, trainer_->steps_taken());
  const double tc = now();
  if (trainer_->save_checkpoint(path)) {
    trainer_->set_restore_point(path);
    last_ckpt_ = path;
    if (root()) {
      rec_->event(make_event(tc, s, "checkpoint", -1, -1, 3.0 * parameter_count(o_.model) * sizeof(float), now() - tc,
                             path));
      if (!o_.quiet) fmt::print("checkpoint: {}\n", path);
    }
  }
  group_->barrier();
}

// The final checkpoint (for --replay and resuming), /summary, and the closing line.
void TrainingRun::finish() {
  const std::string final_path = checkpoint_path(o_, trainer_->steps_taken());
  if (o_.final_checkpoint && last_ckpt_ != final_path) {
    if (trainer_->save_checkpoint(final_path)) last_ckpt_ = final_path;
    group_->barrier();
    if (trainer_->configuration().active_replicas() == 0 && root())
      fmt::print("no replica is active at the end: no final checkpoint\n");
  }
  const GroupBarrierOnExit last{*group_};
  if (!root()) return;
  const double wall = now();
  if (!last_ckpt_.empty()) rec_->set_attr("final_checkpoint", std::filesystem::absolute(last_ckpt_).string());
  rec_->write_summary(wall, group_->size(), peak_.gflops);
  rec_->set_summary("recorder_seconds", recorder_seconds_);
  double tokens = 0, committed = 0, step_s = 0;
  for (const auto& row : rec_->rows())
    tokens += row.tokens, committed += row.tokens_committed, step_s += row.t_end - row.t_start;
  fmt::print("done: {} steps, {:.0f} tokens ({:.0f} committed) in {:.2f} s | throughput {:.0f} tok/s | goodput "
             "{:.0f} tok/s | final loss {:.4f}\nwrote {}{}\n",
             o_.steps, tokens, committed, wall, step_s > 0 ? tokens / step_s : 0.0, committed / wall,
             rec_->rows().empty() ? 0.0 : rec_->rows().back().loss, o_.out,
             last_ckpt_.empty() ? "" : " and checkpoint " + last_ckpt_);
  std::fflush(stdout);
}

void TrainingRun::abandon(const NoProgress& e) {
  const GroupBarrierOnExit last{*group_};
  if (!root()) return;
  if (!rec_) take_over_recorder({});
  rec_->write_summary(now(), static_cast<int>(alive_.size()), peak_.gflops);
  rec_->set_summary("recorder_seconds", recorder_seconds_);
  std::fprintf(stderr, "ntpbench: error: %s; the results file holds every step so far: %s\n", e.what(), o_.out.c_str());
}

// The results file's name: --out, or a dated default that every rank agrees on (only rank 0
// writes, but every rank needs it for the checkpoint directory).
void settle_out_path(Options& o, Comm& world) {
  const bool root = world.rank() == 0;
  if (o.out.empty()) {
    std::string name = root ? default_out() : std::string();
    name.resize(128, '\0');
    world.broadcast(name.data(), name.size(), 0);
    o.out = name.c_str();
  }
  if (root && std::filesystem::exists(o.out) && !o.overwrite)
    throw std::runtime_error("results file '" + o.out + "' exists; choose another --out or pass --overwrite");
}

}  // namespace

// Walks the schedule through the policy: every membership the run will see must leave a way
// forward. Throws UsageError naming the step.
Schedule validate_schedule(const Options& o, int world_size) {
  if (o.schedule.empty()) return {};
  Schedule s;
  try {
    s = Schedule::load(o.schedule, world_size, o.steps);
  } catch (const ScheduleError& e) {
    throw UsageError(e.what());
  }
  const Policy policy = parse_policy(o.policy);
  const Topology topo(world_size, 0, o.tp);
  std::vector<char> alive(world_size, 1);
  for (int step = 1; step <= o.steps; ++step) {
    const auto& ev = s.at(step);
    for (int r : ev.kill) alive[r] = 0;
    for (int r : ev.revive) alive[r] = 1;
    const auto cfg = plan_configuration(policy, topo, o.model, o.micro_batch, o.pacing.boost, alive);
    if (cfg.active_replicas() == 0 && !s.revival_after(step))
      throw UsageError(fmt::format(
          "{}: from step {} every replica is down under --policy {} and no revival is scheduled; the run could "
          "never finish",
          o.schedule, step, o.policy));
  }
  return s;
}

// --kill-mode: signal where the job runs with ULFM, else fence; an explicit signal without it is
// refused with the reason.
void settle_kill_mode(Options& o) {
  const std::string why = ulfm_unavailable_reason();
  if (o.kill_mode.empty()) o.kill_mode = why.empty() && o.backend == "cpu" ? "signal" : "fence";
  if (o.kill_mode == "signal" && !why.empty()) throw UsageError("--kill-mode signal: " + why);
  if (o.kill_mode == "signal" && o.backend != "cpu")
    throw UsageError("--kill-mode signal needs --backend cpu for now (a replacement process cannot be placed on a "
                     "GPU yet); use --kill-mode fence");
}

int run_training(Options o, Comm& world) {
  const bool root = world.rank() == 0;
  settle_kill_mode(o);
  if (world.size() % o.tp != 0)
    throw UsageError(fmt::format("--tp {} does not divide the {} ranks of this job", o.tp, world.size()));
  Schedule schedule = validate_schedule(o, world.size());
  if (o.check) {
    if (root)
      fmt::print("ntpbench --check: OK: {} ranks = {} replicas x TP {}, model {} ({:.2f}M params), {} steps, policy "
                 "{}, schedule {} ({} kills, {} revivals), kill mode {}, timing {}\n",
                 world.size(), world.size() / o.tp, o.tp, o.preset, parameter_count(o.model) / 1e6, o.steps, o.policy,
                 o.schedule.empty() ? "none" : o.schedule, schedule.kills(), schedule.revives(), o.kill_mode, o.timing);
    return 0;
  }
  settle_out_path(o, world);
  if (root && o.policy == "restart" && o.checkpoint_every == 0 && !schedule.empty())
    fmt::print("note: --policy restart without --checkpoint-every: a failure rolls back to the initial state\n");

  TrainingRun run(o, world, std::move(schedule));
  run.open_results();
  run.print_banner();
  run.start_clock();
  try {
    for (int s = 1; s <= o.steps; ++s) {
      const double recovery_seconds = run.apply_events(s);
      run.run_step(s, recovery_seconds);
    }
  } catch (const NoProgress& e) {
    run.abandon(e);
    return 3;
  }
  run.finish();
  return 0;
}

int run_joined(Comm& parent) {
  const JoinMessage m = join_message_from_json(nlohmann::json::parse(broadcast_string(parent, "")));
  // The new processes were started together: the k-th (its rank in its own MPI_COMM_WORLD) takes
  // the k-th logical rank revived.
  const int k = world_comm()->rank();
  const int me = m.ranks.at(k);
  std::unique_ptr<Comm> group = parent.split(0, me);
  Schedule schedule;
  if (!m.options.schedule.empty()) schedule = Schedule::load(m.options.schedule, int(m.state.alive.size()), m.options.steps);
  TrainingRun run(m, me, std::move(group), std::move(schedule));
  try {
    double recovery_seconds = run.join(m.step, m.ranks);
    for (int s = m.step; s <= m.options.steps; ++s) {
      if (s > m.step) recovery_seconds = run.apply_events(s);
      run.run_step(s, recovery_seconds);
    }
  } catch (const NoProgress& e) {
    run.abandon(e);
    return 3;
  }
  run.finish();
  return 0;
}

}  // namespace ntp
