#include "runtime/session.h"

#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/utf8.h"
#include "dist/communicator.h"
#include "engine/request_budget.h"
#include "memory/chunk_optimizer.h"

namespace tessera {
namespace fs = std::filesystem;
using json = nlohmann::json;

std::string default_model_dir() {
  // Where it is looked for, in order: $TESSERA_MODEL, ./models, beside an installed binary
  // (PREFIX/bin/tessera: PREFIX/share/tessera/models), beside a build directory in the source tree
  // (build/tessera: models), and the source tree this binary was built from.
  if (const char* env = std::getenv("TESSERA_MODEL"); env != nullptr && *env != '\0') {
    if (!fs::exists(fs::path(env) / "config.json") && !fs::is_regular_file(env))
      fail(std::string("TESSERA_MODEL=") + env + " is neither a model directory (no config.json) nor a file");
    return env;
  }
  std::vector<fs::path> roots = {fs::current_path() / "models"};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    roots.push_back(exe.parent_path().parent_path() / "share/tessera/models");
    roots.push_back(exe.parent_path().parent_path() / "models");
  }
#ifdef TESSERA_SOURCE_MODELS
  roots.emplace_back(TESSERA_SOURCE_MODELS);
#endif
  for (const auto& r : roots) {
    if (fs::exists(r / "tessera-tiny/config.json", ec)) return (r / "tessera-tiny").string();
  }
  fail(
      "no model given (-m) and the default model tessera-tiny was not found in ./models, beside the binary "
      "or in $TESSERA_MODEL");
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

void check_utf8(const std::string& s, const char* what) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_char_length(s, i);
    if (n == 0)
      fail(std::string(what) + " is not valid UTF-8 (bad byte at offset " + std::to_string(i) + ")");
    i += n;
  }
}

// One GPU per rank: the launcher's processes on this host each see their own, by CUDA_VISIBLE_DEVICES
// (set before CUDA starts in this process: the backend then uses device 0). A list the user gave is
// shared out in order; without one, local rank r gets device r.
void pin_local_gpu() {
  const int local = dist::launcher_local_rank(), n = dist::launcher_local_size();
  if (n <= 1) return;
  const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
  std::string pick = std::to_string(local);
  if (env != nullptr && *env != '\0') {
    std::vector<std::string> ids;
    std::string cur;
    for (const char* p = env;; ++p) {
      if (*p == ',' || *p == '\0') {
        if (!cur.empty()) ids.push_back(cur);
        cur.clear();
        if (*p == '\0') break;
      } else {
        cur += *p;
      }
    }
    if (ids.size() == 1) return;  // one device listed: the user pinned this process already
    if (static_cast<int>(ids.size()) < n)
      fail("CUDA_VISIBLE_DEVICES lists " + std::to_string(ids.size()) + " devices for the " +
           std::to_string(n) + " ranks on this host: list one per rank, or none");
    pick = ids[static_cast<size_t>(local)];
  }
  ::setenv("CUDA_VISIBLE_DEVICES", pick.c_str(), 1);
}

// The ranks of --tp / --ep: MPI's world, which must have exactly max(tp, ep) processes (null for one).
std::shared_ptr<dist::Communicator> parallel_communicator(int tp, int ep, const std::string& device,
                                                          double timeout_s) {
  if (tp < 1 || ep < 1) fail("--tp and --ep must be at least 1");
  const int ranks = std::max(tp, ep), launched = dist::launcher_size();
  const std::string layout = "--tp " + std::to_string(tp) + (ep > 1 ? " --ep " + std::to_string(ep) : "");
  if (ranks == 1) {
    if (launched > 1)
      fail("this process is one of " + std::to_string(launched) +
           " started by the launcher, but --tp is 1: give --tp " + std::to_string(launched) + " or --ep " +
           std::to_string(launched) + " (or run one process)");
    return nullptr;
  }
  if (launched != ranks)
    fail(layout + " needs " + std::to_string(ranks) + " processes, one per rank: run mpirun -np " +
         std::to_string(ranks) + " tessera ... " + layout + " (this job has " + std::to_string(launched) +
         ")");
  if (device == "cuda") pin_local_gpu();  // (the engine builds NCCL over MPI's world)
  std::string why;
  auto comm = dist::mpi_world(timeout_s, &why);
  if (!comm) fail(layout + ": " + why);
  if (comm->size() != ranks) fail(layout + ": MPI's world has " + std::to_string(comm->size()) + " ranks");
  return comm;
}

