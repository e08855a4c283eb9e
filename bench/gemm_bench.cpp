// GEMM throughput at dLLM shapes on this CPU: oneDNN bf16 and f32 through tessera's backend, and
// OpenBLAS sgemm when built with it, against the measured peak (the best large bf16 GEMM).
// Usage: gemm_bench [--quick] [--json FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"

#ifdef TESSERA_HAVE_OPENBLAS
#include <cblas.h>
#endif

using namespace tessera;

namespace {

double time_best(int reps, const std::function<void()>& fn) {
  fn();  // warm-up (primitive creation)
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
  }
  auto be = make_cpu_backend();
  const int reps = quick ? 2 : 5;
  struct Row {
    std::string lib, dtype;
    int64_t m, n, k;
    double gflops;
  };
  std::vector<Row> rows;
  auto run = [&](DType dt, int64_t m, int64_t n, int64_t k) {
    std::vector<char> a(static_cast<size_t>(m * k) * dtype_size(dt)),
        w(static_cast<size_t>(n * k) * dtype_size(dt));
    std::vector<float> c(static_cast<size_t>(m * n));
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<char>(i * 7 % 61);  // finite bf16/f32 patterns
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<char>(i * 13 % 59);
    Tensor ta(a.data(), dt, {m, k}), tw(w.data(), dt, {n, k}), tc(c.data(), DType::F32, {m, n});
    const double s = time_best(reps, [&] { be->gemm(ta, tw, nullptr, tc, false); });
    const double gf =
        2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) / s / 1e9;
    rows.push_back({"onednn", std::string(dtype_name(dt)), m, n, k, gf});
    std::printf("onednn   %-5s M=%-5lld N=%-6lld K=%-5lld %8.1f GFLOP/s\n",
                std::string(dtype_name(dt)).c_str(), static_cast<long long>(m), static_cast<long long>(n),
                static_cast<long long>(k), gf);
  };
  std::printf("# peak: best large square bf16 GEMM\n");
  double peak = 0;
  for (int64_t s : {2048L, 4096L}) {
    run(DType::BF16, s, s, s);
    peak = std::max(peak, rows.back().gflops);
  }
  std::printf("# dLLM shapes\n");
  const std::vector<int64_t> ms =
      quick ? std::vector<int64_t>{512, 2048} : std::vector<int64_t>{512, 1024, 2048, 4096};
  for (DType dt : {DType::BF16, DType::F32}) {
    for (int64_t m : ms) {
      run(dt, m, 4096, 4096);
      run(dt, m, 12288, 4096);
    }
  }
#ifdef TESSERA_HAVE_OPENBLAS
  for (int64_t m : ms) {
    for (int64_t n : {4096L, 12288L}) {
      const int64_t k = 4096;
      std::vector<float> a(static_cast<size_t>(m * k), 0.01f), w(static_cast<size_t>(n * k), 0.02f),
          c(static_cast<size_t>(m * n));
      const double s = time_best(reps, [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                    static_cast<int>(k), 1.0f, a.data(), static_cast<int>(k), w.data(), static_cast<int>(k),
                    0.0f, c.data(), static_cast<int>(n));
      });
      const double gf = 2.0 * static_cast<double>(m * n) * static_cast<double>(k) / s / 1e9;
      rows.push_back({"openblas", "f32", m, n, k, gf});
      std::printf("openblas f32   M=%-5lld N=%-6lld K=%-5lld %8.1f GFLOP/s\n", static_cast<long long>(m),
                  static_cast<long long>(n), static_cast<long long>(k), gf);
    }
  }
#endif
  for (const Row& r : rows) {
    if (r.dtype == "bf16") peak = std::max(peak, r.gflops);  // the measured ceiling: best bf16 rate seen
  }
  std::printf("# fraction of the measured peak (%.1f GFLOP/s, the best bf16 rate of this run)\n", peak);
  for (const Row& r : rows) {
    std::printf("%-8s %-5s %5lld x %5lld x %5lld  %6.1f%%\n", r.lib.c_str(), r.dtype.c_str(),
                static_cast<long long>(r.m), static_cast<long long>(r.n), static_cast<long long>(r.k),
                100.0 * r.gflops / peak);
  }
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << "{\"peak_gflops\": " << peak << ", \"rows\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      f << (i ? "," : "") << "{\"lib\":\"" << r.lib << "\",\"dtype\":\"" << r.dtype << "\",\"m\":" << r.m
        << ",\"n\":" << r.n << ",\"k\":" << r.k << ",\"gflops\":" << r.gflops << "}";
    }
    f << "]}\n";
  }
  return 0;
}
