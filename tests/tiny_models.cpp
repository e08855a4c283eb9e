#include "tiny_models.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "backend/backend.h"
#include "core/ggml_quant.h"
#include "engine/engine.h"
#include "io/config.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace tessera::test {

CheckpointParams checkpoint_params(const std::filesystem::path& dir) {
  CheckpointParams p;
  const Checkpoint ck = Checkpoint::open(dir);
  for (const auto& [name, t] : ck.tensors()) {
    p.total += t.numel();
    if (name.find(".mlp.experts.") != std::string::npos) p.routed_experts += t.numel();
  }
  return p;
}

std::vector<float> diffusion_gemma_reference_logits(const std::filesystem::path& model,
                                                    const std::string& args, size_t n) {
  const auto out = model / ("dgref_" + std::to_string(::getpid()) + ".bin");
  const std::string cmd = python() + " " +
                          (source_dir() / "tests/reference/ref_diffusion_gemma.py").string() +
                          " logits --model " + model.string() + " " + args + " --out " + out.string();
  std::string log;
  if (run_command(cmd, &log) != 0) {
    ADD_FAILURE() << cmd << "\n" << log;
    return {};
  }
  std::vector<float> v(n);
  std::ifstream f(out, std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * 4));
  EXPECT_EQ(static_cast<size_t>(f.gcount()), n * 4);
  std::filesystem::remove(out);
  return v;
}

std::string join_ids(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

std::filesystem::path tiny_checkpoint(const std::string& family, const std::string& extra_args,
                                      std::string* why) {
  static std::map<std::string, std::filesystem::path> made;
  const std::string key = family + "|" + extra_args;
  if (auto it = made.find(key); it != made.end()) return it->second;
  std::string out;
  if (run_command(python() + " -c 'import numpy'", &out) != 0) {
    *why = python() + " with numpy is not available (apt-get install python3-numpy)";
    return {};
  }
  const auto dir = temp_dir("tiny_" + family + "_" + std::to_string(made.size()));
  const std::string cmd = python() + " " + (source_dir() / "tools/make_tiny_checkpoint.py").string() +
                          " --family " + family + " --out " + dir.string() + " " + extra_args;
  if (run_command(cmd, &out) != 0) {
    ADD_FAILURE() << "make_tiny_checkpoint failed: " << cmd << "\n" << out;
    *why = "make_tiny_checkpoint failed";
    return {};
  }
  made[key] = dir;
  return dir;
}

namespace {
std::vector<float> read_floats(const std::filesystem::path& p, size_t n) {
  std::vector<float> v(n);
  std::ifstream f(p, std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * 4));
  EXPECT_EQ(static_cast<size_t>(f.gcount()), n * 4) << "reference output size of " << p;
  std::filesystem::remove(p);
  return v;
}
}  // namespace

std::vector<float> reference_logits(const std::filesystem::path& model, const std::vector<int32_t>& tokens,
                                    const std::vector<int32_t>& rows, int64_t vocab,
                                    std::vector<float>* margins, const std::string& extra_args) {
  const auto out = model / ("ref_" + std::to_string(::getpid()) + ".bin");
  const auto mout = model / ("ref_margins_" + std::to_string(::getpid()) + ".bin");
  const std::string cmd = python() + " " + (source_dir() / "tests/reference/reference.py").string() +
                          " logits --model " + model.string() + " --tokens " + join_ids(tokens) + " --rows " +
                          join_ids(rows) + " --out " + out.string() +
                          (margins != nullptr ? " --margins " + mout.string() : "") + " " + extra_args;
  std::string log;
  if (run_command(cmd, &log) != 0) {
    ADD_FAILURE() << "reference failed: " << cmd << "\n" << log;
    return {};
  }
  if (margins != nullptr) *margins = read_floats(mout, rows.size());
  return read_floats(out, rows.size() * static_cast<size_t>(vocab));
}

std::vector<int32_t> ordinary_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint64_t s = seed;
  for (auto& x : t) {
    s = rng_mix(s);
    x = static_cast<int32_t>(s % static_cast<uint64_t>(vocab - 8));  // ordinary tokens, no specials
  }
  return t;
}

