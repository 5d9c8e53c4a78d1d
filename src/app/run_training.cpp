// The training driver: validates the job (flags, schedule, kill mode), settles the results path,
// and runs TrainingRun (training_run.hpp) from step 1 to the end.
#include <algorithm>
#include <ctime>
#include <filesystem>
#include <optional>
#include <set>

#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backend.hpp"
#include "data.hpp"
#include "fault.hpp"
#include "hang_watch.hpp"
#include "launcher.hpp"
#include "run.hpp"
#include "handover.hpp"
#include "spare_pool.hpp"
#include "training_run.hpp"

namespace ntp {

namespace {

std::string default_out() {
  char buf[64];
  std::time_t now = std::time(nullptr);
  std::strftime(buf, sizeof buf, "results/ntpbench-%Y%m%d-%H%M%S.h5", std::localtime(&now));
  return buf;
}

// The results file's name: --out, or a dated default that every rank agrees on (only rank 0
// writes, but every rank needs it for the checkpoint directory). Rank 0 looks for an existing file
// and every rank learns its verdict, so all refuse it together (exit 2).
void settle_out_path(Options& o, Comm& world) {
  const bool root = world.rank() == 0;
  if (o.out.empty()) o.out = world.post(root ? default_out() : std::string(), 0);
  std::string why;
  if (root && std::filesystem::exists(o.out) && !o.overwrite)
    why = "results file '" + o.out + "' exists; choose another --out or pass --overwrite";
  why = world.post(why, 0);
  if (!why.empty()) throw UsageError(why);
}

// Each distinct problem (one per rank, "" for none) once, with the ranks that have it unless every
// rank does; "" when no rank has one.
std::string summarize_by_rank(const std::vector<std::string>& problems) {
  std::vector<std::pair<std::string, std::vector<int>>> distinct;
  for (int r = 0; r < static_cast<int>(problems.size()); ++r) {
    if (problems[r].empty()) continue;
    auto it = std::find_if(distinct.begin(), distinct.end(), [&](const auto& d) { return d.first == problems[r]; });
    if (it == distinct.end()) it = distinct.insert(distinct.end(), {problems[r], {}});
    it->second.push_back(r);
  }
  if (distinct.size() == 1 && distinct[0].second.size() == problems.size()) return distinct[0].first;
  std::vector<std::string> parts;
  for (const auto& [why, ranks] : distinct)
    parts.push_back(fmt::format("{} (rank{} {})", why, ranks.size() > 1 ? "s" : "", fmt::join(ranks, ", ")));
  return fmt::format("{}", fmt::join(parts, "; "));
}

// The host of every rank of the job, on every rank: kill_node / revive_node name hosts, /ranks
// records them, and revivals go back to them.
std::vector<std::string> job_hosts(Comm& world) {
  const auto hosts = world.gather(host_name(), 0);
  const std::string all = world.post(world.rank() == 0 ? nlohmann::json(hosts).dump() : std::string(), 0);
  return nlohmann::json::parse(all).get<std::vector<std::string>>();
}

}  // namespace

// --data FILE: rank 0 checks the file's format and size and, for a token file, every token id
// against the vocabulary (one full pass, at start-up); every rank learns its verdict, so a bad file
// is refused (exit 2) before any rank trains. Each rank then maps the file and checks its header.
void validate_data_file(const Options& o, Comm& world) {
  std::string why;
  if (world.rank() == 0) {
    try {
      validate_data(o.data, o.model.vocab, o.seq);
    } catch (const DataError& e) {
      why = e.what();
    }
  }
  why = world.post(why, 0);
  if (!why.empty()) throw UsageError(why);
}

// --backend: each rank asks whether it can run it (under cuda: a GPU of its own) before anything is
// built; rank 0 gathers the answers and every rank learns the verdict, so a job with no usable GPU
// is refused once (exit 2) rather than failing on every rank.
void check_backend(const Options& o, Comm& world) {
  if (o.backend == BackendKind::Cpu) return;
  const int local_rank = world.split_node()->rank();
  const auto problems = world.gather(backend_problem(o.backend, local_rank, o.allow_gpu_sharing), 0);
  const std::string why = world.post(world.rank() == 0 ? summarize_by_rank(problems) : std::string(), 0);
  if (!why.empty()) throw UsageError(why);
}

// Walks the schedule through the policy: every membership the run will see must leave a way
// forward. Throws UsageError naming the step.
Schedule validate_schedule(const Options& o, const std::vector<std::string>& hosts) {
  if (o.schedule.empty()) return {};
  const int world_size = static_cast<int>(hosts.size());
  Schedule s;
  try {
    s = Schedule::load(o.schedule, world_size, o.steps, hosts);
  } catch (const ScheduleError& e) {
    throw UsageError(e.what());
  }
  const Topology topo(world_size, 0, o.tp, o.pp);
  std::vector<char> alive(world_size, 1);
  for (int step = 1; step <= o.steps; ++step) {
    const auto& ev = s.at(step);
    for (int r : ev.kill) alive[r] = 0;
    for (int r : ev.revive) alive[r] = 1;
    if (o.kill_mode == KillMode::Signal && std::count(alive.begin(), alive.end(), 1) == 0)
      throw UsageError(fmt::format("{}: step {} kills every rank; with --kill-mode signal no process would be left "
                                   "to revive them (use --kill-mode fence)",
                                   o.schedule, step));
    // With spares taking over deaths at once, whether one can serve a death is the pool's at run
    // time: a repair that leaves no replica and no spare ends the run then (exit 3).
    const bool takeover = o.spares_take_over_deaths();
    const auto cfg = plan_for(o, topo, alive);
    if (cfg.active_replicas() == 0 && !s.revival_after(step) && !takeover)
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
  if (!o.kill_mode) o.kill_mode = why.empty() && o.backend == BackendKind::Cpu ? KillMode::Signal : KillMode::Fence;
  if (o.kill_mode == KillMode::Signal && !why.empty()) throw UsageError("--kill-mode signal: " + why);
  if (o.kill_mode == KillMode::Signal && o.backend != BackendKind::Cpu)
    throw UsageError("--kill-mode signal needs --backend cpu for now (a replacement process cannot be placed on a "
                     "GPU yet); use --kill-mode fence");
}

// A schedule with kills, in a build that can kill for real, launched without fault tolerance: the
// kills would quietly be emulated, and the run not be the one asked for. Refused, naming both ways.
void refuse_kills_fenced_by_the_launch(const Options& o, const Schedule& s, bool mode_chosen) {
  if (mode_chosen || s.kills() == 0 || o.backend != BackendKind::Cpu || !ulfm_compiled() || ulfm_enabled()) return;
  throw UsageError(fmt::format(
      "{}: the schedule kills {} time(s), but the job was launched without fault tolerance, so no process can "
      "really die: launch it with `mpirun --with-ft ulfm` (real kills), or add --kill-mode fence (emulated kills: "
      "the process stays, fenced off from its peers)",
      o.schedule, s.kills()));
}

// Open MPI 5.0 cannot connect a process spawned in a job of several hosts with the ranks on the
// other hosts (MPI_Comm_spawn then fails in the new process's MPI_Init or its first message:
// open-mpi/ompi#12601, #13521), so a signal-mode revival there cannot work. A schedule that revives
// on such a job runs with fenced kills unless signal was asked for, which is refused.
void settle_revivals_across_hosts(Options& o, const JobLayout& layout, const Schedule& s, bool mode_chosen,
                                  bool root) {
  const auto& hosts = layout.trainer_hosts;
  const auto distinct = std::set<std::string>(hosts.begin(), hosts.end()).size();
  if (o.kill_mode != KillMode::Signal || distinct < 2 || s.revives() == 0) return;
  // Spares bring ranks back on any host: each revival (each death, under takeover) takes one.
  const int needed = o.spares_take_over_deaths() ? s.kills() : s.revives();
  if (layout.spares() > 0) {
    if (layout.spares() < needed)
      throw UsageError(fmt::format("{}: the schedule needs {} spare(s) ({} under --spare-use {}) but the job has {}, "
                                   "and on a job of several hosts no process can be spawned instead",
                                   o.schedule, needed, o.spares_take_over_deaths() ? "one per kill" : "one per revival",
                                   o.spare_use, layout.spares()));
    return;
  }
  const std::string why = fmt::format(
      "this job spans {} hosts and the schedule revives ranks, but Open MPI 5.0 cannot connect processes "
      "spawned in a multi-host job to the ranks on other hosts (open-mpi/ompi#13521)",
      distinct);
  if (mode_chosen)
    throw UsageError("--kill-mode signal: " + why + "; use --kill-mode fence, or a schedule without revivals");
  o.kill_mode = KillMode::Fence;
  if (root) fmt::print("note: kills are fenced (--kill-mode fence): {}\n", why);
}

// A TP group whose ranks sit on different hosts sends its activations over the network between
// nodes: almost always a placement mistake (jobs/slurm/ntpbench.sbatch packs TP groups in nodes).
void note_tp_groups_across_hosts(const Options& o, const std::vector<std::string>& hosts) {
  for (std::size_t g = 0; g + o.tp <= hosts.size(); g += o.tp) {
    const std::set<std::string> on(hosts.begin() + g, hosts.begin() + g + o.tp);
    if (on.size() > 1)
      fmt::print("note: the TP group of ranks {}..{} spans hosts {}: its all-reduces cross the network between "
                 "nodes (place ranks in blocks of --tp per node, e.g. mpirun --map-by ppr:K:node)\n",
                 g, g + o.tp - 1, fmt::join(on, ", "));
  }
}

namespace {
// --tp x --pp must divide the trainers (the processes, less any spares). A job of one process that
// no launcher started was most likely meant for mpirun.
void check_degrees_divide(const Options& o, const JobLayout& layout, int processes) {
  const int degree = o.tp * o.pp;
  if (layout.trainers % degree == 0) return;
  const std::string what =
      o.pp == 1 ? fmt::format("--tp {}", o.tp) : fmt::format("--tp {} x --pp {} = {}", o.tp, o.pp, degree);
  // What would: the --tp values that divide the trainers at this --pp.
  std::vector<int> valid;
  for (int t = 1; t * o.pp <= layout.trainers; ++t)
    if (layout.trainers % (t * o.pp) == 0) valid.push_back(t);
  const std::string would =
      valid.empty() ? fmt::format("; --pp {} alone exceeds them", o.pp)
                    : fmt::format("; --tp {} would{}", fmt::join(valid, ", "), o.pp == 1 ? "" : fmt::format(" at --pp {}", o.pp));
  if (layout.spares() > 0)
    throw UsageError(fmt::format("{} does not divide the {} trainer ranks of this job ({} processes, {} of them "
                                 "spares){}",
                                 what, layout.trainers, processes, layout.spares(), would));
  throw UsageError(fmt::format("{} does not divide the {} ranks of this job{}{}", what, layout.trainers,
                               processes == 1 && !started_by_launcher()
                                   ? fmt::format("; launched without mpirun? (mpirun -np {} ntpbench ...)", degree)
                                   : std::string(),
                               would));
}

// A trainer's run from step 1 (with spares: `pool`, and the spares' processes on the recorder).
int train_from_start(const Options& o, Comm& group, Schedule schedule, std::vector<std::string> hosts,
                     SparePool* pool, std::vector<std::string> spare_processes) {
  TrainingRun run(o, group, std::move(schedule), std::move(hosts));
  run.use_spares(pool, std::move(spare_processes));
  run.open_results();
  run.print_banner();
  run.start_clock();
  return run.train(1);
}

// A spare's life, once the recorder knows its process (run_training): it waits in the pool. Once
// handed a rank it trains to the end and returns the run's exit code; else it returns 0 when the
// trainers end the run (or none is left). While it waits it keeps a heartbeat as a trainer does
// (hang_watch.hpp, under its key), so a frozen spare is ended by a process of its host and dropped
// from the pool by the next repair, instead of holding every repair's agreement for ever.
int run_spare(SparePool& pool, const Options& o) {
  std::optional<HangWatch> heartbeat;
  if (o.kill_mode == KillMode::Signal) heartbeat.emplace(hang_job_key(o.out), pool.my_key(), o.failure_timeout);
  for (;;) {
    SparePlan plan;
    try {
      plan = spare_plan_from_text(pool.exchange(""));
    } catch (const PeerFailure&) {
      // A death somewhere in the job: every member of the pool repairs it together, in as many
      // passes as the trainers make: a death during the repair (after the shrink) fails the next
      // collective here too, and the trainers start another pass.
      for (;;) {
        try {
          pool.repair();
          break;
        } catch (const PeerFailure&) {
        }
      }
      if (!pool.any_trainer()) return 0;  // the job is over: nobody is left to hand this spare a rank
      continue;
    }
    if (plan.end) return 0;
    std::unique_ptr<Comm> group = pool.regroup(plan.assign);
    if (!group) continue;
    // This spare now holds a logical rank: it joins as a replacement process does, and beats under
    // that rank from now on (TrainingRun's watch).
    heartbeat.reset();
    return train_replacement(plan.join, pool.my_key(), std::move(group), &pool);
  }
}

}  // namespace

// A process spawned for a revival: the k-th (its rank in its own MPI_COMM_WORLD) of the new
// processes started together takes the k-th logical rank revived.
int run_joined(Comm& parent) {
  const JoinMessage m = join_message_from_json(nlohmann::json::parse(parent.post("", 0)));
  const int k = world_comm()->rank();
  const int me = m.ranks.at(k);
  return train_replacement(m, me, parent.split(0, me), nullptr);
}

int train_replacement(const JoinMessage& m, int logical_rank, std::unique_ptr<Comm> group, SparePool* spares) {
  Schedule schedule;
  if (!m.options.schedule.empty())
    schedule = Schedule::load(m.options.schedule, int(m.state.alive.size()), m.options.steps, m.hosts);
  for (const auto& [step, rank] : m.added_revivals) schedule.add_revival(step, rank);
  TrainingRun run(m, logical_rank, std::move(group), std::move(schedule));
  run.use_spares(spares);
  const double recovery_seconds = run.join(m.step, m.ranks);
  return run.train(m.step, recovery_seconds);
}

int run_training(Options o, Comm& world) {
  const bool root = world.rank() == 0;
  const bool mode_chosen = o.kill_mode.has_value();
  settle_kill_mode(o);
  const JobLayout layout = layout_job(job_hosts(world), o.spares_per_host, o.spare_hosts);
  const int trainers = layout.trainers;
  check_degrees_divide(o, layout, world.size());
  if (layout.spares() > 0 && o.kill_mode != KillMode::Signal)
    throw UsageError("spares (--spares-per-host, --spare-hosts) replace processes that really died: they need "
                     "--kill-mode signal (Open MPI >= 5 with ULFM, mpirun --with-ft ulfm)");
  if (o.straggler_policy != StragglerPolicy::Tolerate && o.straggler_threshold <= 0)
    throw UsageError(fmt::format("--straggler-policy {} acts on detected stragglers: set --straggler-threshold "
                                 "(e.g. 1.2)",
                                 o.straggler_policy));
  Schedule schedule = validate_schedule(o, layout.trainer_hosts);
  validate_data_file(o, world);
  settle_revivals_across_hosts(o, layout, schedule, mode_chosen, root);
  refuse_kills_fenced_by_the_launch(o, schedule, mode_chosen);
  // Kills fenced by default in a build whose MPI has no ULFM are said once, with how to make them real.
  if (root && !mode_chosen && o.kill_mode == KillMode::Fence && schedule.kills() > 0 && !ulfm_unavailable_reason().empty())
    fmt::print("note: the schedule's {} kill(s) will be fenced (emulated: the process stays), not real: {}\n",
               schedule.kills(), ulfm_unavailable_reason());
  if (root) note_tp_groups_across_hosts(o, layout.trainer_hosts);
  if (o.check) {
    if (root)
      fmt::print("ntpbench --check: OK: {} ranks = {} replicas x PP {} x TP {}{}, model {} ({:.2f}M params), {} "
                 "steps, policy {}, schedule {} ({} kills, {} revivals), kill mode {}, timing {}\n",
                 trainers, trainers / (o.tp * o.pp), o.pp, o.tp,
                 layout.spares() ? fmt::format(" + {} spare(s) ({})", layout.spares(), o.spare_use) : std::string(),
                 o.preset, parameter_count(o.model) / 1e6, o.steps, o.policy,
                 o.schedule.empty() ? "none" : o.schedule, schedule.kills(), schedule.revives(), o.kill_mode.value(), o.timing);
    return 0;
  }
  check_backend(o, world);
  settle_out_path(o, world);
  if (root && o.policy == Policy::Restart && o.checkpoint_every == 0 && !schedule.empty())
    fmt::print("note: --policy restart without --checkpoint-every: a failure rolls back to the initial state\n");

  if (layout.spares() == 0) return train_from_start(o, world, std::move(schedule), layout.trainer_hosts, nullptr, {});
  // The pool holds every process, trainers first; the trainers' group is split from it.
  const int key = layout.key.at(world.rank());
  SparePool pool(world.split(0, key), layout, key);
  std::unique_ptr<Comm> trainers_group = pool.comm().split(pool.is_trainer() ? 0 : -1, key);
  const auto processes = pool.comm().gather(fmt::format("{} {}", static_cast<long long>(getpid()), host_name()), 0);
  if (!pool.is_trainer()) return run_spare(pool, o);
  const std::vector<std::string> spare_processes(processes.begin() + std::min<std::size_t>(trainers, processes.size()),
                                                 processes.end());
  return train_from_start(o, *trainers_group, std::move(schedule), layout.trainer_hosts, &pool, spare_processes);
}


}  // namespace ntp
