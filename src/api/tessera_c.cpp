// The C API (include/tessera/tessera.h) over a Session (runtime/session.h): handles, status codes and
// the thread's last error, versioned option structs, and the translation of the C options into
// GenerateOptions. Nothing here decides how to generate: it is what the CLI does, behind C types.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "decode/generate.h"
#include "engine/batcher.h"
#include "engine/request_budget.h"
#include "io/config.h"
#include "memory/chunk_optimizer.h"
#include "runtime/session.h"
#include "tessera/tessera.h"

// Every forward of a model runs on its Batcher's engine thread, which lives as long as the model: calls
// from any thread share forwards where their plans allow, the others run alone on it (Session::run with a
// Batcher).
struct tessera_model {
  std::optional<tessera::Session> session;
  std::unique_ptr<tessera::Batcher> batcher;  // after session: stopped before it is destroyed
  int max_batch = 8;
  std::string path;
};

struct tessera_result {
  std::string text;
  std::vector<int32_t> tokens;
  tessera_finish_reason finish = TESSERA_FINISH_LENGTH;
  tessera_result_stats stats{};
  struct Logprob {
    float logprob = NAN;
    int32_t step = -1;
    std::vector<tessera_top_logprob> top;
  };
  std::vector<Logprob> logprobs;
  std::vector<tessera_edit> edits;
};

