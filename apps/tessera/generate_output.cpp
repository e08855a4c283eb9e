// What generate and chat print: the answer's statistics line, its JSON object, its log-probabilities.
#include "apps/tessera/generate_output.h"

#include <algorithm>
#include <cstdio>

namespace tessera::cli {

void print_stats(const Session::Output& o, Session& s, FILE* f) {
  const double tps = o.seconds > 0 ? static_cast<double>(o.result.tokens.size()) / o.seconds : 0.0;
  const std::string kv = s.engine().kv_cache_bytes() > 0
                             ? ", KV cache " + human_bytes(static_cast<double>(s.engine().kv_cache_bytes()))
                             : "";
  const MoeStats& m = s.engine().moe_stats();
  char moe[96] = "";
  if (m.layer_forwards > 0)
    std::snprintf(
        moe, sizeof moe, " · %.1f of %lld experts per MoE layer%s", m.mean(m.unique),
        static_cast<long long>(s.config().moe.n_experts),
        s.options().des != DesMode::Off ? (" (DES-" + std::string(name(s.options().des)) + ")").c_str() : "");
  // On a GPU the memory that matters is the device's: what this process holds there (weights, workspace,
  // caches, the CUDA runtime; nothing is allocated during a step, so this is the peak).
  const int64_t device_used = device_bytes_in_use(s.engine());
  const std::string memory = device_used >= 0
                                 ? "GPU memory " + human_bytes(static_cast<double>(device_used))
                                 : "peak memory " + human_bytes(static_cast<double>(peak_rss_bytes()));
  std::fprintf(f, "[%d steps · %zu tokens in %.2f s · %.1f tokens/s · %s (activations %s%s)%s]\n",
               o.result.steps_run, o.result.tokens.size(), o.seconds, tps, memory.c_str(),
               human_bytes(static_cast<double>(s.engine().max_planned_peak())).c_str(), kv.c_str(), moe);
}

// One line of JSON. Generated text need not be valid UTF-8 (a byte-level model may stop inside a
// character): invalid bytes are written as U+FFFD, the token ids stay exact.
std::string json_line(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// --logprobs N: per generated token its id, text, log-probability, the step that decided it and the N
// most likely tokens at that step.
namespace {

nlohmann::json logprobs_json(const Session::Output& o, const Session& s) {
  const auto n_top = static_cast<size_t>(s.logprobs_top());
  const Tokenizer& tok = s.tokenizer();
  nlohmann::json arr = nlohmann::json::array();
  for (size_t i = 0; i < o.result.tokens.size() && i < o.result.logprobs.size(); ++i) {
    const TokenLogprob& t = o.result.logprobs[i];
    nlohmann::json top = nlohmann::json::array();
    for (size_t k = 0; k < std::min(n_top, t.top.size()); ++k)
      top.push_back({{"token", t.top[k].first},
                     {"text", tok.token_text(t.top[k].first)},
                     {"logprob", t.top[k].second}});
    arr.push_back({{"token", o.result.tokens[i]},
                   {"text", tok.token_text(o.result.tokens[i])},
                   {"logprob", t.logprob},
                   {"step", t.step},
                   {"top", top}});
  }
  return arr;
}

}  // namespace

// --logprobs without --json: one line per generated token after the text.
void print_logprobs(const Session::Output& o, const Session& s, FILE* f) {
  const auto n_top = static_cast<size_t>(s.logprobs_top());
  const Tokenizer& tok = s.tokenizer();
  auto quoted = [](const std::string& t) {
    return nlohmann::json(t).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  std::fprintf(f, "%5s %5s %9s  %s\n", "index", "step", "logprob", "token (most likely at that step)");
  for (size_t i = 0; i < o.result.tokens.size() && i < o.result.logprobs.size(); ++i) {
    const TokenLogprob& t = o.result.logprobs[i];
    std::string line = quoted(tok.token_text(o.result.tokens[i]));
    for (size_t k = 0; k < std::min(n_top, t.top.size()); ++k) {
      char lp[32];
      std::snprintf(lp, sizeof lp, " %.3f", static_cast<double>(t.top[k].second));
      line += (k == 0 ? "  (" : ", ") + quoted(tok.token_text(t.top[k].first)) + lp;
      if (k + 1 == std::min(n_top, t.top.size())) line += ")";
    }
    std::fprintf(f, "%5zu %5d %9.4f  %s\n", i, t.step, static_cast<double>(t.logprob), line.c_str());
  }
}

// Whether a raw prompt gets the chat template: --chat, or a model that has one unless --raw, an empty
// prompt or an infilling --suffix.
bool uses_chat(const SessionArgs& a, const Session& s, const std::string& prompt) {
  return a.chat || (!a.raw && !a.suffix && s.has_chat_template() && !prompt.empty());
}

nlohmann::json result_json(const Session::Output& o, Session& s, size_t prompt_tokens) {
  nlohmann::json j = {
      {"model", s.model_dir()},
      {"text", o.text},
      {"tokens", o.result.tokens},
      {"stopped", o.stopped},  // the text was cut before a --stop sequence
      {"prompt_tokens", prompt_tokens},
      {"suffix_tokens", s.options().suffix.size()},  // --suffix (infilling)
      {"steps", o.result.steps_run},
      {"forwards", o.result.forwards},
      {"seconds", o.seconds},
      // The first step (planning, new shapes' primitives) apart from the median of the later steps.
      {"first_step_seconds", o.first_step_seconds},
      {"steady_step_seconds", o.steady_step_seconds},
      {"tokens_per_second", o.seconds > 0 ? static_cast<double>(o.result.tokens.size()) / o.seconds : 0.0},
      {"peak_rss_bytes", peak_rss_bytes()},
      {"device_bytes_in_use", device_bytes_in_use(s.engine())},  // -1 on the CPU
      {"activation_peak_bytes", s.engine().max_planned_peak()},
      // --memory-budget bounds the process: the weights, the runtime's own memory (libraries, threads,
      // tokenizer: measured at start-up) and the planned activations; 0 without a budget.
      {"memory_budget_bytes", s.engine().options().memory_budget},
      {"runtime_bytes", s.engine().options().runtime_bytes},
      {"kv_cache_bytes", s.engine().kv_cache_bytes()},
      {"gen_length", s.options().gen_length},
      {"block_length", s.options().block_length},
      {"alg", name(s.options().alg)},
      {"cache", name(s.options().cache)},
      {"sparse", s.options().sparse},
      {"sparse_pattern_bytes", s.engine().sparse_bytes()},
      {"des", name(s.options().des)}};
  if (!s.notes().empty()) j["notes"] = s.notes();  // what was chosen for the user (not printed with --json)
  const GenerateOptions& g = s.options();
  if (g.logprobs) j["logprobs"] = logprobs_json(o, s);
  if (g.window) {
    j["window"] = {{"external", window_external(g)},
                   {"internal", g.window_in},
                   {"refresh", g.window_refresh},
                   {"early_stop", g.window_early_stop}};
  }
  if (g.edit) {  // token editing: its settings and every rewrite
    nlohmann::json edits = nlohmann::json::array();
    for (const TokenEdit& e : o.result.edits)
      edits.push_back({{"step", e.step},
                       {"position", e.position - static_cast<int32_t>(prompt_tokens)},
                       {"old", e.from},
                       {"new", e.to}});
    j["edit"] = {{"threshold", g.threshold},
                 {"edit_threshold", g.edit_threshold},
                 {"max_post_steps", g.max_post_steps},
                 {"penalty", g.edit_penalty},
                 {"edits", edits}};
  }
  const MoeStats& m = s.engine().moe_stats();
  if (m.layer_forwards > 0) {  // means over every (MoE layer, forward)
    j["moe"] = {{"n_experts", s.config().moe.n_experts}, {"top_k", s.config().moe.top_k},
                {"unique_experts", m.mean(m.unique)},    {"unique_experts_block", m.mean(m.unique_voting)},
                {"coreset", m.mean(m.coreset)},          {"des_scope", name(s.options().des_scope)}};
  }
  return j;
}

}  // namespace tessera::cli
