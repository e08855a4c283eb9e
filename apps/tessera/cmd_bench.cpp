// tessera bench: generation speed of engine options side by side, in one run, on one prompt.
//   tessera bench [-m DIR | --geometry NAME] [--prompt-len 512 | -p TEXT] [--gen-length 128]
//                 [--block-length 32] [--steps N] [--threshold X] [--temperature T] [--cache C]
//                 [--eos] [--stop TEXT]... [--compare SPEC]... [--batch N] [--json] [--json-out F] [--svg F]
// The baseline is the options given; each --compare SPEC (the keys of tessera eval) changes some of
// them. Per row: wall time (best of --reps after one warm-up forward over the whole canvas), tokens/s,
// speed-up over the baseline, forwards, the query rows the forwards computed (what the work follows)
// and the key rows they attended to,
// the largest planned activation peak, the KV cache held, and the share of generated tokens equal to
// the baseline's; for MoE models the mean unique experts per MoE layer and forward, and with --profile
// the time in the MoE ops (router + expert FFN) and its speed-up. Generation does not stop at EOS unless
// --eos is given, so every row produces the same number of tokens (window-early-stop fills the tail
// after the EOS with it); --eos and --stop TEXT end the answers as tessera generate does (tokens/s
// counts the answer's tokens).
// --batch N adds a throughput comparison: N requests with the baseline's options (N prompts of the same
// length) one after another, then all at once through the Batcher (packed forwards), with the share of
// requests whose tokens are identical in both.
// Every --compare SPEC is checked before anything is measured; on a terminal a progress line shows on
// stderr, and each row is printed (and flushed) as soon as it is measured.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "apps/tessera/cli_parse.h"
#include "apps/tessera/cli_session.h"
#include "apps/tessera/commands.h"
#include "apps/tessera/compare.h"
#include "apps/tessera/svg.h"
#include "core/error.h"
#include "engine/batcher.h"
#include "io/model_files.h"
#include "io/tokenizer.h"
#include "memory/chunk_optimizer.h"

