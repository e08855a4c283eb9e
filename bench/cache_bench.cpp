// KV cache speed: one generation per cache mode (none, prefix, dual) on the same prompt, side by side
// in one run: wall time, tokens/s, speed-up over no cache, the query rows and query x key pairs the
// forwards computed (the predicted speed-ups: GEMM work follows rows, attention follows pairs), and
// the share of generated tokens equal to the uncached generation's. One forward over the whole canvas
// warms up first; --reps N keeps the best of N generations per mode.
// Usage: cache_bench [--geometry llada-mid | -m DIR] [--prompt-len 1024] [--gen-length 256]
//                    [--block-length 32] [--steps 256] [--threshold 0] [--device cpu|cuda]
//                    [--precision auto|bf16|f32] [--reps 1] [--json FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "decode/generate.h"
#include "engine/engine.h"

using namespace tessera;

namespace {

struct Row {
  std::string cache;
  double seconds = 0;  // best of reps
  int steps = 0;
  double query_rows = 0, pairs = 0;  // summed over the forwards of one generation
  double agreement = 1;              // generated tokens equal to the uncached generation's
  std::vector<int32_t> tokens;
};

}  // namespace

int main(int argc, char** argv) {
  std::string geometry = "llada-mid", model, device = "cpu", precision = "auto", json_path;
  int prompt_len = 1024, gen = 256, block = 32, steps = 256, reps = 1;
  float threshold = 0.0f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--geometry")
      geometry = v;
    else if (k == "-m")
      model = v;
    else if (k == "--prompt-len")
      prompt_len = std::stoi(v);
    else if (k == "--gen-length")
      gen = std::stoi(v);
    else if (k == "--block-length")
      block = std::stoi(v);
    else if (k == "--steps")
      steps = std::stoi(v);
    else if (k == "--threshold")
      threshold = std::stof(v);
    else if (k == "--device")
      device = v;
    else if (k == "--precision")
      precision = v;
    else if (k == "--reps")
      reps = std::stoi(v);
    else if (k == "--json")
      json_path = v;
    else {
      std::fprintf(stderr, "cache_bench: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    EngineOptions opt;
    opt.device = device;
    opt.precision = precision == "f32"    ? Precision::F32
                    : precision == "bf16" ? Precision::BF16
                                          : Precision::Auto;
    std::unique_ptr<Engine> e =
        model.empty() ? Engine::synthetic(named_geometry(geometry), opt) : Engine::load(model, opt);
    const std::string what = model.empty() ? geometry + " (synthetic bf16 weights)" : model;
    // A fixed pseudo-random prompt of ordinary tokens (no mask / special ids at the top of the vocabulary).
    std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
    for (int i = 0; i < prompt_len; ++i) {
      prompt[static_cast<size_t>(i)] = static_cast<int32_t>(rng_mix(static_cast<uint64_t>(i) + 77) %
                                                            static_cast<uint64_t>(e->vocab_size() / 2));
    }
    GenerateOptions o;
    o.gen_length = gen;
    o.block_length = block;
    o.steps = steps;
    o.threshold = threshold;
    o.stop_at_eos = false;
    {  // warm-up: one forward over the whole canvas commits the workspace's pages and the thread pool
      std::vector<int32_t> canvas = prompt, pos(static_cast<size_t>(gen)), tok(pos.size());
      std::vector<float> conf(pos.size());
      canvas.resize(static_cast<size_t>(prompt_len + gen), e->mask_token());
      for (int i = 0; i < gen; ++i) pos[static_cast<size_t>(i)] = prompt_len + i;
      e->predict(canvas, pos, SampleParams{}, tok, conf);
    }
    std::vector<Row> rows;
    for (const char* c : {"none", "prefix", "dual"}) {
      Row r;
      r.cache = c;
      o.cache = c;
      for (int rep = 0; rep < std::max(reps, 1); ++rep) {
        double q = 0, pairs = 0;
        const auto t0 = std::chrono::steady_clock::now();
        const GenerateResult res = generate(*e, prompt, o, [&](const StepEvent&) {
          q += static_cast<double>(e->last_step().shape.n_query);
          pairs += static_cast<double>(e->last_step().shape.n_query) *
                   static_cast<double>(e->last_step().shape.n_kv);
        });
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r.seconds == 0 || s < r.seconds) r.seconds = s;
        r.steps = res.steps_run;
        r.query_rows = q;
        r.pairs = pairs;
        r.tokens = res.tokens;
      }
      if (!rows.empty()) {
        const auto& ref = rows.front().tokens;
        size_t same = 0;
        for (size_t i = 0; i < std::min(ref.size(), r.tokens.size()); ++i)
          same += ref[i] == r.tokens[i] ? 1 : 0;
        r.agreement = ref.empty() ? 1.0 : static_cast<double>(same) / static_cast<double>(ref.size());
      }
      rows.push_back(r);
    }
    std::printf("%s on %s: prompt %d, gen %d, block %d, steps %d%s; KV cache %.1f MiB\n", what.c_str(),
                e->backend().name().c_str(), prompt_len, gen, block, steps,
                threshold > 0 ? (", threshold " + std::to_string(threshold)).c_str() : "",
                static_cast<double>(e->kv_cache_bytes()) / (1 << 20));
    std::printf(
        "| cache | steps | seconds | tokens/s | speed-up | query rows (vs none) | query x key pairs (vs "
        "none) | tokens equal to none |\n");
    std::printf("|---|---|---|---|---|---|---|---|\n");
    const Row& base = rows.front();
    std::ofstream js;
    if (!json_path.empty()) js.open(json_path);
    if (js)
      js << "{\"model\": \"" << what << "\", \"prompt_len\": " << prompt_len << ", \"gen_length\": " << gen
         << ", \"block_length\": " << block << ", \"steps\": " << steps << ", \"rows\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf("| %s | %d | %.3f | %.1f | %.2fx | %.0f (%.1fx fewer) | %.3g (%.1fx fewer) | %.3f |\n",
                  r.cache.c_str(), r.steps, r.seconds, gen / r.seconds, base.seconds / r.seconds,
                  r.query_rows, base.query_rows / r.query_rows, r.pairs, base.pairs / r.pairs, r.agreement);
      if (js)
        js << (i ? ", " : "") << "{\"cache\": \"" << r.cache << "\", \"seconds\": " << r.seconds
           << ", \"steps\": " << r.steps << ", \"speedup\": " << base.seconds / r.seconds
           << ", \"query_rows\": " << r.query_rows << ", \"pairs\": " << r.pairs
           << ", \"agreement\": " << r.agreement << "}";
    }
    if (js) js << "]}\n";
  } catch (const Error& err) {
    std::fprintf(stderr, "cache_bench: %s\n", err.what());
    return 1;
  }
  return 0;
}
