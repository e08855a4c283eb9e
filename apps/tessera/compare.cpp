#include "apps/tessera/compare.h"

#include <sstream>
#include <stdexcept>

#include "core/error.h"
#include "memory/chunk_optimizer.h"

namespace tessera::cli {

Precision parse_precision(const std::string& p) {
  if (p == "bf16") return Precision::BF16;
  if (p == "f32") return Precision::F32;
  if (p == "auto") return Precision::Auto;
  fail("precision must be auto, bf16 or f32, got '" + p + "'");
}

Candidate parse_spec(const std::string& spec, const GenerateOptions& base, const EngineOptions& base_eng) {
  Candidate c{spec, base, base_eng, false};
  EditFlags edit;  // applied once every key is read (a preset, then the values given)
  std::stringstream ss(spec);
  std::string kv;
  while (std::getline(ss, kv, ',')) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) fail("--compare '" + spec + "': expected key=value, got '" + kv + "'");
    const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    auto on_off = [&] {
      if (v != "on" && v != "off")
        fail("--compare '" + spec + "': " + k + " must be on or off, got '" + v + "'");
      return v == "on";
    };
    try {
      if (k == "steps") {
        c.gen.steps = std::stoi(v);
      } else if (k == "block-length") {
        c.gen.block_length = std::stoi(v);
      } else if (k == "threshold") {
        c.gen.threshold = std::stof(v);
        edit.threshold = c.gen.threshold;
      } else if (k == "alg") {
        c.gen.alg = parse_unmask(v);
      } else if (k == "cfg") {
        c.gen.cfg_scale = std::stof(v);
      } else if (k == "temperature") {
        c.gen.temperature = std::stof(v);
      } else if (k == "cache") {
        c.gen.cache = parse_kv_cache(v);
      } else if (k == "sparse") {
        c.gen.sparse = on_off();
      } else if (k == "sparse-block") {
        c.gen.sparse_block = std::stoi(v);
        c.gen.sparse = true;
      } else if (k == "sparse-rho") {
        c.gen.sparse_rho = std::stof(v);
        c.gen.sparse = true;
      } else if (k == "des") {
        if (v != "off" && v != "seq" && v != "vote")
          fail("--compare '" + spec + "': des must be off, seq or vote, got '" + v + "'");
        c.gen.des = parse_des(v);
      } else if (k == "des-k") {
        c.gen.des_k = std::stoi(v);
        if (c.gen.des == DesMode::Off) c.gen.des = DesMode::Seq;
      } else if (k == "des-beta") {
        c.gen.des_beta = std::stof(v);
        if (c.gen.des == DesMode::Off) c.gen.des = DesMode::Vote;
      } else if (k == "des-scope") {
        c.gen.des_scope = parse_des_scope(v);
      } else if (k == "sparse-skip") {
        c.gen.sparse_skip = std::stof(v);
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
                            : c.gen.window_refresh) = std::stoi(v);
        c.gen.window = true;
      } else if (k == "edit-mode") {
        edit.mode = parse_edit_mode(v);
      } else if (k == "edit-threshold") {
        edit.edit_threshold = std::stof(v);
      } else if (k == "max-post-steps") {
        edit.max_post = std::stoi(v);
      } else if (k == "edit-penalty") {
        edit.penalty = std::stof(v);
      } else if (k == "precision") {
        c.eng.precision = parse_precision(v);
        c.own_engine = true;
      } else if (k == "dequantize") {
        c.eng.dequantize = on_off();
        c.own_engine = true;
      } else if (k == "device") {
        c.eng.device = v;
        c.own_engine = true;
      } else if (k == "k-ffn") {
        c.eng.k_ffn = std::stoll(v);
        c.own_engine = true;
      } else if (k == "k-logits") {
        c.eng.k_logits = std::stoll(v);
        c.own_engine = true;
      } else if (k == "memory-budget") {
        c.eng.memory_budget = memory::parse_size(v);
        c.own_engine = true;
      } else {
        fail(
            "--compare '" + spec + "': unknown option '" + k +
            "' (known: steps, block-length, threshold, alg, cfg, temperature, cache, sparse, sparse-block, "
            "sparse-rho, sparse-skip, des, des-k, des-beta, des-scope, window, window-ex, window-in, "
            "window-refresh, window-early-stop, mid-block-stop, suffix, logprobs, edit-mode, edit-threshold, "
            "max-post-steps, edit-penalty, precision, dequantize, "
            "device, k-ffn, k-logits, memory-budget)");
      }
    } catch (const std::invalid_argument&) {
      fail("--compare '" + spec + "': '" + v + "' is not a number for " + k);
    } catch (const std::out_of_range&) {
      fail("--compare '" + spec + "': '" + v + "' is out of range for " + k);
    }
  }
  try {
    apply_edit_flags(edit, c.gen);
  } catch (const Error& e) {
    fail("--compare '" + spec + "': " + e.what());
  }
  TESSERA_CHECK(c.eng.k_ffn >= 1 && c.eng.k_logits >= 1,
                "--compare '" + spec + "': chunk counts must be >= 1");
  return c;
}

}  // namespace tessera::cli
