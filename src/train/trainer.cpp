#include "trainer.hpp"


#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <numeric>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "comm_staged.hpp"
#include "h5.hpp"
#include "ntp_layout.hpp"
#include "reshard.hpp"

namespace ntp {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
constexpr ShardDim kDims[3] = {ShardDim::Heads, ShardDim::Mlp, ShardDim::Vocab};
}  // namespace

Trainer::Trainer(const Options& o, Comm& world, int max_batch)
    : o_(o), world_(world), topo_(world.size(), world.rank(), o.tp), policy_(parse_policy(o.policy)),
      max_batch_(max_batch), pacer_(o.pacing) {
  // While a paced rank sleeps (its emulated device computing), the sync's exchanges progress.
  pacer_.set_background([this] {
    if (sync_) sync_->progress();
  });
  // The CUDA backend reads this when it picks a GPU (src/backend_cuda.cu).
  if (o.allow_gpu_sharing) setenv("NTPBENCH_ALLOW_GPU_SHARING", "1", 1);
  backend_ = make_backend(o.backend, o.backend == "cpu" ? 0 : world.split_node()->rank(), parse_precision(o.precision));
  stage_device_buffers_ = o.backend != "cpu" && o.allow_gpu_sharing;
  data_ = make_data(o.data, o.model.vocab, o.seq, o.seed);
  cfg_ = plan_configuration(policy_, topo_, o.model, o.micro_batch, o.pacing.boost,
                            std::vector<char>(world.size(), 1));
  valid_.assign(topo_.replicas, 1);
  build_comms();
  const int q = cfg_.replica_of(world.rank());
  model_ = make_model(cfg_.replicas[q], cfg_.tp_index_of(world.rank()));
  model_->init_params(o.seed);
  opt_ = std::make_unique<AdamW>(*backend_, model_->layout(), o.opt);
  sync_ = std::make_unique<GradSync>(cfg_, q, cfg_.tp_index_of(world.rank()), *tp_, slot_.get(), model_->layout(),
                                     *backend_, clock_, pacer_);
  tokens_.resize(std::size_t(max_batch) * o.seq);
  targets_.resize(tokens_.size());
}

Trainer::~Trainer() = default;

std::string Trainer::communication() const {
  if (o_.backend == "cpu") return "MPI";
  if (stage_device_buffers_)
    return "MPI with host staging of device buffers (--allow-gpu-sharing: NCCL refuses two ranks on one GPU)";
  return "NCCL for device buffers (one communicator per TP group and sync slot, rebuilt at every membership "
         "change), MPI for host data";
}

void Trainer::build_comms() {
  const int me = world_.rank();
  const bool alive = cfg_.alive[me] != 0;
  live_ = world_.split(alive ? 0 : -1, me);
  const int q = cfg_.replica_of(me), idx = cfg_.tp_index_of(me);
  // The groups that carry device buffers (activations, gradient chunks) are staged through host
  // memory where the world cannot take device pointers (see communication()).
  auto device_capable = [&](std::unique_ptr<Comm> c) {
    return stage_device_buffers_ && c ? make_host_staged_comm(std::move(c), *backend_) : std::move(c);
  };
  tp_ = device_capable(world_.split(q, idx));
  train_ = world_.split(q >= 0 ? 0 : -1, me);
  // Sync slot i: TP index i of every active replica, for i < n2 (the extras sit out).
  slot_ = device_capable(world_.split(q >= 0 && idx < cfg_.n2 ? idx : -1, q));
}

std::unique_ptr<GptModel> Trainer::make_model(const ReplicaPlan& rp, int tp_index) {
  auto m = std::make_unique<GptModel>(*backend_, o_.model, rp.layout, tp_index, *tp_, max_batch_, o_.seq);
  m->set_clock(&clock_);
  m->set_pacer(&pacer_);
  return m;
}

// Is every unit of every sharded dimension held by a live rank of a replica whose state is
// current (it trained the last step)? Replicated tensors then survive too.
bool Trainer::current_state_survives(const Configuration& old_cfg, const std::vector<char>& old_valid,
                                     const std::vector<char>& alive) const {
  const ModelConfig& m = o_.model;
  std::vector<char> held[3] = {std::vector<char>(m.heads, 0), std::vector<char>(m.mlp(), 0),
                               std::vector<char>(m.vocab, 0)};
  bool any = false;
  for (int q = 0; q < topo_.replicas; ++q) {
    const auto& rp = old_cfg.replicas[q];
    if (!old_valid[q] || !rp.active()) continue;
    for (int k = 0; k < 3; ++k) {
      const auto& map = rp.layout.map(kDims[k]);
      for (int u = 0; u < map.units(); ++u)
        if (alive[rp.ranks[map.owner(u)]]) held[k][u] = 1, any = true;
    }
  }
  for (const auto& h : held)
    if (!std::all_of(h.begin(), h.end(), [](char c) { return c != 0; })) return false;
  return any;
}

