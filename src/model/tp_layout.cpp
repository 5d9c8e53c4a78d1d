#include "tp_layout.hpp"

#include <stdexcept>

namespace ntp {

int shard_units(const ModelConfig& m, ShardDim d) {
  switch (d) {
    case ShardDim::Heads: return m.head_units();
    case ShardDim::Mlp: return m.experts > 0 ? 0 : m.mlp();
    case ShardDim::Vocab: return m.vocab;
    case ShardDim::Experts: return m.experts;
    case ShardDim::Replicated: break;
  }
  throw std::logic_error("replicated tensors have no units");
}

TpLayout TpLayout::even(const ModelConfig& m, int tp) {
  if (!tp_degree_problem(m, tp).empty()) throw std::invalid_argument(tp_degree_problem(m, tp));
  return each(m, [tp](int units) { return ShardMap::even(units, tp); });
}

std::string tp_degree_problem(const ModelConfig& m, int tp) {
  if (m.experts > 0 && tp > m.experts)
    return "TP degree " + std::to_string(tp) + " must be at most the expert count (" + std::to_string(m.experts) +
           "): expert parallelism spreads whole experts over the TP group, at least one per rank; use --tp <= --experts";
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
  if (d == ShardDim::Replicated) throw std::logic_error("replicated tensors have no shard map");
  return maps[shard_index(d)];
}

}  // namespace ntp