std::vector<int32_t> random_canvas(int64_t n, int64_t vocab, uint64_t seed, int32_t mask, double mask_ratio) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint64_t s = seed;
  for (auto& x : t) {
    s = rng_mix(s);
    x = static_cast<int32_t>(s % static_cast<uint64_t>(vocab));
    if (static_cast<double>(rng_mix(s) % 1000) / 1000.0 < mask_ratio) x = mask;
  }
  return t;
}

std::vector<int32_t> all_positions(int64_t n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  return p;
}

namespace {
// bf16 MoE: a row whose top-k router margin (reference logits) is within about twice the bf16 noise
// of the router logits (up to 1e-2 on the tiny models, logits ~N(0, 1)) may pick another expert, which
// changes that row completely; such rows are left out of the bf16 comparison (f32 compares them all).
// LLaDA2 routes on sigmoid scores (slope <= 1/4): its margins are in score units, where that logit
// noise is at most 2.5e-3 per expert score; 5e-3 keeps about 85% of the rows, and the kept rows' error
// equals that of the rows far from any tie (no kept row changed experts).
constexpr float kTieMargin = 0.02f;
constexpr float kTieMarginSigmoid = 0.005f;
}  // namespace

void check_logits_against_reference(const std::string& family, const std::string& args,
                                    const EngineOptions& options, double tol) {
  const float tie_margin = family == "llada2" ? kTieMarginSigmoid : kTieMargin;
  const bool f32 = options.precision == Precision::F32;
  TESSERA_TINY_OR_SKIP(dir, family, args);
  auto e = Engine::load(dir, options);
  const int64_t V = e->vocab_size();
  for (int64_t n : {1, 5, 33, 130}) {  // below, at odd offsets of and above the 32/128 tiles
    const auto canvas = random_canvas(n, V, static_cast<uint64_t>(n), e->mask_token(), 0.4);
    const auto pos = all_positions(n);
    std::vector<float> got(static_cast<size_t>(n * V)), margins;
    e->logits(canvas, pos, got);
    const auto ref = reference_logits(dir, canvas, pos, V, &margins);
    ASSERT_EQ(ref.size(), got.size());
    // Rows near a routing tie are compared only in f32 (where the router logits agree to ~1e-6).
    std::vector<float> kept_got, kept_ref;
    for (int64_t r = 0; r < n; ++r) {
      if (f32 || margins[static_cast<size_t>(r)] >= tie_margin) {
        kept_got.insert(kept_got.end(), got.begin() + r * V, got.begin() + (r + 1) * V);
        kept_ref.insert(kept_ref.end(), ref.begin() + r * V, ref.begin() + (r + 1) * V);
      }
    }
    const auto kept = static_cast<int64_t>(kept_ref.size()) / V;
    EXPECT_TRUE(n < 33 || kept * 3 >= n * 2) << family << " L=" << n << ": too many rows near a routing tie";
    const double err = rel_error(kept_got.data(), kept_ref.data(), kept_got.size());
    EXPECT_LE(err, tol) << family << " " << options.device << " L=" << n;
    std::printf("%s %s %s L=%lld: relative error %.2e (%lld of %lld rows away from routing ties)\n",
                family.c_str(), options.device.c_str(), f32 ? "f32" : "bf16", static_cast<long long>(n), err,
                static_cast<long long>(kept), static_cast<long long>(n));
  }
}

std::vector<int32_t> llada2_prompt(int64_t vocab) {
  return random_canvas(11, vocab - 8, 5, 0, 0.0);  // no masks; ordinary tokens (the specials are last)
}

std::vector<GenerateOptions> llada2_generate_cases(int32_t eos_id) {
  std::vector<GenerateOptions> cases;
  for (const auto& [block, steps, threshold] : {std::tuple{8, 8, 0.05f}, std::tuple{16, 4, 0.03f}}) {
    GenerateOptions o;
    o.gen_length = 30;
    o.block_length = block;
    o.steps = steps;
    o.threshold = threshold;
    o.eos_ids = {eos_id};
    cases.push_back(o);
  }
  return cases;
}

