// tessera generate / tessera chat
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "apps/tessera/commands.h"
#include "apps/tessera/session.h"

namespace tessera::cli {

namespace {

void print_stats(const Session::Output& o, Session& s, FILE* f) {
  const double tps = o.seconds > 0 ? static_cast<double>(o.result.tokens.size()) / o.seconds : 0.0;
  const std::string kv = s.engine().kv_cache_bytes() > 0
                             ? ", KV cache " + human_bytes(static_cast<double>(s.engine().kv_cache_bytes()))
                             : "";
  const MoeStats& m = s.engine().moe_stats();
  char moe[96] = "";
  if (m.layer_forwards > 0)
    std::snprintf(moe, sizeof moe, " · %.1f of %lld experts per MoE layer%s", m.mean(m.unique),
                  static_cast<long long>(s.config().moe.n_experts),
                  s.options().des != "off" ? (" (DES-" + s.options().des + ")").c_str() : "");
  std::fprintf(f, "[%d steps · %zu tokens in %.2f s · %.1f tokens/s · peak memory %s (activations %s%s)%s]\n",
               o.result.steps_run, o.result.tokens.size(), o.seconds, tps,
               human_bytes(static_cast<double>(peak_rss_bytes())).c_str(),
               human_bytes(static_cast<double>(s.engine().max_planned_peak())).c_str(), kv.c_str(), moe);
}

// One line of JSON. Generated text need not be valid UTF-8 (a byte-level model may stop inside a
// character): invalid bytes are written as U+FFFD, the token ids stay exact.
std::string json_line(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json result_json(const Session::Output& o, Session& s, size_t prompt_tokens) {
  nlohmann::json j = {
      {"model", s.model_dir()},
      {"text", o.text},
      {"tokens", o.result.tokens},
      {"prompt_tokens", prompt_tokens},
      {"steps", o.result.steps_run},
      {"seconds", o.seconds},
      {"tokens_per_second", o.seconds > 0 ? static_cast<double>(o.result.tokens.size()) / o.seconds : 0.0},
      {"peak_rss_bytes", peak_rss_bytes()},
      {"activation_peak_bytes", s.engine().max_planned_peak()},
      {"kv_cache_bytes", s.engine().kv_cache_bytes()},
      {"gen_length", s.options().gen_length},
      {"block_length", s.options().block_length},
      {"alg", s.options().alg},
      {"cache", s.options().cache},
      {"sparse", s.options().sparse},
      {"sparse_pattern_bytes", s.engine().sparse_bytes()},
      {"des", s.options().des}};
  const GenerateOptions& g = s.options();
  if (g.window) {
    j["window"] = {{"external", window_external(g)},
                   {"internal", g.window_in},
                   {"refresh", g.window_refresh},
                   {"early_stop", g.window_early_stop}};
  }
  const MoeStats& m = s.engine().moe_stats();
  if (m.layer_forwards > 0) {  // means over every (MoE layer, forward)
    j["moe"] = {{"n_experts", s.config().moe.n_experts}, {"top_k", s.config().moe.top_k},
                {"unique_experts", m.mean(m.unique)},    {"unique_experts_block", m.mean(m.unique_voting)},
                {"coreset", m.mean(m.coreset)},          {"des_scope", s.options().des_scope}};
  }
  return j;
}

}  // namespace

void add_generate(CLI::App& app, Registry& reg) {
  auto* sub = app.add_subcommand("generate", "Generate text from a prompt");
  auto a = std::make_shared<SessionArgs>();
  auto prompt = std::make_shared<std::string>();
  sub->add_option("-p,--prompt", *prompt, "prompt text")->required();
  add_session_options(sub, *a);
  reg.handlers.emplace_back(sub, [a, prompt] {
    check_utf8(*prompt, "the prompt");
    Session s(*a);
    const bool use_chat = a->chat || (!a->raw && s.has_chat_template() && !prompt->empty());
    const auto ids = s.prompt_ids({{"user", *prompt}}, use_chat);
    FILE* tty = (!a->json && !a->no_progress && isatty(fileno(stderr))) ? stderr : nullptr;
    const auto o = s.run(ids, tty);
    if (a->json) {
      std::printf("%s\n", json_line(result_json(o, s, ids.size())).c_str());
    } else {
      std::printf("%s\n", o.text.c_str());
      std::fflush(stdout);
      print_stats(o, s, stderr);
    }
    return 0;
  });

  auto* chat = app.add_subcommand("chat", "Multi-turn chat on standard input (empty line or EOF ends)");
  auto c = std::make_shared<SessionArgs>();
  add_session_options(chat, *c);
  reg.handlers.emplace_back(chat, [c] {
    Session s(*c);
    if (!s.has_chat_template())
      std::fprintf(stderr, "note: %s has no chat template; turns are concatenated\n", s.model_dir().c_str());
    std::vector<ChatMessage> history;
    const bool interactive = isatty(fileno(stdin));
    std::string line;
    while (true) {
      if (interactive) std::fprintf(stderr, "you> ");
      if (!std::getline(std::cin, line) || line.empty()) break;
      history.push_back({"user", line});
      const auto ids = s.prompt_ids(history, s.has_chat_template());
      FILE* tty = (!c->no_progress && isatty(fileno(stderr))) ? stderr : nullptr;
      const auto o = s.run(ids, tty);
      if (c->json) {
        std::printf("%s\n", json_line(result_json(o, s, ids.size())).c_str());
      } else {
        std::printf("%s\n", o.text.c_str());
        std::fflush(stdout);
        print_stats(o, s, stderr);
      }
      history.push_back({"assistant", o.text});
    }
    return 0;
  });
}

}  // namespace tessera::cli
