// One MoE layer at real geometries (LLaDA-MoE-7B: 64 experts, top-8, 2048 -> 1024; LLaDA2.0-mini: 256
// experts, top-8, 2048 -> 512, sigmoid + bias + groups), the router plus the expert FFN over the N tokens
// of a block (what a dual-KV-cache step computes), with and without Dynamic Expert Sharing. Router logits
// are drawn independently per token (N(0, 1)): the no-consensus case, in which the union of experts grows
// fastest with N (the "expert explosion"); real tokens of one block agree more. Reports per row the unique
// experts the layer reads (T) and the layer time, best of --reps, with its speed-up over vanilla routing
// measured in the same run. Usage: moe_bench [--device cpu|cuda] [--quick] [--reps R] [--json FILE]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "bench_util.h"
#include "core/dtype.h"
#include "core/error.h"

using namespace tessera;

namespace {

struct Layer {
  const char* name;
  int E, K;
  int64_t H, I;
  MoeRouteParams route;
  std::vector<std::pair<std::string, MoeShare>> variants;  // label, sharing (mode Off: vanilla)
};

MoeShare seq(int k) {
  MoeShare s;
  s.mode = DesMode::Seq;
  s.k = k;
  s.m_core = 1;
  return s;
}
MoeShare vote(double beta, int E) {
  MoeShare s;
  s.mode = DesMode::Vote;
  s.m_core = std::max(1, static_cast<int>(std::floor(beta * E)));
  return s;
}

uint64_t lcg(uint64_t& x) {
  x = x * 6364136223846793005ull + 1442695040888963407ull;
  return x >> 33;
}

// Device buffer of `bytes` filled from host data.
void* upload(Backend& b, const void* host, size_t bytes) {
  void* p = b.alloc_weights(bytes);
  b.copy_to_device(p, host, bytes);
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "cpu", json_path;
  int reps = 5;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    if (!std::strcmp(argv[i], "--quick")) quick = true;
  }
  std::unique_ptr<Backend> be;
  if (device == "cuda") {
    std::string why;
    be = make_cuda_backend(&why);
    if (!be) {
      std::fprintf(stderr, "moe_bench: --device cuda: %s\n", why.c_str());
      return 1;
    }
  } else {
    be = make_cpu_backend();
  }
  MoeRouteParams softmax;
  softmax.top_k = 8;
  MoeRouteParams sigmoid = softmax;
  sigmoid.score = MoeScore::Sigmoid;
  sigmoid.norm_topk = true;
  sigmoid.scale = 2.5f;
  sigmoid.n_group = 8;
  sigmoid.topk_group = 4;
  std::vector<Layer> layers = {
      {"llada-moe-7b",
       64,
       8,
       2048,
       1024,
       softmax,
       {{"vanilla", MoeShare{}},
        {"DES-Seq k=3", seq(3)},
        {"DES-Seq k=2", seq(2)},
        {"DES-Vote beta=0.6", vote(0.6, 64)},
        {"DES-Vote beta=0.4", vote(0.4, 64)}}},
      {"llada2-mini",
       256,
       8,
       2048,
       512,
       sigmoid,
       {{"vanilla", MoeShare{}},
        {"DES-Seq k=3", seq(3)},
        {"DES-Seq k=2", seq(2)},
        {"DES-Vote beta=0.15", vote(0.15, 256)},
        {"DES-Vote beta=0.10", vote(0.10, 256)}}},
  };
  const std::vector<int64_t> blocks = quick ? std::vector<int64_t>{32} : std::vector<int64_t>{8, 16, 32, 64};
  std::string json = "[\n";
  std::printf("MoE layer (router + expert FFN, bf16 experts) on %s, best of %d\n", be->name().c_str(), reps);
  for (Layer& L : layers) {
    // Expert weights: small finite bf16 values (the timing does not depend on them).
    const size_t per = static_cast<size_t>(L.I * L.H);
    std::vector<uint16_t> w(per);
    uint64_t st = 42;
    for (auto& v : w) v = static_cast<uint16_t>(0x3c00 + (lcg(st) & 0x7f) - 0x40 + ((lcg(st) & 1) << 15));
    std::vector<void*> bufs;
    std::vector<const void*> table(static_cast<size_t>(3 * L.E));
    for (int e = 0; e < 3 * L.E; ++e) {
      bufs.push_back(upload(*be, w.data(), per * 2));
      table[static_cast<size_t>(e)] = bufs.back();
    }
    void* dtable = upload(*be, table.data(), table.size() * sizeof(void*));
    MoeExperts ex;
    ex.table = static_cast<const void* const*>(dtable);
    ex.n_experts = L.E;
    ex.hidden = L.H;
    ex.inter = L.I;
    ex.dtype = DType::BF16;
    std::vector<float> bias(static_cast<size_t>(L.E));
    for (auto& b : bias) b = static_cast<float>(lcg(st) % 1000) * 1e-4f;
    void* dbias = upload(*be, bias.data(), bias.size() * 4);
    if (L.route.score == MoeScore::Sigmoid) L.route.expert_bias = static_cast<const float*>(dbias);
    std::printf("\n%s layer: %d experts, top-%d, hidden %lld, expert inter %lld (%.0f MiB of experts)\n",
                L.name, L.E, L.K, static_cast<long long>(L.H), static_cast<long long>(L.I),
                3.0 * L.E * static_cast<double>(per) * 2 / (1 << 20));
    std::printf("%6s %-20s %8s %10s %9s\n", "block", "routing", "experts", "ms", "speed-up");
    for (const int64_t N : blocks) {
      // Router logits N(0, 1) by Box-Muller; x rows of small bf16 values.
      std::vector<float> logits(static_cast<size_t>(N * L.E));
      for (auto& v : logits) {
        const double u1 = (static_cast<double>(lcg(st)) + 1.0) / 2147483649.0,
                     u2 = static_cast<double>(lcg(st)) / 2147483648.0;
        v = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
      }
      std::vector<uint16_t> x(static_cast<size_t>(N * L.H));
      for (auto& v : x) v = static_cast<uint16_t>(0x3c00 + (lcg(st) & 0x7f));
      const size_t scratch_bytes = moe_scratch_bytes(N, L.K, ex);
      void* dl = upload(*be, logits.data(), logits.size() * 4);
      void* dx = upload(*be, x.data(), x.size() * 2);
      void* dscratch = be->alloc_weights(scratch_bytes);
      void* dids = be->alloc_weights(static_cast<size_t>(N * L.K) * 4);
      void* dw = be->alloc_weights(static_cast<size_t>(N * L.K) * 4);
      void* dout = be->alloc_weights(static_cast<size_t>(N * L.H) * 4);
      std::vector<float> zeros(static_cast<size_t>(5 * L.E), 0.0f), state(zeros.size());
      void* dstate = upload(*be, zeros.data(), zeros.size() * 4);
      const Tensor tl(dl, DType::F32, {N, L.E}, be->device()), tx(dx, DType::BF16, {N, L.H}, be->device());
      Tensor ti(dids, DType::I32, {N, L.K}, be->device()), tw(dw, DType::F32, {N, L.K}, be->device());
      Tensor ts(dscratch, DType::I32, {static_cast<int64_t>(scratch_bytes / 4)}, be->device());
      Tensor to(dout, DType::F32, {N, L.H}, be->device());
      double vanilla_ms = 0;
      for (const auto& [label, v] : L.variants) {
        MoeShare sh = v;
        sh.vote_lo = sh.share_lo = 0;
        sh.vote_hi = sh.share_hi = N;
        sh.vote = sh.mode != DesMode::Off;
        sh.apply = true;
        sh.state = static_cast<float*>(dstate);
        MoeRouteParams p = L.route;
        p.share = &sh;
        auto layer = [&] {
          be->copy_to_device(dstate, zeros.data(), zeros.size() * 4);
          be->moe_route(tl, p, ti, tw);
          be->moe_ffn(tx, ti, tw, ex, ts, to);
          be->synchronize();
        };
        const double best = bench::best_seconds(reps, layer);
        be->copy_to_host(state.data(), dstate, state.size() * 4);
        int unique = 0;
        for (int e = 0; e < L.E; ++e) unique += state[static_cast<size_t>(2 * L.E + e)] > 0.0f ? 1 : 0;
        const double ms = best * 1e3;
        if (sh.mode == DesMode::Off) vanilla_ms = ms;
        std::printf("%6lld %-20s %8d %10.3f %8.2fx\n", static_cast<long long>(N), label.c_str(), unique, ms,
                    vanilla_ms / ms);
        char line[256];
        std::snprintf(
            line, sizeof line,
            "  {\"layer\": \"%s\", \"block\": %lld, \"routing\": \"%s\", \"experts\": %d, \"ms\": %.4f, "
            "\"speedup\": %.4f},\n",
            L.name, static_cast<long long>(N), label.c_str(), unique, ms, vanilla_ms / ms);
        json += line;
      }
      for (void* p : {dl, dx, dscratch, dids, dw, dout, dstate}) be->free_weights(p);
    }
    for (void* p : bufs) be->free_weights(p);
    be->free_weights(dtable);
    be->free_weights(dbias);
  }
  if (!json_path.empty()) {
    if (json.size() > 2) json.erase(json.size() - 2, 1);  // the last comma
    std::ofstream(json_path) << json << "]\n";
  }
  return 0;
}
