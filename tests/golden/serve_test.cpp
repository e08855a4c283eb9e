// tessera serve end to end: a real server process on a free port, requests through cpp-httplib's client.
// A completion equals `tessera generate` with the same options; the streamed deltas concatenate to the
// same text; every bad request gets a 4xx with an OpenAI-style error object and the server keeps going.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <thread>

#include "io/tokenizer.h"
#include "serve_client.h"
#include "serve_process.h"
#include "test_util.h"
#include "tiny_models.h"

namespace tessera {
namespace {

using json = nlohmann::json;
using test::client_of;
using test::expect_refused;
using test::post;
using test::ServerProcess;
using test::tiny_dir;
using test::tiny_server;

using test::events;

TEST(Serve, OpenAiCompatibleCompletionsChatAndErrors) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 1");
  const auto tmp = test::temp_dir("serve");
  ServerProcess server("-m " + dir.string() + " --model-id tiny", tmp);
  ASSERT_GT(server.port(), 0);
  httplib::Client c = client_of(server);

  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "tiny");

  // A completion is what `tessera generate` writes for the same options.
  const json req = {
      {"model", "tiny"}, {"prompt", "hello"}, {"max_tokens", 16}, {"block_length", 8}, {"seed", 3}};
  const json got = post(c, "/v1/completions", req.dump(), 200);
  std::string cli;
  ASSERT_EQ(
      test::run_command(std::string(TESSERA_BINARY) + " generate -m " + dir.string() +
                            " -p hello --raw --gen-length 16 --block-length 8 --steps 16 --seed 3 --json "
                            "2>/dev/null",
                        &cli),
      0);
  const json want = json::parse(cli);
  EXPECT_EQ(got["choices"][0]["text"], want["text"]);
  EXPECT_EQ(got["usage"]["completion_tokens"], want["tokens"].size());
  EXPECT_EQ(got["object"], "text_completion");