namespace {

using tessera::Error;
using tessera::GenerateOptions;
using tessera::Session;

thread_local std::string g_last_error;

// Thrown from the step callback when the caller's callback asks to stop.
struct Cancelled {};
// Thrown by copy_out when the caller's buffer cannot hold the answer (the size it needs is written).
struct BufferTooSmall {
  std::string message;
};

// Runs f, turning every exception into a status and the thread's last error.
template <class F>
tessera_status guard(tessera_status on_error, F&& f) {
  try {
    f();
    return TESSERA_OK;
  } catch (const Cancelled&) {
    g_last_error = "cancelled by the step callback";
    return TESSERA_ERROR_CANCELLED;
  } catch (const BufferTooSmall& b) {
    g_last_error = b.message;
    return TESSERA_ERROR_BUFFER_TOO_SMALL;
  } catch (const tessera::BudgetError& e) {
    g_last_error = e.what();
    return TESSERA_ERROR_MEMORY_BUDGET;
  } catch (const Error& e) {
    g_last_error = e.what();
    return on_error;
  } catch (const std::bad_alloc&) {
    g_last_error = "out of memory";
    return TESSERA_ERROR_INTERNAL;
  } catch (const std::exception& e) {
    g_last_error = e.what();
    return TESSERA_ERROR_INTERNAL;
  } catch (...) {
    g_last_error = "unknown error";
    return TESSERA_ERROR_INTERNAL;
  }
}

void need(const void* p, const char* what) {
  if (p == nullptr) tessera::fail(std::string(what) + " is NULL");
}

// The struct_size of a caller's versioned struct, refused when it does not hold the size field itself or
// is larger than this library's struct (a newer header).
template <class T>
uint32_t checked_size(const T& given, const char* what) {
  const uint32_t n = given.struct_size;
  if (n < sizeof(uint32_t) || n > sizeof(T))
    tessera::fail(std::string(what) + ".struct_size is " + std::to_string(n) + ", this library's is " +
                  std::to_string(sizeof(T)) + " (fill it with its _init function, or sizeof)");
  return n;
}

// A caller's versioned struct read into a full one of this library's layout: the fields within the
// caller's struct_size over `defaults`.
template <class T>
T versioned(const T* given, const T& defaults, const char* what) {
  T out = defaults;
  if (given == nullptr) return out;
  std::memcpy(&out, given, checked_size(*given, what));
  out.struct_size = sizeof(T);
  return out;
}

// Copies text into a caller's buffer with its NUL; BufferTooSmall, nothing written, when it does not fit.
void copy_out(const std::string& s, char* buf, size_t capacity, size_t* len) {
  need(len, "the length argument");
  *len = s.size();
  if (capacity <= s.size())
    throw BufferTooSmall{"the buffer holds " + std::to_string(capacity) + " bytes; the text needs " +
                         std::to_string(s.size() + 1) + " with its NUL"};
  std::memcpy(buf, s.data(), s.size());
  buf[s.size()] = '\0';
}

void copy_out(const std::vector<int32_t>& ids, int32_t* buf, size_t capacity, size_t* n) {
  need(n, "the count argument");
  *n = ids.size();
  if (capacity < ids.size())
    throw BufferTooSmall{"the buffer holds " + std::to_string(capacity) + " token ids; " +
                         std::to_string(ids.size()) + " are needed"};
  if (!ids.empty()) std::memcpy(buf, ids.data(), ids.size() * sizeof(int32_t));
}

std::vector<tessera::ChatMessage> messages(const tessera_chat_message* msgs, size_t n) {
  if (n > 0) need(msgs, "the messages");
  std::vector<tessera::ChatMessage> out;
  for (size_t i = 0; i < n; ++i) {
    need(msgs[i].role, "a message's role");
    need(msgs[i].content, "a message's content");
    out.push_back({msgs[i].role, msgs[i].content});
  }
  return out;
}

tessera_generate_options default_options(const Session& s) {
  const GenerateOptions g = s.defaults();
  tessera_generate_options o{};
  o.struct_size = sizeof o;
  o.gen_length = g.gen_length;
  o.steps = 0;         // implied by gen_length (Session::defaults)
  o.block_length = 0;  // implied
  o.temperature = g.temperature;
  o.alg = static_cast<int32_t>(g.alg);
  o.threshold = g.threshold;
  o.cfg_scale = g.cfg_scale;
  o.top_k = g.top_k;
  o.top_p = g.top_p;
  o.alg_temp = g.alg_temp;
  o.seed = g.seed;
  o.cache = static_cast<int32_t>(g.cache);
  o.sparse = g.sparse;
  o.sparse_block = g.sparse_block;
  o.sparse_rho = g.sparse_rho;
  o.sparse_skip = g.sparse_skip;
  o.des = static_cast<int32_t>(g.des);
  o.des_k = g.des_k;
  o.des_beta = g.des_beta;
  o.des_scope = static_cast<int32_t>(g.des_scope);
  o.window = g.window;
  o.window_ex = g.window_ex;
  o.window_in = g.window_in;
  o.window_refresh = g.window_refresh;
  o.window_early_stop = g.window_early_stop;
  o.edit = g.edit;
  o.edit_threshold = g.edit_threshold;
  o.max_post_steps = g.max_post_steps;
  o.edit_penalty = g.edit_penalty;
  o.logprobs = -1;
  o.stop_at_eos = g.stop_at_eos;
  o.mode = static_cast<int32_t>(g.mode);
  o.spec_sampling = static_cast<int32_t>(g.spec_sampling);
  o.draft_threshold = g.draft_threshold;
  o.t_min = g.uniform.t_min;
  o.t_max = g.uniform.t_max;
  o.entropy_bound = g.uniform.entropy_bound;
  o.stability = g.uniform.stability;
  o.confidence = g.uniform.confidence;
  return o;
}

template <class E>
E enum_in(int v, int last, const char* what) {
  if (v < 0 || v > last)
    tessera::fail(std::string(what) + " is " + std::to_string(v) + ", not one of 0.." + std::to_string(last));
  return static_cast<E>(v);
}

// The GenerateOptions of a caller's options (validated), and the number of alternatives per token.
GenerateOptions to_options(const Session& s, const tessera_generate_options* given, int* logprobs_top) {
  const tessera_generate_options o = versioned(given, default_options(s), "tessera_generate_options");
  auto length = [](int32_t v, const char* what) -> std::optional<int> {
    if (v < 0) tessera::fail(std::string(what) + " must be >= 0 (0: implied), got " + std::to_string(v));
    return v == 0 ? std::nullopt : std::optional<int>(v);
  };
  if (o.gen_length <= 0) tessera::fail("gen_length must be positive, got " + std::to_string(o.gen_length));
  GenerateOptions g =
      s.defaults(o.gen_length, length(o.block_length, "block_length"), length(o.steps, "steps"));
  g.temperature = o.temperature;
  g.alg = enum_in<tessera::Unmask>(o.alg, TESSERA_UNMASK_ENTROPY, "alg");
  g.threshold = o.threshold;
  g.cfg_scale = o.cfg_scale;
  g.top_k = o.top_k;
  g.top_p = o.top_p;
  g.alg_temp = o.alg_temp;
  g.seed = o.seed;
  g.cache = enum_in<tessera::KvCache>(o.cache, TESSERA_CACHE_DUAL, "cache");
  g.sparse = o.sparse != 0;
  g.sparse_block = o.sparse_block;
  g.sparse_rho = o.sparse_rho;
  g.sparse_skip = o.sparse_skip;
  g.des = enum_in<tessera::DesMode>(o.des, TESSERA_DES_VOTE, "des");
  g.des_k = o.des_k;
  g.des_beta = o.des_beta;
  g.des_scope = enum_in<tessera::DesScope>(o.des_scope, TESSERA_DES_SCOPE_ALL, "des_scope");
  g.window = o.window != 0;
  g.window_ex = o.window_ex;
  g.window_in = o.window_in;
  g.window_refresh = o.window_refresh;
  g.window_early_stop = o.window_early_stop != 0;
  g.edit = o.edit != 0;
  g.edit_threshold = o.edit_threshold;
  g.max_post_steps = o.max_post_steps;
  g.edit_penalty = o.edit_penalty;
  if (o.n_stop > 0) need(o.stop, "stop");
  for (size_t i = 0; i < o.n_stop; ++i) {
    need(o.stop[i], "a stop sequence");
    g.stop.emplace_back(o.stop[i]);
    tessera::check_utf8(g.stop.back(), "a stop sequence");
  }
  if (o.suffix != nullptr) g.suffix = s.suffix_ids(o.suffix, "the suffix");
  if (o.logprobs < -1 || o.logprobs > static_cast<int>(tessera::kTopLogprobs))
    tessera::fail("logprobs must be -1 (off) or 0.." + std::to_string(tessera::kTopLogprobs) + ", got " +
                  std::to_string(o.logprobs));
  g.logprobs = o.logprobs >= 0;
  *logprobs_top = std::max(o.logprobs, 0);
  g.stop_at_eos = o.stop_at_eos != 0;
  g.mode = enum_in<tessera::DecodeMode>(o.mode, TESSERA_MODE_UNIFORM, "mode");
  g.spec_sampling = enum_in<tessera::SpecSampling>(o.spec_sampling, 1, "spec_sampling");
  g.draft_threshold = o.draft_threshold;
  g.uniform.t_min = o.t_min;
  g.uniform.t_max = o.t_max;
  g.uniform.entropy_bound = o.entropy_bound;
  g.uniform.stability = o.stability;
  g.uniform.confidence = o.confidence;
  // The model's default unmasking (left as initialised) gives way where the options need a
  // probability-like confidence, as in `tessera generate`.
  if (g.alg == s.default_alg()) tessera::fit_default_alg(g);
  tessera::validate_generate_options(g, s.config().vocab, s.block_causal());
  return g;
}

std::vector<int32_t> prompt_of(const Session& s, const int32_t* ids, size_t n, const GenerateOptions& g) {
  if (n > 0) need(ids, "the prompt");
  std::vector<int32_t> p(ids, ids + n);
  s.check_prompt(p, g, false);
  return p;
}

// The step callback of one sequence: the caller's callback with the event in C types; a nonzero answer
// (or another sequence's, through `cancel`) ends the generation with Cancelled.
struct StepRelay {
  tessera_step_callback cb = nullptr;
  void* user = nullptr;
  size_t sequence = 0;
  size_t prompt_len = 0;
  int32_t mask = 0;
  std::mutex* serial = nullptr;  // batches: one callback at a time
  std::atomic<bool>* cancel = nullptr;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double first_step = 0;

