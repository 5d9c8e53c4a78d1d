#pragma once
// One MoE layer's routing of one micro-batch (host memory): what the forward decided and the
// backward reads again.
#include <vector>

namespace ntp {

struct MoeRouting {
  // Per slot a = t * k + j of token t: its expert, weight and whether capacity kept it.
  std::vector<int> expert;
  std::vector<float> weight;
  std::vector<char> kept;
  std::vector<float> probs;           // [T, E], the full softmax (the balancing loss's backward)
  std::vector<long> tokens_per_expert;  // kept assignments per expert
  std::vector<long> offsets;            // [E + 1], every expert's rows (all ranks' experts)
  // Slot a's row among this rank's experts' rows (they lie in expert order, each expert's in token
  // order), -1 for a slot dropped or sent to another rank's expert; rows: how many this rank has.
  std::vector<long> row_of;
  std::vector<long> first_row;  // per expert held here (local index): its first row
  long rows = 0, dropped = 0;
  float aux_loss = 0;
};

}  // namespace ntp
