#include "make_model.hpp"

#include "gpt_model.hpp"
#include "llama_model.hpp"

namespace ntp {

std::unique_ptr<Model> make_model(Backend& backend, const ModelConfig& m, const TpLayout& tp, int tp_rank,
                                  Comm& tp_comm, int max_batch, int seq, const StageRange* stage, int in_flight) {
  const StageRange s = stage ? *stage : StageRange::whole(m);
  if (m.family == Family::Llama)
    return std::make_unique<LlamaModel>(backend, m, tp, tp_rank, tp_comm, max_batch, seq, s, in_flight);
  return std::make_unique<GptModel>(backend, m, tp, tp_rank, tp_comm, max_batch, seq, s, in_flight);
}

}  // namespace ntp
