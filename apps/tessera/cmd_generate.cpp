// tessera generate / tessera chat
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "apps/tessera/canvas_event.h"
#include "apps/tessera/cli_parse.h"
#include "apps/tessera/cli_session.h"
#include "apps/tessera/commands.h"
#include "apps/tessera/generate_output.h"
#include "apps/tessera/svg.h"

namespace tessera::cli {

namespace {

// The prompts of --prompts-file: one per line ('-': standard input); a line that starts with '"' is a
// JSON string (for prompts with newlines or other escapes); empty lines are skipped.
std::vector<std::string> read_prompts(const std::string& path) {
  std::ifstream file;
  if (path != "-") {
    file.open(path);
    if (!file) fail("cannot read the prompts file " + path);
  }
  std::istream& in = path == "-" ? std::cin : file;
  std::vector<std::string> prompts;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const std::string where = path + " line " + std::to_string(n);
    if (line[0] == '"') {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_string()) fail(where + ": a line that starts with '\"' must be one JSON string");
      line = j.get<std::string>();
    }
    check_utf8(line, where.c_str());
    prompts.push_back(line);
  }
  if (prompts.empty()) fail("the prompts file " + path + " holds no prompt");
  return prompts;
}

// Every prompt of the file, --batch of them at a time sharing forwards (engine/batcher.h); results are
// written in the file's order as soon as they and every earlier one are done. A prompt that fails
// (too long for the context, say) gets its error and the others go on; the exit status is then 1.
int generate_many(Session& s, const SessionArgs& a, const std::vector<std::string>& prompts, int batch) {
  Batcher b(s.engine(), batch, std::chrono::milliseconds(2), true);  // over ranks: rank 0 orders
  const size_t n = prompts.size();
  std::vector<Session::Output> out(n);
  std::vector<std::string> err(n);
  std::vector<size_t> prompt_tokens(n);
  std::vector<char> done(n, 0);
  std::atomic<size_t> next{0};
  std::mutex m;
  size_t written = 0, tokens = 0, failed = 0;
  // Over ranks the others run the same prompts (keyed by their line) and rank 0 alone reports them.
  const bool follower = s.follower();
  const bool progress = !a.json && !a.no_progress && !follower && isatty(fileno(stderr));
  const auto t0 = std::chrono::steady_clock::now();
  auto write_ready = [&] {  // under m
    for (; written < n && done[written]; ++written) {
      const size_t i = written;
      if (!err[i].empty()) {
        ++failed;
        if (a.json)
          std::printf("%s\n", json_line({{"index", i}, {"error", err[i]}}).c_str());
        else if (!follower)
          std::fprintf(stderr, "tessera: prompt %zu: %s\n", i + 1, err[i].c_str());
        continue;
      }
      tokens += out[i].result.tokens.size();
      if (a.json) {
        nlohmann::json j;  // read the engine's counters on its own thread, between two forwards
        b.run([&] { j = result_json(out[i], s, prompt_tokens[i]); }, false);
        j["index"] = i;
        std::printf("%s\n", json_line(j).c_str());
      } else {
        std::printf("%s\n", out[i].text.c_str());
      }
    }
    std::fflush(stdout);
    if (progress) std::fprintf(stderr, "\r[%zu / %zu prompts]", written, n);
  };
  auto worker = [&] {
    for (size_t i; (i = next++) < n;) {
      try {
        const auto ids = s.prompt_ids({{"user", prompts[i]}}, uses_chat(a, s, prompts[i]));
        prompt_tokens[i] = ids.size();
        out[i] = s.run(b, ids, s.options(), {}, i);  // keyed by its line: alike on every rank
      } catch (const Error& e) {
        err[i] = e.what();
      }
      std::lock_guard<std::mutex> l(m);
      done[i] = 1;
      write_ready();
    }
  };
  std::vector<std::thread> th;
  for (size_t t = 0; t < std::min(n, static_cast<size_t>(batch)); ++t) th.emplace_back(worker);
  for (auto& t : th) t.join();
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const BatchStats st = b.stats();
  if (progress) std::fprintf(stderr, "\r");
  if (!a.json && !follower) {
    char per[64] = "";
    if (st.forwards > 0)
      std::snprintf(per, sizeof per, " · %.2f sequences per forward",
                    static_cast<double>(st.sequences) / static_cast<double>(st.forwards));
    std::fprintf(stderr, "[%zu prompts%s · %zu tokens in %.2f s · %.1f tokens/s%s]\n", n,
                 failed > 0 ? (", " + std::to_string(failed) + " failed").c_str() : "", tokens, sec,
                 sec > 0 ? static_cast<double>(tokens) / sec : 0.0, per);
  }
  return failed > 0 ? 1 : 0;
}

}  // namespace

