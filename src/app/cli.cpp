#include "cli.hpp"

#include <CLI/CLI.hpp>
#include <cmath>
#include <string>
#include <type_traits>

#include "tp_layout.hpp"

namespace ntp {

namespace {

// Every floating-point flag (and its --config key) must be a finite number that stays finite in the
// field's own type: CLI11's ranges compare, and NaN compares false, so `--lr nan` would pass them.
template <typename T>
CLI::Validator finite() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        long double v = 0;
        if (!CLI::detail::lexical_cast(in, v)) return "'" + in + "' is not a number";
        if (!std::isfinite(v)) return in + " is not a finite number";
        if (!std::isfinite(static_cast<T>(v)))
          return in + " is not a finite number in " + (sizeof(T) == 4 ? "single" : "double") + " precision";
        return {};
      },
      "", "FINITE");
}

// A floating-point option: finite first, then the option's own range.
template <typename T>
CLI::Option* add_real(CLI::App& app, const std::string& name, T& field, const std::string& help) {
  static_assert(std::is_floating_point_v<T>);
  return app.add_option(name, field, help)->check(finite<T>());
}

// Flags that do not map one-to-one onto an Options field: the preset and its overrides, resolved
// into a ModelConfig after parsing.
struct ModelFlags {
  std::string preset;  // "" = the family's default
  std::string model;   // "" = the preset's family
  std::optional<int> layers, heads, hidden, seq, vocab, context, kv_heads, ffn;
  std::optional<float> rope_theta;
  std::string lr_schedule = "constant";
};

void add_model_flags(CLI::App& app, ModelFlags& m, Options& o) {
  app.add_option("--model", m.model,
                 "Model family: gpt2 (LayerNorm, GELU, learned positions, biases, tied head) or llama (RMSNorm, "
                 "SwiGLU, rotary positions, grouped-query attention, no biases, untied head). Default: the "
                 "preset's family")
      ->check(CLI::IsMember({"gpt2", "llama"}));
  app.add_option("--preset", m.preset,
                 "Model size. gpt2: tiny, small (the default), gpt2, gpt2-medium, gpt2-large, gpt2-xl. llama "
                 "(implies --model llama): llama-tiny, llama-small (the default with --model llama), llama-8b "
                 "(an 8B-class shape, for benchmarks and simulation)")
      ->check(CLI::IsMember(preset_names()));
  app.add_option("--kv-heads", m.kv_heads,
                 "llama: key/value heads (grouped-query attention; a divisor of --heads). A KV head and its query "
                 "heads stay on one rank, so --tp may not exceed it")
      ->check(CLI::PositiveNumber);
  app.add_option("--ffn", m.ffn, "llama: SwiGLU hidden width (columns of gate_proj and up_proj)")
      ->check(CLI::PositiveNumber);
  app.add_option("--rope-theta", m.rope_theta, "llama: base of the rotary position embeddings")
      ->check(finite<float>())
      ->check(CLI::Range(1.0f, 1e9f));
  app.add_option("--layers", m.layers, "Override the number of transformer layers")->check(CLI::PositiveNumber);
  app.add_option("--heads", m.heads, "Override the number of attention heads (llama: query heads)")
      ->check(CLI::PositiveNumber);
  app.add_option("--hidden", m.hidden, "Override the hidden size d (a multiple of --heads)")->check(CLI::PositiveNumber);
  app.add_option("--seq", m.seq, "Training sequence length T (default: the preset's context)")
      ->check(CLI::PositiveNumber);
  app.add_option("--context", m.context, "Rows of the position table (default: the preset's; grown to --seq)")
      ->check(CLI::PositiveNumber);
  app.add_option("--vocab", m.vocab, "Override the vocabulary size V")->check(CLI::Range(2, 1 << 24));
  app.add_option("--tp", o.tp, "Tensor-parallel degree; ranks must be a multiple of TP x PP, DP = ranks / (TP x PP)")
      ->check(CLI::PositiveNumber);
  app.add_option("--pp", o.pp,
                 "Pipeline-parallel stages (Megatron's non-interleaved 1F1B): layers split as evenly as possible, "
                 "the embedding on the first stage, the final norm, head and loss on the last; at most --layers")
      ->check(CLI::PositiveNumber);
  app.add_option("--micro-batch", o.micro_batch, "Sequences per micro-batch (b)")->check(CLI::PositiveNumber);
  app.add_option("--micro-batches", o.micro_batches,
                 "Micro-batches per replica per step (M, gradient accumulation; with --pp the pipeline's depth of "
                 "work): a replica takes b x M sequences per step. Under ntp a damaged replica runs max(1, floor(M "
                 "t' / t)) of them")
      ->check(CLI::PositiveNumber);
  app.add_option("--steps", o.steps, "Training steps to run")->check(CLI::PositiveNumber);
  app.add_option("--seed", o.seed, "Seed for weights and synthetic data");
  app.add_option("--data", o.data,
                 "'synthetic' (seeded Markov chain); an llm.c token file (magic 20240520: uint16 tokens, 20240801: "
                 "uint32; every id < --vocab; jobs/data/prepare.py writes one from text), which a .bin file must be; "
                 "or any other file, read as bytes (needs V >= 256)");
}

