#include "model.hpp"

#include <stdexcept>
#include <string>

#include "gpt_model.hpp"
#include "llama_model.hpp"

namespace ntp {

Model::Model(Backend& backend, const ModelConfig& m, const TpLayout& tp, int tp_rank, Comm& tp_comm, int max_batch,
             int seq)
    : be_(backend), m_(m), layout_(m, tp, tp_rank), tp_(&tp_comm), max_batch_(max_batch), T_(seq) {
  if (tp_comm.size() != tp.degree())
    throw std::invalid_argument("TP communicator size does not match the layout's degree");
  if (seq < 1 || seq > m.context)
    throw std::invalid_argument("sequence length " + std::to_string(seq) + " must be between 1 and the context (" +
                                std::to_string(m.context) + ")");
  params_ = Arena(be_, layout_.total());
  grads_ = Arena(be_, layout_.total());
  const std::size_t BT = std::size_t(max_batch) * seq;
  tokens_ = be_.allocate_ints(BT);
  targets_ = be_.allocate_ints(BT);
  vocab_rows_ = be_.allocate_ints(m.vocab);
  const std::vector<int> rows = tp.vocab.local_rows(tp_rank);
  be_.ints_from_host(vocab_rows_, rows.data(), rows.size());
  host_losses_.resize(BT);
}

Model::~Model() {
  be_.release_ints(tokens_);
  be_.release_ints(targets_);
  be_.release_ints(vocab_rows_);
}

void Model::carve() {
  std::size_t total = 0;
  for (auto& w : want_) total += w.second;
  act_arena_ = Arena(be_, total);
  std::size_t off = 0;
  for (auto& w : want_) *w.first = act_arena_.data() + off, off += w.second;
  want_.clear();
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
  if (!clock_) clock_ = &own_clock_;
  B_ = B;
  be_.ints_from_host(tokens_, tokens, std::size_t(B) * T_);
  be_.ints_from_host(targets_, targets, std::size_t(B) * T_);
  return TpContext{be_, *tp_, clock_, pacer_};
}

TpContext Model::begin_backward() {
  if (B_ == 0) throw std::logic_error("backward() before forward()");
  return TpContext{be_, *tp_, clock_, pacer_};
}

double Model::sum_losses(const float* losses, int BT) {
  be_.to_host(host_losses_.data(), losses, BT);
  double sum = 0.0;
  for (int i = 0; i < BT; ++i) sum += host_losses_[i];
  return sum;
}

std::unique_ptr<Model> make_model(Backend& backend, const ModelConfig& m, const TpLayout& tp, int tp_rank,
                                  Comm& tp_comm, int max_batch, int seq) {
  if (m.family == Family::Llama)
    return std::make_unique<LlamaModel>(backend, m, tp, tp_rank, tp_comm, max_batch, seq);
  return std::make_unique<GptModel>(backend, m, tp, tp_rank, tp_comm, max_batch, seq);
}

}  // namespace ntp