  void operator()(const tessera::StepEvent& ev) {
    if (ev.step == 0)
      first_step = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (cancel != nullptr && cancel->load()) throw Cancelled{};
    if (cb == nullptr) return;
    std::vector<tessera_edit> edits;
    for (const tessera::TokenEdit& e : ev.edits) edits.push_back({e.step, e.position, e.from, e.to});
    tessera_step_event c{};
    c.struct_size = sizeof c;
    c.sequence = sequence;
    c.step = ev.step;
    c.canvas = ev.canvas.data();
    c.canvas_len = ev.canvas.size();
    c.prompt_len = prompt_len;
    c.committed = ev.committed;
    c.mask_token = mask;
    c.decided = ev.newly_decided_positions.data();
    c.n_decided = ev.newly_decided_positions.size();
    c.edits = edits.data();
    c.n_edits = edits.size();
    int32_t stop = 0;
    if (serial != nullptr) {
      std::lock_guard<std::mutex> l(*serial);
      stop = cb(&c, user);
    } else {
      stop = cb(&c, user);
    }
    if (stop != 0) {
      if (cancel != nullptr) cancel->store(true);
      throw Cancelled{};
    }
  }
};

tessera_result* make_result(const Session::Output& out, const GenerateOptions& g, size_t prompt_len, int top,
                            double first_step) {
  auto r = std::make_unique<tessera_result>();
  r->text = out.text;
  r->tokens = out.result.tokens;
  r->finish = out.stopped || static_cast<int>(out.result.tokens.size()) < g.gen_length
                  ? TESSERA_FINISH_STOP
                  : TESSERA_FINISH_LENGTH;
  for (const tessera::TokenLogprob& t : out.result.logprobs) {
    tessera_result::Logprob l{t.logprob, t.step, {}};
    for (size_t k = 0; k < std::min(static_cast<size_t>(top), t.top.size()); ++k)
      l.top.push_back({t.top[k].first, t.top[k].second});
    r->logprobs.push_back(std::move(l));
  }
  for (const tessera::TokenEdit& e : out.result.edits) r->edits.push_back({e.step, e.position, e.from, e.to});
  tessera_result_stats& st = r->stats;
  st.struct_size = sizeof st;
  st.prompt_tokens = prompt_len;
  st.generated_tokens = r->tokens.size();
  st.steps = out.result.steps_run;
  st.forwards = out.result.forwards;
  st.seconds = out.seconds;
  st.first_step_seconds = first_step;
  st.n_edits = r->edits.size();
  return r.release();
}

}  // namespace

