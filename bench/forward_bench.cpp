// Forward-step latency and planned activation peak for a geometry with synthetic weights, and
// mask-only vs full logits at several mask ratios, side by side in one run.
// With --lmax, for each total memory budget (GiB, weights included): the longest context the planner
// admits under lazy chunking (L_max), then one real step at that length (capped by --lmax-cap) under
// --memory-budget, with the memory the step really took: device memory (CUDA: the process's use from
// cudaMemGetInfo, the CUDA context included) or resident memory (CPU: peak RSS).
// --quant q8_0|q4_0|q4_K|q5_K|q6_K (bf16: the default): the 2-D weights (GEMM weights, embedding table, LM
// head; not the routed experts) as random blocks of that GGUF type, kept quantized as Model::load keeps them
// (CUDA: GEMMs dequantize tiles); the weights' bytes and (CUDA) the device memory in use are printed. Usage:
// forward_bench [--geometry llada-mid] [--lengths 512,2048 | 0] [--ratios 0.1,0.5,0.9]
//                      [--reps 3] [--device cpu|cuda] [--quant TYPE] [--json FILE]
//                      [--lmax 24,40 --lmax-ratio 0.5 --lmax-cap 65536] [--profile 1]
// --profile 1: every op synchronised and timed; after each masked step's row, the share of each op kind.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"
#include "memory/chunk_optimizer.h"

using namespace tessera;

namespace {

std::vector<double> parse_list(const std::string& s) {
  std::vector<double> v;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ',')) v.push_back(std::stod(x));
  return v;
}