Recovery Trainer::reconfigure(const std::vector<char>& alive) {
  Recovery rec;
  const int me = world_.rank();
  PhaseScope phase(clock_, Phase::Recovery);
  // Detect: one agreement round in which every rank states whether it is alive (after a barrier,
  // so that it does not also time the skew left by the previous step).
  world_.barrier();
  auto t0 = Clock::now();
  const std::vector<int> stated = world_.allgather(alive[me] ? 1 : 0);
  for (int r = 0; r < world_.size(); ++r)
    if ((stated[r] != 0) != (alive[r] != 0)) throw std::logic_error("ranks disagree about the membership");
  rec.detect = since(t0);

  t0 = Clock::now();
  const Configuration old_cfg = cfg_;
  const std::vector<char> old_valid = valid_;
  cfg_ = plan_configuration(policy_, topo_, o_.model, o_.micro_batch, o_.pacing.boost, alive);
  rec.before = old_cfg.degrees();
  rec.after = cfg_.degrees();
  rec.changed = true;
  std::unique_ptr<Comm> old_tp = std::move(tp_);  // kept alive while old models may still reference it
  build_comms();
  rec.reconfigure = since(t0);

  t0 = Clock::now();
  if (cfg_.active_replicas() == 0) {
    // Nobody trains: every state goes stale and is dropped.
    sync_.reset(), opt_.reset(), model_.reset();
    valid_.assign(topo_.replicas, 0);
  } else {
    const bool complete = current_state_survives(old_cfg, old_valid, alive);
    if (complete)
      heal(old_cfg, old_valid, rec);
    else
      restore(rec);
    valid_.assign(topo_.replicas, 0);
    for (int q = 0; q < topo_.replicas; ++q) valid_[q] = cfg_.replicas[q].active();
  }
  const int q = cfg_.replica_of(me);
  if (q >= 0)
    sync_ = std::make_unique<GradSync>(cfg_, q, cfg_.tp_index_of(me), *tp_, slot_.get(), model_->layout(), *backend_,
                                       clock_, pacer_);
  else
    sync_.reset();
  rec.heal = since(t0);
  old_tp.reset();
  world_.barrier();  // everyone starts the next step together
  return rec;
}

