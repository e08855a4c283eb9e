// What every sampler and option produces, frozen: the tokens, the order in which positions were decided
// and the log-probabilities of fixed generations (fixed prompts and seeds, f32) on both bundled models
// and on tiny checkpoints of the four families, recorded in tests/data/behaviour_golden.txt before the
// decoding layer was redesigned (issue #27), and held bit for bit since.
//
// Re-record (only when a change of behaviour is intended, and say so in the commit):
//   TESSERA_RECORD_GOLDEN=1 build/tests/golden_tests --gtest_filter='BehaviourGolden.*'
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "core/error.h"
#include "decode/generate.h"
#include "engine/engine.h"
#include "io/model_files.h"
#include "io/tokenizer.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

std::filesystem::path golden_file() {
  return test::source_dir() / "tests/data/behaviour_golden.txt";
}

bool recording() {
  const char* r = std::getenv("TESSERA_RECORD_GOLDEN");
  return r != nullptr && std::string(r) == "1";
}

// The options of a case: "key=value,key=value" over the defaults of the model (see below). The keys
// are this test's own, so that the cases read the same whatever GenerateOptions looks like.
GenerateOptions options_of(const std::string& spec, GenerateOptions o) {
  std::stringstream ss(spec);
  std::string kv;
  while (std::getline(ss, kv, ',')) {
    if (kv.empty()) continue;
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) throw std::runtime_error("bad case spec " + spec);
    const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    const auto i = [&] { return std::stoi(v); };
    const auto f = [&] { return std::stof(v); };
    if (k == "gen")
      o.gen_length = i();
    else if (k == "steps")
      o.steps = i();
    else if (k == "block")
      o.block_length = i();
    else if (k == "alg")
      o.alg = parse_unmask(v);
    else if (k == "temp")
      o.temperature = f();
    else if (k == "seed")
      o.seed = static_cast<uint64_t>(std::stoull(v));
    else if (k == "threshold")
      o.threshold = f();
    else if (k == "cfg")
      o.cfg_scale = f();
    else if (k == "top_k")
      o.top_k = i();
    else if (k == "top_p")
      o.top_p = f();
    else if (k == "alg_temp")
      o.alg_temp = f();
    else if (k == "eos_inf")
      o.logits_eos_inf = v == "1";
    else if (k == "stop_at_eos")
      o.stop_at_eos = v == "1";
    else if (k == "cache")
      o.cache = parse_kv_cache(v);
    else if (k == "sparse_block")
      o.sparse = true, o.sparse_block = i();
    else if (k == "sparse_rho")
      o.sparse = true, o.sparse_rho = f();
    else if (k == "sparse_skip")
      o.sparse = true, o.sparse_skip = f();
    else if (k == "des")
      o.des = parse_des(v);
    else if (k == "des_k")
      o.des_k = i();
    else if (k == "des_beta")
      o.des_beta = f();
    else if (k == "des_scope")
      o.des_scope = parse_des_scope(v);
    else if (k == "moe_stats")
      o.moe_stats = v == "1";
    else if (k == "win_ex")
      o.window = true, o.window_ex = i();
    else if (k == "win_in")
      o.window = true, o.window_in = i();
    else if (k == "win_refresh")
      o.window = true, o.window_refresh = i();
    else if (k == "win_stop")
      o.window = true, o.window_early_stop = v == "1";
    else if (k == "logprobs")
      o.logprobs = v == "1";
    else if (k == "mid_block_stop")
      o.mid_block_stop = v == "1";
    else if (k == "suffix") {  // token ids separated by ':'
      std::stringstream s(v);
      std::string t;
      while (std::getline(s, t, ':')) o.suffix.push_back(std::stoi(t));
    } else if (k == "stop_after") {  // stop_when: a "stop sequence" once the decided run has N tokens
      const size_t n = static_cast<size_t>(i());
      o.stop_when = [n](std::span<const int32_t> run) { return run.size() >= n; };
    } else {
      throw std::runtime_error("unknown key " + k + " in case spec " + spec);
    }
  }
  return o;
}

