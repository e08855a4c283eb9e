// Mosaic end to end. The plan is the memory a forward uses: a real forward of the llada-mid geometry
// (LLaDA block at d=1024, 4 layers, real vocabulary; synthetic bf16 weights) grows the process's
// resident memory by the planned activation peak, within 5%, plus the runtime's own buffers, which
// are measured separately (RSS growth outside the workspace range) and bounded by a small constant.
// The memory budget in the engine and the CLI: lazy chunking under a budget gives the unchunked
// results; an impossible budget fails before any work, naming the budget, the floor and L_max;
// `tessera plan`.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"
#include "memory/chunk_optimizer.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

struct Growth {
  size_t planned = 0;
  size_t rss = 0;                      // peak RSS growth during the forward
  size_t ws_before = 0, ws_after = 0;  // resident workspace bytes before and after
  int64_t k_ffn = 1, k_logits = 1;
  size_t workspace() const { return ws_after - ws_before; }
  size_t other() const { return rss > workspace() ? rss - workspace() : 0; }  // outside the workspace
};

// One forward of `n` tokens with every other position masked; peak RSS growth measured from a reset
// high-water mark (clear_refs 5).
Growth measure(Engine& e, int64_t n) {
  std::vector<int32_t> canvas(static_cast<size_t>(n)), pos;
  for (int64_t i = 0; i < n; ++i) {
    canvas[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % 100000);
    if (i % 2 == 1) {
      canvas[static_cast<size_t>(i)] = e.mask_token();
      pos.push_back(static_cast<int32_t>(i));
    }
  }
  std::vector<int32_t> tok(pos.size());
  std::vector<float> conf(pos.size());
  reset_peak_rss();
  Growth g;
  const size_t rss0 = process_memory().rss;
  g.ws_before = e.workspace_resident();
  e.predict(canvas, pos, SampleParams{}, tok, conf);
  g.planned = e.last_step().planned_peak;
  g.k_ffn = e.last_step().shape.k_ffn;
  g.k_logits = e.last_step().shape.k_logits;
  g.rss = process_memory().peak - rss0;
  g.ws_after = e.workspace_resident();
  return g;
}

// The runtime's own buffers that a new step shape may grow: oneDNN's shared scratchpad and primitive
// JIT code, the 256-row gather tile, per-thread sampling rows (vocab floats), OpenMP stacks. Measured
// on the project machine (2 threads) at under 1 MiB after a warm-up step; 32 MiB leaves room for
// many more threads and larger scratchpads.
constexpr size_t kRuntimeSlack = size_t{32} << 20;

void check(const Growth& g, const char* what) {
  const double mib = 1048576.0, plan = static_cast<double>(g.planned);
  // The pages resident before the step (a warm-up's plan) count towards this one's.
  const double rss = static_cast<double>(g.rss + g.ws_before);
  std::printf(
      "%s: K_ffn %lld, K_logits %lld; planned peak %.1f MiB; resident workspace %.1f MiB; RSS growth "
      "%.1f MiB + %.1f MiB already resident, of which %.1f MiB outside the workspace: RSS / plan %.3f\n",
      what, static_cast<long long>(g.k_ffn), static_cast<long long>(g.k_logits), plan / mib, g.ws_after / mib,
      g.rss / mib, g.ws_before / mib, g.other() / mib, rss / plan);
  // Every page of the plan is touched, and nothing beyond it (page rounding aside).
  EXPECT_GE(static_cast<double>(g.ws_after), 0.95 * plan) << what;
  EXPECT_LE(static_cast<double>(g.ws_after), 1.05 * plan) << what;
  // The process grows by the plan, within 5%, plus the runtime's own buffers.
  EXPECT_LE(g.other(), kRuntimeSlack) << what;
  EXPECT_LE(rss, 1.05 * plan + static_cast<double>(kRuntimeSlack)) << what;
  EXPECT_GE(rss, 0.95 * plan) << what;
}

TEST(Rss, ForwardGrowthFollowsThePlan) {
  const ModelConfig c = named_geometry("llada-mid");
  const int64_t n = 1024;
  size_t unchunked = 0, weights = 0;
  {
    auto e = Engine::synthetic(c, EngineOptions{}, DType::BF16);
    measure(*e, 64);  // warm-up: threads, small primitives; its workspace pages stay resident
    const Growth g = measure(*e, n);
    check(g, "unchunked");
    unchunked = g.planned;
    weights = e->model().weight_bytes();
  }
  // A budget between the floor and the unchunked peak: lazy chunking must kick in, and the RSS
  // follows the smaller plan.
  EngineOptions o;
  o.memory_budget = weights + unchunked / 3;
  auto e = Engine::synthetic(c, o, DType::BF16);
  measure(*e, 64);
  const Growth g = measure(*e, n);
  EXPECT_GT(g.k_ffn * g.k_logits, 1) << "the budget should force chunking";
  EXPECT_LE(g.planned, unchunked / 3);
  check(g, "lazy chunking");
}