namespace tessera::cli {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct BenchArgs {
  std::string model, geometry, prompt, json_out, svg, device = "cpu", precision = "auto",
                                                      alg = "low_confidence";
  std::string cache = "none", mode = "diffusion";
  int prompt_len = 512, gen_length = 128, block_length = 32, steps = 0, reps = 1, batch = 0;
  int tp = 1, ep = 1;  // tensor / expert parallelism over mpirun's ranks (rank 0 prints)
  float threshold = 0.0f, temperature = 0.0f;
  uint64_t seed = 0;
  bool dequantize = false;
  double dist_timeout = 120.0;  // --dist-timeout: seconds a collective may wait (as generate's)
  bool profile = false;
  bool json = false;              // --json: the JSON on stdout instead of the table
  bool eos = false;               // --eos: the answers end at the model's EOS
  std::vector<std::string> stop;  // --stop: ... or before a stop sequence
  std::vector<std::string> compare;
};

struct Row {
  std::string label;
  double seconds = 0;
  int steps = 0;
  int64_t forwards = 0;  // token editing runs forwards that change nothing (no step)
  double query_rows = 0, key_rows = 0;
  size_t activation_peak = 0, kv_cache = 0;
  size_t weights = 0;  // the engine's weight bytes (quantized GGUF weights count as stored)
  double agreement = 1.0;
  double experts = 0;      // MoE models: mean unique experts per (MoE layer, forward)
  double moe_seconds = 0;  // --profile: time in the MoE router and expert FFN ops
  // CUDA: forwards replayed as recorded step graphs in the best repetition, and the kernels and copies
  // a replayed forward launches at once.
  int64_t graph_replays = 0, graph_nodes = 0, graph_captures = 0, attention_plans = 0;
  std::array<double, graph::kOpKinds> op_seconds{};  // --profile: every op kind, the best repetition
  std::array<double, graph::kOpKinds> op_flops{};    // --profile: their GEMM, expert and attention FLOPs
  MoeTraffic traffic;                                // --profile, MoE: expert parallelism's exchanges
  uint64_t comm_bytes = 0, comm_calls = 0;           // --tp / --ep: this rank's collectives, last repetition
  // GEMM primitives made (Backend::gemm_primitives_created) in each repetition's first step and in its
  // later steps: the first repetition makes its shapes, later ones (new requests) find them cached.
  std::vector<std::pair<int64_t, int64_t>> primitives;
  std::vector<int32_t> tokens;
};

// The model directory of -m, else the bundled default model.
std::string model_dir(const BenchArgs& a) {
  return a.model.empty() ? default_model_dir() : a.model;
}

std::unique_ptr<Engine> make_engine(const BenchArgs& a, const EngineOptions& eng) {
  if (!a.geometry.empty()) return Engine::synthetic(named_geometry(a.geometry), eng);
  return Engine::load(model_dir(a), eng);
}

// cut: cuts every answer before the first of o.stop (o.stop_when says when the decided tokens hold one).
// progress("step 3/64") while it runs.
Row measure(Engine& e, const std::vector<int32_t>& prompt, const GenerateOptions& o, int reps,
            const Tokenizer* cut, const std::function<void(const std::string&)>& progress) {
  progress("warm-up forward");
  {  // warm-up: one forward over the whole canvas commits the workspace and starts the threads
    std::vector<int32_t> canvas = prompt, pos(static_cast<size_t>(o.gen_length)), tok(pos.size());
    std::vector<float> conf(pos.size());
    canvas.resize(prompt.size() + pos.size(), e.mask_token());
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(prompt.size() + i);
    if (e.attention_block() > 0) e.set_attention_block(o.block_length);
    e.predict(canvas, pos, SampleParams{}, tok, conf);
  }
  Row r;
  for (int rep = 0; rep < reps; ++rep) {
    double rows = 0, keys = 0;
    size_t peak = 0;
    e.reset_op_seconds();
    if (e.collectives() != nullptr) e.collectives()->reset_stats();
    const int64_t replays0 = e.step_graphs().replays();
    const int64_t captures0 = e.step_graphs().captures(), plans0 = e.backend().attention_library_plans();
    const auto t0 = std::chrono::steady_clock::now();
    const std::string rep_text =
        reps > 1 ? " (rep " + std::to_string(rep + 1) + "/" + std::to_string(reps) + ")" : std::string();
    progress("step 0/" + std::to_string(o.steps) + rep_text);
    const int64_t made0 = e.backend().gemm_primitives_created();
    int64_t made1 = -1;
    GenerateResult res = generate(e, prompt, o, [&](const StepEvent& ev) {
      if (made1 < 0) made1 = e.backend().gemm_primitives_created();
      progress("step " + std::to_string(ev.step + 1) + "/" + std::to_string(o.steps) + rep_text);
      rows += static_cast<double>(e.last_step().shape.n_query);
      keys += static_cast<double>(e.last_step().shape.n_kv);
      peak = std::max(peak, e.last_step().planned_peak);
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int64_t made = e.backend().gemm_primitives_created();
    r.primitives.emplace_back(made1 < 0 ? made - made0 : made1 - made0, made1 < 0 ? 0 : made - made1);
    if (rep == 0 || s < r.seconds) {
      r.seconds = s;
      const auto& ops = e.op_seconds();
      r.op_seconds = ops;
      r.op_flops = e.op_flops();
      r.traffic = e.moe_traffic();
      r.moe_seconds =
          ops[static_cast<int>(graph::OpKind::MoeRoute)] + ops[static_cast<int>(graph::OpKind::MoeFfn)];
      r.graph_replays = e.step_graphs().replays() - replays0;
      r.graph_captures = e.step_graphs().captures() - captures0;
      r.attention_plans = e.backend().attention_library_plans() - plans0;
      r.graph_nodes = e.step_graphs().last_nodes();
    }
    if (e.options().comm) {
      r.comm_bytes = e.collectives()->stats().bytes;
      r.comm_calls = e.collectives()->stats().calls;
    }
    r.experts = e.moe_stats().mean(e.moe_stats().unique);
    r.steps = res.steps_run;
    r.forwards = res.forwards;
    r.query_rows = rows;
    r.key_rows = keys;
    r.activation_peak = peak;
    if (cut != nullptr) {
      std::string text = cut->decode(res.tokens, true);
      cut_at_stop(*cut, o.stop, res, text);
    }
    r.tokens = std::move(res.tokens);
  }
  r.kv_cache = plan_request(o, 1, false).kv_capacity > 0 ? e.kv_cache_bytes() : 0;
  return r;
}

struct BatchRow {
  double sequential = 0, batched = 0;  // seconds (best of reps)
  BatchStats stats;
  int identical = 0;  // requests whose batched tokens equal their sequential tokens
};

// N requests one after another, then concurrently through a Batcher of N.
BatchRow measure_batch(Engine& e, const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& o,
                       int reps, Progress& progress) {
  const size_t n = prompts.size();
  std::vector<std::vector<int32_t>> seq(n), bat(n);
  BatchRow r;
  for (int rep = 0; rep < reps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < n; ++i) {
      progress.show("batch: one after another, request " + std::to_string(i + 1) + "/" + std::to_string(n));
      seq[i] = generate(e, prompts[i], o).tokens;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep == 0 || s < r.sequential) r.sequential = s;
  }
  for (int rep = 0; rep < reps; ++rep) {
    progress.show("batch: " + std::to_string(n) + " requests at once");
    Batcher b(e, static_cast<int>(n), std::chrono::milliseconds(2), true);  // over ranks: rank 0 orders
    std::vector<std::thread> th;
    std::vector<std::exception_ptr> err(n);
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < n; ++i) {
      th.emplace_back([&, i] {
        try {
          bat[i] = b.generate(prompts[i], o, {}, i).tokens;  // keyed alike on every rank
        } catch (...) {
          err[i] = std::current_exception();
        }
      });
    }
    for (auto& t : th) t.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (const auto& x : err)
      if (x) std::rethrow_exception(x);
    if (rep == 0 || s < r.batched) {
      r.batched = s;
      r.stats = b.stats();
    }
  }
  for (size_t i = 0; i < n; ++i) r.identical += seq[i] == bat[i] ? 1 : 0;
  return r;
}

// The table's row of r (r0: the baseline); and its JSON.
double tokens_per_second(const Row& r) {
  return r.seconds > 0 ? static_cast<double>(r.tokens.size()) / r.seconds : 0.0;
}
double forwards_per_token(const Row& r) {
  return r.tokens.empty() ? 0.0 : static_cast<double>(r.forwards) / static_cast<double>(r.tokens.size());
}

// FLOPs of the GEMMs, gather-GEMMs, routed experts and (dense-counted) attention per second of the whole
// generation.
double counted_rate(const Row& r) {
  double f = 0;
  for (double x : r.op_flops) f += x;
  return r.seconds > 0 ? f / r.seconds : 0.0;
}

// --profile on the CPU: the backend's bf16 GEMM rate now (FLOP/s, best of 3 at M = N = K = 2048, as
// gemm_bench's peak), so that a row's rate is compared with the machine's in the same run; 0 elsewhere.
double machine_gemm_rate(Backend& b) {
  if (b.device() != Device::CPU) return 0.0;
  constexpr int64_t n = 2048;
  std::vector<uint16_t> a(static_cast<size_t>(n * n)), w(a.size());
  for (size_t i = 0; i < a.size(); ++i) {  // values in [-1, 1): no denormals, no constant data
    a[i] = f32_to_bf16(static_cast<float>(2.0 * rng_uniform(1, i, 0) - 1.0));
    w[i] = f32_to_bf16(static_cast<float>(2.0 * rng_uniform(2, i, 0) - 1.0));
  }
  std::vector<float> c(a.size());
  Tensor ta(a.data(), DType::BF16, {n, n}), tw(w.data(), DType::BF16, {n, n}),
      tc(c.data(), DType::F32, {n, n});
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {  // the first creates the primitive
    const auto t0 = std::chrono::steady_clock::now();
    b.gemm(ta, tw, nullptr, tc, false);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::max(best, 2.0 * n * n * n / s);
  }
  return best;
}

void print_row(const Row& r, const Row& r0, bool moe, bool profile, double gemm_rate) {
  std::printf("%-28s %9.3f %9.1f %7.2fx %6d %8.3f %11.0f %11.0f %10s %11s %10s %9.4f", r.label.c_str(),
              r.seconds, tokens_per_second(r), r0.seconds / r.seconds, r.steps, forwards_per_token(r),
              r.query_rows, r.key_rows, human_bytes(static_cast<double>(r.weights)).c_str(),
              human_bytes(static_cast<double>(r.activation_peak)).c_str(),
              human_bytes(static_cast<double>(r.kv_cache)).c_str(), r.agreement);
  if (moe) std::printf(" %8.1f", r.experts);
  if (profile)
    std::printf(" %9.3f %7.2fx", r.moe_seconds, r.moe_seconds > 0 ? r0.moe_seconds / r.moe_seconds : 0.0);
  std::printf("\n");
  if (profile) {
    std::printf("    ops: %s\n", format_op_seconds(r.op_seconds, 1.0, &r.op_flops).c_str());
    const double rate = counted_rate(r);
    if (gemm_rate > 0)
      std::printf(
          "    whole generation: %.0f GFLOP/s (GEMMs, experts and attention over its seconds) = %.0f%% of "
          "the bf16 "
          "GEMM rate measured in this run, %.0f GFLOP/s\n",
          rate / 1e9, 100.0 * rate / gemm_rate, gemm_rate / 1e9);
    const MoeTraffic& t = r.traffic;
    if (t.rows > 0 && r.forwards > 0) {
      std::string line;
      for (size_t i = 0; i < MoeTraffic::kRanks.size(); ++i) {
        const int n = MoeTraffic::kRanks[i];
        if (t.touched[i] == 0) continue;
        char buf[200];
        std::snprintf(
            buf, sizeof buf,
            "%s%d ranks %.2f / %.2f MiB (%.0f%% of row-rank pairs touched, busiest rank %.2fx the mean)",
            line.empty() ? "" : "; ", n, t.all_reduce_bytes(i) / r.forwards / 1048576.0,
            t.sparse_bytes(i) / r.forwards / 1048576.0, 100.0 * t.touched_share(i), t.busiest_over_mean(i));
        line += buf;
      }
      std::printf("    expert parallelism per forward, all-reduce / sparse combine over all ranks: %s\n",
                  line.c_str());
    }
    if (!r.primitives.empty() && gemm_rate > 0) {
      std::string reps;
      for (const auto& [first, later] : r.primitives)
        reps += (reps.empty() ? "" : ", ") + std::to_string(first) + " + " + std::to_string(later);
      std::printf("    GEMM primitives made, first step + later steps, per repetition: %s\n", reps.c_str());
    }
  }
  if (r.comm_calls > 0 && r.forwards > 0) {
    const double f = static_cast<double>(r.forwards);
    std::printf("    collectives: %.1f KiB in %.0f all-reduces per forward (this rank's payload)\n",
                static_cast<double>(r.comm_bytes) / f / 1024.0, static_cast<double>(r.comm_calls) / f);
  }
  std::fflush(stdout);  // each row as soon as it is measured, also into a pipe
}

// Row::traffic per forward, one entry per rank count (MoE models under --profile; else empty).
json traffic_json(const Row& r) {
  json out = json::array();
  const MoeTraffic& t = r.traffic;
  if (t.rows == 0 || r.forwards == 0) return out;
  const double f = static_cast<double>(r.forwards);
  for (size_t i = 0; i < MoeTraffic::kRanks.size(); ++i) {
    if (t.touched[i] == 0) continue;
    out.push_back({{"ranks", MoeTraffic::kRanks[i]},
                   {"all_reduce_bytes_per_forward", t.all_reduce_bytes(i) / f},
                   {"sparse_combine_bytes_per_forward", t.sparse_bytes(i) / f},
                   {"touched_share", t.touched_share(i)},
                   {"busiest_rank_over_mean", t.busiest_over_mean(i)}});
  }
  return out;
}

json row_json(const Row& r, const Row& r0) {
  json op_json = json::object(), flop_json = json::object();
  for (int k = 0; k < graph::kOpKinds; ++k) {
    const char* op = graph::op_name(static_cast<graph::OpKind>(k));
    if (r.op_seconds[static_cast<size_t>(k)] > 0) op_json[op] = r.op_seconds[static_cast<size_t>(k)];
    if (r.op_flops[static_cast<size_t>(k)] > 0) flop_json[op] = r.op_flops[static_cast<size_t>(k)];
  }
  return {{"option", r.label},
          {"seconds", r.seconds},
          {"tokens", r.tokens.size()},
          {"tokens_per_second", tokens_per_second(r)},
          {"speedup", r0.seconds / r.seconds},
          {"steps", r.steps},
          {"forwards", r.forwards},
          {"forwards_per_token", forwards_per_token(r)},
          {"comm_bytes", r.comm_bytes},
          {"comm_calls", r.comm_calls},
          {"query_rows", r.query_rows},
          {"key_rows", r.key_rows},
          {"weight_bytes", r.weights},
          {"activation_peak_bytes", r.activation_peak},
          {"kv_cache_bytes", r.kv_cache},
          {"agreement", r.agreement},
          {"experts_per_moe_layer", r.experts},
          {"moe_seconds", r.moe_seconds},
          {"step_graph_replays", r.graph_replays},
          {"step_graph_nodes", r.graph_nodes},
          {"step_graph_captures", r.graph_captures},
          {"attention_library_plans", r.attention_plans},
          {"op_seconds", std::move(op_json)},
          {"op_flops", std::move(flop_json)},
          {"gemm_primitives_made", r.primitives},
          {"expert_parallel_traffic", traffic_json(r)},
          {"counted_flops_per_second", counted_rate(r)}};
}

// --svg: tokens/s, time per step, speed-up and agreement per option.
void write_chart(const std::string& path, const std::string& title, const std::string& subtitle,
                 const std::vector<Row>& rows, const std::string& batch_note) {
  std::vector<std::string> labels;
  svg::Metric tps{"tokens/s", {}, 1, true}, step{"ms per step", {}, 2, false}, speed{"speed-up", {}, 2, true},
      agree{"agreement", {}, 3, true};
  for (const Row& r : rows) {
    labels.push_back(r.label);
    tps.values.push_back(tokens_per_second(r));
    step.values.push_back(r.steps > 0 ? 1000.0 * r.seconds / r.steps : NAN);
    speed.values.push_back(rows.front().seconds / r.seconds);
    agree.values.push_back(r.agreement);
  }
  std::vector<std::string> notes = {
      "tokens/s: generated tokens per second of wall time (best of the repetitions); ms per step: that time "
      "over the denoising steps run",
      "speed-up: the baseline's time over the row's; agreement: share of the row's tokens equal to the "
      "baseline's, position by position (1 = identical)"};
  if (!batch_note.empty()) notes.push_back(batch_note);
  svg::save(path, "--svg", svg::bar_chart(title, subtitle, labels, {tps, step, speed, agree}, notes));
}

// A uniform-noise model (DiffusionGemma): its three kinds of forward timed apart, as decode/uniform.cpp
// runs them: the prompt's causal prefill (chunks of 512 rows), a canvas's denoising steps (the decoder
// over the whole canvas, sampled and self-conditioned on the device) and the commit (the causal pass that
// appends a finished canvas's K / V). Best of --reps each; the activation peak and the KV cache of each.
int bench_uniform(Engine& e, const BenchArgs& a, const std::vector<int32_t>& prompt,
                  const std::string& what) {
  const ModelConfig& c = e.config();
  const auto P = static_cast<int64_t>(prompt.size()), C = c.uniform.canvas;
  const int steps = a.steps > 0 ? a.steps : 4;
  std::vector<int32_t> canvas = prompt;
  for (int64_t i = 0; i < C; ++i)
    canvas.push_back(
        static_cast<int32_t>(rng_mix(static_cast<uint64_t>(i) + 991) % static_cast<uint64_t>(c.vocab)));
  e.kv_cache_reset(P + C);
  using clock = std::chrono::steady_clock;
  auto secs = [](clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); };
  auto prefill = [&] {
    e.set_causal(true);
    for (int64_t lo = 0; lo < P; lo += 512)
      e.predict_cached(std::span<const int32_t>(canvas).first(static_cast<size_t>(std::min(P, lo + 512))), lo,
                       std::min(P, lo + 512), {}, SampleParams{}, {}, {});
    e.backend().synchronize();  // a GPU's queued work ends inside the timed span
    e.set_causal(false);
  };
  double t_prefill = 1e300, t_step = 1e300, t_commit = 1e300;
  size_t peak_prefill = 0, peak_step = 0, peak_commit = 0;
  CanvasPrediction pred;
  std::vector<float> sc;
  std::array<double, graph::kOpKinds> step_ops{};
  for (int rep = 0; rep < a.reps + 1; ++rep) {  // the first repetition warms up (plans, threads, pages)
    auto t0 = clock::now();
    prefill();
    if (rep > 0) t_prefill = std::min(t_prefill, secs(t0));
    peak_prefill = std::max(peak_prefill, e.last_step().planned_peak);
    sc.clear();
    if (rep == a.reps) e.reset_op_seconds();  // --profile: the last repetition's canvas steps
    for (int s = 0; s < steps; ++s) {
      SampleParams sp;
      sp.temperature = 0.8f - 0.4f * static_cast<float>(s) / static_cast<float>(steps);
      sp.seed = rng_mix(a.seed + static_cast<uint64_t>(s));
      t0 = clock::now();
      e.denoise_canvas(canvas, P, P + C, sc, sp, pred);
      if (rep > 0) t_step = std::min(t_step, secs(t0));
      peak_step = std::max(peak_step, e.last_step().planned_peak);
      sc.swap(pred.soft);
    }
    if (rep == a.reps && a.profile) step_ops = e.op_seconds();
    e.set_causal(true);
    t0 = clock::now();
    e.predict_cached(canvas, P, P + C, {}, SampleParams{}, {}, {});
    e.backend().synchronize();
    if (rep > 0) t_commit = std::min(t_commit, secs(t0));
    peak_commit = std::max(peak_commit, e.last_step().planned_peak);
    e.set_causal(false);
  }
  const ProcessMemory m = process_memory();
  const int64_t dev_total = e.backend().device_total_bytes(), dev_free = e.backend().device_free_bytes();
  json j = {{"model", what},
            {"backend", e.backend().name()},
            {"prompt", P},
            {"canvas", C},
            {"prefill_seconds", t_prefill},
            {"canvas_step_seconds", t_step},
            {"commit_seconds", t_commit},
            {"prefill_activation_peak_bytes", peak_prefill},
            {"canvas_step_activation_peak_bytes", peak_step},
            {"commit_activation_peak_bytes", peak_commit},
            {"weight_bytes", e.model().weight_bytes()},
            {"kv_cache_bytes", e.kv_cache_bytes()},
            {"rss_peak_bytes", m.peak}};
  if (dev_total >= 0 && dev_free >= 0) j["device_bytes_in_use"] = dev_total - dev_free;  // GPU memory
  if (!a.json_out.empty()) {
    std::ofstream f(a.json_out);
    if (!f || !(f << j.dump(2) << "\n")) fail("--json-out: cannot write " + a.json_out);
  }
  if (a.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%s on %s: prompt %lld tokens, canvas %lld, best of %d (after a warm-up)\n", what.c_str(),
              e.backend().name().c_str(), static_cast<long long>(P), static_cast<long long>(C), a.reps);
  std::printf("%-40s %10s %14s\n", "forward", "seconds", "act. peak");
  std::printf("%-40s %10.3f %14s\n", ("prefill (causal, " + std::to_string(P) + " rows)").c_str(), t_prefill,
              human_bytes(static_cast<double>(peak_prefill)).c_str());
  std::printf("%-40s %10.3f %14s\n", "canvas step (decoder, sample, SC)", t_step,
              human_bytes(static_cast<double>(peak_step)).c_str());
  std::printf("%-40s %10.3f %14s\n", "commit (causal, the canvas)", t_commit,
              human_bytes(static_cast<double>(peak_commit)).c_str());
  std::printf(
      "weights %s, KV cache %s, peak RSS %s; a canvas of %d steps + its commit: %.3f s (commit %.1f%%)\n",
      human_bytes(static_cast<double>(e.model().weight_bytes())).c_str(),
      human_bytes(static_cast<double>(e.kv_cache_bytes())).c_str(),
      human_bytes(static_cast<double>(m.peak)).c_str(), steps, steps * t_step + t_commit,
      100.0 * t_commit / (steps * t_step + t_commit));
  if (dev_total >= 0 && dev_free >= 0)
    std::printf("GPU memory in use: %s of %s\n",
                human_bytes(static_cast<double>(dev_total - dev_free)).c_str(),
                human_bytes(static_cast<double>(dev_total)).c_str());
  if (a.profile) std::printf("canvas step by op: %s\n", format_op_seconds(step_ops, steps).c_str());
  return 0;
}