// FNV-1a over the decided positions of every step (with a separator per step).
uint64_t order_hash(const std::vector<std::vector<int32_t>>& order) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t x) {
    for (int b = 0; b < 8; ++b) {
      h ^= (x >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (const auto& s : order) {
    for (int32_t p : s) mix(static_cast<uint64_t>(static_cast<uint32_t>(p)));
    mix(~0ull);
  }
  return h;
}

// One line: the tokens, the steps run, the order's hash, and with logprobs each token's log-probability
// and its first alternative (printed with 9 significant digits: bit for bit in f32).
std::string describe(const GenerateResult& r) {
  std::string s = "tokens";
  for (int32_t t : r.tokens) s += " " + std::to_string(t);
  char buf[96];
  std::snprintf(buf, sizeof buf, " | steps %d | order %016llx", r.steps_run,
                static_cast<unsigned long long>(order_hash(r.order)));
  s += buf;
  if (!r.logprobs.empty()) {
    s += " | lp";
    for (const TokenLogprob& t : r.logprobs) {
      std::snprintf(buf, sizeof buf, " %.9g@%d", static_cast<double>(t.logprob), t.step);
      s += buf;
      if (!t.top.empty()) {
        std::snprintf(buf, sizeof buf, "/%d:%.9g", t.top[0].first, static_cast<double>(t.top[0].second));
        s += buf;
      }
    }
  }
  return s;
}

std::map<std::string, std::string> read_golden() {
  std::map<std::string, std::string> m;
  std::ifstream f(golden_file());
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sep = line.find(" => ");
    if (sep != std::string::npos) m[line.substr(0, sep)] = line.substr(sep + 4);
  }
  return m;
}

// The results of this process's cases, written to the golden file at exit when recording.
std::map<std::string, std::string>& recorded() {
  static std::map<std::string, std::string> m;
  return m;
}

struct RecordAtExit : ::testing::Environment {
  void TearDown() override {
    if (!recording() || recorded().empty()) return;
    std::map<std::string, std::string> all = read_golden();
    for (const auto& [k, v] : recorded()) all[k] = v;
    std::ofstream f(golden_file());
    f << "# tests/golden/behaviour_golden_test.cpp: case => result (see its header). Recorded with "
         "TESSERA_RECORD_GOLDEN=1.\n";
    for (const auto& [k, v] : all) f << k << " => " << v << "\n";
  }
};
[[maybe_unused]] ::testing::Environment* const kRecord =
    ::testing::AddGlobalTestEnvironment(new RecordAtExit);

// Runs every case of `specs` on the model at `dir` with `prompt`; compares each with its golden line.
void check_cases(const std::string& model_name, const std::filesystem::path& dir,
                 const std::vector<int32_t>& prompt, const GenerateOptions& defaults,
                 const std::vector<std::string>& specs) {
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  const std::map<std::string, std::string> golden = read_golden();
  for (const std::string& spec : specs) {
    const std::string key = model_name + " [" + spec + "]";
    std::string got;
    try {
      got = describe(generate(*e, prompt, options_of(spec, defaults)));
    } catch (const Error& err) {
      got = std::string("error: ") + err.what();
    }
    if (recording()) {
      recorded()[key] = got;
      continue;
    }
    const auto it = golden.find(key);
    if (it == golden.end()) {
      ADD_FAILURE() << key << " has no golden line in " << golden_file()
                    << " (record with TESSERA_RECORD_GOLDEN=1)";
      continue;
    }
    EXPECT_EQ(got, it->second) << key;
  }
}

// The cases of a bidirectional model: every sampler with its options, the KV caches, SparseD, the
// window, infilling, cfg, stop conditions and log-probabilities; MoE models add DES.
std::vector<std::string> bidirectional_cases(bool moe) {
  std::vector<std::string> c = {
      // LLaDA 1A: 4 blocks of 8, 4 steps each
      "alg=low_confidence",
      "alg=low_confidence,temp=0.7,seed=3",
      "alg=random,seed=5",
      "alg=random,temp=0.5,seed=5",
      "alg=low_confidence,eos_inf=1",
      "alg=low_confidence,stop_at_eos=0",
      "alg=low_confidence,block=32,steps=8",
      "alg=low_confidence,steps=32",
      // threshold (1C)
      "alg=low_confidence,threshold=0.2",
      "alg=maskgit_plus,threshold=0.1,block=32",
      "alg=topk_margin,threshold=0.05,block=16",
      // cfg
      "alg=low_confidence,cfg=1.5",
      "alg=random,cfg=0.5,temp=0.7,seed=2",
      // Dream 1B: one block, or blocks of 16
      "alg=origin,block=32,seed=1",
      "alg=origin,block=32,temp=0.6,seed=9",
      "alg=maskgit_plus,block=32",
      "alg=topk_margin,block=32",
      "alg=entropy,block=32",
      "alg=entropy,block=16",
      "alg=entropy,block=32,top_k=20,top_p=0.9,temp=0.8,seed=4",
      "alg=maskgit_plus,block=32,top_p=0.7,temp=1.0,seed=8",
      "alg=topk_margin,block=32,alg_temp=0.5,seed=6",
      "alg=entropy,block=16,alg_temp=0.3,seed=7",
      // KV caches (Fast-dLLM)
      "alg=low_confidence,cache=prefix",
      "alg=low_confidence,cache=dual",
      "alg=low_confidence,cache=dual,threshold=0.2",
      "alg=entropy,block=16,cache=prefix",
      "alg=entropy,block=16,cache=dual",
      // SparseD
      "alg=low_confidence,sparse_block=8",
      "alg=low_confidence,sparse_block=4,sparse_rho=0.3,sparse_skip=0.25",
      "alg=entropy,block=32,sparse_block=8,sparse_rho=0.4",
      "alg=low_confidence,threshold=0.2,sparse_block=8",
      // Window-Diffusion
      "alg=low_confidence,win_ex=16,win_in=4,win_refresh=4",
      "alg=low_confidence,win_ex=12,win_in=4,win_refresh=0",
      "alg=low_confidence,win_ex=16,win_in=4,win_refresh=3,win_stop=1",
      "alg=entropy,block=32,win_ex=16,win_in=6,win_refresh=4",
      "alg=origin,block=32,win_ex=16,win_in=6,win_refresh=4,seed=2",
      "alg=low_confidence,threshold=0.2,win_ex=16,win_in=8,win_refresh=4",
      // infilling
      "alg=low_confidence,suffix=40:41:42:43:44",
      "alg=entropy,block=32,suffix=40:41:42",
      "alg=low_confidence,cache=dual,suffix=40:41:42:43",
      "alg=low_confidence,cfg=1.0,suffix=40:41",
      // stop conditions
      "alg=low_confidence,stop_after=5",
      "alg=low_confidence,stop_after=5,mid_block_stop=0",
      "alg=entropy,block=32,stop_after=3",
      // log-probabilities
      "alg=low_confidence,logprobs=1",
      "alg=low_confidence,logprobs=1,cfg=1.0",
      "alg=low_confidence,logprobs=1,cache=dual",
      "alg=entropy,block=32,logprobs=1,win_ex=16,win_in=4,win_refresh=4",
      "alg=low_confidence,logprobs=1,sparse_block=8",
  };
  if (moe) {
    for (const char* s : {
             "alg=low_confidence,des=seq,des_k=1",
             "alg=low_confidence,des=vote,des_beta=0.5",
             "alg=low_confidence,des=vote,des_beta=0.25,des_scope=all",
             "alg=low_confidence,des=seq,des_k=1,cache=prefix",
             "alg=entropy,block=32,des=vote,des_beta=0.5",
             "alg=low_confidence,moe_stats=1",
         })
      c.push_back(s);
  }
  return c;
}

GenerateOptions defaults(int32_t eos) {
  GenerateOptions o;
  o.gen_length = 32;
  o.steps = 16;
  o.block_length = 8;
  o.eos_ids = {eos};
  return o;
}

std::vector<int32_t> text_prompt(const std::filesystem::path& dir, const std::string& text) {
  const Tokenizer t = load_model_tokenizer(dir);
  std::vector<int32_t> ids;
  const ModelConfig c = Engine::load(dir)->config();
  if (model_adds_bos(dir) && c.bos_id >= 0) ids.push_back(static_cast<int32_t>(c.bos_id));
  const std::vector<int32_t> body = t.encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

void check_bundled(const std::string& name, bool moe) {
  const std::filesystem::path dir = test::source_dir() / "models" / name;
  const std::vector<int32_t> prompt = text_prompt(dir, "Once upon a time, the little fox");
  const ModelConfig c = Engine::load(dir)->config();
  check_cases(name, dir, prompt, defaults(static_cast<int32_t>(c.eos_id)), bidirectional_cases(moe));
}

// A prompt of ordinary tokens of a tiny checkpoint (its last ids are special).
std::vector<int32_t> tiny_prompt(int n) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(11 + 17 * i % 250));
  return p;
}