void add_generate(CLI::App& app, Registry& reg) {
  auto* sub = app.add_subcommand("generate", "Generate text from a prompt");
  auto a = std::make_shared<SessionArgs>();
  auto prompt = std::make_shared<std::string>();
  auto prompts_file = std::make_shared<std::string>();
  auto batch = std::make_shared<int>(8);
  auto words = std::make_shared<std::vector<std::string>>();
  auto* p_opt = sub->add_option("-p,--prompt", *prompt, "prompt text (or give it as the last arguments)");
  auto* w_opt = sub->add_option("words", *words, "the prompt, when -p is not given (words joined by spaces)");
  w_opt->excludes(p_opt);
  auto* f_opt =
      sub->add_option("--prompts-file", *prompts_file,
                      "generate for every prompt of a file, one per line ('-': standard input; a line "
                      "starting with '\"' is a JSON string), in batches; results in the file's order");
  p_opt->excludes(f_opt);
  w_opt->excludes(f_opt);
  sub->add_option(
         "--batch", *batch,
         "with --prompts-file: prompts generated at the same time, sharing packed forwards (default 8)")
      ->check(in_range(1, 256));
  add_session_options(sub, *a);
  sub->add_option("--suffix", a->suffix,
                  "infilling: the text after the generated span (every forward sees it; the answer is the "
                  "gen-length tokens between the prompt and it); raw text, no chat template");
  auto canvas = std::make_shared<bool>(false);
  sub->add_flag("--canvas", *canvas,
                "with --json: one line per step before the result, {\"canvas\": {...}}: the committed text, "
                "the provisional tokens and masks, the positions changed and the tokens rewritten");
  auto order_svg = std::make_shared<std::string>();
  sub->add_option("--order-svg", *order_svg,
                  "draw when each token was decided to FILE (SVG): generated position x step, edits marked, "
                  "the token as each cell's hover text")
      ->check(svg::writable_file());
  sub->footer(
      "Examples:\n"
      "  tessera generate -p \"Once upon a time\"\n"
      "  tessera generate -m /models/LLaDA-8B-Instruct -n 128 --steps 64 \"Explain diffusion LMs.\"\n"
      "  tessera generate --prompts-file prompts.txt --json > answers.jsonl");
  reg.handlers.emplace_back(sub, [a, prompt, words, prompts_file, batch, p_opt, w_opt, f_opt, canvas,
                                  order_svg] {
    if (p_opt->count() == 0 && w_opt->count() == 0 && f_opt->count() == 0)
      fail("give a prompt (-p TEXT, or the text as the last arguments) or a prompts file (--prompts-file)");
    for (const std::string& w : *words) *prompt += (prompt->empty() ? "" : " ") + w;
    if (a->suffix && a->chat)
      fail("--suffix infills raw text between the prompt and the suffix; drop --chat");
    if (f_opt->count() > 0) {
      if (*canvas) fail("--canvas streams the steps of one prompt (-p), not of a prompts file");
      if (!order_svg->empty()) fail("--order-svg draws one generation (-p), not a prompts file");
      const auto prompts = read_prompts(*prompts_file);
      Session s(*a);
      if (!a->json) s.print_notes();
      return generate_many(s, *a, prompts, *batch);
    }
    check_utf8(*prompt, "the prompt");
    Session s(*a);
    // Over ranks the others generate alike; rank 0 alone prints (their stdout is /dev/null, their stderr
    // keeps their errors).
    const bool follower = s.follower();
    const bool chat = uses_chat(*a, s, *prompt);
    const auto ids = s.prompt_ids({{"user", *prompt}}, chat);
    if (chat && s.chat_template().builtin() && !a->json)
      std::fprintf(stderr, "note: %s ships no chat template; using %s (--raw: none)\n", s.model_dir().c_str(),
                   s.chat_template().origin().c_str());
    FILE* tty = (!a->json && !a->no_progress && !follower && isatty(fileno(stderr))) ? stderr : nullptr;
    if (*canvas && !a->json) fail("--canvas streams JSON step events; give --json too");
    if (!a->json && !follower) s.print_notes();
    const auto o =
        *canvas ? s.run(ids, s.options(),
                        [&](const StepEvent& ev) {
                          std::printf("%s\n",
                                      json_line({{"canvas", canvas_event_json(ev, s.tokenizer(), ids.size(),
                                                                              s.engine().mask_token(),
                                                                              s.options().eos_ids)}})
                                          .c_str());
                          std::fflush(stdout);
                        })
                : s.run(ids, tty);
    if (!order_svg->empty())  // --order-svg: when each token of this generation was decided
      svg::save(*order_svg, "--order-svg",
                svg::order_chart("Decoding order: " + s.model_dir() + ", \"" + prompt->substr(0, 60) + "\"",
                                 o.result, static_cast<int64_t>(ids.size()), s.options().gen_length,
                                 s.options().block_length,
                                 [&](int32_t t) { return s.tokenizer().decode(std::vector<int32_t>{t}); }));
    if (a->json) {
      std::printf("%s\n", json_line(result_json(o, s, ids.size())).c_str());
    } else {
      std::printf("%s\n", o.text.c_str());
      if (s.options().logprobs) print_logprobs(o, s, stdout);
      std::fflush(stdout);
      if (!follower) print_stats(o, s, stderr);
    }
    return 0;
  });
}

}  // namespace tessera::cli