// Moves every shard a changed replica needs from a live, current holder: its own old owner when
// that rank lives, otherwise the owner in the first current replica. One reshard per dimension
// and replica over the live ranks, params and both AdamW moments together.
void Trainer::heal(const Configuration& old_cfg, const std::vector<char>& old_valid, Recovery& rec) {
  const int me = world_.rank();
  const auto& alive = cfg_.alive;
  if (!live_) {  // this rank is dead: it frees everything and takes no part
    sync_.reset(), opt_.reset(), model_.reset();
    return;
  }
  const auto specs = gpt2_tensors(o_.model);
  // World rank -> rank in live_ (split ordered by world rank).
  std::vector<int> live_rank(world_.size(), kNowhere);
  for (int r = 0, k = 0; r < world_.size(); ++r)
    if (alive[r]) live_rank[r] = k++;

  const int my_old_q = old_cfg.replica_of(me);
  const bool i_hold = my_old_q >= 0 && old_valid[my_old_q] && alive[me] && model_;
  const int new_q = cfg_.replica_of(me);

  std::vector<char> changed(topo_.replicas, 0);
  for (int q = 0; q < topo_.replicas; ++q) {
    const auto& n = cfg_.replicas[q];
    const auto& o = old_cfg.replicas[q];
    changed[q] = n.active() && (!old_valid[q] || !o.active() || n.ranks != o.ranks ||
                                !(n.layout.heads == o.layout.heads && n.layout.mlp == o.layout.mlp &&
                                  n.layout.vocab == o.layout.vocab));
  }
  std::unique_ptr<GptModel> fresh;
  std::unique_ptr<AdamW> fresh_opt;
  if (new_q >= 0 && changed[new_q]) {
    fresh = make_model(cfg_.replicas[new_q], cfg_.tp_index_of(me));
    fresh_opt = std::make_unique<AdamW>(*backend_, fresh->layout(), o_.opt);
    fresh_opt->set_steps_taken(steps_);
  }

  for (int q = 0; q < topo_.replicas; ++q) {
    if (!changed[q]) continue;
    const auto& target = cfg_.replicas[q];
    // The source of a unit: the replica's own old owner if current and alive, else the first
    // current replica whose owner lives.
    auto source = [&](ShardDim d, int u) {
      if (old_valid[q] && old_cfg.replicas[q].active()) {
        const auto& o = old_cfg.replicas[q];
        const int w = o.ranks[o.layout.map(d).owner(u)];
        if (alive[w]) return w;
      }
      for (int p = 0; p < topo_.replicas; ++p) {
        const auto& o = old_cfg.replicas[p];
        if (!old_valid[p] || !o.active()) continue;
        const int w = o.ranks[o.layout.map(d).owner(u)];
        if (alive[w]) return w;
      }
      return kNowhere;
    };
    // One exchange per target replica: a segment per sharded dimension, and one for the
    // replicated tensors.
    std::vector<ReshardPlan> parts;
    std::vector<ReshardTensor> tensors;
    for (int k = 0; k < 3; ++k) {
      const ShardDim d = kDims[k];
      const int units = target.layout.map(d).units();
      std::vector<int> src(units), dst(units);
      for (int u = 0; u < units; ++u) {
        src[u] = live_rank[source(d, u)];
        dst[u] = live_rank[target.ranks[target.layout.map(d).owner(u)]];
      }
      std::vector<int> rows;
      if (i_hold) rows = old_cfg.replicas[my_old_q].layout.map(d).local_rows(old_cfg.tp_index_of(me));
      parts.emplace_back(src, dst, live_->rank(), live_->size(), i_hold ? &rows : nullptr);
      for (int t = 0; t < static_cast<int>(specs.size()); ++t) {
        if (specs[t].dim != d) continue;
        const long ue = specs[t].unit_elems;
        const float* s[3] = {nullptr, nullptr, nullptr};
        float* o[3] = {nullptr, nullptr, nullptr};
        if (i_hold) {
          const std::size_t off = model_->layout().slot(t).offset;
          s[0] = model_->params() + off, s[1] = opt_->m() + off, s[2] = opt_->v() + off;
        }
        if (new_q == q) {
          const std::size_t off = fresh->layout().slot(t).offset;
          o[0] = fresh->params() + off, o[1] = fresh_opt->m() + off, o[2] = fresh_opt->v() + off;
        }
        for (int j = 0; j < 3; ++j) tensors.push_back({s[j], o[j], ue, k});
      }
    }
    // Replicated tensors: one copy per rank of the target, each from the rank itself when it
    // holds a current copy, else from the first live rank of a current replica.
    {
      const int n = target.degree();
      int donor = kNowhere;
      for (int p = 0; p < topo_.replicas && donor == kNowhere; ++p)
        if (old_valid[p] && old_cfg.replicas[p].active())
          for (int w : old_cfg.replicas[p].ranks)
            if (alive[w]) {
              donor = w;
              break;
            }
      std::vector<int> src(n), dst(n), rows(n, -1);
      for (int j = 0; j < n; ++j) {
        const int w = target.ranks[j];
        const int oq = old_cfg.replica_of(w);
        const bool own = oq >= 0 && old_valid[oq];
        src[j] = live_rank[own ? w : donor];
        dst[j] = live_rank[w];
        if (src[j] == live_->rank()) rows[j] = 0;  // every copy it serves comes from its one buffer
      }
      parts.emplace_back(src, dst, live_->rank(), live_->size(), i_hold ? &rows : nullptr);
      for (int t = 0; t < static_cast<int>(specs.size()); ++t) {
        if (specs[t].dim != ShardDim::Replicated) continue;
        const long ue = specs[t].unit_elems;
        for (int j = 0; j < 3; ++j) {
          const float* s = nullptr;
          float* o = nullptr;
          if (i_hold) {
            const std::size_t off = model_->layout().slot(t).offset;
            s = (j == 0 ? model_->params() : j == 1 ? opt_->m() : opt_->v()) + off;
          }
          if (new_q == q) {
            const std::size_t off = fresh->layout().slot(t).offset;
            o = (j == 0 ? fresh->params() : j == 1 ? fresh_opt->m() : fresh_opt->v()) + off;
          }
          tensors.push_back({s, o, ue, 3});
        }
      }
    }
    rec.heal_bytes += reshard(*live_, ReshardPlan::combine(parts), tensors, backend_.get());
  }
  if (fresh) {
    sync_.reset();
    model_ = std::move(fresh);
    opt_ = std::move(fresh_opt);
  } else if (new_q >= 0) {
    model_->set_tp_comm(*tp_);  // unchanged replica: same shards, new communicator
  } else {
    sync_.reset(), opt_.reset(), model_.reset();  // dead, or in a replica that stopped
  }
}