// A toy LLaDA (2 layers, d=64, vocab 512) with random weights: fast, and its FFN / logits / attention
// peaks are of the same order.
ModelConfig toy_llada() {
  ModelConfig c = named_geometry("llada-8b");
  c.hidden = 64;
  c.n_layers = 2;
  c.n_heads = c.n_kv_heads = 4;
  c.head_dim = 16;
  c.intermediate = 256;
  c.vocab = 512;
  c.mask_id = 511;
  return c;
}

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MemoryBudget, AnImpossibleBudgetFailsBeforeAnyWorkNamingTheFloorAndLmax) {
  const ModelConfig c = toy_llada();
  auto plain = Engine::synthetic(c, EngineOptions{}, DType::F32);
  const size_t weights = plain->model().weight_bytes();
  const graph::GraphTemplate& g = plain->model().graph(OutputMode::Sample);
  const int64_t n = 4096;
  const size_t floor = memory::chunk_floor(g, memory::step_shape(n, 0.5));
  // Smaller than the weights: fails at load.
  const std::string w =
      what_of([&] { Engine::synthetic(c, EngineOptions{.memory_budget = weights / 2}, DType::F32); });
  EXPECT_NE(w.find("memory budget " + memory::format_bytes(static_cast<double>(weights / 2))),
            std::string::npos)
      << w;
  EXPECT_NE(w.find("weights alone"), std::string::npos) << w;
  // Above the weights, below weights + floor: the request's largest step fails before it runs.
  const size_t act = floor / 2;
  auto e = Engine::synthetic(c, EngineOptions{.memory_budget = weights + act}, DType::F32);
  const std::string m = what_of([&] { e->check_memory(n, n / 2); });
  const int64_t l_max = memory::largest_context(g, 0.5, act);
  std::printf("%s\n", m.c_str());
  EXPECT_NE(m.find("memory budget " + memory::format_bytes(static_cast<double>(weights + act))),
            std::string::npos)
      << m;
  EXPECT_NE(
      m.find("at least " + memory::format_bytes(static_cast<double>(floor)) + " (the non-chunkable floor"),
      std::string::npos)
      << m;
  EXPECT_NE(m.find("largest context that fits this budget is " + std::to_string(l_max) + " tokens"),
            std::string::npos)
      << m;
  EXPECT_EQ(e->workspace().committed(), 0u);  // nothing ran
  // L_max is exact: its step fits (and runs), one more token does not.
  EXPECT_GT(l_max, 0);
  EXPECT_LT(l_max, n);
  e->check_memory(l_max, (l_max + 1) / 2);
  EXPECT_LE(e->last_step().planned_peak, act);
  EXPECT_THROW(e->check_memory(l_max + 1, (l_max + 2) / 2), Error);
}

TEST(MemoryBudget, LazyChunkingUnderABudgetGivesTheUnchunkedResult) {
  const ModelConfig c = toy_llada();
  const int64_t n = 600;
  std::vector<int32_t> canvas(static_cast<size_t>(n)), pos;
  for (int64_t i = 0; i < n; ++i) {
    canvas[static_cast<size_t>(i)] = static_cast<int32_t>(i * 37 % 500);
    if (i % 3 != 0) {
      canvas[static_cast<size_t>(i)] = c.mask_id;
      pos.push_back(static_cast<int32_t>(i));
    }
  }
  size_t floor = 0;
  auto run = [&](size_t budget, std::vector<int32_t>& tok, std::vector<float>& conf) {
    auto e = Engine::synthetic(c, EngineOptions{.memory_budget = budget}, DType::F32);
    tok.assign(pos.size(), 0);
    conf.assign(pos.size(), 0);
    e->predict(canvas, pos, SampleParams{}, tok, conf);
    graph::StepShape s;
    s.n_query = s.n_kv = n;
    s.n_logits = static_cast<int64_t>(pos.size());
    floor = memory::chunk_floor(e->model().graph(OutputMode::Sample), s);
    return std::make_pair(e->last_step(), e->model().weight_bytes());
  };
  std::vector<int32_t> t1, t2, t3;
  std::vector<float> c1, c2, c3;
  const auto [plain, weights] = run(0, t1, c1);
  const auto [ample, w2] = run(weights + plain.planned_peak, t2, c2);  // fits unchunked: no chunking
  EXPECT_EQ(ample.shape.k_ffn, 1);
  EXPECT_EQ(ample.shape.k_logits, 1);
  EXPECT_EQ(ample.search_plans, 1);
  const size_t act = floor + (plain.planned_peak - floor) / 4;
  const auto [tight, w3] = run(weights + act, t3, c3);
  EXPECT_GT(tight.shape.k_ffn * tight.shape.k_logits, 1);
  EXPECT_LE(tight.planned_peak, act);
  EXPECT_GT(tight.search_plans, 1);
  EXPECT_EQ(t1, t2);
  EXPECT_EQ(c1, c2);
  EXPECT_EQ(t1, t3);
  EXPECT_LE(test::rel_error(c3.data(), c1.data(), c1.size()), 1e-6);
}