void add_optimizer_flags(CLI::App& app, ModelFlags& m, Options& o) {
  add_real(app, "--lr", o.opt.lr, "AdamW peak learning rate")->check(CLI::PositiveNumber);
  add_real(app, "--beta1", o.opt.beta1, "AdamW beta1")->check(CLI::Range(0.0, 0.999999));
  add_real(app, "--beta2", o.opt.beta2, "AdamW beta2")->check(CLI::Range(0.0, 0.999999));
  add_real(app, "--eps", o.opt.eps, "AdamW epsilon")->check(CLI::PositiveNumber);
  add_real(app, "--weight-decay", o.opt.weight_decay, "Decoupled weight decay on 2-D tensors")
      ->check(CLI::NonNegativeNumber);
  add_real(app, "--clip", o.opt.clip, "Clip gradients to this global norm (0: no clipping)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--warmup", o.opt.warmup, "Linear learning-rate warmup steps")->check(CLI::NonNegativeNumber);
  app.add_option("--lr-schedule", m.lr_schedule, "constant, or cosine decay to --min-lr-ratio x lr by the last step")
      ->check(CLI::IsMember({"constant", "cosine"}));
  add_real(app, "--min-lr-ratio", o.opt.min_lr_ratio, "Final lr as a fraction of --lr under cosine decay")
      ->check(CLI::Range(0.0, 1.0));
}

// Where results and checkpoints go, where a run starts from, and what it prints.
void add_output_flags(CLI::App& app, Options& o) {
  app.add_option("--out", o.out, "Results file (HDF5); default results/ntpbench-<date>-<time>.h5");
  app.add_flag("--overwrite", o.overwrite, "Replace an existing --out file instead of refusing");
  app.add_option("--checkpoint-every", o.checkpoint_every, "Write a checkpoint every K steps (0: only the final one)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "Where checkpoints go (default: <out without .h5>.ckpt/)");
  app.add_flag("!--no-final-checkpoint", o.final_checkpoint,
               "Do not write the end-of-run checkpoint (--replay needs it)");
  app.add_option("--init-from", o.init_from,
                 "Start from a checkpoint: weights, and AdamW state, step and data cursor when present")
      ->check(CLI::ExistingFile);
  app.add_flag("--init-weights-only", o.init_weights_only, "With --init-from: load the weights only");
  app.add_option("--replay", o.replay,
                 "Re-run RUN.h5's recorded steps on one rank and compare with its final checkpoint")
      ->check(CLI::ExistingFile);
  add_real(app, "--replay-tol", o.replay_tol, "Largest relative parameter difference --replay accepts")
      ->check(CLI::PositiveNumber);
  app.add_flag("--quiet", o.quiet, "Print only the summary, not a line per step");
  app.add_flag("--check", o.check, "Validate the configuration and the schedule against the job's ranks, then exit");
}

void add_failure_and_timing_flags(CLI::App& app, Options& o) {
  app.add_option("--schedule", o.schedule,
                 "Failure schedule (YAML: events to kill/revive ranks or every rank of a host, kill_node/revive_node, "
                 "and/or a random generator)")
      ->check(CLI::ExistingFile);
  app.add_option("--policy", o.policy,
                 "Recovery policy: dp-drop (a damaged replica stops), ntp (it runs at reduced TP with a smaller "
                 "batch), ntp-pw (reduced TP, full batch, boosted ranks), restart (all roll back to the last "
                 "checkpoint)")
      ->check(CLI::IsMember({"dp-drop", "ntp", "ntp-pw", "restart"}));
  app.add_option("--kill-mode", o.kill_mode,
                 "How a scheduled kill kills: signal (the rank's process dies by SIGKILL, at the event's `at:` phase; "
                 "the others learn it from MPI and repair with ULFM; needs Open MPI >= 5 and mpirun --with-ft "
                 "ulfm) or fence (the rank leaves the communicators and idles; any MPI). Default: signal where "
                 "the job runs with ULFM, else fence; also fence on a job of several hosts whose schedule revives "
                 "ranks (Open MPI 5.0 cannot connect a process spawned there)")
      ->check(CLI::IsMember({"signal", "fence"}));
  add_real(app, "--hang-timeout", o.hang_timeout,
           "Seconds a rank may go without progress (no phase of a step, repair, revival or checkpoint ending) "
           "before it prints where it waits and ends the job with exit code 5; the limit grows to 10x the "
           "longest step so far and to 20x the step the model's FLOPs predict at the peak. 0: wait for ever")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--on-nonfinite", o.on_nonfinite,
                 "A non-finite loss or gradient norm, caught before the update touches any parameter: stop (record "
                 "the step as not committed, end the run with exit code 4) or skip (no update, the batch is "
                 "consumed; skipped steps are counted in /summary)")
      ->check(CLI::IsMember({"stop", "skip"}));
  app.add_option("--timing", o.timing,
                 "wall: real time; paced: each rank emulates a device of --device-gflops and links of --tp-gbps/"
                 "--dp-gbps (for more ranks than cores)")
      ->check(CLI::IsMember({"wall", "paced"}));
  add_real(app, "--device-gflops", o.pacing.device_gflops, "Paced: compute rate of one emulated device, GFLOP/s")
      ->check(CLI::PositiveNumber);
  add_real(app, "--tp-gbps", o.pacing.tp_gbps, "Paced: bandwidth of a link inside a replica, GB/s")
      ->check(CLI::PositiveNumber);
  add_real(app, "--dp-gbps", o.pacing.dp_gbps, "Paced: bandwidth of a link between replicas, GB/s")
      ->check(CLI::PositiveNumber);
  add_real(app, "--link-latency-us", o.pacing.latency_us, "Paced: latency of one message, microseconds")
      ->check(CLI::NonNegativeNumber);
  add_real(app, "--boost", o.pacing.boost,
                 "ntp-pw: speed-up of a damaged replica's ranks (power boost), at most 1.3 (the paper's TDP headroom)")
      ->check(CLI::Range(1.0, 1.3));
}