extern "C" {

const char* tessera_version(void) {
  return TESSERA_VERSION_STRING;
}

const char* tessera_last_error(void) {
  return g_last_error.c_str();
}

const char* tessera_status_name(tessera_status s) {
  switch (s) {
    case TESSERA_OK:
      return "ok";
    case TESSERA_ERROR_INVALID_ARGUMENT:
      return "invalid argument";
    case TESSERA_ERROR_MODEL:
      return "model error";
    case TESSERA_ERROR_MEMORY_BUDGET:
      return "memory budget exceeded";
    case TESSERA_ERROR_BUFFER_TOO_SMALL:
      return "buffer too small";
    case TESSERA_ERROR_CANCELLED:
      return "cancelled";
    case TESSERA_ERROR_INTERNAL:
      return "internal error";
  }
  return "unknown status";
}

void tessera_model_params_init(tessera_model_params* p) {
  if (p == nullptr) return;
  *p = tessera_model_params{};
  p->struct_size = sizeof *p;
  p->device = "cpu";
  p->precision = TESSERA_PRECISION_AUTO;
  p->max_batch = 8;
}

tessera_status tessera_parse_size(const char* text, uint64_t* bytes) {
  return guard(TESSERA_ERROR_INVALID_ARGUMENT, [&] {
    need(text, "the text");
    need(bytes, "bytes");
    *bytes = tessera::memory::parse_size(text);
  });
}

tessera_status tessera_model_open(const char* path, const tessera_model_params* params, tessera_model** out) {
  tessera::LoadOptions lo;
  int max_batch = 8;
  const tessera_status st = guard(TESSERA_ERROR_INVALID_ARGUMENT, [&] {
    need(out, "out");
    *out = nullptr;
    tessera_model_params d;
    tessera_model_params_init(&d);
    const tessera_model_params p = versioned(params, d, "tessera_model_params");
    lo.model = path == nullptr ? "" : path;
    lo.device = p.device == nullptr ? "cpu" : p.device;
    if (lo.device != "cpu" && lo.device != "cuda")
      tessera::fail("device must be \"cpu\" or \"cuda\", got \"" + lo.device + "\"");
    switch (p.precision) {
      case TESSERA_PRECISION_AUTO:
        lo.precision = tessera::Precision::Auto;
        break;
      case TESSERA_PRECISION_BF16:
        lo.precision = tessera::Precision::BF16;
        break;
      case TESSERA_PRECISION_F32:
        lo.precision = tessera::Precision::F32;
        break;
      default:
        tessera::fail("precision is " + std::to_string(p.precision) + ", not one of 0..2");
    }
    lo.memory_budget = p.memory_budget;
    if (p.threads < 0) tessera::fail("threads must be >= 0, got " + std::to_string(p.threads));
    lo.threads = p.threads;
    lo.dequantize = p.dequantize != 0;
    if (p.max_batch < 1 || p.max_batch > 256)
      tessera::fail("max_batch must be in 1..256, got " + std::to_string(p.max_batch));
    max_batch = p.max_batch;
  });
  if (st != TESSERA_OK) return st;
  return guard(TESSERA_ERROR_MODEL, [&] {
    auto m = std::make_unique<tessera_model>();
    m->max_batch = max_batch;
    m->session.emplace(lo);
    m->batcher = std::make_unique<tessera::Batcher>(m->session->engine(), max_batch);
    m->path = m->session->model_dir();
    *out = m.release();
  });
}

void tessera_model_close(tessera_model* m) {
  delete m;
}

tessera_status tessera_model_info_get(const tessera_model* m, tessera_model_info* out) {
  return guard(TESSERA_ERROR_INVALID_ARGUMENT, [&] {
    need(m, "the model");
    need(out, "out");
    const uint32_t size = checked_size(*out, "tessera_model_info");
    const Session& s = *m->session;
    const tessera::ModelConfig& c = s.config();
    tessera_model_info i{};
    i.struct_size = size;
    i.vocab_size = c.vocab;
    i.max_positions = c.max_positions;
    i.mask_token = c.mask_id;
    i.bos_token = static_cast<int32_t>(c.bos_id);
    i.eos_token = static_cast<int32_t>(c.eos_id);
    i.attention_block = s.model_block();
    i.has_chat_template = s.has_chat_template();
    i.adds_bos = s.adds_bos();
    i.weight_bytes = const_cast<Session&>(s).engine().model().weight_bytes();
    i.family = tessera::family_name(c.family);
    i.path = m->path.c_str();
    std::memcpy(out, &i, size);
  });
}

tessera_status tessera_tokenize(const tessera_model* m, const char* text, int32_t* ids, size_t capacity,
                                size_t* n_ids) {
  return guard(TESSERA_ERROR_INVALID_ARGUMENT, [&] {
    need(m, "the model");
    need(text, "the text");
    if (capacity > 0) need(ids, "ids");
    const std::string t(text);
    tessera::check_utf8(t, "the text");
    copy_out(m->session->tokenizer().encode(t), ids, capacity, n_ids);
  });
}

tessera_status tessera_detokenize(const tessera_model* m, const int32_t* ids, size_t n_ids,
                                  int32_t skip_special, char* text, size_t capacity, size_t* len) {
  return guard(TESSERA_ERROR_INVALID_ARGUMENT, [&] {
    need(m, "the model");
    if (n_ids > 0) need(ids, "ids");
    if (capacity > 0) need(text, "the text buffer");
    m->session->check_vocab(std::span<const int32_t>(ids, n_ids));
    copy_out(m->session->tokenizer().decode(std::span<const int32_t>(ids, n_ids), skip_special != 0), text,
             capacity, len);
  });
}

tessera_status tessera_chat_apply(const tessera_model* m, const tessera_chat_message* msgs, size_t n_msgs,
                                  int32_t add_generation_prompt, char* text, size_t capacity, size_t* len) {
  return guard(TESSERA_ERROR_INVALID_ARGUMENT, [&] {
    need(m, "the model");
    if (capacity > 0) need(text, "the text buffer");
    copy_out(m->session->chat_text(messages(msgs, n_msgs), add_generation_prompt != 0), text, capacity, len);
  });
}

tessera_status tessera_prompt_tokens(const tessera_model* m, const tessera_chat_message* msgs, size_t n_msgs,
                                     int32_t use_chat, int32_t* ids, size_t capacity, size_t* n_ids) {
  return guard(TESSERA_ERROR_INVALID_ARGUMENT, [&] {
    need(m, "the model");
    if (capacity > 0) need(ids, "ids");
    copy_out(m->session->encode_messages(messages(msgs, n_msgs), use_chat != 0), ids, capacity, n_ids);
  });
}

tessera_status tessera_generate_options_init(const tessera_model* m, tessera_generate_options* o) {
  return guard(TESSERA_ERROR_INVALID_ARGUMENT, [&] {
    need(m, "the model");
    need(o, "the options");
    *o = default_options(*m->session);
  });
}

tessera_status tessera_generate_options_edit_preset(tessera_generate_options* o, const char* mode) {
  return guard(TESSERA_ERROR_INVALID_ARGUMENT, [&] {
    need(o, "the options");
    need(mode, "the mode");
    const tessera::EditMode e = tessera::parse_edit_mode(mode);
    if (e == tessera::EditMode::Off) {
      o->edit = 0;
      return;
    }
    const tessera::EditPreset p = tessera::edit_preset(e);
    o->edit = 1;
    o->threshold = p.threshold;
    o->edit_threshold = p.edit_threshold;
    o->max_post_steps = p.max_post_steps;
  });
}

tessera_status tessera_generate(tessera_model* m, const int32_t* prompt, size_t prompt_len,
                                const tessera_generate_options* o, tessera_step_callback callback,
                                void* user_data, tessera_result** out) {
  return guard(TESSERA_ERROR_INVALID_ARGUMENT, [&] {
    need(m, "the model");
    need(out, "out");
    *out = nullptr;
    Session& s = *m->session;
    int top = 0;
    const GenerateOptions g = to_options(s, o, &top);
    const std::vector<int32_t> ids = prompt_of(s, prompt, prompt_len, g);
    StepRelay relay{callback, user_data, 0, ids.size(), s.config().mask_id};
    const Session::Output r = s.run(*m->batcher, ids, g, [&](const tessera::StepEvent& ev) { relay(ev); });
    *out = make_result(r, g, ids.size(), top, relay.first_step);
  });
}

tessera_status tessera_generate_batch(tessera_model* m, const int32_t* const* prompts,
                                      const size_t* prompt_lens, size_t n, const tessera_generate_options* o,
                                      tessera_step_callback callback, void* user_data, tessera_result** out) {
  return guard(TESSERA_ERROR_INVALID_ARGUMENT, [&] {
    need(m, "the model");
    need(out, "out");
    if (n == 0) return;
    need(prompts, "prompts");
    need(prompt_lens, "prompt_lens");
    std::fill(out, out + n, nullptr);
    Session& s = *m->session;
    int top = 0;
    const GenerateOptions g = to_options(s, o, &top);
    std::vector<std::vector<int32_t>> ids(n);
    for (size_t i = 0; i < n; ++i) ids[i] = prompt_of(s, prompts[i], prompt_lens[i], g);
    std::vector<std::unique_ptr<tessera_result>> results(n);
    std::vector<std::exception_ptr> errors(n);
    std::atomic<size_t> next{0};
    std::atomic<bool> cancel{false};
    std::mutex serial;
    auto worker = [&] {
      for (size_t i; (i = next++) < n;) {
        try {
          StepRelay relay{callback, user_data, i, ids[i].size(), s.config().mask_id, &serial, &cancel};
          const Session::Output r =
              s.run(*m->batcher, ids[i], g, [&](const tessera::StepEvent& ev) { relay(ev); });
          results[i].reset(make_result(r, g, ids[i].size(), top, relay.first_step));
        } catch (...) {
          errors[i] = std::current_exception();
          cancel.store(true);  // the batch fails as a whole: the others stop at their next step
        }
      }
    };
    std::vector<std::thread> th;
    for (size_t t = 0; t < std::min(n, static_cast<size_t>(m->max_batch)); ++t) th.emplace_back(worker);
    for (auto& t : th) t.join();
    // The first failure that is not a stop caused by another sequence's failure.
    std::exception_ptr first, first_cancel;
    for (const auto& e : errors) {
      if (!e) continue;
      try {
        std::rethrow_exception(e);
      } catch (const Cancelled&) {
        if (!first_cancel) first_cancel = e;
      } catch (...) {
        if (!first) first = e;
      }
    }
    if (first) std::rethrow_exception(first);
    if (first_cancel) std::rethrow_exception(first_cancel);
    for (size_t i = 0; i < n; ++i) out[i] = results[i].release();
  });
}

void tessera_result_free(tessera_result* r) {
  delete r;
}

const char* tessera_result_text(const tessera_result* r) {
  return r == nullptr ? "" : r->text.c_str();
}

size_t tessera_result_tokens(const tessera_result* r, const int32_t** ids) {
  if (ids != nullptr) *ids = r == nullptr ? nullptr : r->tokens.data();
  return r == nullptr ? 0 : r->tokens.size();
}

tessera_finish_reason tessera_result_finish_reason(const tessera_result* r) {
  return r == nullptr ? TESSERA_FINISH_LENGTH : r->finish;
}

void tessera_result_stats_get(const tessera_result* r, tessera_result_stats* out) {
  if (r == nullptr || out == nullptr) return;
  if (out->struct_size < sizeof(uint32_t)) return;
  const uint32_t size = std::min<uint32_t>(out->struct_size, sizeof(tessera_result_stats));
  tessera_result_stats st = r->stats;
  st.struct_size = size;
  std::memcpy(out, &st, size);
}

size_t tessera_result_logprob(const tessera_result* r, size_t i, float* logprob, int32_t* step,
                              const tessera_top_logprob** top) {
  const bool has = r != nullptr && i < r->logprobs.size();
  if (logprob != nullptr) *logprob = has ? r->logprobs[i].logprob : NAN;
  if (step != nullptr) *step = has ? r->logprobs[i].step : -1;
  if (top != nullptr) *top = has ? r->logprobs[i].top.data() : nullptr;
  return has ? r->logprobs[i].top.size() : 0;
}

size_t tessera_result_edits(const tessera_result* r, const tessera_edit** edits) {
  if (edits != nullptr) *edits = r == nullptr ? nullptr : r->edits.data();
  return r == nullptr ? 0 : r->edits.size();
}

tessera_status tessera_plan(tessera_model* m, size_t prompt_len, const tessera_generate_options* o,
                            tessera_memory_plan* out) {
  return guard(TESSERA_ERROR_INVALID_ARGUMENT, [&] {
    need(m, "the model");
    need(out, "out");
    const uint32_t size = checked_size(*out, "tessera_memory_plan");
    Session& s = *m->session;
    int top = 0;
    const GenerateOptions g = to_options(s, o, &top);
    s.check_length(prompt_len, g);
    tessera::Engine& e = s.engine();
    const tessera::RequestPlan plan =
        tessera::plan_request(g, static_cast<int64_t>(prompt_len), s.block_causal());
    tessera::StepStats st;
    m->batcher->run(  // on the engine thread, alone: the plan opens the request's state (a KV cache slot)
        [&] {
          tessera::RequestScope scope(e, plan);
          st = tessera::plan_largest_step(e, plan);
        },
        true);
    tessera_memory_plan p{};
    p.struct_size = size;
    p.canvas = plan.canvas;
    p.logit_rows = std::min(plan.logit_rows, plan.canvas);
    p.kv_cache_rows = plan.kv_capacity * std::max(plan.kv_streams, 1) * (plan.kv_capacity > 0);
    p.weight_bytes = s.engine().model().weight_bytes();
    p.activation_bytes = st.planned_peak;
    p.lower_bound_bytes = st.lower_bound;
    p.k_ffn = st.shape.k_ffn;
    p.k_logits = st.shape.k_logits;
    p.memory_budget = e.options().memory_budget;
    p.shares_forwards = plan.shares_forwards();
    std::memcpy(out, &p, size);
  });
}

}  // extern "C"