int run_bench(const BenchArgs& a) {
  TESSERA_CHECK(a.model.empty() || a.geometry.empty(), "give -m DIR or --geometry NAME, not both");
  TESSERA_CHECK(a.reps >= 1, "--reps must be >= 1");
  TESSERA_CHECK(a.batch == 0 || a.batch >= 2, "--batch needs at least 2 requests");
  TESSERA_CHECK(a.batch == 0 || (!a.eos && a.stop.empty()),
                "--batch measures whole generations; give it without --eos and --stop");
  TESSERA_CHECK(a.prompt.empty() || a.geometry.empty(),
                "-p needs a model with a tokenizer (-m DIR), not --geometry");
  TESSERA_CHECK(a.stop.empty() || a.geometry.empty(),
                "--stop needs a model with a tokenizer (-m DIR), not --geometry");
  // Every --compare spec's keys and values, before the model loads (the full check follows it).
  for (const std::string& spec : a.compare) {
    const Candidate c = parse_spec(spec, GenerateOptions{}, EngineOptions{});
    if (!c.suffix)
      fail("--compare '" + spec +
           "': suffix=off compares infilling in tessera eval --suffix-len; bench has "
           "no suffix");
  }
  Progress progress("bench");
  progress.show("loading " + (a.geometry.empty() ? model_dir(a) : a.geometry));
  EngineOptions eng;
  eng.device = a.device;
  eng.precision = parse_precision(a.precision);
  eng.dequantize = a.dequantize;
  eng.profile_ops = a.profile;
  eng.comm = parallel_communicator(a.tp, a.ep, a.device, a.dist_timeout);
  eng.tp = a.tp;
  eng.ep = a.ep;
  auto base_engine = make_engine(a, eng);
  const ModelConfig& cfg = base_engine->config();
  // --batch: prompt r of the batch (r = 0 is the benchmark's prompt; with -p every request has it).
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(std::max(a.batch, 1)));
  std::optional<Tokenizer> tok;  // -p, --stop: the model's, loaded once
  if (!a.prompt.empty() || !a.stop.empty()) tok = load_model_tokenizer(model_dir(a));
  if (!a.prompt.empty()) {  // as tessera generate --raw encodes it
    const bool bos = model_adds_bos(model_dir(a));
    std::fill(prompts.begin(), prompts.end(), encode_raw(*tok, a.prompt, bos ? cfg.bos_id : -1));
  } else {  // fixed pseudo-random ordinary tokens (the lower half of the vocabulary: no special ids)
    for (size_t r = 0; r < prompts.size(); ++r) {
      for (int i = 0; i < a.prompt_len; ++i)
        prompts[r].push_back(
            static_cast<int32_t>(rng_mix(static_cast<uint64_t>(i) + 77 + 1000003 * r) %
                                 static_cast<uint64_t>(std::max<int64_t>(cfg.vocab / 2, 1))));
    }
  }
  const std::vector<int32_t>& prompt = prompts[0];
  if (cfg.is_uniform()) {
    TESSERA_CHECK(
        a.batch == 0 && a.compare.empty() && !eng.comm,
        "bench on a uniform-noise model times its forwards; --batch, --compare, --tp / --ep do not apply");
    return bench_uniform(*base_engine, a, prompt,
                         a.geometry.empty() ? model_dir(a) : a.geometry + " (synthetic weights)");
  }
  GenerateOptions base;
  base.gen_length = a.gen_length;
  base.block_length = a.block_length;
  base.steps = a.steps > 0 ? a.steps : a.gen_length;
  base.alg = parse_unmask(a.alg);
  base.threshold = a.threshold;
  base.temperature = a.temperature;
  base.seed = a.seed;
  base.cache = parse_kv_cache(a.cache);
  base.mode = parse_decode_mode(a.mode);
  base.causal_context = cfg.tri_mode;  // a tri-mode model's diffusion is seeded and committed causally
  base.stop_at_eos = a.eos;
  TESSERA_CHECK(!a.eos || cfg.eos_id >= 0, "--eos: this model has no EOS token");
  if (cfg.eos_id >= 0) base.eos_ids = {cfg.eos_id};  // window-early-stop ends at it
  base.stop = a.stop;
  base.stop_when = tok ? stop_checker(*tok, a.stop) : nullptr;
  const bool moe = base_engine->supports_expert_sharing();
  base.moe_stats = moe;  // unique experts per MoE layer in every row
  const bool block_causal = base_engine->attention_block() > 0;
  validate_generate_options(base, cfg.vocab, block_causal);
  const int64_t canvas = canvas_length(static_cast<int64_t>(prompt.size()), base, block_causal);
  if (canvas > cfg.max_positions) {
    fail("the prompt of " + std::to_string(prompt.size()) + " tokens plus gen-length " +
         std::to_string(a.gen_length) +
         (block_causal ? " (padded to whole blocks: " + std::to_string(canvas) + ")" : std::string()) +
         " exceeds the model's context of " + std::to_string(cfg.max_positions));
  }
  // The comparisons as generate would check them, before anything is measured.
  const std::vector<Candidate> candidates = check_specs(a.compare, base, eng, cfg.vocab, block_causal);

  const std::string what = a.geometry.empty() ? model_dir(a) : a.geometry + " (synthetic weights)";
  char header[512];
  std::snprintf(
      header, sizeof header,
      "%s on %s: prompt %zu tokens, gen %d, block %d, steps %d, %s%s, cache %s, best of %d", what.c_str(),
      base_engine->backend().name().c_str(), prompt.size(), base.gen_length, base.block_length, base.steps,
      std::string(name(base.alg)).c_str(),
      (std::string(base.threshold > 0 ? ", threshold " + std::to_string(base.threshold).substr(0, 4) : "") +
       (base.temperature > 0 ? ", temperature " + std::to_string(base.temperature).substr(0, 4) : ""))
          .c_str(),
      std::string(name(base.cache)).c_str(), a.reps);
  if (!a.json) {
    std::printf("%s\n", header);
    std::printf("%-28s %9s %9s %8s %6s %8s %11s %11s %10s %11s %10s %9s", "option", "seconds", "tokens/s",
                "speed-up", "steps", "fwd/tok", "query rows", "key rows", "weights", "act. peak", "KV cache",
                "agreement");
    if (moe) std::printf(" %8s", "experts");
    if (a.profile) std::printf(" %9s %8s", "MoE s", "MoE x");
    std::printf("\n");
    std::fflush(stdout);
  }
  const size_t n_rows = candidates.size() + 1;
  const auto progress_of = [&](const std::string& label, size_t i) {
    return [&progress, label, i, n_rows](const std::string& doing) {
      progress.show(label + " (" + std::to_string(i) + "/" + std::to_string(n_rows) + "): " + doing);
    };
  };
  std::vector<Row> rows;
  const Tokenizer* cut = a.stop.empty() ? nullptr : &*tok;
  Row b = measure(*base_engine, prompt, base, a.reps, cut, progress_of("baseline", 1));
  b.label = "baseline";
  b.weights = base_engine->model().weight_bytes();
  rows.push_back(std::move(b));
  progress.clear();
  const double gemm_rate = a.profile ? machine_gemm_rate(base_engine->backend()) : 0.0;
  if (!a.json) print_row(rows.front(), rows.front(), moe, a.profile, gemm_rate);
  int failures = 0;
  json comparisons = json::array({row_json(rows.front(), rows.front())});
  failures = run_comparisons(
      candidates, *base_engine, [&](const EngineOptions& o) { return make_engine(a, o); }, progress, "bench",
      [&](size_t i) { return candidates[i].label; },
      [&](size_t ci, Engine& e) {
        const Candidate& c = candidates[ci];
        Row r = measure(e, prompt, c.gen, a.reps, cut, progress_of(c.label, ci + 2));
        r.label = c.label;
        r.weights = e.model().weight_bytes();
        size_t same = 0;
        for (size_t i = 0; i < std::min(r.tokens.size(), rows.front().tokens.size()); ++i)
          same += r.tokens[i] == rows.front().tokens[i] ? 1 : 0;
        // An empty answer (--eos / --stop at its first token) agrees with an empty baseline only.
        const size_t base_n = rows.front().tokens.size();
        r.agreement = base_n > 0 ? static_cast<double>(same) / static_cast<double>(base_n)
                                 : (r.tokens.empty() ? 1.0 : 0.0);
        progress.clear();
        if (!a.json) print_row(r, rows.front(), moe, a.profile, gemm_rate);
        comparisons.push_back(row_json(r, rows.front()));
        rows.push_back(std::move(r));
      },
      [&](size_t i, const Error& e) {
        comparisons.push_back({{"option", candidates[i].label}, {"error", e.what()}});
      });
  json batch_json = nullptr;
  std::string batch_note;
  if (a.batch >= 2) {
    GenerateOptions bo = base;
    bo.moe_stats = false;  // the unique-expert counts are engine state: not with batching
    TESSERA_CHECK(plan_request(bo, static_cast<int64_t>(prompt.size()), base_engine->attention_block() > 0)
                      .shares_forwards(),
                  "--batch: the baseline's options hold engine state across forwards (SparseD patterns or "
                  "DES); requests with them run one at a time");
    const BatchRow br = measure_batch(*base_engine, prompts, bo, a.reps, progress);
    progress.clear();
    const double tokens = static_cast<double>(a.batch) * a.gen_length;
    const double mean = br.stats.forwards > 0
                            ? static_cast<double>(br.stats.sequences) / static_cast<double>(br.stats.forwards)
                            : 0.0;
    if (!a.json) {
      std::printf("\n%d requests (the baseline's options, prompts of %zu tokens):\n", a.batch, prompt.size());
      std::printf("%-28s %9s %9s %8s %9s %10s\n", "", "seconds", "tokens/s", "speed-up", "forwards",
                  "identical");
      std::printf("%-28s %9.3f %9.1f %7.2fx %9s %10s\n", "one after another", br.sequential,
                  tokens / br.sequential, 1.0, "", "");
      std::printf("%-28s %9.3f %9.1f %7.2fx %9lld %7d/%d   (mean batch %.2f)\n", "batched", br.batched,
                  tokens / br.batched, br.sequential / br.batched, static_cast<long long>(br.stats.forwards),
                  br.identical, a.batch, mean);
      std::fflush(stdout);
    }
    char note[200];
    std::snprintf(note, sizeof note,
                  "--batch %d: %.1f tokens/s one after another, %.1f batched (%.2fx, mean batch %.2f)",
                  a.batch, tokens / br.sequential, tokens / br.batched, br.sequential / br.batched, mean);
    batch_note = note;
    batch_json = {{"requests", a.batch},
                  {"sequential_seconds", br.sequential},
                  {"batched_seconds", br.batched},
                  {"speedup", br.sequential / br.batched},
                  {"forwards", br.stats.forwards},
                  {"mean_batch", mean},
                  {"identical_requests", br.identical}};
  }
  const json out = {{"model", what},
                    {"device", base_engine->backend().name()},
                    {"prompt_tokens", prompt.size()},
                    {"gen_length", base.gen_length},
                    {"block_length", base.block_length},
                    {"steps", base.steps},
                    {"alg", name(base.alg)},
                    {"threshold", base.threshold},
                    {"cache", name(base.cache)},
                    {"mode", name(base.mode)},
                    {"reps", a.reps},
                    {"gemm_rate_flops_per_second", gemm_rate},
                    {"rows", comparisons},
                    {"batch", batch_json}};
  if (a.json) std::printf("%s\n", out.dump(1).c_str());
  if (!a.json_out.empty()) {
    std::ofstream f(a.json_out);
    if (!f || !(f << out.dump(1) << "\n")) fail("--json-out: cannot write " + a.json_out);
  }
  if (!a.svg.empty())
    write_chart(a.svg, "tessera bench: generation speed per option", header, rows, batch_note);
  return failures > 0 ? 1 : 0;
}

}  // namespace