void check_tiny(const std::string& family, const std::string& args, bool moe) {
  std::string why;
  const auto dir = test::tiny_checkpoint(family, args, &why);
  if (dir.empty()) GTEST_SKIP() << why;
  const ModelConfig c = Engine::load(dir)->config();
  check_cases("tiny-" + family, dir, tiny_prompt(9), defaults(static_cast<int32_t>(c.eos_id)),
              bidirectional_cases(moe));
}

TEST(BehaviourGolden, TesseraTiny) {
  check_bundled("tessera-tiny", false);
}
TEST(BehaviourGolden, TesseraTinyMoe) {
  check_bundled("tessera-tiny-moe", true);
}
TEST(BehaviourGolden, TinyLlada) {
  check_tiny("llada", "--seed 3", false);
}
TEST(BehaviourGolden, TinyDream) {
  check_tiny("dream", "--seed 3", false);
}
TEST(BehaviourGolden, TinyLladaMoe) {
  check_tiny("llada_moe", "--seed 3", true);
}

// LLaDA2 (block-causal): blocks on the model's grid, steps per block, threshold with LLaDA2's minimum,
// its exact KV caches, DES, and the samplers that apply to it.
TEST(BehaviourGolden, TinyLlada2) {
  std::string why;
  const auto dir = test::tiny_checkpoint("llada2", "--seed 7", &why);
  if (dir.empty()) GTEST_SKIP() << why;
  const ModelConfig c = Engine::load(dir)->config();
  GenerateOptions d = defaults(static_cast<int32_t>(c.eos_id));
  d.gen_length = 30;
  d.steps = 8;
  d.threshold = 0.05f;
  check_cases("tiny-llada2", dir, tiny_prompt(11), d,
              {
                  "block=8",
                  "block=16,steps=4,threshold=0.03",
                  "block=8,threshold=0",
                  "block=8,threshold=0,alg=random,temp=0.7,seed=3",
                  "block=8,threshold=0,alg=entropy",
                  "block=8,threshold=0,alg=origin,seed=4",
                  "block=8,alg=maskgit_plus,threshold=0.1",
                  "block=8,cache=prefix",
                  "block=8,cache=dual",
                  "block=16,steps=4,threshold=0,cache=prefix",
                  "block=8,des=vote,des_beta=0.5",
                  "block=8,des=seq,des_k=1,cache=prefix",
                  "block=8,logprobs=1",
                  "block=8,logprobs=1,cache=prefix",
                  "block=8,stop_after=4",
                  "block=8,cfg=1.0,threshold=0",
              });
}

}  // namespace
}  // namespace tessera
