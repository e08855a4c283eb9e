// GEMM throughput at dLLM shapes on this CPU: oneDNN bf16 and f32 through tessera's backend, and
// OpenBLAS sgemm when built with it, and quantized (GGUF q8_0 / q4_K) weights, against the measured peak
// (the best large bf16 GEMM).
// Usage: gemm_bench [--quick] [--json FILE]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "bench_util.h"

#ifdef TESSERA_HAVE_OPENBLAS
#include <cblas.h>
#endif

using namespace tessera;

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
  // Operands: uniform values in [-1, 1) (random bit patterns would include f32 denormals, which run at a
  // small fraction of the normal rate, and constant data lets the CPU clock higher).
  auto values = [](size_t n, DType dt, uint64_t seed) {
    std::vector<float> f(n);
    for (size_t i = 0; i < n; ++i) f[i] = static_cast<float>(2.0 * rng_uniform(seed, i, 0) - 1.0);
    std::vector<char> out(n * dtype_size(dt));
    convert_from_f32(f.data(), out.data(), dt, n);
    return out;
  };
  auto run = [&](DType dt, int64_t m, int64_t n, int64_t k) {
    const std::vector<char> a = values(static_cast<size_t>(m * k), dt, 1),
                            w = values(static_cast<size_t>(n * k), dt, 2);
    std::vector<float> c(static_cast<size_t>(m * n));
    Tensor ta(const_cast<char*>(a.data()), dt, {m, k}), tw(const_cast<char*>(w.data()), dt, {n, k}),
        tc(c.data(), DType::F32, {m, n});
    const double s = bench::best_seconds(reps, [&] { be->gemm(ta, tw, nullptr, tc, false); });
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
  // Quantized GGUF weights (Tensor::quant): bf16 activations against q8_0 / q4_K blocks, which the
  // backend dequantizes panel by panel; the same shapes' bf16 rows above are the comparison.
  std::printf("# quantized weights (bf16 activations)\n");
  for (GgmlType qt : {GgmlType::Q8_0, GgmlType::Q4_K}) {
    for (int64_t m : ms) {
      for (int64_t n : {4096L, 12288L}) {
        const int64_t k = 4096;
        std::vector<char> a = values(static_cast<size_t>(m * k), DType::BF16, 1);
        // Random blocks whose f16 scales (q8_0: d at 0; q4_K: d, dmin at 0, 2) are set to 2^-7.
        std::vector<uint8_t> q(ggml_bytes(qt, n * k));
        for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<uint8_t>(rng_mix(i + 99) >> 56);
        const size_t bb = ggml_type_info(qt)->block_bytes;
        for (size_t b = 0; b < q.size(); b += bb) {
          for (size_t o : qt == GgmlType::Q4_K ? std::vector<size_t>{0, 2} : std::vector<size_t>{0}) {
            q[b + o] = 0x00;
            q[b + o + 1] = 0x20;
          }
        }
        std::vector<float> c(static_cast<size_t>(m * n));
        Tensor ta(a.data(), DType::BF16, {m, k}), tw(q.data(), DType::BF16, {n, k}),
            tc(c.data(), DType::F32, {m, n});
        tw.quant = static_cast<int16_t>(qt);
        const double sec = bench::best_seconds(reps, [&] { be->gemm(ta, tw, nullptr, tc, false); });
        const double gf = 2.0 * static_cast<double>(m * n) * static_cast<double>(k) / sec / 1e9;
        const std::string name = ggml_type_info(qt)->name;
        rows.push_back({"onednn", name, m, n, k, gf});
        std::printf("onednn   %-5s M=%-5lld N=%-6lld K=%-5lld %8.1f GFLOP/s\n", name.c_str(),
                    static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k), gf);
      }
    }
  }
#ifdef TESSERA_HAVE_OPENBLAS
  for (int64_t m : ms) {
    for (int64_t n : {4096L, 12288L}) {
      const int64_t k = 4096;
      std::vector<float> a(static_cast<size_t>(m * k), 0.01f), w(static_cast<size_t>(n * k), 0.02f),
          c(static_cast<size_t>(m * n));
      const double s = bench::best_seconds(reps, [&] {
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
