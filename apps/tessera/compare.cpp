#include "apps/tessera/compare.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string_view>

#include "apps/tessera/cli_parse.h"
#include "core/error.h"
#include "memory/chunk_optimizer.h"
#include "runtime/session.h"

namespace tessera::cli {
namespace {

// clang-format off
constexpr std::array<std::string_view, 41> kKeys = {
    "steps", "block-length", "threshold", "alg", "cfg", "temperature", "cache", "mode", "spec-sampling", "draft-threshold", "sparse", "sparse-block",
    "sparse-rho", "sparse-skip", "des", "des-k", "des-beta", "des-scope", "window", "window-ex", "window-in",
    "window-refresh", "window-early-stop", "mid-block-stop", "suffix", "logprobs", "edit-mode",
    "edit-threshold", "max-post-steps", "edit-penalty", "t-min", "t-max", "entropy-bound", "stability",
    "confidence", "precision", "dequantize", "device", "k-ffn", "k-logits", "memory-budget"};
// clang-format on

}  // namespace

std::string known_keys() {
  std::string s;
  for (std::string_view k : kKeys) s += (s.empty() ? "" : ", ") + std::string(k);
  return s;
}

Precision parse_precision(const std::string& p) {
  if (p == "bf16") return Precision::BF16;
  if (p == "f32") return Precision::F32;
  if (p == "auto") return Precision::Auto;
  fail("precision must be auto, bf16 or f32, got '" + p + "'");
}

Candidate parse_spec(const std::string& spec, const GenerateOptions& base, const EngineOptions& base_eng) {
  const std::string where = "--compare '" + spec + "': ";
  if (spec.empty()) fail(where + "empty; give key=value[,key=value...] (keys: " + known_keys() + ")");
  Candidate c{spec, base, base_eng, false};
  EditFlags edit;  // applied once every key is read (a preset, then the values given)
  std::stringstream ss(spec);
  std::string kv;
  while (std::getline(ss, kv, ',')) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      fail(where + "expected key=value, got '" + kv + "' (keys: " + known_keys() + ")");
    const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    if (std::find(kKeys.begin(), kKeys.end(), k) == kKeys.end()) {
      const auto near = closest(k, std::vector<std::string>(kKeys.begin(), kKeys.end()));
      fail(where + "unknown option '" + k + "'" + (near ? " (did you mean '" + *near + "'?)" : "") +
           "; known: " + known_keys());
    }
    auto on_off = [&] {
      if (v != "on" && v != "off") fail(k + " must be on or off, got '" + v + "'");
      return v == "on";
    };
    // A whole number: std::stoi alone would read "8x" as 8.
    auto integer = [&] {
      size_t used = 0;
      const long long x = std::stoll(v, &used);
      if (used != v.size()) throw std::invalid_argument(v);
      if (x < INT32_MIN || x > INT32_MAX) throw std::out_of_range(v);
      return static_cast<int>(x);
    };
    auto real = [&] {
      size_t used = 0;
      const float x = std::stof(v, &used);
      if (used != v.size()) throw std::invalid_argument(v);
      return x;
    };
    try {
      if (k == "steps") {
        c.gen.steps = integer();
      } else if (k == "block-length") {
        c.gen.block_length = integer();
      } else if (k == "threshold") {
        c.gen.threshold = real();
        edit.threshold = c.gen.threshold;
      } else if (k == "alg") {
        c.gen.alg = parse_unmask(v);
      } else if (k == "cfg") {
        c.gen.cfg_scale = real();
      } else if (k == "temperature") {
        c.gen.temperature = real();
      } else if (k == "cache") {
        c.gen.cache = parse_kv_cache(v);
      } else if (k == "mode") {
        c.gen.mode = parse_decode_mode(v);
      } else if (k == "spec-sampling") {
        c.gen.spec_sampling = parse_spec_sampling(v);
      } else if (k == "draft-threshold") {
        c.gen.draft_threshold = real();
      } else if (k == "sparse") {
        c.gen.sparse = on_off();
      } else if (k == "sparse-block") {
        c.gen.sparse_block = integer();
        c.gen.sparse = true;
      } else if (k == "sparse-rho") {
        c.gen.sparse_rho = real();
        c.gen.sparse = true;
      } else if (k == "des") {
        c.gen.des = parse_des(v);
      } else if (k == "des-k") {
        c.gen.des_k = integer();
        if (c.gen.des == DesMode::Off) c.gen.des = DesMode::Seq;
      } else if (k == "des-beta") {
        c.gen.des_beta = real();
        if (c.gen.des == DesMode::Off) c.gen.des = DesMode::Vote;
      } else if (k == "des-scope") {
        c.gen.des_scope = parse_des_scope(v);
      } else if (k == "sparse-skip") {
        c.gen.sparse_skip = real();
        c.gen.sparse = true;
      } else if (k == "suffix") {
        c.suffix = on_off();
      } else if (k == "mid-block-stop") {
        c.gen.mid_block_stop = on_off();
      } else if (k == "logprobs") {
        c.gen.logprobs = on_off();
      } else if (k == "window") {
        c.gen.window = on_off();
      } else if (k == "window-early-stop") {
        c.gen.window_early_stop = on_off();
        if (c.gen.window_early_stop) c.gen.window = true;
      } else if (k == "window-ex" || k == "window-in" || k == "window-refresh") {
        (k == "window-ex"   ? c.gen.window_ex
         : k == "window-in" ? c.gen.window_in
                            : c.gen.window_refresh) = integer();
        c.gen.window = true;
      } else if (k == "edit-mode") {
        edit.mode = parse_edit_mode(v);
      } else if (k == "edit-threshold") {
        edit.edit_threshold = real();
      } else if (k == "max-post-steps") {
        edit.max_post = integer();
      } else if (k == "edit-penalty") {
        edit.penalty = real();
      } else if (k == "t-min") {
        c.gen.uniform.t_min = real();
      } else if (k == "t-max") {
        c.gen.uniform.t_max = real();
      } else if (k == "entropy-bound") {
        c.gen.uniform.entropy_bound = real();
      } else if (k == "stability") {
        c.gen.uniform.stability = integer();
      } else if (k == "confidence") {
        c.gen.uniform.confidence = real();
      } else if (k == "precision") {
        c.eng.precision = parse_precision(v);
        c.own_engine = true;
      } else if (k == "dequantize") {
        c.eng.dequantize = on_off();
        c.own_engine = true;
      } else if (k == "device") {
        if (v != "cpu" && v != "cuda") fail("device must be cpu or cuda, got '" + v + "'");
        c.eng.device = v;
        c.own_engine = true;
      } else if (k == "k-ffn") {
        c.eng.k_ffn = integer();
        c.own_engine = true;
      } else if (k == "k-logits") {
        c.eng.k_logits = integer();
        c.own_engine = true;
      } else if (k == "memory-budget") {
        c.eng.memory_budget = memory::parse_size(v);
        c.own_engine = true;
      }
    } catch (const std::invalid_argument&) {
      fail(where + "'" + v + "' is not a number for " + k);
    } catch (const std::out_of_range&) {
      fail(where + "'" + v + "' is out of range for " + k);
    } catch (const Error& e) {
      fail(where + e.what());
    }
  }
  try {
    apply_edit_flags(edit, c.gen);
  } catch (const Error& e) {
    fail(where + e.what());
  }
  TESSERA_CHECK(c.eng.k_ffn >= 1 && c.eng.k_logits >= 1, where + "chunk counts must be >= 1");
  return c;
}

