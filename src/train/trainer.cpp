#include "trainer.hpp"


#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "comm_staged.hpp"
#include "ntp_layout.hpp"

namespace ntp {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

Trainer::Trainer(const Options& o, Comm& world, int max_batch)
    : o_(o), group_(&world), me_(world.rank()), n_(world.size()), topo_(n_, me_, o.tp),
      policy_(parse_policy(o.policy)), max_batch_(max_batch), pacer_(o.pacing) {
  // While a paced rank sleeps (its emulated device computing), the sync's exchanges progress.
  pacer_.set_background([this] {
    if (sync_) sync_->progress();
  });
  // The CUDA backend reads this when it picks a GPU (src/backend/backend_cuda.cu).
  if (o.allow_gpu_sharing) setenv("NTPBENCH_ALLOW_GPU_SHARING", "1", 1);
  backend_ = make_backend(o.backend, o.backend == "cpu" ? 0 : world.split_node()->rank(), parse_precision(o.precision));
  stage_device_buffers_ = o.backend != "cpu" && o.allow_gpu_sharing;
  data_ = make_data(o.data, o.model.vocab, o.seq, o.seed);
  cfg_ = plan_configuration(policy_, topo_, o.model, o.micro_batch, o.pacing.boost, std::vector<char>(n_, 1));
  valid_.assign(topo_.replicas, 1);
  build_comms();
  const int q = cfg_.replica_of(me_);
  model_ = make_model(cfg_.replicas[q], cfg_.tp_index_of(me_));
  model_->init_params(o.seed);
  opt_ = std::make_unique<AdamW>(*backend_, model_->layout(), o.opt);
  sync_ = std::make_unique<GradSync>(cfg_, q, cfg_.tp_index_of(me_), *tp_, slot_.get(), model_->layout(), *backend_,
                                     clock_, pacer_);
  tokens_.resize(std::size_t(max_batch) * o.seq);
  targets_.resize(tokens_.size());
}

Trainer::Trainer(const Options& o, Comm& group, int max_batch, const JoinState& join)
    : o_(o), group_(&group), me_(join.logical_rank), n_(static_cast<int>(join.alive.size())),
      topo_(n_, me_, o.tp), policy_(parse_policy(o.policy)), max_batch_(max_batch), pacer_(o.pacing) {
  pacer_.set_background([this] {
    if (sync_) sync_->progress();
  });
  // Only the CPU backend joins this way (--kill-mode signal is refused with GPUs).
  backend_ = make_backend(o.backend, 0, parse_precision(o.precision));
  data_ = make_data(o.data, o.model.vocab, o.seq, o.seed);
  cfg_ = plan_configuration(policy_, topo_, o.model, o.micro_batch, o.pacing.boost, join.alive);
  valid_ = join.valid;
  cursor_ = join.cursor, steps_ = join.steps;
  initial_cursor_ = join.initial_cursor, initial_steps_ = join.initial_steps;
  restore_path_ = join.restore_path;
  tokens_.resize(std::size_t(max_batch) * o.seq);
  targets_.resize(tokens_.size());
}

JoinState Trainer::join_state(int logical_rank) const {
  return {logical_rank, cfg_.alive, valid_, cursor_, initial_cursor_, steps_, initial_steps_, restore_path_};
}

void Trainer::revoke_all() {
  for (Comm* c : {group_, live_.get(), tp_.get(), train_.get(), slot_.get()})
    if (c) c->revoke();
}

Trainer::~Trainer() = default;

std::string Trainer::communication() const {
  if (o_.backend == "cpu") return "MPI";
  if (stage_device_buffers_)
    return "MPI with host staging of device buffers (--allow-gpu-sharing: NCCL refuses two ranks on one GPU)";
  return "NCCL for device buffers (one communicator per TP group and sync slot, rebuilt at every membership "
         "change), MPI for host data";
}

namespace {
// Do all members of `c` run on one host? (Collective: the extremes of a hash of each host name.)
bool on_one_host(Comm& c) {
  const double h = static_cast<double>(std::hash<std::string>{}(host_name()) & ((1ULL << 52) - 1));
  double v[2] = {h, -h};
  c.allreduce_max(v, 2);
  return v[0] == -v[1];
}
}  // namespace

// Paced timing on a job spread over several hosts: a group's transfers take the scale-up link when
// all its members share a host, else the scale-out link (pacer.hpp). On one host the default
// stands: the TP group is the emulated node.
void Trainer::route_links() {
  if (!o_.pacing.enabled || on_one_host(*group_)) return;
  if (tp_) pacer_.set_route(Link::Tp, on_one_host(*tp_) ? Link::Tp : Link::Dp);
  if (slot_) pacer_.set_route(Link::Dp, on_one_host(*slot_) ? Link::Tp : Link::Dp);
}

void Trainer::build_comms() {
  const int me = me_;
  const bool alive = cfg_.alive[me] != 0;
  live_ = group_->split(alive ? 0 : -1, me);
  const int q = cfg_.replica_of(me), idx = cfg_.tp_index_of(me);
  // The groups that carry device buffers (activations, gradient chunks) are staged through host
  // memory where the world cannot take device pointers (see communication()).
  auto device_capable = [&](std::unique_ptr<Comm> c) {
    return stage_device_buffers_ && c ? make_host_staged_comm(std::move(c), *backend_) : std::move(c);
  };
  tp_ = device_capable(group_->split(q, idx));
  train_ = group_->split(q >= 0 ? 0 : -1, me);
  // Sync slot i: TP index i of every active replica, for i < n2 (the extras sit out).
  slot_ = device_capable(group_->split(q >= 0 && idx < cfg_.n2 ? idx : -1, q));
  route_links();
}

std::unique_ptr<Model> Trainer::make_model(const ReplicaPlan& rp, int tp_index) {
  auto m = ntp::make_model(*backend_, o_.model, rp.layout, tp_index, *tp_, max_batch_, o_.seq);
  m->set_clock(&clock_);
  m->set_pacer(&pacer_);
  return m;
}

StepResult Trainer::step() { return step(cfg_.batches()); }

StepResult Trainer::step(const std::vector<int>& batch) {
  if (static_cast<int>(batch.size()) != topo_.replicas) throw std::logic_error("one batch size per replica");
  StepResult r;
  r.sample_begin = cursor_;
  r.samples = std::accumulate(batch.begin(), batch.end(), 0LL);
  r.lr = o_.opt.lr_at(steps_ + 1);
  const int q = cfg_.replica_of(me_);
  const bool trains = r.samples > 0 && q >= 0 && model_;
  auto at = [&](StepPoint p) {
    if (hook_) hook_(p);
  };
  if (trains) {
    r.trained = true;
    gradients(batch, r, at);
  } else {
    for (StepPoint p : {StepPoint::Forward, StepPoint::Backward, StepPoint::Sync, StepPoint::Optimizer}) at(p);
  }
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
  if (agree_commit_) {
    PhaseScope s(clock_, Phase::DpComm);
    if (!group_->agree(true)) throw CommitRefused("the step did not commit: a rank failed during it");
  }
  if (r.nonfinite) {
    // --on-nonfinite skip: the batch is consumed without an update; stop: nothing advances (the
    // driver ends the run).
    if (o_.on_nonfinite == "skip") cursor_ += r.samples;
    r.phase_seconds = clock_.take();
    return r;
  }
  if (trains) {
    PhaseScope s(clock_, Phase::Optimizer);
    const auto t0 = Clock::now();
    opt_->step(model_->params(), model_->grads(), clip_scale(r.grad_norm, o_.opt.clip), float(r.lr));
    // AdamW: about a dozen FLOPs per parameter.
    pacer_.pace_compute(since(t0), 12.0 * model_->param_count());
    r.overruns = pacer_.take_overruns();
  }
  if (r.samples > 0) {
    cursor_ += r.samples;
    ++steps_;
  }
  r.phase_seconds = clock_.take();
  return r;
}

// This replica's share of the step up to the update: samples, forward, backward with the
// gradient sync across replicas, the global loss and gradient norm.
void Trainer::gradients(const std::vector<int>& batch, StepResult& r, const std::function<void(StepPoint)>& at) {
  const int T = o_.seq, q = cfg_.replica_of(me_);
  const int B = batch[q];
  if (B > max_batch_) throw std::logic_error("batch exceeds the model's maximum");
  pacer_.set_speed(cfg_.replicas[q].speed);
  const long long first = cursor_ + std::accumulate(batch.begin(), batch.begin() + q, 0LL);
  for (int b = 0; b < B; ++b) data_->sample(first + b, T, &tokens_[std::size_t(b) * T], &targets_[std::size_t(b) * T]);
  model_->zero_grads();
  at(StepPoint::Forward);
  double loss_sum = model_->forward(tokens_.data(), targets_.data(), B);
  const double global_tokens = double(r.samples) * T;
  at(StepPoint::Backward);
  sync_->begin(model_->grads());
  model_->backward(static_cast<float>(1.0 / global_tokens), sync_.get());  // regroups start here
  at(StepPoint::Sync);
  sync_->finish();
  {
    // The global loss: each replica's first rank contributes its replica's sum.
    PhaseScope s(clock_, Phase::DpComm);
    double contrib = cfg_.tp_index_of(me_) == 0 ? loss_sum : 0.0;
    train_->allreduce_sum(&contrib, 1);
    r.loss = contrib / global_tokens;
  }
  r.grad_norm = sync_->global_norm(model_->grads());
  at(StepPoint::Optimizer);
}

bool Trainer::save_checkpoint(const std::string& path) {
  int source = -1;
  for (int q = 0; q < topo_.replicas && source < 0; ++q)
    if (cfg_.replicas[q].active()) source = q;
  if (source < 0) return false;
  if (live_) {
    const auto& rp = cfg_.replicas[source];
    std::vector<int> live_rank(n_, -1);
    for (int r = 0, k = 0; r < n_; ++r)
      if (cfg_.alive[r]) live_rank[r] = k++;
    std::vector<int> ranks;
    for (int w : rp.ranks) ranks.push_back(live_rank[w]);
    const SourceOwners owners = owners_in_replica(rp.layout, ranks);
    CheckpointMeta meta{steps_, cursor_, true};
    // Live ranks outside the source replica take part in the exchange with nothing to send.
    ntp::save_checkpoint(path, *live_, ranks[0], owners, o_.model, model_.get(), opt_.get(), meta);
  }
  restore_path_ = path;
  return true;
}

void Trainer::load_checkpoint(const std::string& path, bool weights_only) {
  if (!model_) return;
  const CheckpointMeta meta = ntp::load_checkpoint(path, *model_, weights_only ? nullptr : opt_.get());
  if (!weights_only && meta.has_optimizer) {
    cursor_ = meta.samples_consumed;
    steps_ = meta.step;
  }
  initial_cursor_ = cursor_;
  initial_steps_ = steps_;
}

}  // namespace ntp
