#include "apps/tessera/session.h"

#include <sys/ioctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/utf8.h"
#include "engine/request_budget.h"
#include "memory/chunk_optimizer.h"

namespace tessera::cli {
namespace fs = std::filesystem;
using json = nlohmann::json;

void add_session_options(CLI::App* sub, SessionArgs& a) {
  sub->add_option("-m,--model", a.model, "model directory (default: the bundled default model)");
  sub->add_option("--gen-length", a.gen_length, "tokens to generate");
  sub->add_option("--steps", a.steps, "denoising steps");
  sub->add_option("--block-length", a.block_length, "semi-autoregressive block length");
  sub->add_option("--temperature", a.temperature, "sampling temperature (0 = greedy)")
      ->check(CLI::Range(0.0, 100.0));
  sub->add_option("--alg", a.alg, "unmasking policy")
      ->check(
          CLI::IsMember({"low_confidence", "random", "origin", "maskgit_plus", "topk_margin", "entropy"}));
  sub->add_option("--threshold", a.threshold,
                  "confidence-threshold parallel decoding (0 = off; default 0.95 for block-causal LLaDA2)")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--cfg", a.cfg, "classifier-free guidance scale (LLaDA)")->check(CLI::Range(0.0, 100.0));
  sub->add_option("--top-k", a.top_k, "top-k filter (Dream algorithms)")->check(CLI::NonNegativeNumber);
  sub->add_option("--top-p", a.top_p, "nucleus filter (Dream algorithms)")->check(CLI::Range(0.0, 1.0));
  sub->add_option("--alg-temp", a.alg_temp, "Dream: sample positions with this temperature")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--seed", a.seed, "random seed");
  sub->add_option("--device", a.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--precision", a.precision, "auto, bf16 or f32")
      ->check(CLI::IsMember({"auto", "bf16", "f32"}));
  sub->add_flag("--dequantize", a.dequantize,
                "GGUF: convert quantized tensors to bf16 at load (twice to four times the memory) instead of "
                "keeping them quantized (CPU)");
  sub->add_option("--memory-budget", a.memory_budget,
                  "total memory for the weights plus the planned activations, e.g. 24GiB, 512MiB, 1.5GB or "
                  "bytes (runtime overhead not included): each step chunks the FFN / logits only as much as "
                  "it must; a request that cannot fit fails before it starts")
      ->check(size_validator());
  sub->add_option(
         "--cache", a.cache,
         "KV cache (Fast-dLLM): none (exact), prefix (reuse K/V before the block), dual (also after it); "
         "approximate for bidirectional models, exact for block-causal LLaDA2")
      ->check(CLI::IsMember({"none", "prefix", "dual"}));
  sub->add_flag(
      "--sparse", a.sparse,
      "SparseD sparse attention: exact for the first --sparse-skip of the steps, then head-specific "
      "block-sparse attention with patterns built once (approximate; bidirectional models)");
  sub->add_option("--sparse-block", a.sparse_block,
                  "SparseD tile side in positions (default 32; implies --sparse)")
      ->check(CLI::PositiveNumber);
  sub->add_option(
         "--sparse-rho", a.sparse_rho,
         "SparseD kept fraction of prompt and of generation key blocks (default 0.5; implies --sparse)")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--sparse-skip", a.sparse_skip,
                  "SparseD fraction of the steps with exact attention (default 0.2; implies --sparse)")
      ->check(CLI::Range(0.0, 0.999));
  sub->add_option("--des", a.des,
                  "Dynamic Expert Sharing (MoE models): off, seq (union of each block token's first --des-k "
                  "experts) or vote (the --des-beta share of the experts with the most router votes); "
                  "approximate")
      ->check(CLI::IsMember({"off", "seq", "vote"}));
  sub->add_option("--des-k", a.des_k, "DES-Seq experts per token in the union (default 2; implies --des seq)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--des-beta", a.des_beta,
                  "DES-Vote coreset size as a share of the experts (default 0.4; implies --des vote)")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--des-scope", a.des_scope,
                  "DES: block (only the block's tokens share the coreset; default) or all (every row)")
      ->check(CLI::IsMember({"block", "all"}));
  sub->add_flag("--window", a.window,
                "Window-Diffusion: each step decides among the first --window-in undecided positions, masks "
                "past the external window are pruned, and phases of --window-refresh forwards reuse cached "
                "K/V (approximate; bidirectional models)");
  sub->add_option("--window-ex", a.window_ex,
                  "Window-Diffusion external window in undecided positions (default 64 for the LLaDA "
                  "algorithms, 128 for the Dream ones; implies --window)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--window-in", a.window_in,
                  "Window-Diffusion active set in undecided positions (default 16; implies --window)")
      ->check(CLI::PositiveNumber);
  sub->add_option(
         "--window-refresh", a.window_refresh,
         "Window-Diffusion forwards per phase (default 32; 0 = no cache, prune only; implies --window)")
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--window-early-stop", a.window_early_stop,
                "Window-Diffusion: after an EOS is decided, never compute the positions after it (implies "
                "--window)");
  sub->add_option("--edit-mode", a.edit_mode,
                  "token editing (LLaDA2.1's draft and edit; any model): quality (threshold 0.7, rewrite a "
                  "decided token of the block when its candidate has p > 0.5), speed (threshold 0.5, rewrite "
                  "whenever the candidate differs) or off (default)")
      ->check(CLI::IsMember({"off", "quality", "speed"}));
  sub->add_option("--edit-threshold", a.edit_threshold,
                  "token editing: rewrite a decided token of the current block when the model's candidate "
                  "differs with a probability above this (0 = whenever it differs); turns editing on")
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--max-post-steps", a.max_post_steps,
                  "token editing: at most this many forwards after the block has no mask (default 16)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--edit-penalty", a.edit_penalty,
                  "token editing: SGLang's 2-gram penalty, subtracted from the logit of the token before "
                  "each position (0 = off; 3 often curbs repetition)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--stop", a.stop,
                  "stop sequence: the answer ends before it, and the blocks after the one it appears in "
                  "are not generated (repeat for several)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  auto* chat = sub->add_flag("--chat", a.chat, "apply the model's chat template");
  sub->add_flag("--raw", a.raw, "use the prompt as it is")->excludes(chat);
  sub->add_option("--logprobs", a.logprobs,
                  "report each generated token's log-probability at the step that decided it, with the N "
                  "most likely tokens there (0 to 20; in --json, else a table after the text)")
      ->check(CLI::Range(0, static_cast<int>(kTopLogprobs)));
  sub->add_flag("--json", a.json, "print one JSON result object");
  sub->add_flag("--no-progress", a.no_progress, "no live view even on a terminal");
}

