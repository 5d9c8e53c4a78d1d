#include "options.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>

namespace ntp {

nlohmann::json to_json(const Options& o) {
  return {
      {"preset", o.preset},
      {"model",
       {{"family", family_name(o.model.family)}, {"vocab", o.model.vocab}, {"context", o.model.context},
        {"layers", o.model.layers}, {"heads", o.model.heads}, {"hidden", o.model.hidden},
        {"kv_heads", o.model.kv()}, {"ffn", o.model.mlp()}, {"rope_theta", o.model.rope_theta}}},
      {"seq", o.seq},
      {"tp", o.tp},
      {"pp", o.pp},
      {"micro_batch", o.micro_batch},
      {"micro_batches", o.micro_batches},
      {"steps", o.steps},
      {"seed", o.seed},
      {"data", o.data},
      {"optimizer",
       {{"lr", o.opt.lr}, {"beta1", o.opt.beta1}, {"beta2", o.opt.beta2}, {"eps", o.opt.eps},
        {"weight_decay", o.opt.weight_decay}, {"clip", o.opt.clip}, {"warmup", o.opt.warmup},
        {"schedule", o.opt.cosine ? "cosine" : "constant"}, {"min_lr_ratio", o.opt.min_lr_ratio},
        {"total_steps", o.opt.total_steps}}},
      {"out", o.out},
      {"checkpoint_every", o.checkpoint_every},
      {"checkpoint_dir", o.checkpoint_dir},
      {"final_checkpoint", o.final_checkpoint},
      {"init_from", o.init_from},
      {"init_weights_only", o.init_weights_only},
      {"threads", o.threads},
      {"peak_gflops", o.peak_gflops},
      {"schedule", o.schedule},
      {"backend", o.backend},
      {"precision", o.precision},
      {"allow_gpu_sharing", o.allow_gpu_sharing},
      {"policy", o.policy},
      {"kill_mode", o.kill_mode},
      {"on_nonfinite", o.on_nonfinite},
      {"hang_timeout", o.hang_timeout},
      {"timing", o.timing},
      {"pacing",
       {{"device_gflops", o.pacing.device_gflops}, {"tp_gbps", o.pacing.tp_gbps}, {"dp_gbps", o.pacing.dp_gbps},
        {"latency_us", o.pacing.latency_us}, {"boost", o.pacing.boost}}},
  };
}

Options options_from_json(const nlohmann::json& j) {
  Options o;
  o.preset = j.at("preset");
  const auto& m = j.at("model");
  o.model = {m.at("vocab"), m.at("context"), m.at("layers"), m.at("heads"), m.at("hidden")};
  // Results written before the Llama family record no family: GPT-2.
  o.model.family = parse_family(m.value("family", std::string("gpt2")));
  if (o.model.family == Family::Llama) {
    o.model.kv_heads = m.at("kv_heads");
    o.model.ffn = m.at("ffn");
    o.model.rope_theta = m.at("rope_theta");
  }
  o.seq = j.at("seq");
  o.tp = j.at("tp");
  o.micro_batch = j.at("micro_batch");
  // Runs recorded before pipeline parallelism have neither key.
  o.pp = j.value("pp", 1);
  o.micro_batches = j.value("micro_batches", 1);
  o.steps = j.at("steps");
  o.seed = j.at("seed");
  o.data = j.at("data");
  const auto& p = j.at("optimizer");
  o.opt.lr = p.at("lr");
  o.opt.beta1 = p.at("beta1");
  o.opt.beta2 = p.at("beta2");
  o.opt.eps = p.at("eps");
  o.opt.weight_decay = p.at("weight_decay");
  o.opt.clip = p.at("clip");
  o.opt.warmup = p.at("warmup");
  o.opt.cosine = p.at("schedule") == "cosine";
  o.opt.min_lr_ratio = p.at("min_lr_ratio");
  o.opt.total_steps = p.at("total_steps");
  o.out = j.at("out");
  o.checkpoint_every = j.at("checkpoint_every");
  o.checkpoint_dir = j.at("checkpoint_dir");
  o.final_checkpoint = j.at("final_checkpoint");
  o.init_from = j.at("init_from");
  o.init_weights_only = j.at("init_weights_only");
  o.threads = j.at("threads");
  o.peak_gflops = j.at("peak_gflops");
  o.schedule = j.value("schedule", "");
  o.backend = j.value("backend", "cpu");
  o.precision = j.value("precision", "fp32");  // files from before --precision: fp32
  o.allow_gpu_sharing = j.value("allow_gpu_sharing", false);
  o.policy = j.value("policy", "ntp");
  o.kill_mode = j.value("kill_mode", "fence");  // files from before real kills: fence
  o.on_nonfinite = j.value("on_nonfinite", "stop");
  o.hang_timeout = j.value("hang_timeout", 600.0);
  o.timing = j.value("timing", "wall");
  if (j.contains("pacing")) {
    const auto& q = j.at("pacing");
    o.pacing.device_gflops = q.at("device_gflops");
    o.pacing.tp_gbps = q.at("tp_gbps");
    o.pacing.dp_gbps = q.at("dp_gbps");
    o.pacing.latency_us = q.at("latency_us");
    o.pacing.boost = q.at("boost");
  }
  o.pacing.enabled = o.timing == "paced";
  return o;
}

std::string checkpoint_dir_for(const Options& o) {
  if (!o.checkpoint_dir.empty()) return o.checkpoint_dir;
  std::filesystem::path p(o.out);
  return (p.parent_path() / (p.stem().string() + ".ckpt")).string();
}

}  // namespace ntp