double max_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string geometry = "llada-mid", device = "cpu", json_path, quant_name = "bf16";
  int16_t quant = -1;
  std::vector<double> lengths = {512, 2048}, ratios = {0.1, 0.5, 0.9}, lmax_budgets;
  double lmax_ratio = 0.5, lmax_cap = 65536;
  int reps = 3;
  bool profile = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--geometry")
      geometry = v;
    else if (k == "--lengths")
      lengths = parse_list(v);
    else if (k == "--ratios")
      ratios = parse_list(v);
    else if (k == "--reps")
      reps = std::stoi(v);
    else if (k == "--device")
      device = v;
    else if (k == "--json")
      json_path = v;
    else if (k == "--lmax")
      lmax_budgets = parse_list(v);
    else if (k == "--lmax-ratio")
      lmax_ratio = std::stod(v);
    else if (k == "--lmax-cap")
      lmax_cap = std::stod(v);
    else if (k == "--profile")
      profile = v != "0";
    else if (k == "--quant") {
      quant_name = v;
      for (uint32_t t = 0; t < 64 && quant < 0; ++t) {
        const GgmlTypeInfo* info = ggml_type_info(t);
        if (info != nullptr && v == info->name && cuda_keeps_quantized(static_cast<int16_t>(t)))
          quant = static_cast<int16_t>(t);
      }
      if (quant < 0 && v != "bf16") {  // bf16: plain weights (the default), for side-by-side scripts
        std::fprintf(stderr, "forward_bench: --quant %s: use bf16, q8_0, q4_0, q4_K, q5_K or q6_K\n",
                     v.c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr, "forward_bench: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (lengths.size() == 1 && lengths[0] == 0) lengths.clear();  // --lengths 0: L_max only
  const ModelConfig cfg = named_geometry(geometry);
  EngineOptions opt;
  opt.device = device;
  opt.profile_ops = profile;
  // The process's memory now (CUDA: device bytes in use, once a backend exists; CPU: resident bytes).
  const auto cuda_free = [&](Engine& eng) { return eng.backend().device_free_bytes(); };
  std::ostringstream lj;  // L_max rows (JSON)
  if (!lmax_budgets.empty()) {
    std::printf("# L_max under lazy chunking, mask ratio %.2f, then one real step at min(L_max, %.0f)\n",
                lmax_ratio, lmax_cap);
    std::printf("%8s | %9s %10s | %9s %8s | %12s %12s | %14s | %8s\n", "budget", "weights", "L_max", "ran L",
                "K f,l", "planned act", "workspace", "process mem", "step s");
    bool first_row = true;
    for (double gib : lmax_budgets) {
      EngineOptions bo = opt;
      bo.memory_budget = static_cast<size_t>(gib * 1073741824.0);
      std::unique_ptr<Engine> eb;
      try {
        eb = Engine::synthetic(cfg, bo, DType::BF16, quant);
      } catch (const Error& ex) {
        std::printf("%5gGiB | %s\n", gib, ex.what());
        continue;
      }
      const int64_t lmax =
          memory::largest_context(eb->model().graph(OutputMode::Sample), lmax_ratio, eb->activation_budget());
      const auto L = static_cast<int64_t>(std::min(static_cast<double>(lmax), lmax_cap));
      std::vector<int32_t> canvas(static_cast<size_t>(L)), pos;
      for (int64_t i = 0; i < L; ++i) {
        canvas[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % 100000);
        if (static_cast<double>(rng_mix(static_cast<uint64_t>(i)) % 10000) < lmax_ratio * 10000) {
          pos.push_back(static_cast<int32_t>(i));
          canvas[static_cast<size_t>(i)] = cfg.mask_id;
        }
      }
      std::vector<int32_t> tok(pos.size());
      std::vector<float> conf(pos.size());
      reset_peak_rss();
      double sec = 0;
      std::string err;
      try {
        const auto t0 = std::chrono::steady_clock::now();
        eb->predict(canvas, pos, SampleParams{}, tok, conf);
        sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      } catch (const Error& ex) {
        err = ex.what();
      }
      // Process memory: CUDA, device bytes in use after the step (weights, workspace, cuBLASLt, context;
      // a step allocates nothing, so this is its peak); CPU, the peak resident set.
      const int64_t free_b = cuda_free(*eb);
      double used = static_cast<double>(process_memory().peak);
      if (free_b >= 0) used = static_cast<double>(eb->backend().device_total_bytes() - free_b);
      const auto& st = eb->last_step();
      std::printf(
          "%5gGiB | %7.2fGiB %10lld | %9lld %4lld,%-3lld | %8.2f GiB %8.2f GiB | %10.2f GiB | %8.2f%s\n", gib,
          static_cast<double>(eb->model().weight_bytes()) / 1073741824.0, static_cast<long long>(lmax),
          static_cast<long long>(L), static_cast<long long>(st.shape.k_ffn),
          static_cast<long long>(st.shape.k_logits), static_cast<double>(st.planned_peak) / 1073741824.0,
          static_cast<double>(eb->workspace().committed()) / 1073741824.0, used / 1073741824.0, sec,
          err.empty() ? "" : ("  FAILED: " + err).c_str());
      lj << (first_row ? "" : ",") << "{\"budget_gib\":" << gib
         << ",\"weights\":" << eb->model().weight_bytes() << ",\"l_max\":" << lmax << ",\"ran\":" << L
         << ",\"k_ffn\":" << st.shape.k_ffn << ",\"k_logits\":" << st.shape.k_logits
         << ",\"planned_peak\":" << st.planned_peak << ",\"committed\":" << eb->workspace().committed()
         << ",\"process_bytes\":" << used << ",\"step_s\":" << sec
         << ",\"ok\":" << (err.empty() ? "true" : "false") << "}";
      first_row = false;
    }
  }
  if (lengths.empty()) {
    if (!json_path.empty())
      std::ofstream(json_path) << "{\"geometry\":\"" << geometry << "\",\"device\":\"" << device
                               << "\",\"lmax\":[" << lj.str() << "]}\n";
    return 0;
  }
  // CUDA: device bytes in use before the model (the context, cuBLASLt's workspace), then with it.
  int64_t before = -1;
  if (device == "cuda") {
    std::string why;
    if (auto probe = make_cuda_backend(&why))
      before = probe->device_total_bytes() - probe->device_free_bytes();
  }
  auto e = Engine::synthetic(cfg, opt, DType::BF16, quant);
  std::printf("# %s: %lld layers, d=%lld, ffn=%lld, vocab=%lld, weights %s %.1f MiB, device %s\n",
              geometry.c_str(), static_cast<long long>(cfg.n_layers), static_cast<long long>(cfg.hidden),
              static_cast<long long>(cfg.intermediate), static_cast<long long>(cfg.vocab), quant_name.c_str(),
              static_cast<double>(e->model().weight_bytes()) / 1048576.0, device.c_str());
  const auto device_used = [&] {
    const int64_t free_b = e->backend().device_free_bytes();
    return free_b < 0 ? -1.0 : static_cast<double>(e->backend().device_total_bytes() - free_b) / 1048576.0;
  };
  if (device_used() >= 0) {
    std::printf(
        "# device memory in use after load %.1f MiB (%.1f MiB before the engine: context, libraries)\n",
        device_used(), static_cast<double>(before) / 1048576.0);
  }
  auto step = [&](const std::vector<int32_t>& canvas, const std::vector<int32_t>& pos) {
    std::vector<int32_t> tok(pos.size());
    std::vector<float> conf(pos.size());
    SampleParams sp;
    e->predict(canvas, pos, sp, tok, conf);  // warm-up: plan + primitives
    e->predict(canvas, pos, sp, tok, conf);  // CUDA: the step graph's recording (engine/step_graphs.h)
    e->reset_op_seconds();
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      e->predict(canvas, pos, sp, tok, conf);
      t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return std::make_pair(t[t.size() / 2], e->last_step().planned_peak);
  };
  std::ostringstream js;
  js << "{\"geometry\":\"" << geometry << "\",\"device\":\"" << device << "\",\"weights\":\"" << quant_name
     << "\",\"weight_bytes\":" << e->model().weight_bytes() << ",\"rows\":[";
  bool first = true;
  std::printf("%6s %5s | %10s %12s | %10s %12s | %7s %7s\n", "L", "mask", "full ms", "full peak", "mask ms",
              "mask peak", "t ratio", "m ratio");
  for (double lf : lengths) {
    const auto L = static_cast<int64_t>(lf);
    std::vector<int32_t> canvas(static_cast<size_t>(L));
    for (int64_t i = 0; i < L; ++i)
      canvas[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % 100000);
    std::vector<int32_t> all(static_cast<size_t>(L));
    for (int64_t i = 0; i < L; ++i) all[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    const auto [full_ms, full_peak] = step(canvas, all);
    for (double r : ratios) {
      std::vector<int32_t> masked;
      for (int64_t i = 0; i < L; ++i) {
        if (static_cast<double>(rng_mix(static_cast<uint64_t>(i)) % 10000) < r * 10000)
          masked.push_back(static_cast<int32_t>(i));
      }
      for (int32_t p : masked) canvas[static_cast<size_t>(p)] = cfg.mask_id;
      const auto [mask_ms, mask_peak] = step(canvas, masked);
      std::printf("%6lld %5.2f | %10.1f %9.1f MiB | %10.1f %9.1f MiB | %6.2fx %6.2fx\n",
                  static_cast<long long>(L), r, full_ms, static_cast<double>(full_peak) / 1048576.0, mask_ms,
                  static_cast<double>(mask_peak) / 1048576.0, full_ms / mask_ms,
                  static_cast<double>(full_peak) / static_cast<double>(mask_peak));
      if (profile)  // the op kinds of the masked step's timed runs, largest first
        std::printf("       ops (per step): %s\n", format_op_seconds(e->op_seconds(), reps).c_str());
      js << (first ? "" : ",") << "{\"L\":" << L << ",\"mask_ratio\":" << r << ",\"full_ms\":" << full_ms
         << ",\"full_peak\":" << full_peak << ",\"mask_ms\":" << mask_ms << ",\"mask_peak\":" << mask_peak
         << "}";
      first = false;
    }
  }
  js << "],\"lmax\":[" << lj.str() << "],\"max_rss_mib\":" << max_rss_mib()
     << ",\"device_used_mib\":" << device_used() << "}\n";
  if (device_used() >= 0)
    std::printf("# device memory in use after the steps %.1f MiB (weights + workspace + runtime)\n",
                device_used());
  std::printf("# process max RSS %.1f MiB (weights + workspace + runtime)\n", max_rss_mib());
  if (!json_path.empty()) std::ofstream(json_path) << js.str();
  return 0;
}