std::string default_model_dir() {
  std::vector<fs::path> roots = {fs::current_path()};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) roots.push_back(exe.parent_path().parent_path());
  for (const auto& r : roots) {
    if (fs::exists(r / "models/tessera-tiny/config.json")) return (r / "models/tessera-tiny").string();
  }
  fail(
      "no model given and the default model models/tessera-tiny was not found (run from the repository, or "
      "pass -m DIR)");
}

size_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<size_t>(u.ru_maxrss) * 1024;
}

int64_t device_bytes_in_use(Engine& e) {
  const int64_t free = e.backend().device_free_bytes();
  return free < 0 ? -1 : e.backend().device_total_bytes() - free;
}

std::string human_bytes(double b) {
  return memory::format_bytes(b);
}

CLI::Validator size_validator() {
  return CLI::Validator(
      [](std::string& v) {
        try {
          memory::parse_size(v);
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      },
      "SIZE");
}

void check_utf8(const std::string& s, const char* what) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_char_length(s, i);
    if (n == 0)
      fail(std::string(what) + " is not valid UTF-8 (bad byte at offset " + std::to_string(i) + ")");
    i += n;
  }
}

Session::Session(const SessionArgs& a) {
  dir_ = a.model.empty() ? default_model_dir() : a.model;
  check_model_path(dir_);
  EngineOptions eo;
  eo.device = a.device;
  eo.memory_budget = a.memory_budget.empty() ? 0 : memory::parse_size(a.memory_budget);
  eo.precision = a.precision == "bf16"  ? Precision::BF16
                 : a.precision == "f32" ? Precision::F32
                                        : Precision::Auto;
  eo.dequantize = a.dequantize;
  engine_ = Engine::load(dir_, eo);
  tok_ = load_model_tokenizer(dir_);
  chat_family_ = detect_chat_family(dir_);
  // A template whose marker tokens the vocabulary lacks cannot be what the model was tuned on.
  const char* marker = chat_family_ == ChatFamily::LladaInstruct ? "<|start_header_id|>"
                       : chat_family_ == ChatFamily::ChatML      ? "<|im_start|>"
                       : chat_family_ == ChatFamily::LladaMoE    ? "<|role_end|>"
                                                                 : nullptr;
  if (marker != nullptr && tok_->token_id(marker) < 0) chat_family_ = ChatFamily::None;
  add_bos_ = model_adds_bos(dir_) && engine_->config().bos_id >= 0;
  // Defaults: the model's generation_config.json (tessera keys), then LLaDA's defaults.
  const fs::path gc_path = fs::path(dir_) / "generation_config.json";
  const json gc = read_json_or_empty(gc_path);
  // Typed reads of its tessera keys: a wrong type or range names the file and the key.
  auto gc_int = [&](const char* key, int dflt) {
    if (!gc.contains(key)) return dflt;
    const json& v = gc[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      fail(gc_path.string() + ": '" + key + "' must be a non-negative integer");
    return v.get<int>();
  };
  auto gc_float = [&](const char* key, float dflt) {
    if (!gc.contains(key)) return dflt;
    const json& v = gc[key];
    if (!v.is_number() || !(std::fabs(v.get<double>()) <= 3.4e38))
      fail(gc_path.string() + ": '" + key + "' must be a number");
    return v.get<float>();
  };
  auto gc_string = [&](const char* key, const std::string& dflt) {
    if (!gc.contains(key)) return dflt;
    if (!gc[key].is_string()) fail(gc_path.string() + ": '" + key + "' must be a string");
    return gc[key].get<std::string>();
  };
  const int gen_len = a.gen_length.value_or(gc_int("gen_length", 128));
  gen_.gen_length = gen_len;
  // Block-causal models (LLaDA2MoeModelLM.generate): block_length 32 (the model's default attention
  // block), steps per block = block_length, threshold 0.95.
  const int model_block = engine_->attention_block();
  gen_.block_length =
      a.block_length.value_or(gc_int("block_length", model_block > 0 ? model_block : gen_len));
  gen_.steps = a.steps.value_or(gc_int("steps", model_block > 0 ? gen_.block_length : gen_len));
  gen_.threshold = a.threshold.value_or(gc_float("threshold", model_block > 0 ? 0.95f : 0.0f));
  gen_.alg = parse_unmask(a.alg.value_or(
      gc_string("alg", std::string(engine_->config().family == Family::Dream && !engine_->config().causal
                                       ? "entropy"
                                       : "low_confidence"))));
  gen_.temperature = a.temperature;
  gen_.cfg_scale = a.cfg;
  gen_.top_k = a.top_k;
  gen_.top_p = a.top_p;
  gen_.alg_temp = a.alg_temp;
  gen_.seed = a.seed;
  gen_.cache = parse_kv_cache(a.cache);
  gen_.sparse = a.sparse || a.sparse_block || a.sparse_rho || a.sparse_skip;
  gen_.sparse_block = a.sparse_block.value_or(gen_.sparse_block);
  gen_.sparse_rho = a.sparse_rho.value_or(gen_.sparse_rho);
  gen_.sparse_skip = a.sparse_skip.value_or(gen_.sparse_skip);
  gen_.des = implied_des(a.des ? std::optional(parse_des(*a.des)) : std::nullopt, a.des_k.has_value(),
                         a.des_beta.has_value(), gen_.des);
  gen_.des_k = a.des_k.value_or(gen_.des_k);
  gen_.des_beta = a.des_beta.value_or(gen_.des_beta);
  gen_.des_scope = parse_des_scope(a.des_scope);
  gen_.window = a.window || a.window_ex || a.window_in || a.window_refresh || a.window_early_stop;
  gen_.window_ex = a.window_ex.value_or(gen_.window_ex);
  gen_.window_in = a.window_in.value_or(gen_.window_in);
  gen_.window_refresh = a.window_refresh.value_or(gen_.window_refresh);
  gen_.window_early_stop = a.window_early_stop;
  apply_edit_flags(EditFlags{a.edit_mode ? std::optional(parse_edit_mode(*a.edit_mode)) : std::nullopt,
                             a.threshold, a.edit_threshold, a.edit_penalty, a.max_post_steps},
                   gen_);
  gen_.stop = a.stop;
  if (a.suffix) gen_.suffix = suffix_ids(*a.suffix, "the suffix");
  gen_.logprobs = a.logprobs.has_value();
  logprobs_top_ = a.logprobs.value_or(0);
  gen_.moe_stats = engine_->supports_expert_sharing();  // the live view and --json report unique experts
  const ModelConfig& c = engine_->config();
  if (c.eos_id >= 0) gen_.eos_ids.push_back(c.eos_id);
  for (const char* extra : {"<|eot_id|>", "<|im_end|>", "<|role_end|>"}) {
    const int32_t id = tok_->token_id(extra);
    if (id >= 0 && id < c.vocab) gen_.eos_ids.push_back(id);
  }
  validate_generate_options(gen_, c.vocab, model_block > 0);
}

std::vector<int32_t> encode_raw(const Tokenizer& t, const std::string& text, int64_t bos) {
  std::vector<int32_t> ids;
  if (bos >= 0) ids.push_back(static_cast<int32_t>(bos));
  const std::vector<int32_t> body = t.encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

std::vector<int32_t> Session::suffix_ids(const std::string& text, const std::string& what) const {
  check_utf8(text, what.c_str());
  std::vector<int32_t> ids = tok_->encode(text);
  if (std::find(ids.begin(), ids.end(), engine_->mask_token()) != ids.end())
    fail(what + " holds the mask token: the suffix is given text, not a gap");
  return ids;
}

int64_t Session::canvas_length(int64_t prompt_len, const GenerateOptions& o) const {
  return tessera::canvas_length(prompt_len, o, engine_->attention_block() > 0);
}

std::vector<int32_t> Session::prompt_ids(const std::vector<ChatMessage>& msgs, bool use_chat,
                                         const GenerateOptions& o) const {
  std::vector<int32_t> ids = encode_messages(msgs, use_chat);
  check_prompt(ids, o, true);
  return ids;
}

std::vector<int32_t> Session::encode_messages(const std::vector<ChatMessage>& msgs, bool use_chat) const {
  for (const auto& m : msgs) check_utf8(m.content, "the prompt");
  std::vector<int32_t> ids;
  if (use_chat) {
    if (chat_family_ == ChatFamily::None) fail(dir_ + " has no chat template (use --raw)");
    ids = tok_->encode(apply_chat_template(chat_family_, msgs, true));
  } else {
    std::string text;
    for (const auto& m : msgs) text += m.content;
    ids = encode_raw(*tok_, text, add_bos_ ? engine_->config().bos_id : -1);
  }
  return ids;
}

void Session::check_prompt(const std::vector<int32_t>& ids, const GenerateOptions& o, bool tokenized) const {
  if (!fits_context(ids.size(), o)) {
    const int64_t total = canvas_length(static_cast<int64_t>(ids.size()), o);
    fail("the prompt of " + std::to_string(ids.size()) + " tokens plus gen-length " +
         std::to_string(o.gen_length) +
         (o.suffix.empty() ? "" : " plus the suffix of " + std::to_string(o.suffix.size()) + " tokens") +
         (engine_->attention_block() > 0 ? " (padded to whole blocks: " + std::to_string(total) + ")" : "") +
         " exceeds the model's context of " + std::to_string(engine_->config().max_positions) + " tokens");
  }
  if (ids.empty()) {
    fail("the prompt is empty and the model adds no BOS token: give a prompt with -p");
  }
  for (const int32_t id : ids) {
    if (id >= 0 && id < engine_->config().vocab) continue;
    if (!tokenized) {
      fail("token id " + std::to_string(id) + " of the prompt is outside the model's vocabulary [0, " +
           std::to_string(engine_->config().vocab) + ")");
    }
    fail(dir_ + ": the tokenizer gave token " + std::to_string(id) + " (\"" + tok_->token_text(id) +
         "\"), outside the model's vocabulary of " + std::to_string(engine_->config().vocab) +
         " tokens: the tokenizer does not belong to this model");
  }
}

namespace {

// Redraws the canvas in place: the cursor goes back over the previous frame's rows, then the new
// frame is written in one call (no flicker).
class LiveView {
 public:
  LiveView(FILE* f, const Tokenizer& t, size_t prompt_len, int32_t mask)
      : f_(f), t_(t), plen_(prompt_len), mask_(mask) {
    winsize w{};
    if (ioctl(fileno(f), TIOCGWINSZ, &w) == 0 && w.ws_col > 0) cols_ = w.ws_col;
  }
  // The committed text plain; after it, the provisional tokens dimmed (with token editing they may
  // still change) and the masks as shaded blocks; the tokens this step rewrote in reverse video.
  void draw(const StepEvent& ev, int total_steps) {
    std::string body;
    edits_ += ev.edits.size();
    for (size_t i = plen_; i < ev.canvas.size(); ++i) {
      if (ev.canvas[i] == mask_) {
        body += "\xe2\x96\x91";
        continue;
      }
      const bool edited = std::any_of(ev.edits.begin(), ev.edits.end(), [&](const TokenEdit& e) {
        return static_cast<size_t>(e.position) == i;
      });
      const bool provisional = static_cast<int>(i) >= ev.committed;
      body += (edited        ? "\x1b[7m"
               : provisional ? "\x1b[2m"
                             : "") +
              t_.token_text(ev.canvas[i]) + (edited || provisional ? "\x1b[0m" : "");
    }
    std::string frame = body + "\n\x1b[2m[step " + std::to_string(ev.step + 1) + "/" +
                        std::to_string(total_steps) + "]" +
                        (edits_ > 0 ? " " + std::to_string(edits_) + " edits" : std::string()) + "\x1b[0m\n";
    std::string out;
    if (rows_ > 0) out += "\x1b[" + std::to_string(rows_) + "F";
    out += "\x1b[J" + frame;
    std::fwrite(out.data(), 1, out.size(), f_);
    std::fflush(f_);
    rows_ = count_rows(frame);
  }
  void clear() {
    if (rows_ > 0) {
      const std::string out = "\x1b[" + std::to_string(rows_) + "F\x1b[J";
      std::fwrite(out.data(), 1, out.size(), f_);
    }
    rows_ = 0;
  }

 private:
  int count_rows(const std::string& s) const {
    int rows = 0, col = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      if (c == '\n') {
        ++rows;
        col = 0;
      } else if (c == 0x1b) {
        while (i < s.size() && s[i] != 'm') ++i;
      } else if ((c & 0xC0) != 0x80) {
        if (++col > cols_) {
          ++rows;
          col = 1;
        }
      }
    }
    return rows;
  }
  FILE* f_;
  const Tokenizer& t_;
  size_t plen_;
  int32_t mask_;
  int cols_ = 80;
  int rows_ = 0;
  size_t edits_ = 0;  // tokens rewritten so far
};

}  // namespace

Session::Output Session::run(const std::vector<int32_t>& prompt, FILE* tty) {
  std::optional<LiveView> view;
  if (tty != nullptr) view.emplace(tty, *tok_, prompt.size(), engine_->mask_token());
  Output o = run(prompt, gen_, [&](const StepEvent& ev) {
    if (view) view->draw(ev, gen_.steps);
  });
  if (view) view->clear();
  return o;
}

Session::Output Session::run(const std::vector<int32_t>& prompt, const GenerateOptions& g,
                             const std::function<void(const StepEvent&)>& on_step) {
  // The request is planned once: its state (KV cache, SparseD patterns, DES) is held open from here to
  // its end, and a memory budget is checked on its largest step before the first forward.
  const bool block_causal = engine_->attention_block() > 0;
  RequestScope request(*engine_, plan_checked(prompt, g, engine_->config().vocab, block_causal));
  check_request_budget(*engine_, request.plan());
  return timed(g, [&](const GenerateOptions& s) { return generate(request, prompt, s, on_step); });
}

size_t find_stop(std::string_view text, const std::vector<std::string>& stop) {
  size_t at = std::string::npos;
  for (const std::string& s : stop) at = std::min(at, text.find(s));
  return at;
}

std::function<bool(std::span<const int32_t>)> stop_checker(const Tokenizer& t,
                                                           const std::vector<std::string>& stop) {
  if (stop.empty()) return {};
  return [&t, stop](std::span<const int32_t> ids) {
    return find_stop(t.decode(ids, true), stop) != std::string::npos;
  };
}

bool cut_at_stop(const Tokenizer& t, const std::vector<std::string>& stop, GenerateResult& r,
                 std::string& text) {
  const size_t cut = find_stop(text, stop);
  if (cut == std::string::npos) return false;
  // The tokens keep those whose text lies wholly before the cut: the shortest prefix whose text reaches
  // past it, less its last token.
  text.resize(cut);
  std::vector<int32_t>& ids = r.tokens;
  size_t lo = 0, hi = ids.size();  // decode(ids[0, n)) grows with n: the smallest n that passes the cut
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (t.decode(std::span<const int32_t>(ids.data(), mid + 1), true).size() > cut)
      hi = mid;
    else
      lo = mid + 1;
  }
  ids.resize(lo);
  if (r.logprobs.size() > lo) r.logprobs.resize(lo);
  return true;
}

Session::Output Session::timed(const GenerateOptions& g,
                               const std::function<GenerateResult(const GenerateOptions&)>& gen) const {
  GenerateOptions s = g;
  s.stop_when = stop_checker(*tok_, g.stop);  // generation ends once the decided tokens hold one
  Output o;
  const auto t0 = std::chrono::steady_clock::now();
  o.result = gen(s);
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  o.text = tok_->decode(o.result.tokens, true);
  o.stopped = cut_at_stop(*tok_, g.stop, o.result, o.text);
  return o;
}

Session::Output Session::run(Batcher& b, const std::vector<int32_t>& prompt, const GenerateOptions& g,
                             const std::function<void(const StepEvent&)>& on_step) {
  Output o;
  const bool block_causal = engine_->attention_block() > 0;
  if (b.max_batch() == 1 ||
      !plan_request(g, static_cast<int64_t>(prompt.size()), block_causal).shares_forwards()) {
    b.run([&] { o = run(prompt, g, on_step); }, true);
    return o;
  }
  return timed(g, [&](const GenerateOptions& s) { return b.generate(prompt, s, on_step); });
}

}  // namespace tessera::cli