void add_bench(CLI::App& app, Registry& reg) {
  auto* sub = app.add_subcommand(
      "bench",
      "Generation speed of engine options side by side (KV cache, threshold, chunking, precision, ...)");
  sub->option_defaults()->always_capture_default();
  auto a = std::make_shared<BenchArgs>();
  sub->add_option("-m,--model", a->model, "model directory (default: the bundled default model)");
  std::string names;
  for (const std::string& g : geometry_names()) names += (names.empty() ? "" : ", ") + g;
  sub->add_option("--geometry", a->geometry,
                  "a real geometry with synthetic weights instead of a model: " + names)
      ->check(CLI::IsMember(geometry_names()));
  sub->add_option("-p,--prompt", a->prompt, "prompt text (default: --prompt-len pseudo-random tokens)");
  sub->add_option("--prompt-len", a->prompt_len, "prompt tokens when no -p is given")
      ->check(CLI::PositiveNumber);
  sub->add_option("--gen-length", a->gen_length, "tokens to generate")->check(CLI::PositiveNumber);
  sub->add_option("--block-length", a->block_length, "block length")->check(CLI::PositiveNumber);
  sub->add_option("--steps", a->steps, "denoising steps (0: gen-length)");
  sub->add_option("--alg", a->alg, "unmasking policy")
      ->check(
          CLI::IsMember({"low_confidence", "random", "origin", "maskgit_plus", "topk_margin", "entropy"}));
  sub->add_option("--temperature", a->temperature, "sampling temperature (0 = greedy)")
      ->check(in_range(0, 100));
  sub->add_option("--seed", a->seed, "sampling seed");
  auto threads = std::make_shared<int>(0);
  sub->add_option("-t,--threads", *threads, "CPU threads (default: OMP_NUM_THREADS, else every core)")
      ->check(in_range(1, 4096));
  sub->add_option("--threshold", a->threshold, "confidence-threshold decoding (0 = off)")
      ->check(in_range(0, 1));
  sub->add_option("--cache", a->cache, "KV cache of the baseline")
      ->check(CLI::IsMember({"none", "prefix", "dual"}));
  sub->add_option("--mode", a->mode,
                  "how the baseline writes the canvas: diffusion, ar or spec (ar and spec: tri-mode models)")
      ->check(CLI::IsMember({"diffusion", "ar", "spec"}));
  sub->add_option("--device", a->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--tp", a->tp,
                  "tensor parallelism over N processes started by mpirun -np N (rank 0 prints; each row also "
                  "gives the collectives' bytes per forward)")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--ep", a->ep, "expert parallelism (MoE models) over the same ranks")
      ->check(CLI::Range(1, 1024));
  sub->add_option(
         "--dist-timeout", a->dist_timeout,
         "with --tp / --ep: seconds a collective may wait for the other ranks before the job ends with "
         "an error (a rank died or hangs)")
      ->check(in_range(0.001, 1e6));
  sub->add_option("--precision", a->precision, "auto, bf16 or f32")
      ->check(CLI::IsMember({"auto", "bf16", "f32"}));
  sub->add_flag(
      "--dequantize", a->dequantize,
      "GGUF: convert quantized tensors to bf16 at load instead of keeping them quantized (CPU; CUDA: "
      "q8_0, q4_0, q4_K, q5_K, q6_K)");
  sub->add_option("--reps", a->reps, "timed generations per row (the best counts)")
      ->check(CLI::PositiveNumber);
  sub->add_option(
         "--compare", a->compare,
         "options to compare with the baseline, e.g. \"cache=dual\" or \"threshold=0.9,cache=prefix\" "
         "(repeatable; keys as in tessera eval; all checked before anything runs)")
      ->option_text("SPEC");
  sub->add_option("--batch", a->batch,
                  "also time N requests with the baseline's options one after another and batched (packed "
                  "forwards; 0: no)")
      ->check(in_range(0, 256));
  sub->add_flag("--eos", a->eos,
                "the answers end at the model's EOS (default: every row generates gen-length tokens)");
  sub->add_option("--stop", a->stop,
                  "the answers end before this text (repeatable; needs the model's tokenizer); tokens/s "
                  "counts the answer's tokens")
      ->default_str("");
  sub->add_flag("--json", a->json, "print the results as JSON on stdout instead of the table");
  sub->add_option("--json-out", a->json_out, "also write the JSON to FILE")->check(svg::writable_file());
  sub->add_option("--svg", a->svg,
                  "draw the table as bar charts (tokens/s, ms per step, speed-up, agreement) to FILE")
      ->check(svg::writable_file());
  sub->add_flag("--profile", a->profile,
                "time every op (synchronising the device after each): the seconds of each op kind per row, "
                "and the MoE router + expert FFN time");
  sub->footer(
      "Columns: seconds (best of --reps), tokens/s, speed-up over the baseline, steps run, forwards per "
      "token, query rows computed and key rows attended over all forwards, weights, the largest planned "
      "activation peak, the KV cache held, agreement (share of tokens equal to the "
      "baseline's).\n\nExamples:\n"
      "  tessera bench --compare cache=prefix --compare cache=dual --compare threshold=0.9\n"
      "  tessera bench --geometry llada-mid --prompt-len 256 --compare k-logits=4 --json-out bench.json "
      "--svg "
      "bench.svg");
  reg.handlers.emplace_back(sub, [a, threads] {
    if (*threads > 0) omp_set_num_threads(*threads);
    return run_bench(*a);
  });
}

}  // namespace tessera::cli