// No live replica holds every shard: every active replica reloads the last checkpoint (or the
// initial state) and the steps since are lost.
void Trainer::restore(Recovery& rec) {
  const int me = world_.rank();
  sync_.reset(), opt_.reset(), model_.reset();
  rec.restored = true;
  rec.restored_from = restore_path_.empty() ? "initial state" : restore_path_;
  const int q = cfg_.replica_of(me);
  long long cursor = initial_cursor_;
  int steps = initial_steps_;
  if (!restore_path_.empty()) {
    // Every rank agrees on the restore point from the file's attributes.
    h5::File f(restore_path_, h5::Mode::ReadOnly);
    steps = static_cast<int>(h5::get_attr_int(f.id(), "/", "step"));
    cursor = h5::get_attr_int(f.id(), "/", "samples_consumed");
  }
  if (q >= 0) {
    model_ = make_model(cfg_.replicas[q], cfg_.tp_index_of(me));
    opt_ = std::make_unique<AdamW>(*backend_, model_->layout(), o_.opt);
    if (!restore_path_.empty()) {
      ntp::load_checkpoint(restore_path_, *model_, opt_.get());
      rec.heal_bytes = double(model_->param_count()) * 3 * sizeof(float);
    } else {
      model_->init_params(o_.seed);
      if (!o_.init_from.empty()) ntp::load_checkpoint(o_.init_from, *model_, o_.init_weights_only ? nullptr : opt_.get());
      opt_->set_steps_taken(initial_steps_);
    }
  }
  cursor_ = cursor;
  steps_ = steps;
  rec.restored_step = steps;
}

StepResult Trainer::step() { return step(cfg_.batches()); }

StepResult Trainer::step(const std::vector<int>& batch) {
  if (static_cast<int>(batch.size()) != topo_.replicas) throw std::logic_error("one batch size per replica");
  StepResult r;
  const int T = o_.seq, me = world_.rank();
  r.sample_begin = cursor_;
  r.samples = std::accumulate(batch.begin(), batch.end(), 0LL);
  r.lr = o_.opt.lr_at(steps_ + 1);
  if (r.samples == 0) {
    r.phase_seconds = clock_.take();
    return r;
  }
  const int q = cfg_.replica_of(me);
  if (q >= 0 && model_) {
    r.trained = true;
    const int B = batch[q];
    if (B > max_batch_) throw std::logic_error("batch exceeds the model's maximum");
    pacer_.set_speed(cfg_.replicas[q].speed);
    const long long first = cursor_ + std::accumulate(batch.begin(), batch.begin() + q, 0LL);
    for (int b = 0; b < B; ++b)
      data_->sample(first + b, T, &tokens_[std::size_t(b) * T], &targets_[std::size_t(b) * T]);
    model_->zero_grads();
    double loss_sum = model_->forward(tokens_.data(), targets_.data(), B);
    const double global_tokens = double(r.samples) * T;
    sync_->begin(model_->grads());
    model_->backward(static_cast<float>(1.0 / global_tokens), sync_.get());  // regroups start here
    sync_->finish();
    {
      // The global loss: each replica's first rank contributes its replica's sum.
      PhaseScope s(clock_, Phase::DpComm);
      double contrib = cfg_.tp_index_of(me) == 0 ? loss_sum : 0.0;
      train_->allreduce_sum(&contrib, 1);
      r.loss = contrib / global_tokens;
    }
    r.grad_norm = sync_->global_norm(model_->grads());
    {
      PhaseScope s(clock_, Phase::Optimizer);
      const auto t0 = Clock::now();
      opt_->step(model_->params(), model_->grads(), clip_scale(r.grad_norm, o_.opt.clip), float(r.lr));
      // AdamW: about a dozen FLOPs per parameter.
      pacer_.pace_compute(since(t0), 12.0 * model_->param_count());
    }
    r.overruns = pacer_.take_overruns();
  }
  cursor_ += r.samples;
  ++steps_;
  r.phase_seconds = clock_.take();
  return r;
}

bool Trainer::save_checkpoint(const std::string& path) {
  if (!live_) return false;
  int source = -1;
  for (int q = 0; q < topo_.replicas && source < 0; ++q)
    if (cfg_.replicas[q].active()) source = q;
  if (source < 0) return false;
  const auto& rp = cfg_.replicas[source];
  std::vector<int> live_rank(world_.size(), -1);
  for (int r = 0, k = 0; r < world_.size(); ++r)
    if (cfg_.alive[r]) live_rank[r] = k++;
  std::vector<int> ranks;
  for (int w : rp.ranks) ranks.push_back(live_rank[w]);
  const SourceOwners owners = owners_in_replica(rp.layout, ranks);
  CheckpointMeta meta{steps_, cursor_, true};
  // Live ranks outside the source replica take part in the exchange with nothing to send.
  ntp::save_checkpoint(path, *live_, ranks[0], owners, o_.model, model_.get(), opt_.get(), meta);
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
