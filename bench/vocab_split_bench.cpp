// The sampler over an LM head split by vocabulary (engine/vocab_parallel.cpp) against the CPU sampler on
// the whole rows, side by side in one run: `mpirun -np N vocab_split_bench [--rows R] [--vocab V]`. Every
// rank builds the same random logits; rank 0 times cpu_sample_rows on the whole [R, V] rows, then every
// rank runs split_sample_rows on its [R, V / N] share (the collectives included). Median of --reps runs;
// rank 0 prints the table (docs/PERF.md, "Tensor and expert parallelism over MPI").
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "dist/communicator.h"
#include "engine/vocab_parallel.h"

using namespace tessera;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t R = 32, V = 126464;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--rows")
      R = std::atoll(argv[i + 1]);
    else if (a == "--vocab")
      V = std::atoll(argv[i + 1]);
    else if (a == "--reps")
      reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "vocab_split_bench: unknown option %s (--rows R --vocab V --reps N)\n", a.c_str());
      return 2;
    }
  }
  std::string why;
  auto comm = dist::mpi_world(120.0, &why);
  if (!comm) {
    std::fprintf(stderr, "vocab_split_bench: %s\n", why.c_str());
    return 1;
  }
  const int ranks = comm->size(), rank = comm->rank();
  const VocabShare share = vocab_share(V, ranks, rank);
  // Logits like a language model's: a few peaked tokens over a broad tail.
  std::vector<float> whole(static_cast<size_t>(R * V)), mine(static_cast<size_t>(R * share.n));
  uint64_t s = 99;
  for (float& x : whole) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const float u = static_cast<float>((s >> 40) & 0xffffff) / 16777216.0f;
    x = 4.0f * (u - 0.5f) + (u > 0.9995f ? 12.0f : 0.0f);
  }
  for (int64_t r = 0; r < R; ++r)
    std::copy_n(whole.begin() + r * V + share.lo, share.n, mine.begin() + r * share.n);
  std::vector<int32_t> keys(static_cast<size_t>(R)), tok(static_cast<size_t>(R));
  std::vector<float> conf(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) keys[static_cast<size_t>(r)] = static_cast<int32_t>(r);
  const Tensor all_t(whole.data(), DType::F32, {R, V}), mine_t(mine.data(), DType::F32, {R, share.n}),
      keys_t(keys.data(), DType::I32, {R});
  Tensor tok_t(tok.data(), DType::I32, {R}), conf_t(conf.data(), DType::F32, {R});
  struct Case {
    const char* what;
    SampleParams p;
  };
  std::vector<Case> cases;
  const auto add = [&](const char* what, float t, bool gumbel, float top_p, int top_k, ConfKind c) {
    SampleParams p;
    p.temperature = t;
    p.gumbel = gumbel;
    p.top_p = top_p;
    p.top_k = top_k;
    p.conf = c;
    p.seed = 3;
    cases.push_back({what, p});
  };
  add("greedy, prob", 0.0f, true, 1.0f, 0, ConfKind::Prob);
  add("gumbel 0.7, prob", 0.7f, true, 1.0f, 0, ConfKind::Prob);
  add("dream 0.5, entropy", 0.5f, false, 1.0f, 0, ConfKind::NegEntropy);
  add("dream 0.5, top_p 0.95", 0.5f, false, 0.95f, 0, ConfKind::Prob);
  add("dream 0.5, top_k 50", 0.5f, false, 1.0f, 50, ConfKind::Prob);
  if (rank == 0)
    std::printf(
        "rows %lld, vocab %lld, %d ranks (share %lld), median of %d\n| sampler | whole rows, one process | "
        "split over the ranks | ratio | bytes sent per rank |\n|---|---:|---:|---:|---:|\n",
        static_cast<long long>(R), static_cast<long long>(V), ranks, static_cast<long long>(share.n), reps);
  using Clock = std::chrono::steady_clock;
  for (const Case& c : cases) {
    std::vector<double> one, split;
    for (int i = 0; i < reps; ++i) {
      if (rank == 0) {
        const auto t0 = Clock::now();
        cpu_sample_rows(all_t, keys_t, c.p, tok_t, conf_t);
        one.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      comm->barrier();
      comm->reset_stats();
      const auto t0 = Clock::now();
      split_sample_rows(mine_t, keys_t, c.p, share, *comm, tok_t, conf_t);
      split.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    if (rank == 0) {
      const double a = median(one), b = median(split);
      std::printf("| %s | %.2f ms | %.2f ms | %.2fx | %llu in %llu calls |\n", c.what, 1e3 * a, 1e3 * b,
                  a / b, static_cast<unsigned long long>(comm->stats().bytes),
                  static_cast<unsigned long long>(comm->stats().calls));
    }
  }
  return 0;
}
