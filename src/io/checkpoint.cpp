#include "checkpoint.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>

#include "h5.hpp"
#include "reshard.hpp"

namespace ntp {

namespace {

// The model dimensions recorded as root attributes (Llama's only where the family is llama).
std::vector<std::pair<const char*, int>> model_dims(const ModelConfig& m) {
  std::vector<std::pair<const char*, int>> d = {
      {"vocab", m.vocab}, {"context", m.context}, {"layers", m.layers}, {"heads", m.heads}, {"hidden", m.hidden}};
  if (m.family == Family::Llama) d.insert(d.end(), {{"kv_heads", m.kv()}, {"ffn", m.mlp()}});
  if (m.moe()) d.insert(d.end(), {{"experts", m.experts}, {"top_k", m.top_k}});
  return d;
}

// The family a checkpoint holds: its "model" attribute, or for a foreign file without one, which
// embedding it has.
std::string checkpoint_family(hid_t f) {
  if (h5::has_attr(f, "/", "model")) return h5::get_attr_string(f, "/", "model");
  return h5::exists(f, "model.embed_tokens.weight") ? "llama" : "gpt2";
}

void check_model(hid_t f, const std::string& path, const ModelConfig& m) {
  const std::string family = checkpoint_family(f);
  if (family != family_name(m.family))
    throw CheckpointError(fmt::format("checkpoint {} holds a {} model, but this run trains a {} model (--model)",
                                      path, family, family_name(m.family)));
  for (auto [name, want] : model_dims(m)) {
    if (!h5::has_attr(f, "/", name)) continue;  // foreign checkpoints: the tensor shapes still get checked
    const long long got = h5::get_attr_int(f, "/", name);
    if (got != want)
      throw CheckpointError(
          fmt::format("checkpoint {}: {} = {}, but this run has {} = {}", path, name, got, name, want));
  }
  if (m.family == Family::Llama && h5::has_attr(f, "/", "rope_theta")) {
    const double stored = h5::get_attr_double(f, "/", "rope_theta");
    if (float(stored) != m.rope_theta)
      throw CheckpointError(fmt::format("checkpoint {}: rope_theta = {}, but this run has rope_theta = {}", path,
                                        stored, m.rope_theta));
  }
}

// A tensor holding NaN or Inf would train into NaN from its first step: refused at load, naming it.
void check_finite(const std::vector<float>& v, const std::string& path, const std::string& name) {
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]) && bad++ == 0) first = i;
  if (bad == 0) return;
  throw CheckpointError(fmt::format("checkpoint {}: tensor '{}' holds {} non-finite value(s) (the first, {}, at "
                                    "flat index {} of {}); refusing to load it",
                                    path, name, bad, v[first], first, v.size()));
}

// Canonical full tensor -> this rank's units.
void scatter_units(float* dst, const std::vector<float>& canonical, const TensorSpec& s, const TensorSlot& slot) {
  long k = 0;
  for (int u : slot.units)
    for (long e = 0; e < s.unit_elems; ++e) dst[k++] = canonical[long(u) * s.unit_elems + e];
}
}  // namespace

SourceOwners owners_in_replica(const ModelConfig& m, const TpLayout& layout, const std::vector<int>& replica_ranks,
                               int stages) {
  const auto specs = model_tensors(m);
  const int degree = layout.degree();
  if (static_cast<int>(replica_ranks.size()) != degree * stages)
    throw std::invalid_argument("owners_in_replica: the replica's ranks are not its stages' TP groups");
  SourceOwners o(specs.size());
  for (std::size_t t = 0; t < specs.size(); ++t) {
    int stage = 0;
    while (!StageRange::of(m, stage, stages).holds(specs[t])) ++stage;
    const int* ranks = replica_ranks.data() + std::size_t(stage) * degree;
    if (specs[t].dim == ShardDim::Replicated) {
      o[t] = {ranks[0]};
      continue;
    }
    const ShardMap& map = layout.map(specs[t].dim);
    o[t].resize(map.units());
    for (int u = 0; u < map.units(); ++u) o[t][u] = ranks[map.owner(u)];
  }
  return o;
}