CachedStep run_cached_step(Engine& e, const std::filesystem::path& dir) {
  CachedStep c;
  const int64_t V = e.vocab_size(), n = 75;
  c.a = random_canvas(n, V, 12, e.mask_token(), 0.7);
  c.b = c.a;
  const auto fill = random_canvas(n, V, 13, e.mask_token(), 0.0);
  for (int64_t i = c.lo; i < c.hi; i += 2) c.b[static_cast<size_t>(i)] = fill[static_cast<size_t>(i)];
  for (int64_t p = c.lo + 1; p < c.hi; p += 3) c.positions.push_back(static_cast<int32_t>(p));
  c.got.resize(c.positions.size() * static_cast<size_t>(V));
  std::vector<float> scratch(static_cast<size_t>(V));
  e.kv_cache_reset(n);
  e.logits_cached(c.a, 0, n, std::vector<int32_t>{0}, scratch);  // fills the cache from A
  e.logits_cached(c.b, c.lo, c.hi, c.positions, c.got);
  c.reference = reference_logits(
      dir, c.b, c.positions, V, nullptr,
      "--cache-tokens " + join_ids(c.a) + " --compute " + std::to_string(c.lo) + "," + std::to_string(c.hi));
  EXPECT_EQ(c.reference.size(), c.got.size());
  return c;
}

void expect_row_list_steps_match_reference(const EngineOptions& opt, double tol) {
  for (const char* fam : {"llada", "dream", "llada_moe"}) {
    TESSERA_TINY_OR_SKIP(dir, fam, "--seed 4");
    auto e = Engine::load(dir, opt);
    const int64_t V = e->vocab_size(), n = 48;
    const auto a = random_canvas(n, V, 12, e->mask_token(), 0.7);
    auto b = a;
    const std::vector<int32_t> rows = {3, 10, 11, 12, 30, 41};
    const auto fill = random_canvas(n, V, 13, e->mask_token(), 0.0);
    for (int32_t r : rows) b[static_cast<size_t>(r)] = fill[static_cast<size_t>(r)];
    const std::vector<int32_t> positions = {11, 12, 31};  // Dream: rows 10, 11, 30 predict them
    std::vector<float> scratch(static_cast<size_t>(V)), got(positions.size() * static_cast<size_t>(V));
    e->kv_cache_reset(n);
    e->logits_cached(a, 0, n, std::vector<int32_t>{0}, scratch);
    e->logits_rows(b, rows, positions, got);
    const bool shift = std::string(fam) == "dream";
    EXPECT_EQ(e->last_step().shape.n_query, shift ? 6 : 7) << fam;
    const std::vector<int32_t> computed = shift ? rows : std::vector<int32_t>{3, 10, 11, 12, 30, 31, 41};
    const auto want =
        reference_logits(dir, b, positions, V, nullptr,
                         "--cache-tokens " + join_ids(a) + " --compute-rows " + join_ids(computed));
    ASSERT_EQ(want.size(), got.size()) << fam;
    const double err = rel_error(got.data(), want.data(), got.size());
    EXPECT_LE(err, tol) << fam;
    std::printf("%s: row-list step vs reference %.2e\n", fam, err);
  }
}

nlohmann::json reference_generate_json(const std::filesystem::path& model, const std::vector<int32_t>& prompt,
                                       const std::string& flags) {
  return run_reference(python() + " " + (source_dir() / "tests/reference/reference.py").string() +
                       " generate --model " + model.string() + " --prompt " + join_ids(prompt) + " " + flags);
}

nlohmann::json run_reference(const std::string& cmd) {
  std::string out;
  // The JSON is the last line (stderr, e.g. a numpy warning, may come before it).
  const bool ran = run_command(cmd, &out) == 0;
  const size_t end = out.find_last_not_of('\n');
  const size_t begin = end == std::string::npos ? 0 : out.rfind('\n', end);
  auto j = nlohmann::json::parse(out.substr(begin == std::string::npos ? 0 : begin + 1), nullptr, false);
  if (!ran || j.is_discarded() || !j.contains("tokens") || !j.contains("order")) {
    ADD_FAILURE() << "reference failed: " << cmd << "\n" << out;
    return nullptr;
  }
  return j;
}

