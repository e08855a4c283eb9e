// Forward-step latency and planned activation peak for a geometry with synthetic weights, and
// mask-only vs full logits at several mask ratios, side by side in one run.
// Usage: forward_bench [--geometry llada-mid] [--lengths 512,2048] [--ratios 0.1,0.5,0.9]
//                      [--reps 3] [--device cpu|cuda] [--json FILE]
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/engine.h"

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
  std::string geometry = "llada-mid", device = "cpu", json_path;
  std::vector<double> lengths = {512, 2048}, ratios = {0.1, 0.5, 0.9};
  int reps = 3;
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
  }
  const ModelConfig cfg = named_geometry(geometry);
  EngineOptions opt;
  opt.device = device;
  auto e = Engine::synthetic(cfg, opt, DType::BF16);
  std::printf("# %s: %lld layers, d=%lld, ffn=%lld, vocab=%lld, weights %.1f MiB, device %s\n",
              geometry.c_str(), static_cast<long long>(cfg.n_layers), static_cast<long long>(cfg.hidden),
              static_cast<long long>(cfg.intermediate), static_cast<long long>(cfg.vocab),
              static_cast<double>(e->model().weight_bytes()) / 1048576.0, device.c_str());
  auto step = [&](const std::vector<int32_t>& canvas, const std::vector<int32_t>& pos) {
    std::vector<int32_t> tok(pos.size());
    std::vector<float> conf(pos.size());
    SampleParams sp;
    e->predict(canvas, pos, sp, tok, conf);  // warm-up: plan + primitives
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
  js << "{\"geometry\":\"" << geometry << "\",\"device\":\"" << device << "\",\"rows\":[";
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
      js << (first ? "" : ",") << "{\"L\":" << L << ",\"mask_ratio\":" << r << ",\"full_ms\":" << full_ms
         << ",\"full_peak\":" << full_peak << ",\"mask_ms\":" << mask_ms << ",\"mask_peak\":" << mask_peak
         << "}";
      first = false;
    }
  }
  js << "],\"max_rss_mib\":" << max_rss_mib() << "}\n";
  std::printf("# process max RSS %.1f MiB (weights + workspace + runtime)\n", max_rss_mib());
  if (!json_path.empty()) std::ofstream(json_path) << js.str();
  return 0;
}