// Where the arithmetic runs: threads, backend, precision, and the peak MFU is measured against.
void add_hardware_flags(CLI::App& app, Options& o) {
  app.add_option("--threads", o.threads, "BLAS/OpenMP threads per rank (0: cores per node / ranks per node)")
      ->check(CLI::NonNegativeNumber);
  add_real(app, "--peak-gflops", o.peak_gflops,
           "Peak GFLOP/s of one rank for MFU (0: the machine's SGEMM peak at the rank's threads, probed at start "
           "and never below the best earlier probe, cached in ~/.cache/ntpbench; see results/README.md)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--backend", o.backend, "Where kernels run: cpu (OpenBLAS + OpenMP) or cuda (cuBLAS, one GPU per rank)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--precision", o.precision,
                 "GEMM arithmetic: fp32, or bf16 (needs --backend cuda): every matmul and attention product runs on "
                 "bf16 copies of its operands with fp32 accumulation and output; weights (the fp32 master copy), "
                 "gradients, AdamW and all other kernels stay fp32")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_flag("--allow-gpu-sharing", o.allow_gpu_sharing,
               "With --backend cuda: allow more ranks than GPUs on a node (ranks then share GPUs)");
}

// The preset and family from --preset and --model, refusing a preset of the other family and
// Llama-only flags on GPT-2.
void resolve_family(const ModelFlags& m, Options& o) {
  if (!m.preset.empty() && !m.model.empty() && m.model != family_name(preset_family(m.preset)))
    throw CLI::ValidationError("--model", "--preset " + m.preset + " is a " + family_name(preset_family(m.preset)) +
                                              " model, but --model is " + m.model + " (the " + m.model +
                                              " presets: " + (m.model == "llama" ? "llama-tiny, llama-small, llama-8b" :
                                              "tiny, small, gpt2, gpt2-medium, gpt2-large, gpt2-xl") + ")");
  o.preset = !m.preset.empty() ? m.preset : m.model == "llama" ? "llama-small" : "small";
  o.model = preset(o.preset);
  if (o.model.family == Family::Llama) return;
  const std::pair<const char*, bool> llama_only[] = {
      {"--kv-heads", bool(m.kv_heads)}, {"--ffn", bool(m.ffn)}, {"--rope-theta", bool(m.rope_theta)}};
  for (auto [flag, given] : llama_only)
    if (given)
      throw CLI::ValidationError(flag, std::string(flag) + " applies to --model llama only (this run trains " +
                                           o.preset + ", a gpt2 model)");
}

