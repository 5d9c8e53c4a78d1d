#include "model.hpp"

#include <stdexcept>
#include <string>


namespace ntp {

Model::Model(Backend& backend, const ModelConfig& m, const TpLayout& tp, int tp_rank, Comm& tp_comm, int max_batch,
             int seq, const StageRange& stage, int in_flight)
    : be_(backend), m_(m), layout_(m, tp, tp_rank, stage), tp_(&tp_comm), max_batch_(max_batch), T_(seq) {
  if (in_flight < 1) throw std::invalid_argument("a model keeps at least one micro-batch in flight");
  slots_.in_flight = in_flight;
  if (tp_comm.size() != tp.degree())
    throw std::invalid_argument("TP communicator size does not match the layout's degree");
  if (seq < 1 || seq > m.context)
    throw std::invalid_argument("sequence length " + std::to_string(seq) + " must be between 1 and the context (" +
                                std::to_string(m.context) + ")");
  mem_.params = Arena(be_, layout_.total());
  mem_.grads = Arena(be_, layout_.total());
  const std::size_t BT = std::size_t(max_batch) * seq;
  slots_.tokens = be_.allocate_ints(BT * in_flight);
  slots_.targets = be_.allocate_ints(BT * in_flight);
  ids_.tokens = slots_.tokens, ids_.targets = slots_.targets;
  slots_.batch.assign(in_flight, 0);
  ids_.vocab_rows = be_.allocate_ints(m.vocab);
  const std::vector<int> rows = tp.map(ShardDim::Vocab).local_rows(tp_rank);
  be_.ints_from_host(ids_.vocab_rows, rows.data(), rows.size());
  host_losses_.resize(BT);
}

Model::~Model() {
  be_.release_ints(slots_.tokens);
  be_.release_ints(slots_.targets);
  be_.release_ints(ids_.vocab_rows);
}

// Arena: the scratch views, then slot 0's per-slot views, slot 1's, ...
void Model::carve() {
  std::size_t scratch = 0;
  for (auto& w : want_) (w.per_slot ? slots_.stride : scratch) += w.n;
  mem_.activations = Arena(be_, scratch + slots_.stride * slots_.in_flight);
  std::size_t off = 0, slot_off = scratch;
  for (auto& w : want_) {
    if (w.per_slot) {
      slots_.views.emplace_back(w.p, slot_off);
      slot_off += w.n;
    } else {
      *w.p = mem_.activations.data() + off;
      off += w.n;
    }
  }
  want_.clear();
  use_micro_batch(0);
}

void Model::use_micro_batch(int slot) {
  if (slot < 0 || slot >= slots_.in_flight)
    throw std::out_of_range("micro-batch slot " + std::to_string(slot) + " of " + std::to_string(slots_.in_flight));
  slots_.batch[slots_.current] = B_;
  slots_.current = slot;
  B_ = slots_.batch[slot];
  for (auto& [p, off] : slots_.views) *p = mem_.activations.data() + off + slots_.stride * slot;
  const std::size_t BT = std::size_t(max_batch_) * T_;
  ids_.tokens = slots_.tokens + BT * slot;
  ids_.targets = slots_.targets + BT * slot;
}

void Model::set_tp_comm(Comm& tp) {
  if (tp.size() != layout_.tp().degree()) throw std::invalid_argument("TP communicator size does not match the layout");
  tp_ = &tp;
}

void Model::init_params(unsigned long long seed) {
  std::vector<float> host;
  for (int t = 0; t < layout_.tensor_count(); ++t) {
    const auto& slot = layout_.slot(t);
    host.resize(slot.elems);
    init_tensor_units(host.data(), m_, layout_.specs()[t], t, slot.units, seed);
    be_.from_host(param(t), host.data(), host.size());
  }
}

TpContext Model::begin_forward(const int* tokens, const int* targets, int B) {
  if (B < 1 || B > max_batch_)
    throw std::invalid_argument("batch " + std::to_string(B) + " outside [1, " + std::to_string(max_batch_) + "]");
  if (!timing_.clock) timing_.clock = &timing_.own_clock;
  B_ = B;
  if (stage().first_stage) be_.ints_from_host(ids_.tokens, tokens, std::size_t(B) * T_);
  if (stage().last_stage) be_.ints_from_host(ids_.targets, targets, std::size_t(B) * T_);
  return TpContext{be_, *tp_, timing_.clock, timing_.pacer};
}

TpContext Model::begin_backward() {
  if (B_ == 0) throw std::logic_error("backward() before forward()");
  return TpContext{be_, *tp_, timing_.clock, timing_.pacer};
}

double Model::sum_losses(const float* losses, int BT) {
  be_.to_host(host_losses_.data(), losses, BT);
  double sum = 0.0;
  for (int i = 0; i < BT; ++i) sum += host_losses_[i];
  return sum;
}

}  // namespace ntp