  // Streaming: the deltas concatenate to the same text, then the finish reason, then [DONE].
  json sreq = req;
  sreq["stream"] = true;
  auto sr = c.Post("/v1/completions", sreq.dump(), "application/json");
  ASSERT_TRUE(sr);
  EXPECT_EQ(sr->get_header_value("Content-Type"), "text/event-stream");
  const auto ev = events(sr->body);
  ASSERT_GE(ev.size(), 3u) << sr->body;
  EXPECT_EQ(ev.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < ev.size(); ++i)
    text += json::parse(ev[i])["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, want["text"].get<std::string>());
  EXPECT_EQ(json::parse(ev[ev.size() - 2])["choices"][0]["finish_reason"], "length");

  // Stop sequences: the text ends before the first one, streamed or not. One that appears in the first
  // block of 8 (two of its tokens, plain ASCII) also ends the generation there: at most half the steps.
  const auto tok = Tokenizer::from_file(dir / "tokenizer.json");
  const auto ids = want["tokens"].get<std::vector<int32_t>>();
  const std::string full = want["text"].get<std::string>();
  std::string early;
  for (size_t i = 2; i + 1 < 8 && early.empty(); ++i) {  // two tokens: the first may be decided alone
    early = tok.decode(std::vector<int32_t>{ids[i], ids[i + 1]}, true);
    if (std::any_of(early.begin(), early.end(),
                    [](char ch) { return static_cast<unsigned char>(ch) >= 0x80; }))
      early.clear();
  }
  ASSERT_FALSE(early.empty()) << "no plain token in the first block of " << full;
  for (const json& stop : {json(early), json::array({"\x01never", early}), json("\x01never")}) {
    const bool hit = stop != json("\x01never");
    const std::string expect = hit ? full.substr(0, full.find(early)) : full;
    json q = req;
    q["stop"] = stop;
    const json r = post(c, "/v1/completions", q.dump(), 200);
    EXPECT_EQ(r["choices"][0]["text"], expect) << stop;
    EXPECT_EQ(r["choices"][0]["finish_reason"], hit ? "stop" : "length") << stop;
    if (hit)  // the answer's tokens are all decided within the first block (often sooner)
      EXPECT_LE(r["tessera"]["steps"].get<int>(), 8) << stop;
    else
      EXPECT_EQ(r["tessera"]["steps"], 16) << stop;
    EXPECT_LT(r["usage"]["completion_tokens"].get<size_t>(), hit ? 8u : 17u) << stop;
    q["stream"] = true;
    auto s = c.Post("/v1/completions", q.dump(), "application/json");
    ASSERT_TRUE(s);
    const auto sev = events(s->body);
    ASSERT_GE(sev.size(), 2u) << s->body;
    std::string streamed;
    for (size_t i = 0; i + 1 < sev.size(); ++i)
      streamed += json::parse(sev[i])["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(streamed, expect) << stop;
    EXPECT_EQ(json::parse(sev[sev.size() - 2])["choices"][0]["finish_reason"], hit ? "stop" : "length");
  }

  // n choices: choice i is the request alone with seed + i (at temperature 1 they differ); streamed,
  // each index's deltas concatenate to its text, and the usage comes last in a chunk of its own.
  json nq = req;
  nq["n"] = 3;
  nq["temperature"] = 1.0;
  const json nr = post(c, "/v1/completions", nq.dump(), 200);
  ASSERT_EQ(nr["choices"].size(), 3u) << nr;
  size_t tokens = 0;
  std::set<std::string> distinct;
  for (int i = 0; i < 3; ++i) {
    json one = req;
    one["temperature"] = 1.0;
    one["seed"] = 3 + i;
    const json alone = post(c, "/v1/completions", one.dump(), 200);
    EXPECT_EQ(nr["choices"][i]["index"], i);
    EXPECT_EQ(nr["choices"][i]["text"], alone["choices"][0]["text"]) << i;
    tokens += alone["usage"]["completion_tokens"].get<size_t>();
    distinct.insert(alone["choices"][0]["text"].get<std::string>());
  }
  EXPECT_EQ(nr["usage"]["completion_tokens"], tokens);
  EXPECT_GT(distinct.size(), 1u);
  nq["stream"] = true;
  nq["stream_options"] = {{"include_usage", true}};
  auto ns = c.Post("/v1/completions", nq.dump(), "application/json");
  ASSERT_TRUE(ns);
  const auto nev = events(ns->body);
  ASSERT_GE(nev.size(), 5u) << ns->body;
  EXPECT_EQ(nev.back(), "[DONE]");
  std::string per[3];
  int finished = 0;
  for (size_t i = 0; i + 2 < nev.size(); ++i) {
    const json e = json::parse(nev[i]);
    ASSERT_EQ(e["choices"].size(), 1u) << nev[i];
    const int k = e["choices"][0]["index"];
    ASSERT_TRUE(k >= 0 && k < 3) << nev[i];
    per[k] += e["choices"][0]["text"].get<std::string>();
    finished += e["choices"][0]["finish_reason"].is_null() ? 0 : 1;
  }
  EXPECT_EQ(finished, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(per[i], nr["choices"][i]["text"]) << i;
  const json last = json::parse(nev[nev.size() - 2]);
  EXPECT_TRUE(last["choices"].empty()) << last;
  EXPECT_EQ(last["usage"]["completion_tokens"], tokens);

  // Chat, streamed: a role chunk first; with the KV cache as a tessera option.
  const json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                     {"max_tokens", 16},
                     {"block_length", 8},
                     {"cache", "dual"},
                     {"stream", true}};
  auto cr = c.Post("/v1/chat/completions", chat.dump(), "application/json");
  ASSERT_TRUE(cr);
  const auto cev = events(cr->body);
  ASSERT_GE(cev.size(), 3u) << cr->body;
  EXPECT_EQ(json::parse(cev[0])["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(json::parse(cev[0])["object"], "chat.completion.chunk");

  // SparseD as a tessera option: keeping every tile gives the exact completion.
  json sparse = req;
  sparse["sparse_rho"] = 1.0;
  sparse["sparse_block"] = 4;
  const json sp = post(c, "/v1/completions", sparse.dump(), 200);
  EXPECT_EQ(sp["choices"][0]["text"], want["text"]);
  EXPECT_EQ(sp["tessera"]["sparse"], true);
  // So is a Window-Diffusion window over the whole generation without its cache.
  json win = req;
  win["window_ex"] = win["window_in"] = 16;
  win["window_refresh"] = 0;
  const json wr = post(c, "/v1/completions", win.dump(), 200);
  EXPECT_EQ(wr["choices"][0]["text"], want["text"]);
  EXPECT_EQ(wr["tessera"]["window"], true);

  // Bad requests: 4xx, an error object naming the problem; the server still answers afterwards.
  const std::pair<std::string, std::string> bad[] = {
      {R"({"prompt": "x", "bogus": 1})", "unknown field 'bogus'"},
      {R"({"prompt": )", "not valid JSON"},
      {R"([1, 2])", "must be a JSON object"},
      {R"({"prompt": "x", "max_tokens": 0})", "'max_tokens' must be in [1, "},
      {R"({"prompt": "x", "max_tokens": "many"})", "'max_tokens' must be an integer"},
      {R"({"prompt": "x", "max_tokens": 16, "block_length": 8, "steps": 5})",
       "not divisible by the number of blocks"},
      {R"({"prompt": "x", "n": 0})", "'n' must be in [1, 16]"},
      {R"({"prompt": "x", "n": 17})", "'n' must be in [1, 16]"},
      {R"({"prompt": "x", "n": "2"})", "'n' must be an integer"},
      {R"({"prompt": "x", "stop": ""})", "'stop' must be a non-empty string or an array of 1 to 4"},
      {R"({"prompt": "x", "stop": ["a", 1]})", "'stop' must be a non-empty string or an array"},
      {R"({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]})", "an array of 1 to 4 non-empty strings"},
      {R"({"prompt": "x", "stop": []})", "an array of 1 to 4 non-empty strings"},
      {R"({"prompt": "x", "cache": "lru"})", "unknown KV cache 'lru'"},
      {R"({"prompt": "x", "seed": -1})", "'seed' must be >= 0"},
      {R"({"prompt": "x", "sparse": 1})", "'sparse' must be true or false"},
      {R"({"prompt": "x", "sparse_rho": 2})", "sparse-rho must be in [0, 1]"},
      {R"({"prompt": "x", "des": "vote"})", "expert sharing needs a mixture-of-experts model"},
      {R"({"prompt": "x", "des": "some"})", "unknown expert sharing 'some'"},
      {R"({"prompt": "x", "des_k": 2, "des_beta": 0.3})", "choose different methods"},
      {R"({"prompt": "x", "window": 1})", "'window' must be true or false"},
      {R"({"prompt": "x", "window_in": 100, "window_ex": 8})",
       "window-in (100) must not exceed window-ex (8)"},
      {R"({"prompt": "x", "window": true, "cache": "dual"})", "Window-Diffusion keeps its own phase cache"},
      {R"({"prompt": 7})", "'prompt' must be a string"},
      {R"({"messages": []})", "'messages' must be a non-empty array"},
      // Found by the fuzzer (tests/fuzz): these were 500s or wrapped numbers.
      {"{\"prompt\": \xff}", "not valid JSON"},  // the parser quotes the byte that is not UTF-8
      {R"({"prompt": "x", "stream": true, "stream_options": {"include_usage": "yes"}})",
       "'include_usage' must be true or false"},
      {R"({"prompt": "x", "stream_options": 3})", "'stream_options' must be an object"},
      {R"({"prompt": "x", "temperature": 1e300})", "'temperature' is out of range"},
      {R"({"prompt": "x", "max_tokens": 18446744073709551615})", "'max_tokens' must be an integer"},
  };
  for (const auto& [body, msg] : bad) {
    const bool chat_route = body.find("messages") != std::string::npos;
    const json e = post(c, chat_route ? "/v1/chat/completions" : "/v1/completions", body, 400);
    EXPECT_NE(e["error"]["message"].get<std::string>().find(msg), std::string::npos)
        << body << " -> " << e.dump();
  }
  const std::string long_prompt(3000, 'a');
  const json too_long = post(c, "/v1/completions", json{{"prompt", long_prompt}}.dump(), 400);
  EXPECT_NE(too_long["error"]["message"].get<std::string>().find("exceeds the model's context"),
            std::string::npos)
      << too_long.dump();
  const json wrong_model = post(c, "/v1/completions", R"({"prompt": "x", "model": "gpt-4"})", 404);
  EXPECT_NE(wrong_model["error"]["message"].get<std::string>().find("serves 'tiny'"), std::string::npos);
  auto nf = c.Get("/v1/nothing");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);
  EXPECT_EQ(post(c, "/v1/completions", req.dump(), 200)["choices"][0]["text"], want["text"]);

  // A second server on the same port fails to start instead of sharing the port.
  std::string second;
  EXPECT_NE(test::run_command("timeout 30 " + std::string(TESSERA_BINARY) + " serve -m " + dir.string() +
                                  " --port " + std::to_string(server.port()) + " 2>&1",
                              &second),
            0);
  EXPECT_NE(second.find("cannot listen on 127.0.0.1:" + std::to_string(server.port())), std::string::npos)
      << second;
}

// logprobs: a completion's values are those `tessera generate --logprobs` reports for the same request
// (which the Logprobs golden tests check against the model's logits); the chat format carries the same
// values with exact bytes; streamed events carry them too, each token once; bad values are refused.
TEST(Serve, LogprobsInBothFormatsStreamedAndNot) {
  const auto dir = tiny_dir();
  ServerProcess server = tiny_server("", "serve_logprobs");
  ASSERT_GT(server.port(), 0);
  httplib::Client c = client_of(server);
  std::string cli_out;
  ASSERT_EQ(test::run_command(std::string(TESSERA_BINARY) + " generate -m " + dir.string() +
                                  " -p \"Once upon a time\" --gen-length 32 --block-length 8 --steps 32 "
                                  "--temperature 0.8 --seed 5 --logprobs 3 --json 2>/dev/null",
                              &cli_out),
            0);
  const json cli = json::parse(cli_out);
  const json& want = cli["logprobs"];
  ASSERT_EQ(want.size(), cli["tokens"].size());
  ASSERT_GT(want.size(), 0u);

  const json req = {{"prompt", "Once upon a time"}, {"max_tokens", 32}, {"block_length", 8},
                    {"temperature", 0.8},           {"seed", 5},        {"logprobs", 3}};
  const json got = post(c, "/v1/completions", req.dump(), 200);
  const json& lp = got["choices"][0]["logprobs"];
  EXPECT_EQ(got["choices"][0]["text"], cli["text"]);
  ASSERT_EQ(lp["tokens"].size(), want.size());
  std::string joined;
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("token " + std::to_string(i));
    EXPECT_EQ(lp["tokens"][i], want[i]["text"]);
    EXPECT_EQ(lp["token_logprobs"][i], want[i]["logprob"]);
    EXPECT_EQ(lp["text_offset"][i], joined.size());
    joined += lp["tokens"][i].get<std::string>();
    ASSERT_EQ(lp["top_logprobs"][i].size(), 3u);
    for (const json& t : want[i]["top"])
      EXPECT_EQ(lp["top_logprobs"][i][t["text"].get<std::string>()], t["logprob"]);
  }
  EXPECT_EQ(joined, cli["text"]);

  // Streamed: every token's values once, in order, the same as above.
  json sreq = req;
  sreq["stream"] = true;
  auto r = c.Post("/v1/completions", sreq.dump(), "application/json");
  ASSERT_TRUE(r);
  std::vector<std::string> toks;
  std::vector<double> vals;
  for (const std::string& e : events(r->body)) {
    if (e == "[DONE]") continue;
    const json j = json::parse(e);
    const json& l = j["choices"][0]["logprobs"];
    for (size_t i = 0; i < l["tokens"].size(); ++i) {
      EXPECT_EQ(l["text_offset"][i], std::accumulate(toks.begin(), toks.end(), std::string()).size());
      toks.push_back(l["tokens"][i]);
      vals.push_back(l["token_logprobs"][i]);
    }
  }
  EXPECT_EQ(json(toks), lp["tokens"]);
  EXPECT_EQ(json(vals), lp["token_logprobs"]);

  // Chat: the same values; the bytes of the tokens make the content.
  const json creq = {{"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}},
                     {"max_tokens", 32},
                     {"block_length", 8},
                     {"temperature", 0.8},
                     {"seed", 5},
                     {"logprobs", true},
                     {"top_logprobs", 2}};
  const json chat = post(c, "/v1/chat/completions", creq.dump(), 200);
  const json& content = chat["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), want.size());
  std::string bytes;
  for (size_t i = 0; i < content.size(); ++i) {
    EXPECT_EQ(content[i]["logprob"], want[i]["logprob"]);
    ASSERT_EQ(content[i]["top_logprobs"].size(), 2u);
    EXPECT_EQ(content[i]["top_logprobs"][0]["logprob"], want[i]["top"][0]["logprob"]);
    for (const json& b : content[i]["bytes"]) bytes.push_back(static_cast<char>(b.get<int>()));
  }
  EXPECT_EQ(bytes, chat["choices"][0]["message"]["content"]);
  // Without logprobs the field is null, as OpenAI's.
  json plain = creq;
  plain.erase("logprobs");
  plain.erase("top_logprobs");
  EXPECT_TRUE(post(c, "/v1/chat/completions", plain.dump(), 200)["choices"][0]["logprobs"].is_null());

  expect_refused(c, "/v1/completions", {{"prompt", "a"}, {"logprobs", 21}},
                 "'logprobs' must be an integer in [0, 20]");
  expect_refused(c, "/v1/completions", {{"prompt", "a"}, {"logprobs", true}},
                 "'logprobs' must be an integer");
  expect_refused(c, "/v1/completions", {{"prompt", "a"}, {"echo", true}}, "'echo' is not supported");
  expect_refused(c, "/v1/chat/completions",
                 {{"messages", {{{"role", "user"}, {"content", "a"}}}}, {"top_logprobs", 2}},
                 "'top_logprobs' needs 'logprobs': true");
  expect_refused(
      c, "/v1/chat/completions",
      {{"messages", {{{"role", "user"}, {"content", "a"}}}}, {"logprobs", true}, {"top_logprobs", -1}},
      "'top_logprobs' must be in [0, 20]");
}

// Chat content as OpenAI's array of text parts is the same as their texts joined by newlines; other part
// types are refused; the developer role is a system message. (The server runs with --batch-wait 0.)
TEST(Serve, ChatContentPartsAndTheDeveloperRole) {
  ServerProcess server = tiny_server(" --batch-wait 0", "serve_parts");
  ASSERT_GT(server.port(), 0);
  httplib::Client c = client_of(server);
  auto chat = [&](const json& messages) {
    const json req = {{"messages", messages}, {"max_tokens", 16}, {"block_length", 8}, {"seed", 2}};
    return post(c, "/v1/chat/completions", req.dump(), 200)["choices"][0]["message"]["content"];
  };
  const json parts = {
      {{"role", "developer"}, {"content", {{{"type", "text"}, {"text", "Be brief."}}}}},
      {{"role", "user"},
       {"content", {{{"type", "text"}, {"text", "Once upon"}}, {{"type", "text"}, {"text", "a time"}}}}}};
  const json plain = {{{"role", "system"}, {"content", "Be brief."}},
                      {{"role", "user"}, {"content", "Once upon\na time"}}};
  const json want = chat(plain);
  EXPECT_FALSE(want.get<std::string>().empty());
  EXPECT_EQ(chat(parts), want);
  // A different text gives a different answer (the parts are read, not dropped).
  EXPECT_NE(chat({{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "The dog"}}}}}}), want);
  auto refused = [&](const json& messages, const std::string& msg) {
    expect_refused(c, "/v1/chat/completions", {{"messages", messages}}, msg);
  };
  refused({{{"role", "user"}, {"content", {{{"type", "image_url"}, {"image_url", {{"url", "x"}}}}}}}},
          "content parts of type 'image_url' are not supported");
  refused({{{"role", "user"}, {"content", {{{"type", "text"}}}}}},
          "a text content part needs a string 'text'");
  refused({{{"role", "user"}, {"content", {"hi"}}}}, "every content part needs a string 'type'");
  refused({{{"role", "user"}, {"content", 3}}}, "a 'content' (a string or an array of text parts)");
  refused({{{"role", "robot"}, {"content", "x"}}},
          "message role must be system, developer, user, assistant or tool");
  refused({{{"role", "tool"}, {"content", "x"}}}, "'messages[0].tool_call_id' is required in a tool message");
}