ReferenceGeneration reference_generate(const std::filesystem::path& model, const std::vector<int32_t>& prompt,
                                       const GenerateOptions& o, bool logprobs) {
  std::string flags = "--gen-length " + std::to_string(o.gen_length) + " --steps " + std::to_string(o.steps) +
                      " --block-length " + std::to_string(o.block_length) + " --alg " +
                      std::string(name(o.alg));
  if (o.cache != KvCache::None) flags += " --cache " + std::string(name(o.cache));
  if (!o.suffix.empty()) flags += " --suffix " + join_ids(o.suffix);
  if (o.sparse) {
    flags += " --sparse --sparse-block " + std::to_string(o.sparse_block) + " --sparse-rho " +
             std::to_string(o.sparse_rho) + " --sparse-skip " + std::to_string(o.sparse_skip);
  }
  if (o.window) {
    flags += " --window " + std::to_string(window_external(o)) + "," + std::to_string(o.window_in) + "," +
             std::to_string(o.window_refresh);
  }
  if (o.window && o.window_early_stop) flags += " --early-eos " + join_ids(o.eos_ids);
  if (o.cfg_scale > 0.0f) flags += " --cfg " + std::to_string(o.cfg_scale);
  if (o.des != DesMode::Off) {
    flags += " --des " + std::string(name(o.des)) + " --des-k " + std::to_string(o.des_k) + " --des-beta " +
             std::to_string(o.des_beta) + " --des-scope " + std::string(name(o.des_scope));
  }
  if (logprobs) flags += " --logprobs";
  ReferenceGeneration r;
  // What the reference does not model would be ignored silently: refuse it.
  if (o.threshold > 0.0f || o.temperature > 0.0f || o.top_k > 0 || o.top_p < 1.0f || o.alg_temp > 0.0f ||
      o.eps != 1e-3f || o.logits_eos_inf || !o.stop.empty() || o.stop_when ||
      (o.stop_at_eos && !o.eos_ids.empty())) {
    ADD_FAILURE() << "reference_generate: reference.py models greedy generations without threshold, "
                     "temperature, top-k / top-p, alg-temp, another eps or an EOS / stop-sequence stop";
    return r;
  }
  const nlohmann::json j = reference_generate_json(model, prompt, flags);
  if (j.is_null()) return r;
  r.canvas = j["tokens"].get<std::vector<int32_t>>();
  for (const auto& s : j["order"]) r.order.push_back(s.get<std::vector<int32_t>>());
  if (logprobs) {
    for (const auto& v : j["logprobs"]) r.logprobs.push_back(v.is_null() ? NAN : v.get<double>());
  }
  return r;
}

namespace {

// ggml's reference quantizers (quantize_row_q8_0_ref / quantize_row_q4_0_ref) for one block of 32.
void quantize_block32(GgmlType t, const float* x, uint8_t* out) {
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = t == GgmlType::Q8_0 ? amax / 127 : max / -8, id = d != 0 ? 1 / d : 0;
  const uint16_t h = f32_to_f16(d);
  out[0] = static_cast<uint8_t>(h & 0xff);
  out[1] = static_cast<uint8_t>(h >> 8);
  if (t == GgmlType::Q8_0) {
    for (int j = 0; j < 32; ++j)
      out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[j] * id)));
    return;
  }
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
    const int hi = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f)));
    out[2 + j] = static_cast<uint8_t>(lo | hi << 4);
  }
}

}  // namespace

