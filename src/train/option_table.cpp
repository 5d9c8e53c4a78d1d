#include "option_table.hpp"

#include <cmath>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

#include "machine_profile.hpp"

namespace ntp {

namespace {

// A reference to one member of Options, as a FieldRef of the member's type.
#define NTP_FIELD(member) [](Options& o) -> auto& { return o.member; }

// An option naming one of an enum's values (choices.hpp), read and written as its name.
template <auto Member>
TextField choice_field() {
  using E = std::remove_reference_t<decltype(std::declval<Options&>().*Member)>;
  return TextField{[](const Options& o) -> std::string { return choice_name(o.*Member); },
                   [](Options& o, const std::string& s) { o.*Member = parse_choice<E>(s); }};
}

// --emulate-shape: none, or a preset.
std::vector<std::string> shape_choices() {
  std::vector<std::string> c = {"none"};
  for (const auto& p : preset_names()) c.push_back(p);
  return c;
}

// --detect-s and the other recovery figures: "machine" (the profile's) or a number of 0 or more
// (checkpoint storage: above 0), in place of the profile's figure.
template <std::optional<double> RecoveryOverrides::*Member>
OptionSpec recovery_option() {
  const RecoveryPart* part = nullptr;
  for (const RecoveryPart& p : recovery_parts())
    if (p.given == Member) part = &p;
  TextField field{[](const Options& o) -> std::string {
                    const std::optional<double>& v = o.recovery_given.*Member;
                    return v ? fmt::format("{}", *v) : std::string("machine");
                  },
                  [](Options& o, const std::string& s) {
                    if (s == "machine") return void(o.recovery_given.*Member = std::nullopt);
                    const bool rate = Member == &RecoveryOverrides::checkpoint_gbps;
                    std::size_t used = 0;
                    double v = -1;
                    try {
                      v = std::stod(s, &used);
                    } catch (const std::exception&) {
                      used = 0;
                    }
                    if (used != s.size() || !std::isfinite(v) || (rate ? !(v > 0) : !(v >= 0)))
                      throw std::invalid_argument("'" + s + "' is not machine or a number " +
                                                  (rate ? "above 0" : "of 0 or more"));
                    o.recovery_given.*Member = v;
                  }};
  return {.flag = part->flag, .key = std::string("pacing/recovery/") + part->name, .field = field,
          .help = fmt::format("Paced: {} on the emulated machine, in place of --machine's figure (machine: "
                              "that figure, jobs/machines/*.yaml)",
                              part->help),
          .missing = Missing::Default};
}

std::vector<OptionSpec> recovery_cost_options() {
  return {recovery_option<&RecoveryOverrides::detect>(),      recovery_option<&RecoveryOverrides::repair>(),
          recovery_option<&RecoveryOverrides::reinit>(),      recovery_option<&RecoveryOverrides::reconfigure>(),
          recovery_option<&RecoveryOverrides::replace>(),     recovery_option<&RecoveryOverrides::takeover>(),
          recovery_option<&RecoveryOverrides::restart>(),     recovery_option<&RecoveryOverrides::checkpoint_gbps>()};
}

std::vector<OptionSpec> model_options() {
  return {
      {.flag = "--model", .key = "model/family",
       .field = TextField{[](const Options& o) -> std::string { return family_name(o.model.family); },
                          [](Options& o, const std::string& s) { o.model.family = parse_family(s); }},
       .help = "Model family: gpt2 (LayerNorm, GELU, learned positions, biases, tied head) or llama (RMSNorm, "
               "SwiGLU, rotary positions, grouped-query attention, no biases, untied head). Default: the "
               "preset's family",
       .check = Check::OneOf, .choices = {"gpt2", "llama"}, .missing = Missing::Legacy, .legacy = "gpt2",
       .model_override = true},
      {.flag = "--preset", .key = "preset", .field = NTP_FIELD(preset),
       .help = "Model size. gpt2: tiny, small (the default), gpt2, gpt2-medium, gpt2-large, gpt2-xl. llama "
               "(implies --model llama): llama-tiny, llama-small (the default with --model llama), llama-8b "
               "(an 8B-class shape, for benchmarks and simulation); mixtures of experts (llama blocks, --experts): "
               "moe-tiny, mixtral-8x7b and moe-fine-16b (DeepSeekMoE 16B's routed experts), the last two for "
               "--emulate-shape and simulation",
       .check = Check::OneOf, .choices = preset_names(), .model_override = true},
      {.flag = "--kv-heads", .key = "model/kv_heads", .field = NTP_FIELD(model.kv_heads),
       .help = "llama: key/value heads (grouped-query attention; a divisor of --heads). A KV head and its query "
               "heads stay on one rank, so --tp may not exceed it (recorded as 0 for gpt2)",
       .check = Check::Positive, .missing = Missing::Default, .model_override = true},
      {.flag = "--ffn", .key = "model/ffn", .field = NTP_FIELD(model.ffn),
       .help = "llama: SwiGLU hidden width (columns of gate_proj and up_proj; recorded as 0 for gpt2)",
       .check = Check::Positive, .missing = Missing::Default, .model_override = true},
      {.flag = "--rope-theta", .key = "model/rope_theta", .field = NTP_FIELD(model.rope_theta),
       .help = "llama: base of the rotary position embeddings", .check = Check::Range, .lo = 1.0, .hi = 1e9,
       .missing = Missing::Default, .model_override = true},
      {.flag = "--experts", .key = "model/experts", .field = NTP_FIELD(model.experts),
       .help = "llama: a mixture of experts in place of each layer's MLP (Mixtral's block): this many SwiGLU "
               "experts of width --ffn, whole experts spread over the TP group (expert parallelism = TP; "
               "--tp may not exceed it); 0: a dense MLP (moe-tiny: 8)",
       .check = Check::NonNegative, .missing = Missing::Default, .model_override = true},
      {.flag = "--top-k", .key = "model/top_k", .field = NTP_FIELD(model.top_k),
       .help = "MoE: experts per token, weighted by the softmax over their router logits",
       .check = Check::Positive, .missing = Missing::Default, .model_override = true},
      {.flag = "--capacity-factor", .key = "model/capacity_factor", .field = NTP_FIELD(model.capacity_factor),
       .help = "MoE: each expert takes at most ceil(F x tokens x top-k / experts) assignments per forward pass, "
               "in token order; the rest are dropped (counted in /steps dropped_tokens). 0: no limit, none dropped",
       .check = Check::Range, .lo = 0.0, .hi = 1e6, .missing = Missing::Default, .model_override = true},
      {.flag = "--router-aux-coef", .key = "model/router_aux_coef", .field = NTP_FIELD(model.router_aux_coef),
       .help = "MoE: weight of the router's load-balancing loss (Switch Transformer's) in the gradient, per "
               "replica and forward pass; /steps loss is the language model's alone",
       .check = Check::Range, .lo = 0.0, .hi = 1e6, .missing = Missing::Default, .model_override = true},
      {.flag = "--layers", .key = "model/layers", .field = NTP_FIELD(model.layers),
       .help = "Override the number of transformer layers", .check = Check::Positive, .model_override = true},
      {.flag = "--heads", .key = "model/heads", .field = NTP_FIELD(model.heads),
       .help = "Override the number of attention heads (llama: query heads)", .check = Check::Positive,
       .model_override = true},
      {.flag = "--hidden", .key = "model/hidden", .field = NTP_FIELD(model.hidden),
       .help = "Override the hidden size d (a multiple of --heads)", .check = Check::Positive,
       .model_override = true},
      {.flag = "--seq", .key = "seq", .field = NTP_FIELD(seq),
       .help = "Training sequence length T (default: the preset's context)", .check = Check::Positive,
       .model_override = true},
      {.flag = "--context", .key = "model/context", .field = NTP_FIELD(model.context),
       .help = "Rows of the position table (default: the preset's; grown to --seq)", .check = Check::Positive,
       .model_override = true},
      {.flag = "--vocab", .key = "model/vocab", .field = NTP_FIELD(model.vocab),
       .help = "Override the vocabulary size V", .check = Check::Range, .lo = 2, .hi = 1 << 24,
       .model_override = true},
  };
}

std::vector<OptionSpec> layout_options() {
  return {
      {.flag = "--tp", .key = "tp", .field = NTP_FIELD(tp),
       .help = "Tensor-parallel degree; ranks must be a multiple of TP x PP, DP = ranks / (TP x PP)",
       .check = Check::Positive},
      {.flag = "--pp", .key = "pp", .field = NTP_FIELD(pp),
       .help = "Pipeline-parallel stages (Megatron's non-interleaved 1F1B): layers split as evenly as possible, "
               "the embedding on the first stage, the final norm, head and loss on the last; at most --layers",
       .check = Check::Positive, .missing = Missing::Default},
      {.flag = "--micro-batch", .key = "micro_batch", .field = NTP_FIELD(micro_batch),
       .help = "Sequences per micro-batch (b)", .check = Check::Positive},
      {.flag = "--micro-batches", .key = "micro_batches", .field = NTP_FIELD(micro_batches),
       .help = "Micro-batches per replica per step (M, gradient accumulation; with --pp the pipeline's depth of "
               "work): a replica takes b x M sequences per step. Under ntp a damaged replica runs max(1, floor(M "
               "t' / t)) of them",
       .check = Check::Positive, .missing = Missing::Default},
      {.flag = "--steps", .key = "steps", .field = NTP_FIELD(steps), .help = "Training steps to run",
       .check = Check::Positive},
      {.flag = "--seed", .key = "seed", .field = NTP_FIELD(seed), .help = "Seed for weights and synthetic data"},
      {.flag = "--data", .key = "data", .field = NTP_FIELD(data),
       .help = "'synthetic' (seeded Markov chain); an llm.c token file (magic 20240520: uint16 tokens, 20240801: "
               "uint32; every id < --vocab; jobs/data/prepare.py writes one from text), which a .bin file must be; "
               "or any other file, read as bytes (needs V >= 256)"},
  };
}

std::vector<OptionSpec> optimizer_options() {
  return {
      {.flag = "--lr", .key = "optimizer/lr", .field = NTP_FIELD(opt.lr), .help = "AdamW peak learning rate",
       .check = Check::Positive},
      {.flag = "--beta1", .key = "optimizer/beta1", .field = NTP_FIELD(opt.beta1), .help = "AdamW beta1",
       .check = Check::Range, .lo = 0.0, .hi = 0.999999},
      {.flag = "--beta2", .key = "optimizer/beta2", .field = NTP_FIELD(opt.beta2), .help = "AdamW beta2",
       .check = Check::Range, .lo = 0.0, .hi = 0.999999},
      {.flag = "--eps", .key = "optimizer/eps", .field = NTP_FIELD(opt.eps), .help = "AdamW epsilon",
       .check = Check::Positive},
      {.flag = "--weight-decay", .key = "optimizer/weight_decay", .field = NTP_FIELD(opt.weight_decay),
       .help = "Decoupled weight decay on 2-D tensors", .check = Check::NonNegative},
      {.flag = "--clip", .key = "optimizer/clip", .field = NTP_FIELD(opt.clip),
       .help = "Clip gradients to this global norm (0: no clipping)", .check = Check::NonNegative},
      {.flag = "--warmup", .key = "optimizer/warmup", .field = NTP_FIELD(opt.warmup),
       .help = "Linear learning-rate warmup steps", .check = Check::NonNegative},
      {.flag = "--lr-schedule", .key = "optimizer/schedule",
       .field = TextField{[](const Options& o) -> std::string { return o.opt.cosine ? "cosine" : "constant"; },
                          [](Options& o, const std::string& s) {
                            if (s != "cosine" && s != "constant")
                              throw std::invalid_argument("unknown lr schedule '" + s + "' (constant, cosine)");
                            o.opt.cosine = s == "cosine";
                          }},
       .help = "constant, or cosine decay to --min-lr-ratio x lr by the last step", .check = Check::OneOf,
       .choices = {"constant", "cosine"}},
      {.flag = "--min-lr-ratio", .key = "optimizer/min_lr_ratio", .field = NTP_FIELD(opt.min_lr_ratio),
       .help = "Final lr as a fraction of --lr under cosine decay", .check = Check::Range, .lo = 0.0, .hi = 1.0},
      // Not a flag: the cosine schedule's horizon, set to --steps.
      {.key = "optimizer/total_steps", .field = NTP_FIELD(opt.total_steps)},
  };
}

// Where results and checkpoints go, where a run starts from, and what it prints. --overwrite,
// --replay, --quiet and --check concern one invocation, not the run: they are not recorded.
std::vector<OptionSpec> output_options() {
  return {
      {.flag = "--out", .key = "out", .field = NTP_FIELD(out),
       .help = "Results file (HDF5); default results/ntpbench-<date>-<time>.h5"},
      {.flag = "--overwrite", .field = NTP_FIELD(overwrite),
       .help = "Replace an existing --out file instead of refusing"},
      {.flag = "--checkpoint-every", .key = "checkpoint_every", .field = NTP_FIELD(checkpoint_every),
       .help = "Write a checkpoint every K steps (0: only the final one)", .check = Check::NonNegative},
      {.flag = "--checkpoint-dir", .key = "checkpoint_dir", .field = NTP_FIELD(checkpoint_dir),
       .help = "Where checkpoints go (default: <out without .h5>.ckpt/)"},
      {.flag = "--no-final-checkpoint", .key = "final_checkpoint", .field = NTP_FIELD(final_checkpoint),
       .help = "Do not write the end-of-run checkpoint (--replay needs it)", .negated = true},
      {.flag = "--init-from", .key = "init_from", .field = NTP_FIELD(init_from),
       .help = "Start from a checkpoint: weights, and AdamW state, step and data cursor when present",
       .check = Check::ExistingFile},
      {.flag = "--init-weights-only", .key = "init_weights_only", .field = NTP_FIELD(init_weights_only),
       .help = "With --init-from: load the weights only"},
      {.flag = "--replay", .field = NTP_FIELD(replay),
       .help = "Re-run RUN.h5's recorded steps on one rank and compare with its final checkpoint",
       .check = Check::ExistingFile},
      {.flag = "--replay-tol", .field = NTP_FIELD(replay_tol),
       .help = "Largest relative parameter difference --replay accepts", .check = Check::Positive},
      {.flag = "--quiet", .field = NTP_FIELD(quiet), .help = "Print only the summary, not a line per step"},
      {.flag = "--check", .field = NTP_FIELD(check),
       .help = "Validate the configuration and the schedule against the job's ranks, then exit"},
  };
}

// Where the arithmetic runs: threads, backend, precision, and the peak MFU is measured against.
std::vector<OptionSpec> hardware_options() {
  return {
      {.flag = "--threads", .key = "threads", .field = NTP_FIELD(threads),
       .help = "BLAS/OpenMP threads per rank (0: cores per node / ranks per node)", .check = Check::NonNegative},
      {.flag = "--peak-gflops", .key = "peak_gflops", .field = NTP_FIELD(peak_gflops),
       .help = "Peak GFLOP/s of one rank for MFU (0: the machine's SGEMM peak at the rank's threads, probed at "
               "start and never below the best earlier probe, cached in ~/.cache/ntpbench; see results/README.md)",
       .check = Check::NonNegative},
      {.flag = "--backend", .key = "backend", .field = choice_field<&Options::backend>(),
       .help = "Where kernels run: cpu (OpenBLAS + OpenMP) or cuda (cuBLAS, one GPU per rank)",
       .check = Check::OneOf, .choices = choice_names<BackendKind>(), .missing = Missing::Default},
      {.flag = "--precision", .key = "precision", .field = choice_field<&Options::precision>(),
       .help = "GEMM arithmetic: fp32, or bf16 (needs --backend cuda): every matmul and attention product runs on "
               "bf16 copies of its operands with fp32 accumulation and output; weights (the fp32 master copy), "
               "gradients, AdamW and all other kernels stay fp32",
       .check = Check::OneOf, .choices = choice_names<Precision>(), .missing = Missing::Default},
      {.flag = "--allow-gpu-sharing", .key = "allow_gpu_sharing", .field = NTP_FIELD(allow_gpu_sharing),
       .help = "With --backend cuda: allow more ranks than GPUs on a node (ranks then share GPUs)",
       .missing = Missing::Default},
  };
}

std::vector<OptionSpec> failure_options() {
  return {
      {.flag = "--schedule", .key = "schedule", .field = NTP_FIELD(schedule),
       .help = "Failure schedule (YAML: events to kill, hang (freeze) or revive ranks, or every rank of a host "
               "(kill_node/revive_node), and/or a random generator, whose hang_fraction makes a share of its "
               "failures hangs)",
       .check = Check::ExistingFile, .missing = Missing::Default},
      {.flag = "--policy", .key = "policy", .field = choice_field<&Options::policy>(),
       .help = "Recovery policy: dp-drop (a damaged replica stops), ntp (it runs at reduced TP with a smaller "
               "batch), ntp-pw (reduced TP, full batch, boosted ranks), restart (all roll back to the last "
               "checkpoint)",
       .check = Check::OneOf, .choices = choice_names<Policy>(), .missing = Missing::Default},
      {.flag = "--kill-mode", .key = "kill_mode", .field = TextField{[](const Options& o) -> std::string { return o.kill_mode ? choice_name(*o.kill_mode) : ""; },
                          [](Options& o, const std::string& s) {
                            o.kill_mode = s.empty() ? std::nullopt : std::optional(parse_choice<KillMode>(s));
                          }},
       .help = "How a scheduled kill kills: signal (the rank's process dies by SIGKILL, at the event's `at:` "
               "phase; the others learn it from MPI and repair with ULFM; needs Open MPI >= 5 and mpirun --with-ft "
               "ulfm) or fence (the rank leaves the communicators and idles; any MPI). Default: signal where the "
               "job runs with ULFM, else fence; also fence on a job of several hosts whose schedule revives ranks "
               "(Open MPI 5.0 cannot connect a process spawned there)",
       .check = Check::OneOf, .choices = choice_names<KillMode>(), .missing = Missing::Legacy, .legacy = "fence"},
      {.flag = "--hang-timeout", .key = "hang_timeout", .field = NTP_FIELD(hang_timeout),
       .help = "Seconds a rank may go without progress (no phase of a step, repair, revival or checkpoint "
               "ending) before it prints where it waits and ends the job with exit code 5; the limit grows to 10x "
               "the longest step so far and to 20x the step the model's FLOPs predict at the peak. 0: wait for "
               "ever",
       .check = Check::NonNegative, .missing = Missing::Default},
      {.flag = "--failure-timeout", .key = "failure_timeout", .field = NTP_FIELD(failure_timeout),
       .help = "Hung ranks (--kill-mode signal): a trainer whose heartbeat (a thread of its own, every eighth of "
               "this) stops for this many seconds while its process exists (kill -STOP, a schedule's `hang`) is "
               "declared hung by a rank of its host, ended with SIGKILL and recovered from like a death. A long "
               "step, checkpoint or heal never looks hung: the heartbeat does not wait for them. Not caught: a "
               "process stuck in one call while its other threads run, or a host whose every trainer froze (the "
               "watchdog, --hang-timeout, ends the job with exit code 5); under --kill-mode fence a `hang` event is "
               "an emulated kill",
       .check = Check::Positive, .missing = Missing::Default},
      {.flag = "--straggler-threshold", .key = "stragglers/threshold", .field = NTP_FIELD(straggler_threshold),
       .help = "Stragglers: a rank whose compute time per FLOP (forward, backward, optimizer; not its waits) "
               "stays above this many times the median of its TP group's other ranks for --straggler-window steps "
               "is a straggler (e.g. 1.2); every rank reaches the same verdict from the same numbers, and /events "
               "and the console record it with the measured factor, and its end; --straggler-policy says what is "
               "done. Default 0: no detection (under --timing wall with ranks sharing cores, compute times measure "
               "the contention)",
       .check = Check::NonNegative, .missing = Missing::Default},
      {.flag = "--straggler-window", .key = "stragglers/window", .field = NTP_FIELD(straggler_window),
       .help = "Consecutive steps a rank's compute must stay above --straggler-threshold to be named a straggler, "
               "and at or below it to be one no longer",
       .check = Check::Positive, .missing = Missing::Default},
      {.flag = "--straggler-policy", .key = "stragglers/policy", .field = choice_field<&Options::straggler_policy>(),
       .help = "What a straggler's verdict does from the next step (needs --straggler-threshold): tolerate (the "
               "job runs at its pace), evict (it leaves the training groups as if failed under --policy, its "
               "process alive; a probe it runs while the others train names the end of its episode, and it "
               "rejoins, healed from its peers) or rebalance (its replica keeps every rank and shares heads, MLP "
               "columns and vocabulary rows in proportion to measured speed, and takes the largest batch that "
               "keeps pace with a healthy replica, within 2%)",
       .check = Check::OneOf, .choices = choice_names<StragglerPolicy>(), .missing = Missing::Default},
      {.flag = "--spares-per-host", .key = "spares/per_host", .field = NTP_FIELD(spares_per_host),
       .help = "Spare processes: the last K processes of every host train nothing and replace a dead rank of that "
               "host (--spare-use); start the job with that many more processes than TP x PP x DP",
       .check = Check::NonNegative, .missing = Missing::Default},
      {.flag = "--spare-hosts", .key = "spares/hosts", .field = NTP_FIELD(spare_hosts),
       .help = "Spare hosts: every process of the last H hosts is a spare, which can replace ranks of any host "
               "(the ranks of one dead host go to one spare host, so TP groups stay inside a host)",
       .check = Check::NonNegative, .missing = Missing::Default},
      {.flag = "--spare-use", .key = "spares/use", .field = choice_field<&Options::spare_use>(),
       .help = "With spares and --kill-mode signal: revive (a scheduled or generated revival is served by a spare "
               "instead of a spawned process) or takeover (a hot spare takes a dead rank's place in the repair of "
               "the death itself, healed from its peers). Without a spare left: spawn on one host",
       .check = Check::OneOf, .choices = choice_names<SpareUse>(), .missing = Missing::Default},
      {.flag = "--on-nonfinite", .key = "on_nonfinite", .field = choice_field<&Options::on_nonfinite>(),
       .help = "A non-finite loss or gradient norm, caught before the update touches any parameter: stop "
               "(record the step as not committed, end the run with exit code 4) or skip (no update, the batch "
               "is consumed; skipped steps are counted in /summary)",
       .check = Check::OneOf, .choices = choice_names<OnNonfinite>(), .missing = Missing::Default},
      {.flag = "--timing", .key = "timing", .field = choice_field<&Options::timing>(),
       .help = "wall: real time; paced: each rank emulates one GPU of --machine, slowed by --time-scale (for more "
               "ranks than cores)",
       .check = Check::OneOf, .choices = choice_names<Timing>(), .missing = Missing::Default},
      {.flag = "--machine", .key = "pacing/machine", .field = NTP_FIELD(machine),
       .help = "Paced: the machine each rank emulates one GPU of: dgx-a100, dgx-h100 or gb200-nvl72 (device FLOP/s, "
               "NVLink and NIC bandwidth, latency, and what each part of a recovery costs there; jobs/machines/*.yaml "
               "names the sources), or custom (the default: the rates of --device-gflops, --memory-gbps, --tp-gbps, "
               "--dp-gbps and --link-latency-us, and dgx-a100's recovery costs)",
       .check = Check::OneOf, .choices = machine_names(), .missing = Missing::Legacy, .legacy = "custom"},
      {.flag = "--time-scale", .key = "pacing/time_scale",
       .field = TextField{[](const Options& o) -> std::string {
                            return o.auto_time_scale() ? "auto" : fmt::format("{}", o.time_scale);
                          },
                          [](Options& o, const std::string& s) {
                            if (s == "auto") {
                              o.time_scale = 0;
                              return;
                            }
                            double v = 0;
                            std::size_t used = 0;
                            try {
                              v = std::stod(s, &used);
                            } catch (const std::exception&) {
                              used = 0;
                            }
                            if (used == 0 || used != s.size() || !std::isfinite(v) || v <= 0)
                              throw std::invalid_argument("--time-scale must be auto or a number above 0, not '" + s +
                                                          "'");
                            o.time_scale = v;
                          }},
       .help = "Paced: every rate of the machine is slowed by this one factor, so every ratio stays the machine's. "
               "auto (the default for a named machine; custom's is 1): measured at start-up, the smallest power of 2 at "
               "which this machine's real compute and transfers take at most 1/--headroom of their emulated time",
       .missing = Missing::Legacy, .legacy = "1"},
      {.flag = "--headroom", .key = "pacing/headroom", .field = NTP_FIELD(headroom),
       .help = "Paced, --time-scale auto: how many times its real time each phase's emulated time must be at least",
       .check = Check::Range, .lo = 1.0, .hi = 1e6, .missing = Missing::Default},
      {.flag = "--emulated-precision", .key = "pacing/precision", .field = choice_field<&Options::emulated_precision>(),
       .help = "Paced: which of the machine's dense FLOP/s the device runs at (the arithmetic here stays fp32)",
       .check = Check::OneOf, .choices = choice_names<EmulatedPrecision>(), .missing = Missing::Default},
      {.flag = "--emulate-shape", .key = "pacing/emulate_shape", .field = NTP_FIELD(emulate_shape),
       .help = "Paced: charge each phase as this preset would cost at the same layout and tokens (FLOPs per token; "
               "TP activations by hidden size and layer count; gradient and parameter transfers by parameter "
               "count), while the arithmetic stays the model's; none: the model's own costs",
       .check = Check::OneOf, .choices = shape_choices(), .missing = Missing::Default},
      {.flag = "--device-gflops", .key = "pacing/device_gflops", .field = NTP_FIELD(pacing.device_gflops),
       .help = "Paced, --machine custom: compute rate of one emulated device, GFLOP/s", .check = Check::Positive,
       .missing = Missing::Default},
      {.flag = "--memory-gbps", .key = "pacing/memory_gbps", .field = NTP_FIELD(pacing.memory_gbps),
       .help = "Paced, --machine custom: memory bandwidth of one emulated device, GB/s, at which the optimizer "
               "(28 bytes per parameter) runs when that is slower than its FLOPs; 0: FLOPs alone",
       .check = Check::NonNegative, .missing = Missing::Default},
      {.flag = "--tp-gbps", .key = "pacing/tp_gbps", .field = NTP_FIELD(pacing.tp_gbps),
       .help = "Paced, --machine custom: bandwidth of a link inside a replica, GB/s", .check = Check::Positive,
       .missing = Missing::Default},
      {.flag = "--dp-gbps", .key = "pacing/dp_gbps", .field = NTP_FIELD(pacing.dp_gbps),
       .help = "Paced, --machine custom: bandwidth of a link between replicas, GB/s", .check = Check::Positive,
       .missing = Missing::Default},
      {.flag = "--link-latency-us", .key = "pacing/latency_us", .field = NTP_FIELD(pacing.latency_us),
       .help = "Paced, --machine custom: latency of one message, microseconds", .check = Check::NonNegative,
       .missing = Missing::Default},
      {.flag = "--boost", .key = "pacing/boost", .field = NTP_FIELD(pacing.boost),
       .help = "ntp-pw: speed-up of a damaged replica's ranks (power boost), at most 1.3 (the paper's TDP "
               "headroom)",
       .check = Check::Range, .lo = 1.0, .hi = 1.3, .missing = Missing::Default},
  };
}

#undef NTP_FIELD

}  // namespace

const std::vector<OptionSpec>& option_table() {
  static const std::vector<OptionSpec> table = [] {
    std::vector<OptionSpec> t;
    for (auto group : {model_options, layout_options, optimizer_options, output_options, hardware_options,
                       failure_options, recovery_cost_options}) {
      auto g = group();
      t.insert(t.end(), std::make_move_iterator(g.begin()), std::make_move_iterator(g.end()));
    }
    return t;
  }();
  return table;
}

const OptionSpec& option_spec(const std::string& flag) {
  for (const OptionSpec& s : option_table())
    if (s.flag == flag) return s;
  throw std::out_of_range("no option " + flag);
}

nlohmann::json field_value(const OptionSpec& s, const Options& o) {
  return std::visit(
      [&](auto f) -> nlohmann::json {
        if constexpr (std::is_same_v<decltype(f), TextField>)
          return f.get(o);
        else
          return f(const_cast<Options&>(o));  // the reference is only read
      },
      s.field);
}

void set_field_value(const OptionSpec& s, Options& o, const nlohmann::json& v) {
  std::visit(
      [&](auto f) {
        if constexpr (std::is_same_v<decltype(f), TextField>)
          f.set(o, v.get<std::string>());
        else
          f(o) = v.get<std::remove_reference_t<decltype(f(o))>>();
      },
      s.field);
}

void copy_field(const OptionSpec& s, const Options& from, Options& to) {
  set_field_value(s, to, field_value(s, from));
}

nlohmann::json to_json(const Options& o) {
  nlohmann::json j = nlohmann::json::object();
  for (const OptionSpec& s : option_table())
    if (!s.key.empty()) j[nlohmann::json::json_pointer("/" + s.key)] = field_value(s, o);
  return j;
}

Options options_from_json(const nlohmann::json& j) {
  Options o;
  for (const OptionSpec& s : option_table()) {
    if (s.key.empty()) continue;
    const nlohmann::json::json_pointer at("/" + s.key);
    if (j.contains(at))
      set_field_value(s, o, j.at(at));
    else if (s.missing == Missing::Legacy)
      set_field_value(s, o, s.legacy);
    else if (s.missing == Missing::Required)
      throw std::invalid_argument("the recorded configuration has no '" + s.key + "'");
    // Missing::Default: o already holds today's default.
  }
  o.pacing.enabled = o.timing == Timing::Paced;
  return o;
}

}  // namespace ntp
