// SparseD's two kernels on the CPU against dense attention, at one layer's shapes: the dense
// bidirectional attention of L rows, the selection pass (sparse_select: block importance and the kept
// tiles per head), and the block-sparse attention over the selected pattern, best of --reps each, with
// the ratios to dense measured in the same run. Queries and keys are random (N(0, 1) scaled by --peak):
// the kernels' cost does not depend on the values, only on the kept fraction, which is reported.
// --kernels runs each CPU attention kernel (f32: the reference; bf16: bf16 operands, f32 accumulation,
// AVX-512 BF16; staged: bf16 with K / V rounded once per call into the scratch a bf16 graph plans
// (AttnParams::kv_scratch); auto: what the engine picks) side by side in one run, taking turns repetition by
// repetition for dense attention; dense GFLOP/s counts 4 L^2 d per head (QK^T and PV) and the speed-up
// is over the first kernel listed. --configs none times dense attention only.
// Usage: sparse_bench [--lengths 2048,4096] [--heads 8] [--kv-heads 8] [--head-dim 128] [--prompt-frac 0.95]
//                     [--configs 32:0.5,128:0.3,128:0.1] [--reps 3] [--kernels f32,bf16]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "bench_util.h"
#include "core/error.h"

using namespace tessera;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> lengths{2048, 4096};
  int heads = 8, kv_heads = 8, head_dim = 128, reps = 3;
  double prompt_frac = 0.95, peak = 2.0;
  std::vector<std::pair<int, float>> configs{{32, 0.5f}, {128, 0.3f}, {128, 0.1f}};
  std::vector<std::string> kernels{"auto"};
  try {
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string k = argv[i], v = argv[i + 1];
      if (k == "--lengths") {
        lengths.clear();
        for (const auto& s : split(v)) lengths.push_back(std::stoll(s));
      } else if (k == "--heads") {
        heads = std::stoi(v);
      } else if (k == "--kv-heads") {
        kv_heads = std::stoi(v);
      } else if (k == "--head-dim") {
        head_dim = std::stoi(v);
      } else if (k == "--prompt-frac") {
        prompt_frac = std::stod(v);
      } else if (k == "--peak") {
        peak = std::stod(v);
      } else if (k == "--reps") {
        reps = std::max(1, std::stoi(v));
      } else if (k == "--kernels") {
        kernels = split(v);
        for (const auto& n : kernels)
          TESSERA_CHECK(n == "f32" || n == "bf16" || n == "staged" || n == "auto",
                        "--kernels: expected f32, bf16, staged or auto, got '" + n + "'");
      } else if (k == "--configs") {
        configs.clear();
        for (const auto& s : split(v)) {
          if (s == "none") continue;
          const auto colon = s.find(':');
          TESSERA_CHECK(colon != std::string::npos, "--configs: expected BLOCK:RHO, got '" + s + "'");
          configs.emplace_back(std::stoi(s.substr(0, colon)), std::stof(s.substr(colon + 1)));
        }
      } else {
        throw Error("unknown option " + k);
      }
    }
    TESSERA_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && head_dim > 0 && head_dim <= 256,
                  "bad head geometry");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sparse_bench: %s\n", e.what());
    return 2;
  }
  auto kernel_of = [](const std::string& name) {
    if (name == "f32") return CpuAttention::F32;
    if (name == "bf16" || name == "staged") return CpuAttention::BF16;
    return CpuAttention::Auto;
  };
  std::vector<std::unique_ptr<Backend>> backends;
  try {
    for (const std::string& kname : kernels) backends.push_back(make_cpu_backend({kernel_of(kname)}));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sparse_bench: %s\n", e.what());
    return 2;
  }
  std::printf("CPU attention: %d heads (%d kv) of %d, bidirectional; best of %d; kernels:", heads, kv_heads,
              head_dim, reps);
  for (const std::string& kname : kernels) {
    const bool bf16 = resolve_cpu_attention(kernel_of(kname)) == CpuAttention::BF16;
    std::printf(" %s (%s%s)", kname.c_str(), bf16 ? "bf16 operands, f32 accumulation" : "f32",
                kname == "staged" ? ", K / V staged in bf16 in the planned scratch" : "");
  }
  std::printf("\n%6s %6s %10s %8s %8s\n", "L", "kernel", "dense ms", "GFLOP/s", "speed-up");
  for (const int64_t L : lengths) {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, static_cast<float>(peak));
    std::vector<float> q(static_cast<size_t>(L * heads * head_dim)),
        k(static_cast<size_t>(L * kv_heads * head_dim)), v(k.size()), out(q.size());
    for (auto* vec : {&q, &k, &v})
      for (float& x : *vec) x = nd(rng);
    std::vector<int32_t> cu{0, static_cast<int32_t>(L)}, pos(static_cast<size_t>(L));
    std::iota(pos.begin(), pos.end(), 0);
    const Tensor tq(q.data(), DType::F32, {L, heads * head_dim}),
        tk(k.data(), DType::F32, {L, kv_heads * head_dim}),
        tv(v.data(), DType::F32, {L, kv_heads * head_dim});
    Tensor to(out.data(), DType::F32, {L, heads * head_dim});
    std::vector<uint8_t> scratch(attn_kv_scratch_bytes(L, kv_heads * head_dim));  // what a bf16 graph plans
    auto with_scratch = [&](size_t b, AttnParams a) {
      if (kernels[b] == "staged") a.kv_scratch = scratch.data();
      return a;
    };
    AttnParams p;
    p.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    p.cu_q = cu.data();
    p.cu_k = cu.data();
    p.q_pos = pos.data();
    p.k_pos = pos.data();
    p.operands = DType::BF16;  // the bf16 kernel may run (a bf16 model's attention)
    // The kernels take turns, one repetition each, so that a change in the machine's load falls on all.
    std::vector<double> dense(backends.size(), 1e30);
    for (int r = 0; r < reps; ++r)
      for (size_t b = 0; b < backends.size(); ++b)
        dense[b] =
            std::min(dense[b], bench::best_seconds(1, [&] {
                       backends[b]->attention(tq, tk, tv, to, heads, kv_heads, head_dim, with_scratch(b, p));
                     }));
    const double flops = 4.0 * static_cast<double>(L) * static_cast<double>(L) * head_dim * heads;
    for (size_t b = 0; b < backends.size(); ++b)
      std::printf("%6lld %6s %10.1f %8.1f %7.2fx\n", static_cast<long long>(L), kernels[b].c_str(),
                  dense[b] * 1e3, flops / dense[b] * 1e-9, dense[0] / dense[b]);
    if (configs.empty()) continue;
    std::printf("%6s %6s %6s %5s %10s %10s %10s %8s %8s %8s\n", "L", "kernel", "block", "rho", "dense ms",
                "select ms", "sparse ms", "kept", "sparse x", "select x");
    for (const auto& [block, rho] : configs) {
      for (size_t b = 0; b < backends.size(); ++b) {
        Backend& be = *backends[b];
        const int64_t nb = (L + block - 1) / block;
        std::vector<uint8_t> pattern(static_cast<size_t>(heads * nb * nb));
        SparseSelectParams sp;
        sp.scale = p.scale;
        sp.block = block;
        sp.rho = rho;
        sp.n_prompt_keys = static_cast<int64_t>(static_cast<double>(L) * prompt_frac);
        sp.operands = DType::BF16;
        const double select = bench::best_seconds(
            reps, [&] { be.sparse_select(tq, tk, heads, kv_heads, head_dim, sp, pattern.data()); });
        AttnParams ps = with_scratch(b, p);
        ps.block_mask = pattern.data();
        ps.sparse_block = block;
        const double sparse =
            bench::best_seconds(reps, [&] { be.attention(tq, tk, tv, to, heads, kv_heads, head_dim, ps); });
        const double kept = static_cast<double>(std::count(pattern.begin(), pattern.end(), uint8_t{1})) /
                            static_cast<double>(pattern.size());
        std::printf("%6lld %6s %6d %5.2f %10.1f %10.1f %10.1f %7.1f%% %7.2fx %7.2fx\n",
                    static_cast<long long>(L), kernels[b].c_str(), block, static_cast<double>(rho),
                    dense[b] * 1e3, select * 1e3, sparse * 1e3, kept * 100.0, dense[b] / sparse,
                    select / dense[b]);
      }
    }
  }
  return 0;
}