void requantize_gguf(const std::filesystem::path& src, const std::filesystem::path& dst) {
  const auto g = GgufFile::open(src);
  std::vector<std::pair<std::string, GgufValue>> kv(g->metadata().begin(), g->metadata().end());
  std::vector<GgufWriteTensor> out;
  for (const GgufTensor& t : g->tensors()) {
    GgufWriteTensor w{t.name, t.ne, t.type, {t.data, t.data + t.bytes}};
    if (t.ne.size() >= 2 && t.ne[0] % 32 == 0 && ggml_type_info(t.type)->block == 1) {
      w.type = t.name.find("ffn_down") != std::string::npos ? GgmlType::Q4_0 : GgmlType::Q8_0;
      std::vector<float> f(static_cast<size_t>(t.numel()));
      ggml_dequantize(t.type, t.data, f.data(), t.numel());
      w.data.assign(ggml_bytes(w.type, t.numel()), 0);
      for (int64_t b = 0; b < t.numel() / 32; ++b)
        quantize_block32(w.type, f.data() + 32 * b,
                         w.data.data() + static_cast<size_t>(b) * ggml_type_info(w.type)->block_bytes);
    }
    out.push_back(std::move(w));
  }
  write_gguf(dst, kv, out);
}

void PrintTo(const ReferenceRun& r, std::ostream* os) {
  *os << "tokens " << join_ids(r.tokens) << ", order";
  for (const auto& s : r.order) *os << " [" << join_ids(s) << "]";
}

std::vector<ReferenceRun> reference_runs(const std::filesystem::path& dir,
                                         const std::vector<std::vector<int32_t>>& prompts,
                                         const GenerateOptions& o) {
  std::vector<ReferenceRun> runs;
  for (const auto& prompt : prompts) {
    const ReferenceGeneration r = reference_generate(dir, prompt, o);
    const auto P = static_cast<long>(prompt.size()), G = static_cast<long>(o.gen_length);
    if (r.canvas.size() != prompt.size() + static_cast<size_t>(G) + o.suffix.size()) {
      ADD_FAILURE() << "the reference canvas has " << r.canvas.size() << " tokens";
      runs.push_back({});
      continue;
    }
    EXPECT_EQ(std::vector<int32_t>(r.canvas.begin(), r.canvas.begin() + P), prompt);
    EXPECT_EQ(std::vector<int32_t>(r.canvas.begin() + P + G, r.canvas.end()), o.suffix);
    runs.push_back({{r.canvas.begin() + P, r.canvas.begin() + P + G}, r.order});
  }
  return runs;
}

std::vector<ReferenceRun> expect_matches_reference(const std::filesystem::path& dir,
                                                   const std::vector<std::vector<int32_t>>& prompts,
                                                   const GenerateOptions& o, const std::string& what) {
  auto e = Engine::load(dir, EngineOptions{.precision = Precision::F32});
  const std::vector<ReferenceRun> want = reference_runs(dir, prompts, o);
  for (size_t i = 0; i < prompts.size() && i < want.size(); ++i) {
    const GenerateResult r = generate(*e, prompts[i], o);
    const std::string at = what + ", prompt " + join_ids(prompts[i]);
    EXPECT_EQ(r.order, want[i].order) << at;
    EXPECT_EQ(r.tokens, want[i].tokens) << at;
  }
  return want;
}

void expect_config_error(const std::filesystem::path& src, const std::string& name,
                         const std::function<void(nlohmann::json&)>& edit, const std::string& expect) {
  const auto d = temp_dir("bad_config_" + name);
  for (const auto& f : std::filesystem::directory_iterator(src))
    std::filesystem::copy(f.path(), d / f.path().filename(),
                          std::filesystem::copy_options::overwrite_existing);
  std::ifstream in(d / "config.json");
  nlohmann::json c = nlohmann::json::parse(in);
  in.close();
  edit(c);
  std::ofstream(d / "config.json") << c.dump(2);
  try {
    (void)load_config(d);
    ADD_FAILURE() << name << ": expected an error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find(expect), std::string::npos) << name << ": " << err.what();
  }
  // The CLI reports the same in one line and exits non-zero.
  std::string out;
  EXPECT_NE(run_command(std::string(TESSERA_BINARY) + " generate -m " + d.string() + " -p hi", &out), 0);
  EXPECT_NE(out.find(expect), std::string::npos) << out;
  EXPECT_LE(std::count(out.begin(), out.end(), '\n'), 1) << out;
}

}  // namespace tessera::test