void save_checkpoint(const std::string& path, Comm& comm, int writer, const SourceOwners& owners,
                     const ModelConfig& m, Model* model, AdamW* opt, const CheckpointMeta& meta) {
  const auto specs = model_tensors(m);
  const bool writing = comm.rank() == writer;
  if (owners.size() != specs.size()) throw std::invalid_argument("save_checkpoint: one owner list per tensor");

  const std::string tmp = path + ".partial";
  std::unique_ptr<h5::File> file;
  if (writing) {
    std::filesystem::path dir = std::filesystem::path(path).parent_path();
    if (!dir.empty()) std::filesystem::create_directories(dir);
    file = std::make_unique<h5::File>(tmp, h5::Mode::Truncate);
    hid_t f = file->id();
    const bool llama = m.family == Family::Llama;
    h5::set_attr(f, "/", "format",
                 fmt::format("ntpbench {} checkpoint (Hugging Face names, fp32)", llama ? "Llama" : "GPT-2"));
    h5::set_attr(f, "/", "model", std::string(family_name(m.family)));
    h5::set_attr(f, "/", "step", static_cast<long long>(meta.step));
    h5::set_attr(f, "/", "samples_consumed", meta.samples_consumed);
    for (auto [name, v] : model_dims(m)) h5::set_attr(f, "/", name, static_cast<long long>(v));
    if (llama) h5::set_attr(f, "/", "rope_theta", static_cast<double>(m.rope_theta));
  }

  if (writing && !model) throw std::logic_error("checkpoint writer holds no model");
  std::vector<float> full[3];
  float* local[3] = {model ? model->params() : nullptr, opt ? opt->m() : nullptr, opt ? opt->v() : nullptr};
  const char* prefix[3] = {"", "optimizer/m/", "optimizer/v/"};
  for (int t = 0; t < static_cast<int>(specs.size()); ++t) {
    const TensorSpec& s = specs[t];
    const std::size_t off = model ? model->layout().slot(t).offset : 0;
    const long n = s.full_elems(m);
    // Every tensor, replicated ones too, comes to the writer through the reshard primitive: with
    // pipeline stages its owner may be another rank.
    const ReshardPlan plan(owners[t], std::vector<int>(owners[t].size(), writer), comm.rank(), comm.size());
    const long unit = s.unit_elems;  // a replicated tensor's one unit is all of it
    std::vector<ReshardTensor> tensors;
    for (int k = 0; k < 3; ++k) {
      full[k].assign(writing ? n : 0, 0.0f);
      tensors.push_back({model ? local[k] + off : nullptr, writing ? full[k].data() : nullptr, unit});
    }
    reshard(comm, plan, tensors, model ? &model->backend() : nullptr);
    if (!writing) continue;
    for (int k = 0; k < 3; ++k) {
      const auto hf = to_hf(m, s, full[k]);
      h5::write_floats(file->id(), prefix[k] + s.name, s.hf_shape, hf.data());
    }
  }
  if (writing) {
    file->flush();
    file.reset();
    std::filesystem::rename(tmp, path);
  }
  comm.barrier();  // the file is complete for every rank once this returns
}

namespace {
CheckpointMeta load_checkpoint_file(const std::string& path, Model& model, AdamW* opt);
std::vector<std::vector<float>> read_checkpoint_params_file(const std::string& path, const ModelConfig& m,
                                                            const std::string& group);
// A file that is not a readable checkpoint (truncated, not HDF5, a tensor missing) is the user's
// input, not a fault of this rank: the HDF5 layer's error becomes a CheckpointError naming the
// file, which every rank reaches alike (exit 2, one message).
template <typename F>
auto as_checkpoint_error(const std::string& path, F&& read) {
  try {
    return read();
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw CheckpointError(fmt::format("checkpoint {} cannot be read: {}", path, e.what()));
  }
}
}  // namespace

CheckpointMeta load_checkpoint(const std::string& path, Model& model, AdamW* opt) {
  return as_checkpoint_error(path, [&] { return load_checkpoint_file(path, model, opt); });
}

std::vector<std::vector<float>> read_checkpoint_params(const std::string& path, const ModelConfig& m,
                                                       const std::string& group) {
  return as_checkpoint_error(path, [&] { return read_checkpoint_params_file(path, m, group); });
}

namespace {
CheckpointMeta load_checkpoint_file(const std::string& path, Model& model, AdamW* opt) {
  const ParamLayout& L = model.layout();
  const ModelConfig& m = L.model();
  h5::File file(path, h5::Mode::ReadOnly);
  hid_t f = file.id();
  check_model(f, path, m);
  CheckpointMeta meta;
  if (h5::has_attr(f, "/", "step")) meta.step = static_cast<int>(h5::get_attr_int(f, "/", "step"));
  if (h5::has_attr(f, "/", "samples_consumed")) meta.samples_consumed = h5::get_attr_int(f, "/", "samples_consumed");
  meta.has_optimizer = h5::exists(f, "optimizer/m/" + L.specs()[0].name);
  const bool load_opt = opt && meta.has_optimizer;

  std::vector<float> host;
  for (int t = 0; t < L.tensor_count(); ++t) {
    const TensorSpec& s = L.specs()[t];
    const TensorSlot& slot = L.slot(t);
    host.resize(slot.elems);
    struct Target {
      std::string name;
      float* dst;
    };
    std::vector<Target> targets = {{s.name, model.params() + slot.offset}};
    if (load_opt) {
      targets.push_back({"optimizer/m/" + s.name, opt->m() + slot.offset});
      targets.push_back({"optimizer/v/" + s.name, opt->v() + slot.offset});
    }
    for (auto& tg : targets) {
      const auto stored = h5::read_floats(f, tg.name, s.hf_shape);
      check_finite(stored, path, tg.name);
      const auto canonical = from_hf(m, s, stored);
      scatter_units(host.data(), canonical, s, slot);
      model.backend().from_host(tg.dst, host.data(), host.size());
    }
  }
  if (load_opt) opt->set_steps_taken(meta.step);
  return meta;
}

std::vector<std::vector<float>> read_checkpoint_params_file(const std::string& path, const ModelConfig& m,
                                                            const std::string& group) {
  h5::File file(path, h5::Mode::ReadOnly);
  check_model(file.id(), path, m);
  std::vector<std::vector<float>> out;
  for (const auto& s : model_tensors(m))
    out.push_back(from_hf(m, s, h5::read_floats(file.id(), group + s.name, s.hf_shape)));
  return out;
}
}  // namespace

}  // namespace ntp