// After parsing: the model from the preset and its overrides, and the checks that span flags.
// Throws CLI::ValidationError naming the flag.
void resolve(const ModelFlags& m, Options& o) {
  resolve_family(m, o);
  if (m.kv_heads) o.model.kv_heads = *m.kv_heads;
  if (m.ffn) o.model.ffn = *m.ffn;
  if (m.rope_theta) o.model.rope_theta = *m.rope_theta;
  if (m.layers) o.model.layers = *m.layers;
  if (m.heads) o.model.heads = *m.heads;
  if (m.hidden) o.model.hidden = *m.hidden;
  if (m.vocab) o.model.vocab = *m.vocab;
  if (m.context) o.model.context = *m.context;
  o.seq = m.seq ? *m.seq : o.model.context;
  if (o.seq > o.model.context) {
    if (m.context)
      throw CLI::ValidationError("--seq", "--seq " + std::to_string(o.seq) + " exceeds --context " +
                                              std::to_string(*m.context));
    o.model.context = o.seq;
  }
  if (o.model.hidden % o.model.heads != 0)
    throw CLI::ValidationError("--hidden", "hidden size " + std::to_string(o.model.hidden) +
                                               " is not a multiple of the head count " +
                                               std::to_string(o.model.heads));
  try {
    validate_model(o.model);
  } catch (const std::invalid_argument& e) {
    throw CLI::ValidationError("--model", e.what());
  }
  if (o.model.family == Family::Llama && o.tp > o.model.head_units())
    throw CLI::ValidationError("--tp", tp_degree_problem(o.model, o.tp));
  if (o.tp > o.model.heads)
    throw CLI::ValidationError("--tp", "TP degree " + std::to_string(o.tp) + " exceeds the head count " +
                                           std::to_string(o.model.heads));
  if (o.pp > o.model.layers)
    throw CLI::ValidationError("--pp", "--pp " + std::to_string(o.pp) + " stages for a model of " +
                                           std::to_string(o.model.layers) + " layers: every stage needs a layer");
  o.opt.cosine = m.lr_schedule == "cosine";
  if (o.init_weights_only && o.init_from.empty()) throw CLI::ValidationError("--init-weights-only", "needs --init-from");
  if (o.precision != "fp32" && o.backend != "cuda")
    throw CLI::ValidationError("--precision", "--precision " + o.precision + " needs --backend cuda; --backend " +
                                                  o.backend + " computes in fp32 only");
  o.opt.total_steps = o.steps;
  o.pacing.enabled = o.timing == "paced";
}

}  // namespace

ParseResult parse_options(int argc, char** argv, bool print) {
  CLI::App app{
      "ntpbench: a real GPT-2 or Llama training step (forward, backward, AdamW) under tensor x pipeline x data "
      "parallelism on MPI ranks.\nLaunch with mpirun/srun; DP = ranks / (--tp x --pp). Results go to an HDF5 file (see results/README.md)."};
  app.option_defaults()->always_capture_default();
  Options o;
  ModelFlags m;
  add_model_flags(app, m, o);
  add_optimizer_flags(app, m, o);
  add_output_flags(app, o);
  add_hardware_flags(app, o);
  add_failure_and_timing_flags(app, o);
  app.set_config("--config", "", "Read any of these flags from a TOML file (CLI11 syntax: name = value)");
  app.allow_config_extras(false);  // a misspelt key in a config file is an error, not a silent default
  app.footer(
      "Exit codes: 0 the run finished; 1 an internal or MPI error on some rank (its message names it); 2 bad "
      "flags, schedule, config or checkpoint; 3 failures left no replica able to train and no "
      "revival is scheduled (the results file holds every step so far); 4 a non-finite loss or gradient norm; 5 "
      "a rank made no progress within --hang-timeout, or new processes for a revival did not join within 300 s "
      "(the MPI library reported nothing: a peer stopped without dying, or the library itself hangs).");
  try {
    app.parse(argc, argv);
    resolve(m, o);
  } catch (const CLI::CallForHelp& e) {
    if (print) app.exit(e);
    return {std::nullopt, 0};
  } catch (const CLI::ParseError& e) {
    if (print) app.exit(e);
    return {std::nullopt, 2};
  }
  return {o, 0};
}

}  // namespace ntp