namespace {

// A byte count every rank plans with: the largest of the ranks' (their processes measure slightly different
// runtimes, and ranks whose budgets chunked a step differently would sum rows that do not match).
size_t agreed_bytes(dist::Communicator* comm, size_t mine) {
  if (comm == nullptr || comm->size() == 1) return mine;
  std::vector<uint64_t> all(static_cast<size_t>(comm->size()));
  const uint64_t v = mine;
  comm->all_gather(&v, all.data(), sizeof(v));
  return static_cast<size_t>(*std::max_element(all.begin(), all.end()));
}

}  // namespace

Session::Session(const LoadOptions& lo) {
  dir_ = lo.model.empty() ? default_model_dir() : lo.model;
  check_model_path(dir_);
  if (lo.threads < 0)
    fail("threads must be >= 0 (0: OMP_NUM_THREADS or every core), got " + std::to_string(lo.threads));
  if (lo.threads > 0) omp_set_num_threads(lo.threads);
  EngineOptions eo;
  eo.device = lo.device;
  eo.memory_budget = lo.memory_budget;
  eo.comm = parallel_communicator(lo.tp, lo.ep, lo.device, lo.dist_timeout);
  eo.tp = lo.tp;
  eo.ep = lo.ep;
  // The budget bounds the process: what it holds before the model (libraries, threads) is counted in it,
  // and below the tokenizer's share.
  if (lo.memory_budget > 0) eo.runtime_bytes = agreed_bytes(eo.comm.get(), process_memory().rss);
  eo.prefix_cache_bytes = lo.prefix_cache;
  eo.precision = lo.precision;
  eo.dequantize = lo.dequantize;
  engine_ = Engine::load(dir_, eo);
  const size_t before_tokenizer = lo.memory_budget > 0 ? process_memory().rss : 0;
  tok_ = load_model_tokenizer(dir_);
  if (lo.memory_budget > 0) {
    const size_t after = process_memory().rss;
    engine_->add_runtime_bytes(
        agreed_bytes(eo.comm.get(), after > before_tokenizer ? after - before_tokenizer : 0));
  }
  const auto token_text = [&](int64_t id) {
    return id >= 0 && static_cast<size_t>(id) < tok_->vocab_size()
               ? tok_->token_text(static_cast<int32_t>(id))
               : std::string();
  };
  chat_ = ChatTemplate::for_model(dir_, token_text(engine_->config().bos_id),
                                  token_text(engine_->config().eos_id), lo.chat_template_file);
  if (chat_.builtin()) {
    // A built-in template whose marker tokens the vocabulary lacks cannot be what the model was tuned on.
    const ChatFamily family = detect_chat_family(dir_);
    const char* marker = family == ChatFamily::LladaInstruct ? "<|start_header_id|>"
                         : family == ChatFamily::ChatML      ? "<|im_start|>"
                         : family == ChatFamily::LladaMoE    ? "<|role_end|>"
                         : family == ChatFamily::Gemma4      ? "<|turn>"
                                                             : nullptr;
    if (marker != nullptr && tok_->token_id(marker) < 0) chat_ = ChatTemplate();
  }
  add_bos_ = model_adds_bos(dir_) && engine_->config().bos_id >= 0;
  model_block_ = engine_->attention_block();
  // The most text a prompt that fits the context can hold: every token covers at most its own text (4x
  // for what a normalizer may shrink); longer text is refused before it is tokenized.
  size_t longest = 1;
  for (size_t id = 0; id < tok_->vocab_size(); ++id) {
    try {
      longest = std::max(longest, tok_->token_text(static_cast<int32_t>(id)).size());
    } catch (const Error&) {  // a gap in the ids
    }
  }
  max_prompt_bytes_ = static_cast<size_t>(engine_->config().max_positions) * longest * 4;
  // Defaults: the model's generation_config.json (tessera keys), then LLaDA's defaults.
  const fs::path gc_path = fs::path(dir_) / "generation_config.json";
  const json gc = read_json_or_empty(gc_path);
  // Typed reads of its tessera keys: a wrong type or range names the file and the key.
  auto gc_int = [&](const char* key) -> std::optional<int> {
    if (!gc.contains(key)) return std::nullopt;
    const json& v = gc[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      fail(gc_path.string() + ": '" + key + "' must be a non-negative integer");
    return v.get<int>();
  };
  gc_gen_length_ = gc_int("gen_length");
  gc_block_length_ = gc_int("block_length");
  gc_steps_ = gc_int("steps");
  auto num = [](double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", x);
    return std::string(b);
  };
  auto gc_float = [&](const char* key, double low, double high) -> std::optional<float> {
    if (!gc.contains(key)) return std::nullopt;
    const json& v = gc[key];
    if (!v.is_number() || !(v.get<double>() >= low && v.get<double>() <= high))
      fail(gc_path.string() + ": '" + key + "' must be a number in [" + num(low) + ", " + num(high) + "]");
    return v.get<float>();
  };
  gc_threshold_ = gc_float("threshold", -3.4e38, 3.4e38);
  // The sampling keys transformers' generation_config.json shares (temperature, top_p, top_k) and
  // tessera's repetition penalty (edit_penalty: SGLang's 2-gram penalty).
  gc_temperature_ = gc_float("temperature", 0.0, 100.0);
  gc_top_p_ = gc_float("top_p", 0.0, 1.0);
  gc_edit_penalty_ = gc_float("edit_penalty", 0.0, 100.0);
  gc_top_k_ = gc_int("top_k");
  if (gc.contains("alg")) {
    if (!gc["alg"].is_string()) fail(gc_path.string() + ": 'alg' must be a string");
    gc_alg_ = gc["alg"].get<std::string>();
  }
  set_options(defaults());
  if (lo.memory_budget > 0) measure_runtime();
}

// With a budget, a first forward of a few tokens runs at load: what it leaves resident beyond its plan's
// workspace (threads' stacks, oneDNN's generated kernels and caches, the sampler's buffers) is the
// runtime's share of every later step, counted in the budget before any request is planned.
void Session::measure_runtime() {
  GenerateOptions w;
  w.gen_length = w.block_length = model_block_ > 0 ? model_block_ : 8;
  w.steps = 1;
  w.eos_ids = gen_.eos_ids;
  if (engine_->config().is_uniform()) {  // one step of one canvas of the model's own length
    w.mode = DecodeMode::Uniform;
    w.gen_length = w.block_length = gen_.block_length;
    w.uniform = gen_.uniform;
  }
  const std::vector<int32_t> prompt = encode_raw(*tok_, "tessera", add_bos_ ? engine_->config().bos_id : -1);
  // The heap's growth and the code the forward touches for the first time (the mapped weights are planned
  // as weights, the workspace as activations).
  const auto resident = [&] { return process_memory().anon + mapped_code_resident(dir_); };
  const size_t anon = resident(), budget = engine_->options().memory_budget;
  engine_->set_memory_budget(0);  // measured whatever the budget; a budget too small is the request's error
  generate(*engine_, prompt, w);
  const size_t after = resident(), ws = engine_->workspace_resident();
  engine_->set_memory_budget(budget);
  engine_->add_runtime_bytes(
      agreed_bytes(engine_->options().comm.get(), after > anon + ws ? after - anon - ws : 0));
}

GenerateOptions uniform_defaults(const ModelConfig& mc, int gen_length) {
  const ModelConfig::Uniform& u = mc.uniform;
  GenerateOptions g;
  g.mode = DecodeMode::Uniform;
  g.gen_length = gen_length;
  g.block_length = static_cast<int>(u.canvas);
  g.steps = u.steps;
  g.uniform = UniformSampling{u.t_min,     u.t_max,      u.entropy_bound,
                              u.stability, u.confidence, mc.pad_id >= 0 ? mc.pad_id : 0};
  g.eos_ids = u.eos_ids;
  return g;
}

GenerateOptions Session::defaults(std::optional<int> gen_length, std::optional<int> block_length,
                                  std::optional<int> steps, std::vector<std::string>* notes) const {
  GenerateOptions g;
  // The model's own layout first (generation_config.json, else LLaDA's: one block, a token per step;
  // block-causal models (LLaDA2MoeModelLM.generate): block_length 32, the model's attention block, steps
  // per block = block_length, threshold 0.95), then fitted to the length asked for.
  // Tri-mode models (Nemotron-Labs-Diffusion's generate): blocks of the trained block_size (32), steps
  // per block = block_length, threshold 0.9, the causal context.
  const ModelConfig& mc = engine_->config();
  if (mc.is_uniform()) {  // DiffusionGemma: generation_config.json's sampler, canvas after canvas
    g = uniform_defaults(mc, gen_length.value_or(static_cast<int>(mc.uniform.max_new_tokens)));
    g.block_length = block_length.value_or(g.block_length);
    g.steps = steps.value_or(g.steps);
    return g;
  }
  const int tri_block = mc.tri_mode ? static_cast<int>(std::max<int64_t>(mc.diffusion_block, 1)) : 0;
  const int model_block = model_block_ > 0 ? model_block_ : tri_block;
  g.gen_length = gc_gen_length_.value_or(128);
  g.block_length = gc_block_length_.value_or(model_block > 0 ? model_block : g.gen_length);
  g.steps = gc_steps_.value_or(model_block > 0 ? g.block_length : g.gen_length);
  fit_layout(g, gen_length.value_or(g.gen_length), block_length, steps, notes);
  g.threshold = gc_threshold_.value_or(model_block_ > 0 ? 0.95f : mc.tri_mode ? 0.9f : 0.0f);
  g.causal_context = mc.tri_mode;
  g.alg = default_alg();
  g.temperature = gc_temperature_.value_or(g.temperature);
  g.top_p = gc_top_p_.value_or(g.top_p);
  g.top_k = gc_top_k_.value_or(g.top_k);
  g.edit_penalty = gc_edit_penalty_.value_or(g.edit_penalty);
  g.moe_stats = engine_->supports_expert_sharing();  // the live view and --json report unique experts
  const ModelConfig& c = engine_->config();
  if (c.eos_id >= 0) g.eos_ids.push_back(c.eos_id);
  for (const char* extra : {"<|eot_id|>", "<|im_end|>", "<|role_end|>"}) {
    const int32_t id = tok_->token_id(extra);
    if (id >= 0 && id < c.vocab) g.eos_ids.push_back(id);
  }
  return g;
}

Unmask Session::default_alg() const {
  return parse_unmask(gc_alg_.value_or(
      engine_->config().family == Family::Dream && !engine_->config().causal ? "entropy" : "low_confidence"));
}

void Session::fit_layout(GenerateOptions& g, int gen_length, std::optional<int> block_length,
                         std::optional<int> steps, std::vector<std::string>* notes) const {
  auto note = [&](const std::string& n) {
    if (notes != nullptr) notes->push_back(n);
  };
  const double steps_per_token =
      g.gen_length > 0 ? static_cast<double>(g.steps) / static_cast<double>(g.gen_length) : 1.0;
  const int base_block = g.block_length;
  g.gen_length = gen_length;
  // The attention block is the model's (block-causal), or steps count per canvas (uniform noise): neither
  // scales with the length; validation names bad values.
  if (block_causal() || g.mode == DecodeMode::Uniform || gen_length <= 0) {
    if (block_length) g.block_length = *block_length;
    if (steps) g.steps = *steps;
    return;
  }
  const int n = gen_length;
  if (steps && *steps > n) {
    note("steps " + std::to_string(*steps) + " is more than gen-length " + std::to_string(n) +
         ": at most one token per step, so " + std::to_string(n) + " steps run");
    steps = n;
  }
  if (block_length) {
    g.block_length = *block_length;
  } else if (base_block >= n) {
    g.block_length = n;
  } else {
    // The largest divisor of n up to the model's block (that also divides the given steps into whole
    // blocks), if it is at least half the model's block; else one block.
    int best = n;
    for (int d = base_block; d >= std::max(1, (base_block + 1) / 2); --d) {
      if (n % d == 0 && (!steps || *steps % (n / d) == 0)) {
        best = d;
        break;
      }
    }
    g.block_length = best;
    if (best != base_block)
      note("block-length " + std::to_string(best) + (best == n ? " (one block)" : "") + ": gen-length " +
           std::to_string(n) + " is not a multiple of the model's block-length " +
           std::to_string(base_block) + " (--block-length sets it)");
  }
  const int blocks = g.block_length >= n || g.block_length <= 0 ? 1 : n / g.block_length;
  if (steps) {
    g.steps = *steps;
    return;
  }
  const int want = std::clamp(static_cast<int>(std::lround(steps_per_token * n)), 1, n);
  g.steps = std::min(n, (want + blocks - 1) / blocks * blocks);
}

void Session::set_options(const GenerateOptions& o) {
  validate_generate_options(o, engine_->config().vocab, block_causal());
  gen_ = o;
}

std::string Session::chat_text(const std::vector<ChatMessage>& msgs, bool add_generation_prompt) const {
  for (const auto& m : msgs) check_utf8(m.content, "a message");
  return templated(msgs, add_generation_prompt);
}

std::string Session::templated(const std::vector<ChatMessage>& msgs, bool add_generation_prompt) const {
  if (chat_.empty()) fail(dir_ + " has no chat template (use --raw)");
  Conversation c = Conversation::of(msgs, add_generation_prompt);
  c.enable_thinking = thinking_;
  return chat_.render(c);
}

void Session::set_thinking(std::optional<bool> on) {
  if (on && !chat_.takes_thinking())
    fail(dir_ + "'s chat template has no thinking switch (enable_thinking); drop --think");
  thinking_ = on;
}

std::shared_ptr<const TokenConstraint> Session::json_output(std::shared_ptr<const JsonGrammar> grammar,
                                                            std::string suffix) const {
  std::call_once(vocab_once_, [&] { vocab_bytes_ = VocabBytes::of(*tok_, engine_->config().vocab); });
  return json_constraint(std::move(grammar), vocab_bytes_, gen_.eos_ids, std::move(suffix));
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
  return tessera::canvas_length(prompt_len, o, block_causal());
}

void Session::check_prompt_bytes(size_t bytes) const {
  if (bytes > max_prompt_bytes_)
    fail("the prompt of " + std::to_string(bytes) + " bytes exceeds the model's context of " +
         std::to_string(engine_->config().max_positions) + " tokens whatever its tokens (at most " +
         std::to_string(max_prompt_bytes_) + " bytes can fit); it was not tokenized");
}

std::vector<int32_t> Session::prompt_ids(const std::vector<ChatMessage>& msgs, bool use_chat,
                                         const GenerateOptions& o) const {
  size_t bytes = 0;
  for (const auto& m : msgs) bytes += m.content.size();
  check_prompt_bytes(bytes);
  std::vector<int32_t> ids = encode_messages(msgs, use_chat);
  check_prompt(ids, o, true);
  return ids;
}

std::vector<int32_t> Session::prompt_ids(const Conversation& c, const std::string& reply_start,
                                         const GenerateOptions& o, std::string* text_out) const {
  if (chat_.empty()) fail(dir_ + " has no chat template (use --raw)");
  // The messages' text was checked when it was parsed; the bound on bytes is checked on the rendered text.
  const std::string text = chat_.render(c) + reply_start;
  check_prompt_bytes(text.size());
  std::vector<int32_t> ids = tok_->encode(text);
  check_prompt(ids, o, true);
  if (text_out != nullptr) *text_out = text;
  return ids;
}

std::vector<int32_t> Session::encode_messages(const std::vector<ChatMessage>& msgs, bool use_chat) const {
  for (const auto& m : msgs) check_utf8(m.content, "the prompt");
  std::vector<int32_t> ids;
  if (use_chat) {
    ids = tok_->encode(templated(msgs, true));  // the messages were checked above
  } else {
    std::string text;
    for (const auto& m : msgs) text += m.content;
    ids = encode_raw(*tok_, text, add_bos_ ? engine_->config().bos_id : -1);
  }
  return ids;
}

void Session::check_vocab(std::span<const int32_t> ids, const std::string& of) const {
  for (const int32_t id : ids)
    if (id < 0 || id >= engine_->config().vocab)
      fail("token id " + std::to_string(id) + " " + of + "is outside the model's vocabulary [0, " +
           std::to_string(engine_->config().vocab) + ")");
}

void Session::check_length(size_t n, const GenerateOptions& o) const {
  if (!fits_context(n, o)) {
    const int64_t total = canvas_length(static_cast<int64_t>(n), o);
    fail("the prompt of " + std::to_string(n) + " tokens plus gen-length " + std::to_string(o.gen_length) +
         (o.suffix.empty() ? "" : " plus the suffix of " + std::to_string(o.suffix.size()) + " tokens") +
         (block_causal() ? " (padded to whole blocks: " + std::to_string(total) + ")" : "") +
         " exceeds the model's context of " + std::to_string(engine_->config().max_positions) + " tokens");
  }
  if (n == 0) fail("the prompt is empty and the model adds no BOS token: give a prompt with -p");
}

void Session::check_prompt(const std::vector<int32_t>& ids, const GenerateOptions& o, bool tokenized) const {
  check_length(ids.size(), o);
  if (!tokenized) return check_vocab(ids, "of the prompt ");
  for (const int32_t id : ids) {
    if (id >= 0 && id < engine_->config().vocab) continue;
    fail(dir_ + ": the tokenizer gave token " + std::to_string(id) + " (\"" + tok_->token_text(id) +
         "\"), outside the model's vocabulary of " + std::to_string(engine_->config().vocab) +
         " tokens: the tokenizer does not belong to this model");
  }
}

Session::Output Session::run(const std::vector<int32_t>& prompt, const GenerateOptions& g,
                             const std::function<void(const StepEvent&)>& on_step) {
  // The request is planned once: its state (KV cache, SparseD patterns, DES) is held open from here to
  // its end, and a memory budget is checked on its largest step before the first forward.
  RequestScope request(*engine_, plan_checked(prompt, g, engine_->config().vocab, block_causal()));
  check_request_budget(*engine_, request.plan());
  return timed(g, on_step,
               [&](const GenerateOptions& s, const StepFn& f) { return generate(request, prompt, s, f); });
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

Session::Output Session::timed(
    const GenerateOptions& g, const StepFn& on_step,
    const std::function<GenerateResult(const GenerateOptions&, const StepFn&)>& gen) const {
  GenerateOptions s = g;
  s.stop_when = stop_checker(*tok_, g.stop);  // generation ends once the decided tokens hold one
  Output o;
  const auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  std::vector<double> steps;  // each step's seconds, from the end of the one before
  o.result = gen(s, [&](const StepEvent& ev) {
    if (on_step) on_step(ev);
    const auto now = std::chrono::steady_clock::now();
    steps.push_back(std::chrono::duration<double>(now - last).count());
    last = now;
  });
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!steps.empty()) {
    o.first_step_seconds = steps.front();
    std::vector<double> later(steps.begin() + 1, steps.end());
    if (!later.empty()) {
      std::nth_element(later.begin(), later.begin() + static_cast<std::ptrdiff_t>(later.size() / 2),
                       later.end());
      o.steady_step_seconds = later[later.size() / 2];
    }
  }
  o.text = tok_->decode(o.result.tokens, true);
  o.stopped = cut_at_stop(*tok_, g.stop, o.result, o.text);
  return o;
}

Session::Output Session::run(Batcher& b, const std::vector<int32_t>& prompt, const GenerateOptions& g,
                             const std::function<void(const StepEvent&)>& on_step, uint64_t key) {
  Output o;
  if (b.max_batch() == 1 ||
      !plan_request(g, static_cast<int64_t>(prompt.size()), block_causal()).shares_forwards()) {
    if (!b.over_ranks()) {
      b.run([&] { o = run(prompt, g, on_step); }, true, key);
      return o;
    }
    // Over ranks the generation runs on every rank as an exclusive job; after each step, rank 0's
    // decision to stop (its on_step threw: a client gone, a timeout) is every rank's, so that the ranks'
    // collectives stay paired.
    const auto agreed = [&](const StepEvent& ev) {
      std::exception_ptr err;
      try {
        if (on_step) on_step(ev);
      } catch (...) {
        err = std::current_exception();
      }
      if (!b.agree_stop(err != nullptr)) return;
      if (err) std::rethrow_exception(err);
      fail("this request was ended by rank 0");
    };
    b.run([&] { o = run(prompt, g, agreed); }, true, key);
    return o;
  }
  return timed(g, on_step,
               [&](const GenerateOptions& s, const StepFn& f) { return b.generate(prompt, s, f, key); });
}

}  // namespace tessera
