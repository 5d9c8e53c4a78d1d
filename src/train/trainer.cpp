#include "trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "comm_staged.hpp"
#include "machine_profile.hpp"
#include "make_model.hpp"
#include "ntp_layout.hpp"
#include "rebalance.hpp"

namespace ntp {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

Configuration plan_for(const Options& o, const Topology& topo, const std::vector<char>& alive,
                       const std::vector<double>& rank_speed) {
  Configuration c = plan_configuration(o.policy, topo, o.model, replica_batch(o), o.pacing.boost,
                                       alive, o.micro_batches);
  rebalance_by_speed(c, o.model, o.seq, o.tp, replica_batch(o), o.micro_batches, rank_speed);
  return c;
}

Trainer::Trainer(const Options& o, Comm& world, int max_batch)
    : o_(o), group_(&world), topo_(world.size(), world.rank(), o.tp, o.pp), pacer_(paced_rates(o)) {
  feed_.max_batch = max_batch;
  // While a paced rank sleeps (its emulated device computing), the sync's exchanges progress.
  pacer_.set_background([this] {
    if (shard_.sync) shard_.sync->progress();
  });
  // The CUDA backend reads this when it picks a GPU (src/backend/backend_cuda.cu).
  if (o.allow_gpu_sharing) setenv("NTPBENCH_ALLOW_GPU_SHARING", "1", 1);
  device_.backend = make_backend(o.backend, o.backend == BackendKind::Cpu ? 0 : world.split_node()->rank(), o.precision);
  device_.stage_buffers = o.backend != BackendKind::Cpu && o.allow_gpu_sharing;
  feed_.source = make_data(o.data, o.model.vocab, o.seq, o.seed);
  cfg_ = plan_for(o, topo_, std::vector<char>(topo_.world_size, 1));
  held_.valid.assign(topo_.replicas, 1);
  build_comms();
  const int q = cfg_.replica_of(topo_.world_rank);
  shard_.model = make_model(cfg_.replicas[q], cfg_.tp_index_of(topo_.world_rank), cfg_.stage_of(topo_.world_rank));
  shard_.model->init_params(o.seed);
  shard_.opt = std::make_unique<AdamW>(*device_.backend, shard_.model->layout(), o.opt);
  shard_.sync = std::make_unique<GradSync>(cfg_, q, cfg_.tp_index_of(topo_.world_rank), *groups_.tp, groups_.slot.get(),
                                           shard_.model->layout(), *device_.backend, clock_, pacer_);
  feed_.tokens.resize(std::size_t(max_batch) * o.seq);
  feed_.targets.resize(feed_.tokens.size());
}

Trainer::Trainer(const Options& o, Comm& group, int max_batch, const JoinState& join)
    : o_(o), group_(&group), topo_(static_cast<int>(join.alive.size()), join.logical_rank, o.tp, o.pp),
      pacer_(paced_rates(o)) {
  feed_.max_batch = max_batch;
  pacer_.set_background([this] {
    if (shard_.sync) shard_.sync->progress();
  });
  // Only the CPU backend joins this way (--kill-mode signal is refused with GPUs).
  device_.backend = make_backend(o.backend, 0, o.precision);
  feed_.source = make_data(o.data, o.model.vocab, o.seq, o.seed);
  rank_speed_ = join.rank_speed;
  cfg_ = plan_for(o, topo_, join.alive, rank_speed_);
  held_.valid = join.valid;
  held_.lost = join.lost;
  progress_.cursor = join.cursor, progress_.steps = join.steps;
  restart_point_.initial.cursor = join.initial_cursor, restart_point_.initial.steps = join.initial_steps;
  restart_point_.path = join.restore_path;
  feed_.tokens.resize(std::size_t(max_batch) * o.seq);
  feed_.targets.resize(feed_.tokens.size());
}

JoinState Trainer::join_state(int logical_rank) const {
  return {logical_rank, cfg_.alive, rank_speed_, held_.valid, held_.lost, progress_.cursor, restart_point_.initial.cursor, progress_.steps, restart_point_.initial.steps,
          restart_point_.path};
}

double Trainer::probe_seconds() {
  // An n^3 product: at least 128^3 (4.2 MFLOP, about a millisecond on one CPU core), and under
  // paced timing large enough to take 5 ms on the emulated device, charged as the model's compute
  // is (--emulate-shape: as the target's), so that its emulated time, not the real time under it,
  // decides the figure. (Charged as it is, a product the scaled DGX does in 5 ms takes this CPU
  // tens of ms: the probe then timed this machine's contention, and an evicted straggler at half
  // speed read 0.4x.)
  const PacingConfig& pc = pacer_.config();
  const int n = !pc.enabled ? 128
                            : std::clamp(int(std::cbrt(5e-3 * pc.device_gflops * 1e9 / (2 * pc.shape.flops))) + 1,
                                         128, 1024);
  if (device_.probe.size() != std::size_t(3) * n * n) {
    device_.probe = Arena(*device_.backend, std::size_t(3) * n * n);
    device_.backend->zero(device_.probe.data(), device_.probe.size());
  }
  // Not a step's compute: at the rank's own speed (no boost of a replica it left), and no overrun
  // counted against the next step.
  const Pacer::Counters counters = pacer_.counters();
  const double speed = pacer_.speed();
  pacer_.set_speed(1.0);
  float* a = device_.probe.data();
  const auto t0 = Clock::now();
  device_.backend->matmul_forward(a + 2L * n * n, a, a + std::size_t(n) * n, nullptr, n, n, n, WeightLayout::OutIn);
  float done = 0;
  device_.backend->to_host(&done, a + 2L * n * n, 1);  // waits for a device's product
  pacer_.pace_compute(seconds_since(t0), 2.0 * n * n * n);
  const double seconds = seconds_since(t0);
  pacer_.set_speed(speed);
  pacer_.set_counters(counters);
  return seconds;
}

void Trainer::revoke_all() {
  for (Comm* c : {group_, groups_.live.get(), groups_.tp.get(), groups_.train.get(), groups_.slot.get(), groups_.pp.get(), groups_.embed.get()})
    if (c) c->revoke();
}

Trainer::~Trainer() = default;

std::string Trainer::communication() const {
  if (o_.backend == BackendKind::Cpu) return "MPI";
  if (device_.stage_buffers)
    return "MPI with host staging of device buffers (--allow-gpu-sharing: NCCL refuses two ranks on one GPU)";
  return "NCCL for device buffers (one communicator per TP group and sync slot, rebuilt at every membership "
         "change), MPI for host data";
}

namespace {
// Do all members of `c` hold the same `value`? (Collective: its largest and smallest agree.)
bool same_on_all(Comm& c, double value) {
  double v[2] = {value, -value};
  c.allreduce_max(v, 2);
  return v[0] == -v[1];
}

// Do all members of `c` run on one host? (A hash of each host name, exact in a double.)
bool on_one_host(Comm& c) {
  return same_on_all(c, static_cast<double>(std::hash<std::string>{}(host_name()) & ((1ULL << 52) - 1)));
}
}  // namespace

// Paced timing on a job spread over several hosts: a group's transfers take the scale-up link when
// all its members share a host, else the scale-out link (pacer.hpp). On one host emulating a named
// machine, the same by its scale-up domains: logical ranks in blocks of its GPUs per domain (eight
// ranks of a DGX are one node, and their DP sync goes over NVLink too). On one host otherwise (a
// custom machine) the default stands: the TP group is the emulated node.
void Trainer::route_links() {
  if (!o_.pacing.enabled) return;
  if (on_one_host(*group_)) {
    if (o_.custom_machine()) return;
    const int domain = machine_profile(o_.machine).gpus_per_domain;
    const auto one_domain = [&](Comm& c) { return same_on_all(c, double(topo_.world_rank / domain)); };
    if (groups_.tp) pacer_.set_route(Link::Tp, one_domain(*groups_.tp) ? Link::Tp : Link::Dp);
    if (groups_.slot) pacer_.set_route(Link::Dp, one_domain(*groups_.slot) ? Link::Tp : Link::Dp);
    return;
  }
  if (groups_.tp) pacer_.set_route(Link::Tp, on_one_host(*groups_.tp) ? Link::Tp : Link::Dp);
  if (groups_.slot) pacer_.set_route(Link::Dp, on_one_host(*groups_.slot) ? Link::Tp : Link::Dp);
}

void Trainer::build_comms() {
  const int me = topo_.world_rank;
  const bool alive = cfg_.alive[me] != 0;
  groups_.live = group_->split(alive ? 0 : -1, me);
  const int q = cfg_.replica_of(me), idx = cfg_.tp_index_of(me), st = cfg_.stage_of(me);
  const int P = topo_.stages, t = topo_.tp;
  // The groups that carry device buffers (activations, gradient chunks) are staged through host
  // memory where the world cannot take device pointers (see communication()).
  auto device_capable = [&](std::unique_ptr<Comm> c) {
    return device_.stage_buffers && c ? make_host_staged_comm(std::move(c), *device_.backend) : std::move(c);
  };
  groups_.tp = device_capable(group_->split(q >= 0 ? q * P + st : -1, idx));
  groups_.train = group_->split(q >= 0 ? 0 : -1, me);
  // Sync slot (stage, i): TP index i of that stage in every active replica, for i < n2 (the extras
  // sit out).
  groups_.slot = device_capable(group_->split(q >= 0 && idx < cfg_.n2 ? st * t + idx : -1, q));
  // With stages: the pipeline of my replica and TP index, and the tied embedding's two ends.
  groups_.pp = P > 1 ? device_capable(group_->split(q >= 0 ? q * t + idx : -1, st)) : nullptr;
  const bool ends = q >= 0 && (st == 0 || st == P - 1);
  groups_.embed = P > 1 && tied_tensor(o_.model) >= 0 ? device_capable(group_->split(ends ? q * t + idx : -1, st)) : nullptr;
  route_links();
}

std::unique_ptr<Model> Trainer::make_model(const ReplicaPlan& rp, int tp_index, int stage) {
  const StageRange range = StageRange::of(o_.model, stage, rp.stages);
  // 1F1B keeps at most stages - stage micro-batches between forward and backward on a stage.
  const int in_flight = std::min(rp.stages - stage, o_.micro_batches);
  auto m = ntp::make_model(*device_.backend, o_.model, rp.layout, tp_index, *groups_.tp, feed_.max_batch, o_.seq, &range, in_flight);
  m->set_clock(&clock_);
  m->set_pacer(&pacer_);
  return m;
}

StepResult Trainer::step() { return step(cfg_.batches()); }

StepResult Trainer::step(const std::vector<int>& batch) {
  if (static_cast<int>(batch.size()) != topo_.replicas) throw std::logic_error("one batch size per replica");
  StepResult r;
  const auto t_step = Clock::now();
  pacer_.take_covered_seconds();  // what came before the step is not its
  r.sample_begin = progress_.cursor;
  r.samples = std::accumulate(batch.begin(), batch.end(), 0LL);
  r.lr = o_.opt.lr_at(progress_.steps + 1);
  const int q = cfg_.replica_of(topo_.world_rank);
  const bool trains = r.samples > 0 && q >= 0 && shard_.model;
  auto at = [&](StepPoint p) {
    if (step_control_.hook) step_control_.hook(p);
  };
  if (trains) {
    r.trained = true;
    gradients(batch, r, at);
  } else {
    for (StepPoint p : {StepPoint::Forward, StepPoint::Backward, StepPoint::Sync, StepPoint::Optimizer}) at(p);
  }
  // The two collectives below wait for the slowest rank to finish its step (Pacer::note_wait).
  const auto t_waits = Clock::now();
  // A non-finite loss or gradient norm (both global, so every trainer sees the same) stops the
  // update everywhere: every rank learns it before any parameter changes.
  if (r.samples > 0) {
    PhaseScope s(clock_, Phase::DpComm);
    double bad = trains && !(std::isfinite(r.loss) && std::isfinite(r.grad_norm)) ? 1 : 0;
    group_->allreduce_max(&bad, 1);
    r.nonfinite = bad > 0;
  }
  // The commit point: every live rank agrees before any parameter changes, so a step interrupted
  // by a failure commits everywhere or nowhere (and consumes no samples when it does not).
  if (step_control_.agree_commit) {
    PhaseScope s(clock_, Phase::DpComm);
    if (!group_->agree(true)) throw CommitRefused("the step did not commit: a rank failed during it");
  }
  pacer_.note_wait(seconds_since(t_waits));
  if (r.nonfinite) {
    // --on-nonfinite skip: the batch is consumed without an update; stop: nothing advances (the
    // driver ends the run).
    if (o_.on_nonfinite == OnNonfinite::Skip) progress_.cursor += r.samples;
    r.phase_seconds = clock_.take();
    return r;
  }
  if (trains) {
    PhaseScope s(clock_, Phase::Optimizer);
    const auto t0 = Clock::now();
    shard_.opt->step(shard_.model->params(), shard_.model->grads(), clip_scale(r.grad_norm, o_.opt.clip), float(r.lr));
    pacer_.pace_optimizer(seconds_since(t0), shard_.model->param_count());
    r.overruns = pacer_.take_overruns();
    r.overrun_ratio = pacer_.take_worst_ratio();
    r.overrun_seconds = pacer_.take_overrun_seconds();
    r.compute_flops = 3 * shard_.model->local_forward_flops(batch[q]) + kAdamWFlopsPerParameter * shard_.model->param_count();
  }
  if (r.samples > 0) {
    progress_.cursor += r.samples;
    ++progress_.steps;
  }
  r.link_overruns = pacer_.take_link_overruns();
  r.link_overrun_seconds = pacer_.take_link_overrun_seconds();
  if (pacer_.enabled() && trains)
    r.host_seconds = std::max(0.0, seconds_since(t_step) - pacer_.take_covered_seconds());
  r.phase_seconds = clock_.take();
  return r;
}

StepResult Trainer::step_in_passes(const std::vector<int>& passes) {
  if (topo_.replicas != 1 || topo_.stages != 1) throw std::logic_error("step_in_passes: one replica, one stage");
  replay_passes_ = passes;
  struct Clear {
    std::vector<int>& p;
    ~Clear() { p.clear(); }
  } clear{replay_passes_};
  return step({std::accumulate(passes.begin(), passes.end(), 0)});
}

void Trainer::dry_step() {
  StepResult r;
  const std::vector<int> batch = cfg_.batches();
  r.samples = std::accumulate(batch.begin(), batch.end(), 0LL);
  const int q = cfg_.replica_of(topo_.world_rank);
  if (r.samples > 0 && q >= 0 && shard_.model) gradients(batch, r, [](StepPoint) {});
  clock_.take();
}

// This replica's share of the step up to the update: samples, forward and backward of every
// micro-batch (through the pipeline's stages), the gradient sync across replicas, the global loss
// and gradient norm.
void Trainer::gradients(const std::vector<int>& batch, StepResult& r, const std::function<void(StepPoint)>& at) {
  const int T = o_.seq, q = cfg_.replica_of(topo_.world_rank);
  const int B = batch[q], M = cfg_.replicas[q].micro_batches;
  if (B % M != 0) throw std::logic_error(fmt::format("a batch of {} does not split into {} micro-batches", B, M));
  if (B / M > feed_.max_batch) throw std::logic_error("micro-batch exceeds the model's maximum");
  pacer_.set_speed(cfg_.replicas[q].speed);
  const long long first = progress_.cursor + std::accumulate(batch.begin(), batch.begin() + q, 0LL);
  const double global_tokens = double(r.samples) * T;
  {
    const auto t0 = Clock::now();
    shard_.model->zero_grads();
    pacer_.pace_pass(seconds_since(t0), shard_.model->param_count(), 0, sizeof(float));
  }
  double loss_sum = 0;
  if (replay_passes_.empty()) {
    loss_sum = pipeline(first, M, B / M, static_cast<float>(1.0 / global_tokens), at);
  } else {
    long long sample = first;
    for (int b : replay_passes_) {
      loss_sum += pipeline(sample, 1, b, static_cast<float>(1.0 / global_tokens), at);
      sample += b;
    }
  }
  const Model::RouterStats routed = shard_.model->take_router_stats();
  if (cfg_.tp_index_of(topo_.world_rank) == 0) {
    r.moe_kept = routed.kept, r.moe_dropped = routed.dropped, r.moe_load_max = routed.load_max;
    r.moe_tokens_per_expert.assign(routed.tokens_per_expert.begin(), routed.tokens_per_expert.end());
  }
  at(StepPoint::Sync);
  reduce_tied_embedding();
  shard_.sync->finish();
  const int stage = cfg_.stage_of(topo_.world_rank), P = topo_.stages;
  {
    // The global loss: the first rank of each replica's last stage contributes its replica's sum.
    PhaseScope s(clock_, Phase::DpComm);
    double contrib = cfg_.tp_index_of(topo_.world_rank) == 0 && stage == P - 1 ? loss_sum : 0.0;
    pacer_.wait_for_peers([&] { groups_.train->allreduce_sum(&contrib, 1); });
    r.loss = contrib / global_tokens;
  }
  double squares = shard_.sync->squared_norm(shard_.model->grads());
  if (groups_.pp) {
    // One partial per stage, summed in stage order: bitwise the same on every rank.
    PhaseScope s(clock_, Phase::Optimizer);
    std::vector<double> per_stage(P, 0.0);
    per_stage[stage] = squares;
    pacer_.wait_for_peers([&] { groups_.pp->allreduce_sum(per_stage.data(), per_stage.size()); });
    squares = 0;
    for (double v : per_stage) squares += v;
  }
  r.grad_norm = std::sqrt(squares);
  at(StepPoint::Optimizer);
}

// Megatron's non-interleaved 1F1B: stage s runs min(P - s - 1, M) forwards (warm-up), then
// alternates one forward and one backward, then runs the remaining backwards (cool-down). With one
// stage it is a forward and a backward per micro-batch. Gradients accumulate over the
// micro-batches; the last backward carries the gradient sync's observer, whose regroups start as
// that backward finishes each layer.
double Trainer::pipeline(long long first, int M, int b, float dloss, const std::function<void(StepPoint)>& at) {
  const int T = o_.seq, P = topo_.stages, s = cfg_.stage_of(topo_.world_rank), K = shard_.model->in_flight();
  const int prev = s > 0 ? s - 1 : -1, next = s < P - 1 ? s + 1 : -1;
  const std::size_t n = std::size_t(b) * T * o_.model.hidden;  // one micro-batch's activations
  double loss = 0;
  int forwards = 0, backwards = 0;
  auto receive_input = [&] {
    shard_.model->use_micro_batch(forwards % K);
    pp_transfer(nullptr, -1, shard_.model->stage_input(), prev, n);
  };
  auto forward = [&] {
    const int k = forwards++;
    shard_.model->use_micro_batch(k % K);
    if (k == 0) at(StepPoint::Forward);
    for (int i = 0; i < b; ++i)
      feed_.source->sample(first + std::int64_t(k) * b + i, T, &feed_.tokens[std::size_t(i) * T], &feed_.targets[std::size_t(i) * T]);
    loss += shard_.model->forward(feed_.tokens.data(), feed_.targets.data(), b);
  };
  auto backward = [&] {
    const int k = backwards++;
    shard_.model->use_micro_batch(k % K);
    if (k == 0) at(StepPoint::Backward);
    const bool last = k == M - 1;
    if (last) shard_.sync->begin(shard_.model->grads());
    shard_.model->backward(dloss, last ? shard_.sync.get() : nullptr);
  };
  const int warmup = std::min(P - s - 1, M), steady = M - warmup;
  for (int i = 0; i < warmup; ++i) {
    receive_input();
    forward();
    pp_transfer(shard_.model->stage_output(), next, nullptr, -1, n);
  }
  if (steady > 0) receive_input();
  for (int i = 0; i < steady; ++i) {
    forward();
    // The output goes on while the gradient of the oldest micro-batch in flight comes back.
    pp_transfer(shard_.model->stage_output(), next, shard_.model->boundary_grad(), next, n);
    backward();
    if (i == steady - 1) {
      pp_transfer(shard_.model->boundary_grad(), prev, nullptr, -1, n);
    } else {
      // The input gradient goes back while the next micro-batch's input comes in (the gradient
      // is scratch, the input belongs to the next slot).
      const float* grad = shard_.model->boundary_grad();
      shard_.model->use_micro_batch(forwards % K);
      pp_transfer(grad, prev, shard_.model->stage_input(), prev, n);
    }
  }
  for (int i = 0; i < warmup; ++i) {
    pp_transfer(nullptr, -1, shard_.model->boundary_grad(), next, n);
    backward();
    pp_transfer(shard_.model->boundary_grad(), prev, nullptr, -1, n);
  }
  return loss;
}

// Paced timing: a stage's transfer waits for its peer by design (the peer is still computing, and
// its pacing already makes that the emulated bubble). The two meet first, with a one-float
// exchange whose wait is the peer's lateness; the transfer's real time is then its copy alone,
// checked against its emulated link as every other transfer is (a late peer is not a slow link).
void Trainer::pp_transfer(const float* send, int dest, float* recv, int src, std::size_t n) {
  if (dest < 0 && src < 0) return;
  if (dest >= 0 && src >= 0 && dest != src) throw std::logic_error("pp_transfer: one peer per transfer");
  PhaseScope p(clock_, Phase::PpComm);
  if (pacer_.enabled()) {
    const int peer = dest >= 0 ? dest : src;
    float out = 0, in = 0;
    // The bubble: a wait for the other stage, by design.
    pacer_.wait_for_peers([&] { groups_.pp->sendrecv(&out, 1, peer, &in, 1, peer); });
  }
  const auto t0 = Clock::now();
  groups_.pp->sendrecv(send, dest >= 0 ? n : 0, dest, recv, src >= 0 ? n : 0, src);
  // Stages sit in different scale-up domains: their transfers take the scale-out link.
  pacer_.pace_transfer(seconds_since(t0), double(n) * sizeof(float), 1, Link::Dp, Traffic::Activations);
}

void Trainer::reduce_tied_embedding() {
  if (!groups_.embed) return;
  PhaseScope p(clock_, Phase::PpComm);
  const int t = tied_tensor(o_.model);
  const long n = shard_.model->layout().slot(t).elems;
  if (pacer_.enabled())  // the first stage ends its backward last: meet it first (pp_transfer)
    pacer_.wait_for_peers([&] { groups_.embed->barrier(); });
  const auto t0 = Clock::now();
  groups_.embed->allreduce_sum(shard_.model->grad(t), std::size_t(n));
  pacer_.pace_transfer(seconds_since(t0), double(n) * sizeof(float), 2, Link::Dp, Traffic::Parameters);  // a two-rank all-reduce
}

bool Trainer::save_checkpoint(const std::string& path) {
  int source = -1;
  for (int q = 0; q < topo_.replicas && source < 0; ++q)
    if (cfg_.replicas[q].active()) source = q;
  if (source < 0) return false;
  if (groups_.live) {
    const auto& rp = cfg_.replicas[source];
    std::vector<int> live_rank(topo_.world_size, -1);
    for (int r = 0, k = 0; r < topo_.world_size; ++r)
      if (cfg_.alive[r]) live_rank[r] = k++;
    std::vector<int> ranks;
    for (int w : rp.ranks) ranks.push_back(live_rank[w]);
    const SourceOwners owners = owners_in_replica(o_.model, rp.layout, ranks, rp.stages);
    CheckpointMeta meta{progress_.steps, progress_.cursor, true};
    // Live ranks outside the source replica take part in the exchange with nothing to send.
    ntp::save_checkpoint(path, *groups_.live, ranks[0], owners, o_.model, shard_.model.get(), shard_.opt.get(), meta);
  }
  restart_point_.path = path;
  return true;
}

void Trainer::load_checkpoint(const std::string& path, bool weights_only) {
  if (!shard_.model) return;
  const CheckpointMeta meta = ntp::load_checkpoint(path, *shard_.model, weights_only ? nullptr : shard_.opt.get());
  if (!weights_only && meta.has_optimizer) {
    progress_.cursor = meta.samples_consumed;
    progress_.steps = meta.step;
  }
  restart_point_.initial.cursor = progress_.cursor;
  restart_point_.initial.steps = progress_.steps;
}

}  // namespace ntp