// A completions "prompt" may be several prompts, and token ids: choice p * n + i is prompt p's choice i,
// the same as the request of that prompt alone; token ids generate what their text does (BOS included
// as the model's config gives it); the usage counts every prompt once. Streamed, each choice's deltas
// make its text. Bad prompts are refused.
TEST(Serve, CompletionsTakeSeveralPromptsAndTokenIds) {
  const auto dir = tiny_dir();
  ServerProcess server = tiny_server("", "serve_prompts");
  ASSERT_GT(server.port(), 0);
  httplib::Client c = client_of(server);
  const json base = {{"max_tokens", 16}, {"block_length", 8}, {"temperature", 1.0}, {"seed", 9}, {"n", 2}};
  auto with = [&](const json& prompt) {
    json r = base;
    r["prompt"] = prompt;
    return r;
  };
  const std::vector<std::string> texts = {"Once upon a time", "The dog"};
  std::vector<json> alone;
  size_t prompt_tokens = 0;
  for (const std::string& t : texts) {
    alone.push_back(post(c, "/v1/completions", with(t).dump(), 200));
    prompt_tokens += alone.back()["usage"]["prompt_tokens"].get<size_t>();
  }
  const json both = post(c, "/v1/completions", with(texts).dump(), 200);
  ASSERT_EQ(both["choices"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(both["choices"][i]["index"], i);
    EXPECT_EQ(both["choices"][i]["text"], alone[i / 2]["choices"][i % 2]["text"]) << i;
  }
  EXPECT_EQ(both["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_NE(alone[0]["choices"][0]["text"], alone[1]["choices"][0]["text"]);

  // Token ids: the tokenizer's ids of the text, with the BOS the string prompt got.
  const auto tok = Tokenizer::from_file(dir / "tokenizer.json");
  std::ifstream cf(dir / "config.json");
  const int32_t bos = json::parse(cf)["bos_token_id"];
  std::vector<int32_t> ids = tok.encode(texts[1]);
  if (alone[1]["usage"]["prompt_tokens"].get<size_t>() == ids.size() + 1) ids.insert(ids.begin(), bos);
  ASSERT_EQ(alone[1]["usage"]["prompt_tokens"].get<size_t>(), ids.size());
  const json by_ids = post(c, "/v1/completions", with(ids).dump(), 200);
  EXPECT_EQ(by_ids["choices"][1]["text"], alone[1]["choices"][1]["text"]);
  const json mixed = post(c, "/v1/completions", with(json::array({ids, texts[0]})).dump(), 200);
  EXPECT_EQ(mixed["choices"][0]["text"], alone[1]["choices"][0]["text"]);
  EXPECT_EQ(mixed["choices"][3]["text"], alone[0]["choices"][1]["text"]);

  // Streamed: the deltas of each index make its text.
  json sreq = with(texts);
  sreq["stream"] = true;
  auto r = c.Post("/v1/completions", sreq.dump(), "application/json");
  ASSERT_TRUE(r);
  std::vector<std::string> streamed(4);
  for (const std::string& e : events(r->body)) {
    if (e == "[DONE]") continue;
    const json j = json::parse(e);
    streamed[j["choices"][0]["index"].get<size_t>()] += j["choices"][0]["text"].get<std::string>();
  }
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(streamed[i], both["choices"][i]["text"]) << i;

  auto refused = [&](const json& prompt, const std::string& msg) {
    expect_refused(c, "/v1/completions", with(prompt), msg);
  };
  refused(json::array(), "'prompt' must be a string, an array of token ids");
  refused(json::array({"a", 3}), "'prompt' must be a string, an array of token ids");
  refused(json::array({json::array()}), "a token-id prompt must not be empty");
  refused(json::array({1, 99999}), "token id 99999 of the prompt is outside the model's vocabulary");
  refused(json::array({1, -2}), "token id -2 of the prompt is out of range");
  refused(std::vector<std::string>(40, "a"), "at most 64 choices in all (prompts x n), got 40 x 2");
}

// Concurrent requests share packed forwards (--batch) and each gets what it gets alone: completions
// and streams with their own prompts, seeds and samplers, and a KV-cache request (which runs alone).
TEST(Serve, ConcurrentRequestsAreBatchedAndAnswerAsAlone) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 1");
  const auto tmp = test::temp_dir("serve-batch");
  ServerProcess server("-m " + dir.string() + " --batch 4", tmp);
  ASSERT_GT(server.port(), 0);
  std::vector<json> reqs;
  for (int i = 0; i < 6; ++i) {
    json r = {{"prompt", "story " + std::to_string(i)}, {"max_tokens", 32}, {"block_length", 8}, {"seed", i}};
    if (i % 2 == 1) r["temperature"] = 0.8;
    if (i == 2) r["alg"] = "entropy", r["top_p"] = 0.9;
    if (i == 3) r["stream"] = true;
    if (i == 4) r["cache"] = "dual";
    reqs.push_back(r);
  }
  // The text of one request's response (a stream's deltas concatenated).
  auto text_of = [&](const json& r) {
    httplib::Client c = client_of(server);
    auto res = c.Post("/v1/completions", r.dump(), "application/json");
    if (!res || res->status != 200) return std::string("no 200 response: ") + (res ? res->body : "none");
    if (!r.contains("stream")) return json::parse(res->body)["choices"][0]["text"].get<std::string>();
    std::string t;
    const auto ev = events(res->body);
    for (size_t i = 0; i + 1 < ev.size(); ++i)
      t += json::parse(ev[i])["choices"][0]["text"].get<std::string>();
    return t;
  };
  std::vector<std::string> alone;
  for (const json& r : reqs) alone.push_back(text_of(r));
  std::vector<std::string> together(reqs.size());
  std::vector<std::thread> th;
  std::atomic<int> ready{0};
  for (size_t i = 0; i < reqs.size(); ++i) {
    th.emplace_back([&, i] {
      ++ready;
      while (ready.load() < static_cast<int>(reqs.size())) std::this_thread::yield();
      together[i] = text_of(reqs[i]);
    });
  }
  for (auto& t : th) t.join();
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(together[i], alone[i]) << reqs[i].dump();
    EXPECT_EQ(alone[i].find("no 200"), std::string::npos) << alone[i];
  }
  httplib::Client c("127.0.0.1", server.port());
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  const json b = json::parse(h->body)["batch"];
  EXPECT_EQ(b["max"], 4);
  EXPECT_GT(b["largest"].get<int>(), 1) << h->body;
  EXPECT_LE(b["largest"].get<int>(), 4) << h->body;
  EXPECT_GT(b["sequences"].get<int>(), b["forwards"].get<int>()) << h->body;
}

// More requests in flight than httplib's default pool of 8 threads: with --batch 12, twelve concurrent
// requests share forwards of more than 8 sequences (each connection needs a worker thread of its own).
TEST(Serve, BatchesLargerThanEightRequests) {
  TESSERA_TINY_OR_SKIP(dir, "llada", "--seed 1");
  const auto tmp = test::temp_dir("serve-batch12");
  ServerProcess server("-m " + dir.string() + " --batch 12", tmp);
  ASSERT_GT(server.port(), 0);
  const int n = 12;
  std::vector<std::thread> th;
  std::atomic<int> ready{0}, ok{0};
  for (int i = 0; i < n; ++i) {
    th.emplace_back([&, i] {
      httplib::Client c = client_of(server, 120);
      const json r = {{"prompt", "story " + std::to_string(i)}, {"max_tokens", 64}, {"block_length", 8}};
      ++ready;
      while (ready.load() < n) std::this_thread::yield();
      auto res = c.Post("/v1/completions", r.dump(), "application/json");
      if (res && res->status == 200) ++ok;
    });
  }
  for (auto& t : th) t.join();
  EXPECT_EQ(ok.load(), n);
  httplib::Client c("127.0.0.1", server.port());
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  const json b = json::parse(h->body)["batch"];
  EXPECT_GT(b["largest"].get<int>(), 8) << h->body;
  EXPECT_LE(b["largest"].get<int>(), 12) << h->body;
}

// Infilling: a completion's `suffix` follows the generated span in every forward; the text is the span,
// as `tessera generate --suffix` gives it, streamed or not; the suffix changes the fill; chat completions
// and the combinations the engine cannot honour get 400s.
TEST(Serve, CompletionsInfillBeforeTheSuffix) {
  const auto dir = tiny_dir();
  ServerProcess server = tiny_server("", "serve_suffix");
  ASSERT_GT(server.port(), 0);
  httplib::Client c = client_of(server);
  const std::string prompt = "Once upon a time, there was a", suffix = " and they lived happily ever after.";
  std::string cli_out;
  ASSERT_EQ(
      test::run_command(std::string(TESSERA_BINARY) + " generate -m " + dir.string() + " -p \"" + prompt +
                            "\" --suffix \"" + suffix + "\" --gen-length 16 --steps 16 --json 2>/dev/null",
                        &cli_out),
      0);
  const json cli = json::parse(cli_out);
  json req = {{"prompt", prompt}, {"suffix", suffix}, {"max_tokens", 16}};
  const json got = post(c, "/v1/completions", req.dump(), 200);
  EXPECT_EQ(got["choices"][0]["text"], cli["text"]);
  ASSERT_GT(cli["suffix_tokens"].get<size_t>(), 0u);
  EXPECT_EQ(got["usage"]["prompt_tokens"],
            cli["prompt_tokens"].get<size_t>() + cli["suffix_tokens"].get<size_t>());
  req["stream"] = true;
  auto s = c.Post("/v1/completions", req.dump(), "application/json");
  ASSERT_TRUE(s);
  const auto ev = events(s->body);
  ASSERT_GE(ev.size(), 2u);
  std::string streamed;
  for (size_t i = 0; i + 1 < ev.size(); ++i)
    streamed += json::parse(ev[i])["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(streamed, cli["text"]);
  const json plain = post(c, "/v1/completions", json{{"prompt", prompt}, {"max_tokens", 16}}.dump(), 200);
  EXPECT_NE(plain["choices"][0]["text"], got["choices"][0]["text"]) << "the suffix changed nothing";
  expect_refused(c, "/v1/chat/completions",
                 {{"messages", {{{"role", "user"}, {"content", "a"}}}}, {"suffix", "b"}},
                 "'suffix' is a completions field");
  expect_refused(c, "/v1/completions", {{"prompt", "a"}, {"suffix", 3}}, "'suffix' must be a string");
  expect_refused(c, "/v1/completions", {{"prompt", "a"}, {"suffix", "b<|mdm_mask|>c"}},
                 "'suffix' holds the mask token");
  expect_refused(c, "/v1/completions", {{"prompt", "a"}, {"suffix", "b"}, {"window_early_stop", true}},
                 "window-early-stop cannot be combined with a suffix");
  std::string long_suffix;
  for (int i = 0; i < 600; ++i) long_suffix += " the";  // 600 tokens or more, past the context of 512
  expect_refused(c, "/v1/completions", {{"prompt", "a"}, {"suffix", long_suffix}}, "plus the suffix of");
}

// /tokenize and /detokenize (llama.cpp's server format): the model's tokenizer, BOS on request where the
// model adds one, pieces that concatenate to the text, and back; bad bodies get 400s.
TEST(Serve, TokenizeAndDetokenize) {
  ServerProcess server = tiny_server("", "serve_tokenize");
  ASSERT_GT(server.port(), 0);
  httplib::Client c = client_of(server);
  const Tokenizer tok = Tokenizer::from_file(tiny_dir() / "tokenizer.json");
  const std::string text = "Once upon a time, \"caf\u00e9\" <|endoftext|>";
  const std::vector<int32_t> want = tok.encode(text);
  const json t = post(c, "/tokenize", json{{"content", text}}.dump(), 200);
  EXPECT_EQ(t["tokens"].get<std::vector<int32_t>>(), want);
  EXPECT_EQ(want.back(), 4088) << "the special token's text is its id, as in a prompt";
  const json b = post(c, "/tokenize", json{{"content", text}, {"add_special", true}}.dump(), 200);
  ASSERT_EQ(b["tokens"].size(), want.size() + 1);  // tessera-tiny adds its BOS (4089) to raw prompts
  EXPECT_EQ(b["tokens"][0], 4089);
  const json p = post(c, "/tokenize", json{{"content", text}, {"with_pieces", true}}.dump(), 200);
  std::string joined;  // a piece that is part of a character comes as its bytes
  int byte_pieces = 0;
  for (const json& e : p["tokens"]) {
    if (e["piece"].is_string()) {
      joined += e["piece"].get<std::string>();
      continue;
    }
    ++byte_pieces;
    for (const json& ch : e["piece"]) joined += static_cast<char>(ch.get<int>());
  }
  EXPECT_EQ(joined, text);
  EXPECT_GT(byte_pieces, 0) << "the test did not test pieces inside a character";
  const json d = post(c, "/detokenize", json{{"tokens", want}}.dump(), 200);
  EXPECT_EQ(d["content"], text);
  expect_refused(c, "/tokenize", {{"text", "a"}}, "unknown field 'text'");
  expect_refused(c, "/tokenize", {{"content", 5}}, "'content' must be a string");
  expect_refused(c, "/detokenize", {{"tokens", {1, 4096}}},
                 "token id 4096 is outside the model's vocabulary");
  expect_refused(c, "/detokenize", {{"tokens", {1, -1}}}, "token id -1 is outside");
  expect_refused(c, "/detokenize", {{"tokens", "1 2"}}, "'tokens' must be an array of token ids");
  auto r = c.Post("/tokenize", "[1,", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
}

}  // namespace
}  // namespace tessera