TEST(MemoryBudget, CliGenerateAndPlan) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 3");
  const std::string bin = TESSERA_BINARY;
  const std::string gen =
      bin + " generate -m " + dir.string() + " -p hello --gen-length 16 --steps 4 --no-progress";
  const size_t weights = Engine::load(dir)->model().weight_bytes();
  std::string out;
  test::expect_command_error(gen + " --memory-budget 12XB", "bad memory size '12XB'");
  test::expect_command_error(gen + " --memory-budget 1KiB", "weights alone");
  test::expect_command_error(gen + " --memory-budget " + std::to_string(weights + 4096),
                             "largest context that fits this budget is");
  EXPECT_EQ(out.find(" steps · "), std::string::npos) << "no step may run: " << out;
  ASSERT_EQ(test::run_command(gen + " --memory-budget 1GiB", &out), 0) << out;
  EXPECT_NE(out.find(" steps · "), std::string::npos) << out;

  const auto svg = test::temp_dir("plan_svg") / "plan.svg";
  ASSERT_EQ(test::run_command(
                bin +
                    " plan --geometry llada-8b --context 65536 --mask-ratio 0.9 --budget 24GiB --json "
                    "--svg " +
                    svg.string() + " 2>/dev/null",
                &out),
            0)
      << out;
  const auto j = nlohmann::json::parse(out);
  EXPECT_TRUE(j["fits"].get<bool>());
  EXPECT_GT(j["chosen"]["k_logits"].get<int64_t>(), 1);  // 59k logit rows of 126464 floats do not fit
  EXPECT_LE(j["chosen"]["peak_bytes"].get<size_t>(), j["activation_budget_bytes"].get<size_t>());
  EXPECT_GT(j["l_max"].get<int64_t>(), 65536);
  EXPECT_LT(j["chosen"]["peak_to_average"].get<double>(), j["unchunked"]["peak_to_average"].get<double>());
  std::ifstream f(svg);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("<svg"), std::string::npos);
  EXPECT_NE(text.find("blk.31.ffn_gate"), std::string::npos);  // one rectangle per tensor
  EXPECT_NE(text.find("peak "), std::string::npos);
  ASSERT_EQ(test::run_command(bin + " plan --geometry dream-7b --context 4096 --mask-ratio 0.5", &out), 0)
      << out;
  for (const char* want :
       {"activation peak", "lower bound (live)", "peak / average live", "non-chunkable floor"}) {
    EXPECT_NE(out.find(want), std::string::npos) << out;
  }
  test::expect_command_error(bin + " plan --context 4096", "-m DIR or --geometry");
}

// `tessera plan --device cuda` plans the graph the CUDA engine runs (with the bf16 K / V staging of its
// flash attention): its L_max for LLaDA-8B at 24 / 40 GiB is the one the engine planned and ran on an
// H100 (forward_bench --lmax, docs/PERF.md). The CPU's bf16 attention plans the same staging buffer
// (where the CPU has AVX-512 BF16), so the same L_max; without it (TESSERA_CPU_KV_STAGE=0) a longer one.
TEST(MemoryBudget, PlanForCudaIsTheGpuEnginesPlan) {
  const std::string bin = TESSERA_BINARY;
  const auto l_max = [&](const std::string& budget, const std::string& device, const std::string& env = "") {
    std::string out;
    EXPECT_EQ(test::run_command(env + bin + " plan --geometry llada-8b --context 4096 --budget " + budget +
                                    " --json --device " + device,
                                &out),
              0)
        << out;
    const auto j = nlohmann::json::parse(out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << out;
    if (j.is_discarded()) return int64_t{-1};
    EXPECT_EQ(j["device"].get<std::string>(), device);
    return j["l_max"].get<int64_t>();
  };
  EXPECT_EQ(l_max("24GiB", "cuda"), 108058);
  EXPECT_EQ(l_max("40GiB", "cuda"), 298683);
  if (resolve_cpu_attention(CpuAttention::Auto) == CpuAttention::BF16) {
    EXPECT_EQ(l_max("24GiB", "cpu"), 108058);
  }
  EXPECT_GT(l_max("24GiB", "cpu", "TESSERA_CPU_KV_STAGE=0 "), 108058);
  test::expect_command_error(bin + " plan --geometry llada-8b --context 4096 --device tpu", "--device");
}

}  // namespace
}  // namespace tessera
