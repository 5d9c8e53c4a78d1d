#pragma once
// GPT-2 model dimensions, the named presets, and the analytic FLOP count used for MFU and pacing.
#include <string>
#include <vector>

namespace ntp {

struct ModelConfig {
  int vocab = 256;    // V
  int context = 32;   // rows of the position table (max sequence length)
  int layers = 2;     // L
  int heads = 4;      // H
  int hidden = 64;    // d
  int head_size() const { return hidden / heads; }
  int mlp() const { return 4 * hidden; }
};

// Returns the preset's dimensions, or throws std::invalid_argument naming the known presets.
ModelConfig preset(const std::string& name);
const std::vector<std::string>& preset_names();

// Parameter count of the full (unsharded) model, LM head tied to the token embedding.
long long parameter_count(const ModelConfig& m);

// FLOPs of one training step (forward + backward = 3x forward) over `sequences` sequences of
// length T: every matmul (including the LM head) at 2 FLOPs per multiply-add, and attention's
// two T x T products per head counted in full, as in the PaLM/Megatron MFU convention.
double training_flops(const ModelConfig& m, long long sequences, int T);

}  // namespace ntp
