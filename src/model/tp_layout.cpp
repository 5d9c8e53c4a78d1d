#include "tp_layout.hpp"

#include <stdexcept>

namespace ntp {

TpLayout TpLayout::even(const ModelConfig& m, int tp) {
  if (tp < 1 || tp > m.heads)
    throw std::invalid_argument("TP degree " + std::to_string(tp) + " must be between 1 and the head count (" +
                                std::to_string(m.heads) + ")");
  return TpLayout{ShardMap::even(m.heads, tp), ShardMap::even(m.mlp(), tp), ShardMap::even(m.vocab, tp)};
}

const ShardMap& TpLayout::map(ShardDim d) const {
  switch (d) {
    case ShardDim::Heads: return heads;
    case ShardDim::Mlp: return mlp;
    case ShardDim::Vocab: return vocab;
    case ShardDim::Replicated: break;
  }
  throw std::logic_error("replicated tensors have no shard map");
}

}  // namespace ntp