std::vector<Candidate> check_specs(const std::vector<std::string>& specs, const GenerateOptions& base,
                                   const EngineOptions& eng, int64_t vocab, bool block_causal) {
  std::vector<Candidate> out;
  for (const std::string& spec : specs) {
    Candidate c = parse_spec(spec, base, eng);
    if (c.gen.gen_length != base.gen_length)
      fail("--compare '" + spec + "': a comparison must generate the same length");
    try {
      validate_generate_options(c.gen, vocab, block_causal);
    } catch (const Error& e) {
      fail("--compare '" + spec + "': " + e.what());
    }
    out.push_back(std::move(c));
  }
  return out;
}

// ---- Progress --------------------------------------------------------------------------------------------

GenerateOptions exact_path(const ModelConfig& mc, int gen_length, int steps, int block_length, Unmask alg) {
  if (mc.is_uniform()) {  // the model's own sampler (DiffusionGemma has one decoding)
    GenerateOptions g = uniform_defaults(mc, gen_length);
    if (steps > 0) g.steps = steps;
    if (block_length > 0) g.block_length = block_length;
    return g;
  }
  GenerateOptions g;
  g.gen_length = gen_length;
  g.steps = steps > 0 ? steps : gen_length;
  const int tri_block = mc.tri_mode && mc.diffusion_block > 0
                            ? static_cast<int>(std::min<int64_t>(mc.diffusion_block, gen_length))
                            : 0;
  g.block_length = block_length > 0 ? block_length : tri_block > 0 ? tri_block : gen_length;
  g.causal_context = mc.tri_mode;
  g.alg = alg;
  if (mc.eos_id >= 0) g.eos_ids = {mc.eos_id};
  return g;
}

int run_comparisons(const std::vector<Candidate>& cs, Engine& base,
                    const std::function<std::unique_ptr<Engine>(const EngineOptions&)>& load,
                    Progress& progress, const std::string& command,
                    const std::function<std::string(size_t)>& what,
                    const std::function<void(size_t, Engine&)>& body,
                    const std::function<void(size_t, const Error&)>& on_error) {
  int failures = 0;
  for (size_t i = 0; i < cs.size(); ++i) {
    try {
      std::unique_ptr<Engine> own;
      if (cs[i].own_engine) {
        progress.show(what(i) + ": loading an engine of its own");
        own = load(cs[i].eng);
      }
      body(i, own ? *own : base);
    } catch (const Error& e) {
      progress.clear();
      std::fprintf(stderr, "tessera %s: comparison '%s' cannot run: %s\n", command.c_str(),
                   cs[i].label.c_str(), e.what());
      on_error(i, e);
      ++failures;
    }
  }
  return failures;
}

Progress::Progress(std::string command, bool quiet)
    : command_(std::move(command)), on_(!quiet && isatty(fileno(stderr)) != 0) {}

Progress::~Progress() {
  clear();
}

void Progress::show(const std::string& what) {
  if (!on_) return;
  std::fprintf(stderr, "\r\x1b[K[%s] %s", command_.c_str(), what.c_str());
  std::fflush(stderr);
  shown_ = true;
}

void Progress::clear() {
  if (!on_ || !shown_) return;
  std::fprintf(stderr, "\r\x1b[K");
  std::fflush(stderr);
  shown_ = false;
}

}  // namespace tessera::cli
