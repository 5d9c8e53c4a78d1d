#pragma once
// The model of a family, chosen in one place apart from the base class, so that model.hpp/.cpp
// (the base) knows nothing of the families derived from it.
#include <memory>

#include "model.hpp"

namespace ntp {

// The model of m.family on this rank (arguments as Model's constructor; by default the whole
// model, one micro-batch at a time).
std::unique_ptr<Model> make_model(Backend& backend, const ModelConfig& m, const TpLayout& tp, int tp_rank,
                                  Comm& tp_comm, int max_batch, int seq, const StageRange* stage = nullptr,
                                  int in_flight = 1);

}  // namespace ntp
