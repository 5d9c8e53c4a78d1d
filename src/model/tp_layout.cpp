#include "tp_layout.hpp"

#include <stdexcept>

namespace ntp {

TpLayout TpLayout::even(const ModelConfig& m, int tp) {
  if (tp < 1 || tp > m.head_units())
    throw std::invalid_argument(tp_degree_problem(m, tp));
  return TpLayout{ShardMap::even(m.head_units(), tp), ShardMap::even(m.mlp(), tp), ShardMap::even(m.vocab, tp)};
}

std::string tp_degree_problem(const ModelConfig& m, int tp) {
  if (tp >= 1 && tp <= m.head_units()) return "";
  if (m.family == Family::Llama)
    return "TP degree " + std::to_string(tp) + " must be between 1 and the KV-head count (" +
           std::to_string(m.kv()) + "): a query head stays with its key/value head, so a KV group (" +
           std::to_string(m.q_per_kv()) + " query heads and their KV head) is the smallest unit a rank holds; " +
           "use --tp <= --kv-heads (KV heads are not replicated)";
  return "TP degree " + std::to_string(tp) + " must be between 1 and the head count (" + std::to_string(m.heads) +
         ")";
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
