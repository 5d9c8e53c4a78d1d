#include "trainer.hpp"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <stdexcept>
#include <thread>

#include <cblas.h>
#include <fmt/format.h>

namespace ntp {

Topology::Topology(int world_size_, int world_rank_, int tp_)
    : world_size(world_size_), world_rank(world_rank_), tp(tp_) {
  if (tp < 1 || world_size % tp != 0)
    throw std::invalid_argument(fmt::format("--tp {} does not divide the {} ranks of this job", tp, world_size));
  replicas = world_size / tp;
  replica = world_rank / tp;
  slot = world_rank % tp;
}

std::vector<int> Topology::replica_ranks(int r) const {
  std::vector<int> ranks(tp);
  std::iota(ranks.begin(), ranks.end(), r * tp);
  return ranks;
}

Trainer::Trainer(const Options& o, Comm& world, int max_batch)
    : o_(o), world_(world), topo_(world.size(), world.rank(), o.tp) {
  tp_comm_ = world_.split(topo_.replica, topo_.slot);
  dp_comm_ = world_.split(topo_.slot, topo_.replica);
  backend_ = make_cpu_backend();
  const TpLayout layout = TpLayout::even(o.model, o.tp);
  model_ = std::make_unique<GptModel>(*backend_, o.model, layout, topo_.slot, *tp_comm_, max_batch, o.seq);
  model_->set_clock(&clock_);
  opt_ = std::make_unique<AdamW>(*backend_, model_->layout(), o.opt);
  data_ = make_data(o.data, o.model.vocab, o.seq, o.seed);
  model_->init_params(o.seed);
  tokens_.resize(std::size_t(max_batch) * o.seq);
  targets_.resize(tokens_.size());
}

StepResult Trainer::step(const std::vector<int>& batch) {
  if (static_cast<int>(batch.size()) != topo_.replicas) throw std::logic_error("one batch size per replica");
  StepResult r;
  clock_.take();  // start this step's phase accounting
  const int T = o_.seq, B = batch[topo_.replica];
  r.sample_begin = cursor_;
  r.samples = std::accumulate(batch.begin(), batch.end(), 0LL);
  const long long first = cursor_ + std::accumulate(batch.begin(), batch.begin() + topo_.replica, 0LL);
  for (int b = 0; b < B; ++b) data_->sample(first + b, T, &tokens_[std::size_t(b) * T], &targets_[std::size_t(b) * T]);

  model_->zero_grads();
  double loss_sum = model_->forward(tokens_.data(), targets_.data(), B);
  const double global_tokens = double(r.samples) * T;
  model_->backward(static_cast<float>(1.0 / global_tokens));
  {
    PhaseScope s(clock_, Phase::DpComm);
    dp_comm_->allreduce_sum(model_->grads(), model_->param_count());
    dp_comm_->allreduce_sum(&loss_sum, 1);
  }
  {
    PhaseScope s(clock_, Phase::Optimizer);
    r.grad_norm = opt_->grad_norm(model_->grads(), *tp_comm_);
    r.lr = o_.opt.lr_at(opt_->steps_taken() + 1);
    opt_->step(model_->params(), model_->grads(), clip_scale(r.grad_norm, o_.opt.clip), float(r.lr));
  }
  r.loss = loss_sum / global_tokens;
  cursor_ += r.samples;
  r.phase_seconds = clock_.take();
  return r;
}

void Trainer::save_checkpoint(const std::string& path) {
  CheckpointMeta meta{opt_->steps_taken(), cursor_, true};
  ntp::save_checkpoint(path, world_, 0, owners_in_replica(model_->layout().tp(), topo_.replica_ranks(0)), *model_,
                       *opt_, meta);
}

void Trainer::load_checkpoint(const std::string& path, bool weights_only) {
  const CheckpointMeta meta = ntp::load_checkpoint(path, *model_, weights_only ? nullptr : opt_.get());
  if (!weights_only && meta.has_optimizer) cursor_ = meta.samples_consumed;
}

int configure_threads(int requested) {
  int n = requested;
  if (n <= 0) {
    auto node = node_comm();
    cpu_set_t set;
    const int allowed = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                                      : int(std::thread::hardware_concurrency());
    const int cores = std::max(1u, std::thread::hardware_concurrency());
    n = std::max(1, std::min(allowed, cores / node->size()));
  }
  openblas_set_num_threads(n);
  omp_set_num_threads(n);
  return n;
}

double measure_sgemm_gflops() {
  const int n = 384;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(),
                n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n / s / 1e9);
  }
  return best;
}

}  // namespace ntp
